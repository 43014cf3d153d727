"""The image tabs' method menus and controls come from the method registries (no browser, no model loaded): the
menu is the registry less the baseline, a method shows the controls of its parameters with their help, the
controls' values become its parameters, and "lossless" is its plug-in's word."""

import gradio as gr
import pytest

from demos import image2_tab, image_tab
from mmaccel.errors import InputError
from mmaccel.image.pipeline import ImagePipeline


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    with gr.Blocks() as blocks:
        image_tab.build(image_tab.image_model("builtin:fashion-mnist"), tmp_path_factory.mktemp("image"))
    return blocks


def test_the_menu_is_the_registry_less_the_baseline_and_sjd2():
    assert list(image_tab.METHODS) == [m for m in ImagePipeline.methods() if m not in ("ar", "sjd2")]
    assert list(image2_tab.WORLD_OF) == ["ar-small", "code", "mar", "ar-draft", "cspd", "sjd2"]


def test_a_method_shows_its_controls_with_its_parameters_help(tab):
    change = next(f.fn for f in tab.fns.values() if f.name == "<lambda>")
    updates = change("zipar")
    shown = {c: u.get("info") for c, u in zip(image_tab.CONTROLS, updates) if u["visible"]}
    helps = {r["name"]: r["help"] for r in ImagePipeline.methods()["zipar"].parameters()}
    assert shown == {"row_window": helps["window"], "s": helps["s"], "coupled": helps["coupled"],
                     "grouped": helps["grouped"]}
    assert updates[-1].startswith("**zipar**: ZipAR")
    assert [c for c, u in zip(image_tab.CONTROLS, change("lantern")) if u["visible"]] == ["k", "delta"]


def test_controls_become_the_methods_parameters():
    assert image_tab.method_params("zipar", 8, 2, 4, 0.1, 5, True, False) == {"s": 5, "window": 2, "coupled": True,
                                                                              "grouped": False}
    assert image_tab.method_params("lantern", 8, 0, 3, 0.25, 4, False, False) == {"k": 3, "delta": 0.25}
    assert image_tab.method_params("tree", 8, 0, 3, 0.25, 4, False, False) == {}         # no control: its defaults
    with pytest.raises(InputError, match=r"δ \(LANTERN's TV budget\) must be in \[0, 0.5\]"):
        image_tab.method_params("lantern", 8, 0, 3, 0.75, 4, False, False)
    assert image2_tab.method_params("code", 6, True, 8, 4, 16, 1, True) == {"draft_steps": 6, "training_free": False}
    assert image2_tab.method_params("mar", 6, True, 8, 2, 16, 1, True) == {"tokens_per_step": 2}


def test_lossless_is_the_plug_ins_word():
    controls = image2_tab.METHOD_CONTROLS
    assert controls.lossless("code", {"draft_steps": 7}) == "no (relaxed: draft_steps = 7)"
    assert controls.lossless("ar-draft", {}) == "no (another model)"
    assert controls.lossless("cspd", {"num_draft": 1, "inner_temperature": 1.0}) == "yes"
    assert controls.lossless("sjd2", {"window": 16, "steps": 1, "coupled": True}) == "yes"
