"""The Image II tab's events, called as Gradio calls them (no browser), over the built-in VAR, MAR and SJD2 GPT:
each method runs next to its own world's AR with the same seed, the table says what it shares with AR, and
bad settings are page messages."""

import re

import gradio as gr
import pytest

from demos import image2_tab

# the method's settings: N, specialised refiner, CSpD drafts, MAR tokens per step, SJD2 window, levels, coupled
SETTINGS = [7, True, 8, 4, 16, 1, True]


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    with gr.Blocks() as blocks:
        image2_tab.build(image2_tab.image2_models(), tmp_path_factory.mktemp("image2"))
    return blocks


def handler(blocks, name: str):
    return next(f.fn for f in blocks.fns.values() if name in (f.api_name, f.name))


def generate(blocks, method: str, settings=SETTINGS, class_name="Trouser", batch=2):
    return handler(blocks, "image2")(class_name, method, *settings, 0, batch, None)


def row(stats: str, name: str) -> list[str]:
    line = next(line for line in stats.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_code_keeps_the_large_vars_first_scales(tab):
    ar, fast, stats, archive = generate(tab, "code")
    assert row(stats, "target passes (NFE)") == ["10", "7"] and row(stats, "small VAR passes") == ["0", "3"]
    assert row(stats, "leading scales identical to AR (all images)")[1] == "7 of 10"
    cache = row(stats, "KV cache (MB)")
    assert float(cache[1]) < 0.6 * float(cache[0])
    assert len(ar["value"]) == len(fast["value"]) == 2 and ar["label"] == "AR: large VAR, next scale"
    assert archive.endswith("samples.zip")

    n4 = generate(tab, "code", [4, False, *SETTINGS[2:]])[2]            # training-free hand-off at another N
    assert row(n4, "leading scales identical to AR (all images)")[1] == "4 of 10"


def test_coupled_sjd2_gives_ars_images(tab):
    stats = generate(tab, "sjd2")[2]
    assert row(stats, "images identical to AR") == ["–", "2 of 2"] and row(stats, "lossless") == ["–", "yes"]
    assert row(stats, "target passes (NFE)")[0] == "256" and int(row(stats, "target passes (NFE)")[1]) < 256


def test_continuous_methods(tab):
    cspd = generate(tab, "cspd", class_name="all classes, in turn")[2]
    assert int(row(cspd, "draft passes")[1]) > 0 and int(row(cspd, "target passes (NFE)")[1]) < 64
    mar = generate(tab, "mar", [7, True, 8, 8, 16, 1, True])[2]          # 8 tokens a step: 64 / 8 passes
    assert row(mar, "target passes (NFE)") == ["64", "8"]
    draft = generate(tab, "ar-draft")[2]
    assert row(draft, "target passes (NFE)") == ["64", "0"] and row(draft, "draft passes")[1] == "64"


@pytest.mark.parametrize("method, settings, message", [
    ("code", [3, True, 8, 4, 16, 1, True], "no refiner specialised for draft_steps=3"),
    ("code", [12, False, 8, 4, 16, 1, True], r"N \(scales from the large VAR\) must be in \[1, 9\]"),
    ("sjd2", [7, True, 8, 4, 16, 9, True], r"denoising levels must be in \[1, 8\]"),
    ("sjd2", [7, True, 8, 4, 2, 3, True], r"denoising steps \(3\) cannot exceed the window \(2\)"),
    ("unicorn", SETTINGS, "unknown method 'unicorn'"),
])
def test_bad_settings_are_page_messages(tab, method, settings, message):
    with pytest.raises(gr.Error) as info:
        generate(tab, method, settings)
    assert re.search(message, str(info.value)), str(info.value)


def test_an_unknown_class_is_a_page_message(tab):
    with pytest.raises(gr.Error, match="unknown class 'Unicorn'"):
        generate(tab, "code", class_name="Unicorn")


def test_a_method_shows_only_its_controls(tab):
    updates = handler(tab, "<lambda>")("sjd2")
    visible = [u["visible"] for u in updates[:-1]]
    assert visible == [False, False, False, False, True, True, True]     # window, levels, coupled
    assert updates[-1].startswith("SJD2")
