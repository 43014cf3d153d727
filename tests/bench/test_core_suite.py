"""Acceptance: `mmaccel bench core --quick` on the real SmolLM2 writes the published JSON shape,
and every greedy lossless method reproduced the AR output inside the run."""

import json

from mmaccel.bench.harness import validate_document
from mmaccel.cli import main


def test_bench_core_quick_writes_valid_json(tmp_path):
    out = tmp_path / "core.json"
    assert main(["bench", "core", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_document(doc)
    assert doc["suite"] == "core" and doc["baseline"] == "ar" and doc["config"]["quick"] is True
    assert {r["method"] for r in doc["results"]} == {"ar", "speculative-k2", "speculative-k4", "tree", "ngram", "jacobi"}
    for r in doc["results"]:
        assert r["lossless"] is True and r["quality"]["identical_to_ar"] == 1.0, r
        assert r["nfe"] > 0 and r["latency_s"] > 0 and r["peak_mem_mb"] > 0
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()
