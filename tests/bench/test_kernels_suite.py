"""`mmaccel bench kernels`: every kernel family timed per shape on tiny quick shapes, compile failures
recorded rather than raised, the JSON / Markdown outputs and their benchmark page."""

import json

import pytest
import torch

from mmaccel.bench import kernels_suite
from mmaccel.bench.report import suite_pages
from mmaccel.cli import main

KERNELS = ["speculative", "pooled", "grouped", "grouped-coupled", "tree-sampled", "tree-greedy", "tree-mask"]


def _quick_without_compile(monkeypatch):
    real = kernels_suite.run_kernels
    monkeypatch.setattr(kernels_suite, "run_kernels", lambda *args, **kw: real(*args, **{**kw, "compile": False}))


def test_quick_cli_writes_every_kernel(tmp_path, monkeypatch, capsys):
    _quick_without_compile(monkeypatch)
    out = tmp_path / "kernels.json"
    assert main(["bench", "kernels", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["suite"] == "kernels" and doc["command"] == "mmaccel bench kernels --quick --device cpu"
    assert doc["config"]["quick"] is True and doc["torch"] == torch.__version__ and doc["triton"]
    assert [r["kernel"] for r in doc["results"]] == KERNELS
    for r in doc["results"]:
        assert r["reference_us"] > 0 and r["rounds_us"] == {"reference": [r["reference_us"]]}     # one round
        assert r["compiled_us"] is None and r["compiled_note"] == "not run (compile=False)"
        assert r["triton_us"] is None and r["triton_note"].startswith("n/a")      # CPU tensors: no kernel runs
    md = out.with_suffix(".md").read_text()
    assert "| tree-mask | B=2, N=7 |" in md and "n/a: " in md
    assert "## `mmaccel bench kernels --quick --device cpu`" in suite_pages(tmp_path)["kernels.md"]


def test_compile_failures_are_recorded(monkeypatch):
    def broken_compile(fn):
        def call(*args):
            raise RuntimeError("inductor could not lower this\nsecond line")
        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(kernels_suite, "QUICK_TREES", [])
    monkeypatch.setattr(kernels_suite, "QUICK_MASKS", [])
    doc = kernels_suite.run_kernels("cpu", quick=True, log=lambda m: None)
    assert [r["kernel"] for r in doc["results"]] == KERNELS[:4]
    for r in doc["results"]:
        assert r["compiled_us"] is None and r["compiled_note"] == "RuntimeError: inductor could not lower this"
        assert r["reference_us"] > 0
    assert "RuntimeError: inductor could not lower this | –" in kernels_suite.markdown(doc)


def test_grouped_shapes_beyond_the_distance_matrix_are_marked(monkeypatch):
    monkeypatch.setattr(kernels_suite, "QUICK_CHAIN", [(1, 2, 96)])
    monkeypatch.setattr(kernels_suite, "MAX_DISTANCE_VOCAB", 64)
    monkeypatch.setattr(kernels_suite, "QUICK_TREES", [])
    monkeypatch.setattr(kernels_suite, "QUICK_MASKS", [])
    doc = kernels_suite.run_kernels("cpu", quick=True, compile=False, log=lambda m: None)
    grouped = [r for r in doc["results"] if r["kernel"].startswith("grouped")]
    assert len(grouped) == 2 and all(r["reference_us"] is None and "GiB" in r["compiled_note"] for r in grouped)


def test_bad_options_are_refused(capsys):
    assert main(["bench", "kernels", "--samples", "3"]) == 2
    assert "kernels takes --quick, --device and --out, not --samples" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_with_compile_matches_the_reference():
    doc = kernels_suite.run_kernels("cpu", quick=True, log=lambda m: None)
    for r in doc["results"]:
        assert r["compiled_note"] is None and r["compiled_us"] > 0 and r["compiled_matches"] is True, r
