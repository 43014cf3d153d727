"""Acceptance: `mmaccel bench core --quick` on the real SmolLM2 writes the published JSON shape,
and every greedy lossless method reproduced the AR output inside the run."""

import json

import pytest

from mmaccel.bench.harness import validate_document
from mmaccel.cli import main


def test_bench_core_quick_writes_valid_json(tmp_path):
    """The CLI path on the real SmolLM2 with its distilled draft (speculative, k = 4): the draft's tokens
    reproduce AR's. Every default method: test_bench_core_quick_runs_every_default_method (slow); each
    method's exactness on a tiny LM: tests/lm/test_pipeline.py."""
    out = tmp_path / "core.json"
    assert main(["bench", "core", "--quick", "--methods", "speculative:k=4", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_document(doc)
    assert doc["suite"] == "core" and doc["baseline"] == "ar" and doc["config"]["quick"] is True
    assert doc["command"] == "mmaccel bench core --quick --methods speculative:k=4"
    assert {r["method"] for r in doc["results"]} == {"ar", "speculative:k=4"}
    for r in doc["results"]:
        assert r["lossless"] is True and r["quality"]["identical_to_ar"] == 1.0, r
        assert r["nfe"] > 0 and r["latency_s"] > 0 and r["peak_mem_mb"] > 0
    assert doc["results"][1]["nfe"] < doc["results"][0]["nfe"]        # the draft's tokens were accepted
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()


@pytest.mark.slow
def test_bench_core_quick_runs_every_default_method(tmp_path):
    """`mmaccel bench core --quick` as the README quotes it: every default method on SmolLM2. The default suite
    covers the same CLI path and model with one method (test_bench_core_quick_writes_valid_json), and each
    method's exactness on a tiny LM (tests/lm/test_pipeline.py)."""
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
