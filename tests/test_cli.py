"""CLI: bad input is one line on stderr and exit code 2, never a traceback."""

import json

import pytest

from mmaccel.cli import main
from tests.speech.ctc.test_wav2vec2 import checkpoint  # noqa: F401  (fixture)


@pytest.mark.parametrize("argv, message", [
    (["bench", "nosuchsuite"], "unknown benchmark suite"),
    (["bench", "core", "--samples", "100"], "does not apply"),
    (["bench", "core", "--inception-samples", "100"], "does not apply"),
    (["bench", "core", "--heads", "none"], "does not apply"),
    (["bench", "image", "--inception-samples", "-1"], "must be >= 0"),
    (["bench", "core", "--threads", "0"], "--threads must be >= 1"),
    (["generate", "hello", "--model", "/nonexistent/model"], "does not exist"),
    (["generate", "hello", "--model", "builtin:nope"], "unknown built-in"),
])
def test_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmaccel: error:") and message in err[0]


@pytest.mark.parametrize("params, message", [
    (["--method", "teleport"], "unknown method"), (["--method", "speculative", "--param", "k=0"], "k must be"),
    (["--temperature", "-1"], "temperature"), (["--method", "sjd", "--param", "window=-3"], "window"),
])
def test_generate_validates_method_and_sampling(capsys, tiny_lm_dir, params, message):
    assert main(["generate", "the cat", "--model", str(tiny_lm_dir), "--draft", "none", *params]) == 2
    assert message in capsys.readouterr().err


def test_generate_prints_text_and_stats(capsys, tiny_lm_dir):
    argv = ["generate", "the cat sat", "--model", str(tiny_lm_dir), "--draft", str(tiny_lm_dir),
            "--method", "speculative", "--param", "k=3", "--max-new-tokens", "6"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["nfe"] >= 1 and captured.out.strip() != ""


def test_methods_listing(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(family in out for family in ("text ", "image ", "speech "))
    assert "relaxed (budget: epsilon)" in out and "k=4 (int, [1, 64]): draft tokens per verification" in out
    assert main(["methods", "--pipeline", "image", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "### `lantern` (image)" in out and "run: `mmaccel image generate --method lantern`" in out
    assert "follows: LANTERN (ICLR 2025), arXiv 2410.03355" in out and "speech" not in out
    assert "| `delta` | float | `0.1` | [0.0, 1.0] |" in out


def test_image_generate_writes_pngs(tmp_path, capsys):
    assert main(["image", "generate", "--method", "gsd", "--labels", "0,Sneaker", "--out", str(tmp_path), "--seed", "1"]) == 0
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["000_class0.png", "001_class7.png"]
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["nfe"] > 1 and stats["new_tokens"] == 2 * 256


@pytest.mark.parametrize("argv, match", [
    (["--labels", ","], "labels is empty"),
    (["--labels", "10"], "out of range"),
    (["--labels", "Shoe"], "unknown class label"),
    (["--labels", "1", "--method", "nope"], "unknown method"),
    (["--labels", "1", "--cfg-scale", "-1"], "cfg_scale"),
    (["--labels", "1", "--method", "zipar", "--param", "s=0"], "s must"),
    (["--labels", "1", "--model", "/nowhere/gpt.pt", "--vq", "/nowhere/vq.pt"], "not found"),
])
def test_image_generate_errors_are_one_line(tmp_path, capsys, argv, match):
    assert main(["image", "generate", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmaccel: error:") and match in err and "\n" not in err


def test_image_generate_scale_writes_pngs_with_code(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["image", "generate-scale", "--method", "code", "--draft-steps", "7", "--labels", "0,Bag",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["000_class0.png", "001_class8.png"]
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (stats["nfe"], stats["draft_passes"], stats["new_tokens"]) == (7, 3, 2 * 680) and stats["cache_mb"] > 0


@pytest.mark.parametrize("argv, match", [
    (["--labels", "1", "--method", "code", "--draft-steps", "10"], "draft_steps must be an int in [1, 9]"),
    (["--labels", "1", "--draft-steps", "3"], "draft_steps"),
    (["--labels", "1", "--method", "code", "--specialised", "--draft-steps", "2"], "no refiner specialised"),
    (["--labels", "1", "--refiner-cfg", "1.5"], "method 'ar' does not take parameter(s) refiner_cfg"),
    (["--labels", "1", "--method", "code", "--param", "refiner_cfg=-3"], "refiner_cfg must be in [-1.0, 1000.0]"),
    (["--labels", "1", "--model", "/nowhere/var_d16.pth", "--vq", "/nowhere/vae.pth"], "not found"),
    (["--labels", "1", "--top-p", "0"], "top_p"),
])
def test_image_generate_scale_errors_are_one_line(tmp_path, capsys, argv, match):
    assert main(["image", "generate-scale", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmaccel: error:") and match in err and "\n" not in err


def test_image_generate_continuous_writes_pngs_with_cspd(tmp_path, capsys):
    from tests.image.test_continuous_pipeline import write_tiny_models

    model = write_tiny_models(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["image", "generate-continuous", "--model", str(model), "--method", "cspd", "--num-draft", "4",
                 "--diffusion-steps", "3", "--labels", "0,8", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["000_class0.png", "001_class8.png"]
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (stats["nfe"], stats["draft_passes"], stats["new_tokens"]) == (7, 13, 2 * 16)
    assert main(["image", "generate-continuous", "--model", str(model), "--method", "mar", "--num-draft", "4",
                 "--labels", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmaccel: error:") and "method 'mar' does not take parameter(s) num_draft" in err
    assert "\n" not in err
    assert main(["image", "generate-continuous", "--model", str(model), "--method", "mar", "--param", "tokens_per_step=8",
                 "--diffusion-steps", "3", "--labels", "1", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["nfe"] == 2          # 16 tokens, 8 a step


def test_asr_transcribe_prints_transcripts_and_reports_bad_files(capsys, tmp_path):
    from tests.speech.test_pipeline import FILES, LIBRIVOX

    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    from mmaccel.errors import ModelNotFoundError
    from mmaccel.speech.whisper import BUILTIN, package_file

    try:
        package_file(BUILTIN["tiny.en"], BUILTIN["tiny.en"].model_parts[0])
    except ModelNotFoundError:
        pytest.skip("Whisper tiny.en not installed")
    rc = main(["asr", "transcribe", FILES[1], str(tmp_path / "missing.wav"), "--model", "builtin:tiny.en"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert f"{FILES[1]}\tHe was not an old-sposed young man." in out and "missing.wav\tERROR: audio file not found" in out
    assert '"method": "greedy"' in err and '"rtfx"' in err
    assert main(["asr", "transcribe", FILES[1], "--model", "builtin:tiny.en", "--method", "eagle", "--fixed-k"]) == 0
    assert "He was not an old-sposed young man." in capsys.readouterr().out
    assert main(["asr", "transcribe", FILES[1], "--model", "builtin:tiny.en", "--method", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    assert main(["asr", "transcribe", FILES[1], "--model", "builtin:tiny.en", "--method", "speculative",
                 "--draft", "none"]) == 2
    assert "needs a draft model" in capsys.readouterr().err
    assert main(["asr", "transcribe", FILES[1], "--model", "builtin:tiny.en", "--draft", str(tmp_path / "d.safetensors")]) == 2
    assert "draft decoder file not found" in capsys.readouterr().err
    assert main(["asr", "transcribe", FILES[1], "--model", "builtin:tiny.en", "--temperature", "0,0.5",
                 "--best-of", "2", "--log-prob-threshold", "0", "--no-speech-threshold", "none",
                 "--output-format", "json", "--output-dir", str(tmp_path)]) == 0    # every window decoded again
    segments = json.loads((tmp_path / "sense_and_sensibility_01_austen_64kb-0880.json").read_text())["segments"]
    assert segments and {s["temperature"] for s in segments} <= {0.0, 0.5}
    with pytest.raises(SystemExit):
        main(["asr", "transcribe", FILES[1], "--temperature", "0,hot"])
    assert "temperatures are numbers" in capsys.readouterr().err
    assert main(["asr", "transcribe", FILES[1], "--model", "builtin:tiny.en", "--temperature", "0.5,0.2"]) == 2
    assert "must not decrease" in capsys.readouterr().err


def test_asr_ctc_and_whisfusion_print_transcripts(capsys, tmp_path, checkpoint, tiny_en_asr):  # noqa: F811
    from mmaccel.speech.whisfusion.model import WhisfusionDecoder
    from tests.speech.test_pipeline import FILES, LIBRIVOX

    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    assert main(["asr", "ctc", FILES[1], FILES[2], "--model", str(checkpoint), "--method", "greedy"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 2 and out.startswith(f"{FILES[1]}\t") and "rtfx" in json.loads(err.strip().splitlines()[-1])
    assert main(["asr", "ctc", FILES[1], "--model", str(checkpoint), "--beam", "0"]) == 2
    assert "beam must be" in capsys.readouterr().err
    WhisfusionDecoder(tiny_en_asr.bundle.model, tokens_per_second=5.0).save(tmp_path / "wf", "builtin:tiny.en")
    rc = main(["asr", "whisfusion", FILES[1], str(tmp_path / "missing.wav"), "--model", str(tmp_path / "wf"),
               "--candidates", "2", "--steps", "1"])
    out, err = capsys.readouterr()
    assert rc == 1 and out.startswith(f"{FILES[1]}\t") and "missing.wav\tERROR: audio file not found" in out
    assert json.loads(err.strip().splitlines()[-1])["nfe"] == 1
    assert main(["asr", "whisfusion", FILES[1], "--model", str(tmp_path / "wf"), "--candidates", "0"]) == 2
    assert "candidates must be" in capsys.readouterr().err
