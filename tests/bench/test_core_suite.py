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


def test_bench_core_runs_on_a_cuda_device_with_graphs(tiny_lm_dir):
    """`mmaccel bench core --device cuda --cuda-graphs` end to end on the emulated device of
    tests/emulated_cuda.py (a tiny Llama in place of SmolLM2 keeps it quick): lossless rows stay identical."""
    from mmaccel.bench.core_suite import build_core_suite
    from mmaccel.bench.harness import MethodSpec, run_suite
    from mmaccel.lm.pipeline import TextPipeline
    from tests.emulated_cuda import emulated_cuda

    with emulated_cuda() as report:
        pipe = TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir), device="cuda", cuda_graphs=True)
        suite = build_core_suite(quick=True, pipeline=pipe,
                                 methods=[MethodSpec("ar"), MethodSpec("speculative", {"k": 2}), MethodSpec("sjd")])
        doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    assert report.replays > 0
    assert all(r["lossless"] and r["quality"]["identical_to_ar"] == 1.0 for r in doc["results"]), doc["results"]
