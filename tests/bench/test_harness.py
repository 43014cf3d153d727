"""Harness: ratios against the in-process baseline, the published JSON shape, lossless checking."""

import json

import pytest

from mmaccel.bench.core_suite import build_core_suite
from mmaccel.bench.harness import MethodSpec, Suite, run_suite, validate_document, write_results
from mmaccel.core.methods import build_method
from mmaccel.errors import InputError
from mmaccel.lm.pipeline import TextPipeline


@pytest.fixture(scope="module")
def pipe(tiny_lm_dir):
    return TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir))


def tiny_suite(pipe, methods, corrupt=None):
    prompts = ["the cat sat", "a dog ran far", "red and blue", "go then stop"]

    def run_batch(spec, inputs, seed):
        out = pipe.generate(inputs, spec.name, max_new_tokens=8, seed=seed, **spec.params)
        tokens = [t[:-1] + [0] if spec.key == corrupt else t for t in out.tokens]
        return tokens, out.stats

    def quality(spec, outputs, baseline):
        return {"identical_to_ar": sum(a == b for a, b in zip(outputs, baseline)) / len(baseline)}

    return Suite("tiny", {"max_new_tokens": 8}, methods, {1: [[p] for p in prompts[:2]], 2: [prompts[:2], prompts[2:]]},
                 run_batch, quality, lambda spec: build_method(spec.name, **spec.params).lossless,
                 warmup=lambda spec: run_batch(spec, prompts[:1], 0))


def test_suite_document_shape_and_ratios(pipe, tmp_path):
    methods = [MethodSpec("ar"), MethodSpec("speculative", {"k": 3}), MethodSpec("ngram", {"k": 2}, label="lookup")]
    doc = run_suite(tiny_suite(pipe, methods), log=lambda m: None)
    validate_document(doc)
    assert [(r["method"], r["batch"]) for r in doc["results"]] == [
        ("ar", 1), ("speculative", 1), ("lookup", 1), ("ar", 2), ("speculative", 2), ("lookup", 2)]
    for r in doc["results"]:
        assert r["lossless"] is True and r["quality"]["identical_to_ar"] == 1.0
        if r["method"] == "ar":
            assert r["nfe_ratio"] == 1.0 and r["speedup"] == 1.0 and r["mean_accepted"] == 1.0
    paths = write_results(doc, tmp_path / "sub" / "tiny.json", "identical_to_ar")
    assert [p.suffix for p in paths] == [".json", ".md", ".png"] and all(p.stat().st_size > 0 for p in paths)
    assert json.loads(paths[0].read_text()) == doc


def test_methods_run_in_an_order_that_rotates_from_batch_to_batch(pipe):
    methods = [MethodSpec("ar"), MethodSpec("speculative", {"k": 3}), MethodSpec("ngram", {"k": 2})]
    suite = tiny_suite(pipe, methods)
    calls, run = [], suite.run_batch

    def recording(spec, inputs, seed):
        calls.append((spec.name, tuple(inputs), seed))
        return run(spec, inputs, seed)

    suite.run_batch, suite.warmup = recording, None
    doc = run_suite(suite, log=lambda m: None)
    names = [name for name, _, _ in calls]
    assert names == ["ar", "speculative", "ngram", "speculative", "ngram", "ar",        # batch size 1
                     "ar", "speculative", "ngram", "speculative", "ngram", "ar"]        # batch size 2
    assert {seed for name, inputs, seed in calls if inputs == ("a dog ran far",)} == {1}    # every method, same seed
    for r in doc["results"]:        # outputs in input order whatever the order the methods ran in
        assert r["quality"]["identical_to_ar"] == 1.0


def test_a_lossless_claim_is_checked_against_the_baseline(pipe):
    methods = [MethodSpec("ar"), MethodSpec("speculative", {"k": 3})]
    doc = run_suite(tiny_suite(pipe, methods, corrupt="speculative"), log=lambda m: None)
    spec_rows = [r for r in doc["results"] if r["method"] == "speculative"]
    assert all(r["lossless"] is False and r["quality"]["identical_to_ar"] < 1 for r in spec_rows)


def test_baseline_must_come_first(pipe):
    with pytest.raises(InputError, match="baseline"):
        run_suite(tiny_suite(pipe, [MethodSpec("ngram")]), log=lambda m: None)


def test_core_suite_rejects_unknown_methods_before_running(pipe):
    with pytest.raises(InputError, match="unknown method"):
        build_core_suite(quick=True, methods=[MethodSpec("ar"), MethodSpec("hyperdrive")], pipeline=pipe)
