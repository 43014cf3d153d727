"""`mmaccel eval fid`: folders and .npz files agree with the metrics module, and bad input is one line."""

import json

import numpy as np
import pytest
import torch

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.eval.distributed import Dist
from mmaccel.eval.fid import evaluate_fid
from mmaccel.eval.image_files import image_files, open_image_set
from mmaccel.metrics.fid import bootstrap_std, extract_features, feature_stats, frechet_distance, reference_stats
from tests.eval.conftest import one_line_error, upsample64, write_pngs


@pytest.fixture(scope="module")
def images64(fashion_test_images):
    return upsample64(fashion_test_images[:24])              # uint8 [24, 64, 64]


def test_folder_fid_matches_the_metrics_module(tmp_path, images64, capsys):
    write_pngs(tmp_path / "s", images64)
    out = tmp_path / "report.json"
    assert main(["eval", "fid", "--samples", str(tmp_path / "s"), "--features", "domain", "--out", str(out),
                 "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    feats = extract_features(torch.from_numpy(images64), "domain")
    ref = reference_stats("test", extractor="domain", size=64)
    assert report["fid"] == round(frechet_distance(*feature_stats(feats), *ref), 4)
    assert report["fid_std"] == round(bootstrap_std(feats, ref, 10), 4) and report["fid_std"] > 0
    assert report["samples"] == {"path": str(tmp_path / "s"), "count": 24, "size": [64, 64]}
    assert report["reference"] == {"name": "fashion-mnist-test", "count": 10000, "size": [64, 64]}
    assert report["features"] == "domain" and report["extractor_id"].startswith("clf")


def test_npz_layouts_and_folders_score_alike(tmp_path, images64):
    write_pngs(tmp_path / "s", images64)
    np.savez(tmp_path / "grey.npz", images64)                                         # arr_0, [N, H, W]
    np.savez(tmp_path / "rgb.npz", images=np.repeat(images64[..., None], 3, axis=-1))  # [N, H, W, 3]
    np.savez(tmp_path / "one.npz", images64[..., None])                               # [N, H, W, 1]
    scores = {name: evaluate_fid(tmp_path / name, "fashion-mnist-test", "domain", Dist(), bootstrap_rounds=0)["fid"]
              for name in ("s", "grey.npz", "rgb.npz", "one.npz")}
    assert len(set(scores.values())) == 1, scores


def test_folder_reference_recursive_and_hidden_files_skipped(tmp_path, fashion_test_images):
    write_pngs(tmp_path / "a", fashion_test_images[:6])
    write_pngs(tmp_path / "a" / "nested", fashion_test_images[6:10], prefix="n")
    (tmp_path / "a" / ".hidden.png").write_bytes(b"not an image")                  # e.g. an unfinished write
    (tmp_path / "a" / ".cache").mkdir()
    (tmp_path / "a" / ".cache" / "x.png").write_bytes(b"not an image")
    (tmp_path / "a" / "notes.txt").write_text("ignored")
    files = image_files(tmp_path / "a")
    names = [f.relative_to(tmp_path / "a").as_posix() for f in files]
    assert names == [f"img_{i:04d}.png" for i in range(6)] + [f"nested/n_{i:04d}.png" for i in range(4)]
    report = evaluate_fid(tmp_path / "a", str(tmp_path / "a"), "domain", Dist(), bootstrap_rounds=0)
    assert abs(report["fid"]) < 1e-3 and report["reference"]["count"] == 10 and report["samples"]["size"] == [28, 28]


def test_jpeg_is_read(tmp_path, fashion_test_images):
    from PIL import Image

    (tmp_path / "j").mkdir()
    for i, image in enumerate(fashion_test_images[:3]):
        Image.fromarray(image).save(tmp_path / "j" / f"{i}.JPG", quality=95)
    image_set = open_image_set(tmp_path / "j")
    assert image_set.count == 3 and image_set.load(0, 3).shape == (3, 3, 28, 28)


def _bad_inputs(tmp_path, fashion_test_images):
    from PIL import Image

    (tmp_path / "empty").mkdir()
    write_pngs(tmp_path / "mixed", fashion_test_images[:3])
    Image.fromarray(np.zeros((30, 28), np.uint8)).save(tmp_path / "mixed" / "odd.png")
    write_pngs(tmp_path / "garbage", fashion_test_images[:3])
    (tmp_path / "garbage" / "broken.png").write_bytes(b"\x89PNG not really")
    write_pngs(tmp_path / "truncated", fashion_test_images[:3])
    whole = (tmp_path / "truncated" / "img_0001.png").read_bytes()
    (tmp_path / "truncated" / "img_0001.png").write_bytes(whole[: len(whole) // 2])
    write_pngs(tmp_path / "single", fashion_test_images[:1])
    write_pngs(tmp_path / "ok", fashion_test_images[:4])
    write_pngs(tmp_path / "wide", np.zeros((3, 28, 40), np.uint8))
    np.savez(tmp_path / "nokey.npz", pixels=np.zeros((3, 8, 8), np.uint8))
    np.savez(tmp_path / "float.npz", np.zeros((3, 8, 8), np.float32))
    np.savez(tmp_path / "chw.npz", np.zeros((3, 3, 8, 8), np.uint8))
    (tmp_path / "x.txt").write_text("hi")


@pytest.mark.parametrize("samples, extra, match", [
    ("empty", [], "holds no images"),
    ("mixed", [], "mixes image sizes: most are 28x28 (HxW) but 1 differ: odd.png (30x28)"),
    ("garbage", [], "cannot read image"),
    ("truncated", [], "cannot decode image"),
    ("single", [], "holds 1 image; FID needs at least 2"),
    ("ok", ["--features", "clip"], "unknown --features 'clip'; choose from inception, domain"),
    ("missing", [], "not found"),
    ("ok", ["--reference", "nowhere"], "--reference nowhere not found"),
    ("wide", [], "must be square"),
    ("nokey.npz", [], "has no array named arr_0 or images (it holds: pixels)"),
    ("float.npz", [], "must be uint8"),
    ("chw.npz", [], "[N, H, W, C] with C = 1 or 3"),
    ("x.txt", [], "neither a folder nor an .npz"),
    ("ok", ["--bootstrap-rounds", "-1"], "--bootstrap-rounds must be >= 0"),
])
def test_bad_input_is_one_line(tmp_path, capsys, fashion_test_images, samples, extra, match):
    _bad_inputs(tmp_path, fashion_test_images)
    assert main(["eval", "fid", "--samples", str(tmp_path / samples), "--features", "domain", *extra]) == 2
    line = one_line_error(capsys, match)
    if samples == "truncated":
        assert "img_0001.png" in line


def test_bootstrap_std_is_shared_with_the_benchmarks():
    import mmaccel.bench.image_fid as image_fid
    import mmaccel.bench.image_suite as image_suite

    assert not hasattr(image_suite, "_bootstrap_std") and "bootstrap_std" in image_fid.run_image_fid.__code__.co_names
    feats = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    ref = feature_stats(torch.randn(50, 4, generator=torch.Generator().manual_seed(1)))
    assert bootstrap_std(feats, ref, rounds=0) == 0.0
    assert bootstrap_std(feats, ref, rounds=5) == bootstrap_std(feats, ref, rounds=5) > 0
    with pytest.raises(InputError, match="rounds"):
        bootstrap_std(feats, ref, rounds=-2)
