"""Acceptance: `mmaccel bench image --quick` on the built-in Fashion-MNIST GPT writes the published
JSON shape with quality numbers for every method."""

import json

from mmaccel.bench.harness import validate_document
from mmaccel.bench.image_suite import DEFAULT_METHODS
from mmaccel.cli import main
from mmaccel.image.methods import build_image_method


def test_bench_image_quick_writes_valid_json(tmp_path):
    out = tmp_path / "image.json"
    assert main(["bench", "image", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_document(doc)
    specs = {spec.key: spec for spec in DEFAULT_METHODS}
    assert doc["suite"] == "image" and doc["config"]["quick"] is True
    assert {r["method"] for r in doc["results"]} == {spec.key for spec in DEFAULT_METHODS}
    assert {r["batch"] for r in doc["results"]} == {1, 8}
    for r in doc["results"]:
        q = r["quality"]
        assert r["nfe"] > 0 and r["latency_s"] > 0 and r["peak_mem_mb"] > 0
        assert q["samples"] in (2, 8) and 0 <= q["class_acc"] <= 1
        if q["samples"] >= 2:
            assert q["fid_domain"] >= 0
        spec = specs[r["method"]]
        if build_image_method(spec.name, **spec.params).lossless:
            assert r["tv_per_output"] == 0.0 and r["lossless"], r
    rows = {(r["method"], r["batch"]): r for r in doc["results"]}
    assert rows[("zipar-s8", 8)]["nfe_ratio"] > 1.8                      # 256 passes -> 1 + 15 + 15 * 8 = 136
    relaxed = [r for r in doc["results"] if r["method"] in ("lantern", "gsd")]
    assert all(r["tv_per_output"] > 0 for r in relaxed)                # the budget they spent is reported
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()
    assert (tmp_path / "image_samples.png").stat().st_size > 0          # one row of samples per method
