"""`mmaccel eval image`: PNGs + summary, exact resume of a deleted batch, config changes and bad input."""

import json

import pytest

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.eval.distributed import Dist
from mmaccel.eval.image import evaluate_image_method, sample_name
from tests.eval.conftest import one_line_error

RUN = dict(method="sjd", params={"window": 8}, num_samples=6, batch_size=2, features="domain", seed=3)


def _files(root):
    return {p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted((root / "samples").glob("*.png")) + sorted((root / "batches").glob("*"))}


def _untimed(record: dict) -> dict:
    return {**record, "stats": {k: v for k, v in record["stats"].items() if k not in ("time_s", "peak_mem_mb")}}


def test_sample_names():
    assert sample_name(123, 3, 1000) == "000123_class3.png"
    assert sample_name(5, 0, 12_345_678) == "00000005_class0.png"


def test_resume_regenerates_only_the_missing_batch(tmp_path, fashion_pipe):
    logs = []
    run = lambda **kw: evaluate_image_method(tmp_path, dist=Dist(), pipeline=fashion_pipe, log=logs.append,  # noqa: E731
                                             **{**RUN, **kw})
    first = run()
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "000000_class0.png", "000001_class1.png", "000002_class2.png", "000003_class3.png", "000004_class4.png",
        "000005_class5.png"]
    assert first["generated_batches"] == 3 and first["nfe"] > 0 and first["ar_nfe"] == 3 * 256
    assert first["fid"]["samples"] == 6 and first["fid"]["features"] == "domain"
    assert json.loads((tmp_path / "summary.json").read_text()) == first
    before = _files(tmp_path)

    (tmp_path / "samples" / "000003_class3.png").unlink()                  # batch 1 lost one image
    second = run()
    assert (second["generated_batches"], second["resumed_batches"]) == (1, 2)
    assert "3 batches: 1 generated, 2 resumed" in logs[-1]
    after = _files(tmp_path)
    assert after.keys() == before.keys()
    for name, (mtime, data) in after.items():
        if name.endswith(".json"):                                         # records: equal but for timings
            data, old = (_untimed(json.loads(d)) for d in (data, before[name][1]))
            assert data == old, name
        else:
            assert data == before[name][1], name                            # same bytes: deterministic batches
        regenerated = name.startswith(("samples/000002", "samples/000003", "batches/batch_000001"))
        assert (mtime != before[name][0]) == regenerated, name
    for key in ("fid", "nfe", "mean_accepted", "new_tokens", "draft_passes"):
        assert second[key] == first[key]

    (tmp_path / "batches" / "batch_000002.json").unlink()                  # a batch without its done-marker
    assert run()["generated_batches"] == 1
    unscored = run(reference="none")                                       # scoring options are not config
    assert unscored["generated_batches"] == 0 and "fid" not in unscored


def test_config_change_needs_overwrite(tmp_path, fashion_pipe, capsys):
    small = {**RUN, "num_samples": 2}
    evaluate_image_method(tmp_path, dist=Dist(), pipeline=fashion_pipe, log=lambda m: None, **small)
    old = (tmp_path / "samples" / "000000_class0.png").read_bytes()
    with pytest.raises(InputError, match=r"differs in: seed\); pass --overwrite"):
        evaluate_image_method(tmp_path, dist=Dist(), pipeline=fashion_pipe, **{**small, "seed": 4})
    assert (tmp_path / "samples" / "000000_class0.png").read_bytes() == old
    argv = ["eval", "image", "--out", str(tmp_path), "--method", "sjd", "--param", "window=8", "--num-samples", "2",
            "--batch-size", "2", "--features", "domain", "--seed", "4", "--threads", "1"]
    assert main(argv) == 2
    one_line_error(capsys, "holds an earlier run with another config")
    assert main(argv + ["--overwrite"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["generated_batches"] == 1 and summary["config"]["seed"] == 4
    assert (tmp_path / "samples" / "000000_class0.png").read_bytes() != old


def test_foreign_out_directory_is_not_touched(tmp_path, capsys):
    (tmp_path / "holiday.png").write_bytes(b"a user's photo")
    assert main(["eval", "image", "--out", str(tmp_path), "--num-samples", "2", "--features", "domain"]) == 2
    one_line_error(capsys, "is not empty and holds no config.json")
    assert (tmp_path / "holiday.png").read_bytes() == b"a user's photo"


@pytest.mark.parametrize("extra, match", [
    (["--num-samples", "1"], "--num-samples must be >= 2 for an FID"),
    (["--num-samples", "4", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["--num-samples", "4", "--method", "teleport"], "unknown method"),
    (["--num-samples", "4", "--method", "sjd", "--param", "window=-1"], "window"),
    (["--num-samples", "4", "--features", "clip"], "unknown --features"),
    (["--num-samples", "4", "--reference", "/nowhere/ref"], "--reference /nowhere/ref not found"),
    (["--num-samples", "4", "--bootstrap-rounds", "-1"], "--bootstrap-rounds must be >= 0"),
    (["--num-samples", "4", "--temperature", "-1"], "temperature"),
    (["--num-samples", "4", "--cfg-scale", "-2"], "cfg_scale"),
    (["--num-samples", "4", "--model", "/nowhere/gpt.pt", "--vq", "/nowhere/vq.pt"], "not found"),
])
def test_bad_input_is_one_line(tmp_path, capsys, extra, match):
    assert main(["eval", "image", "--out", str(tmp_path / "run"), "--features", "domain", *extra]) == 2
    one_line_error(capsys, match)
    assert not (tmp_path / "run").exists()


def test_a_bad_reference_folder_fails_before_generating(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    (tmp_path / "ref").mkdir()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "ref" / "a.png")
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(tmp_path / "ref" / "b.png")
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "ref" / "c.png")
    assert main(["eval", "image", "--out", str(tmp_path / "run"), "--num-samples", "4", "--features", "domain",
                 "--reference", str(tmp_path / "ref")]) == 2
    one_line_error(capsys, "--reference " + str(tmp_path / "ref") + " mixes image sizes")
    assert not (tmp_path / "run").exists()
