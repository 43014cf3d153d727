"""Acceptance: `mmaccel bench image --quick` on the built-in Fashion-MNIST GPT writes the published
JSON shape with quality numbers for every method; the full run's quality samples are cached and resume."""

import json

import pytest
import torch

from mmaccel.bench.harness import MethodSpec, validate_document
from mmaccel.bench.image_suite import DEFAULT_METHODS, QUALITY_BATCH, quality_inception_features, quality_samples
from mmaccel.cli import main
from mmaccel.image.methods import build_image_method
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT
from mmaccel.image.pipeline import ImagePipeline
from mmaccel.image.tokenizers.vq import VQConfig, VQModel


def test_bench_image_quick_writes_valid_json(tmp_path):
    """The CLI path on the built-in model with a relaxed method (LANTERN: its budget is reported beside AR's exact
    rows). Every default method: test_bench_image_quick_runs_every_default_method (slow); an exact method's rows
    in a suite: tests/bench/test_core_suite.py."""
    for spec in DEFAULT_METHODS:                                        # the default list still builds
        build_image_method(spec.name, **spec.params)
    out = tmp_path / "image.json"
    methods = "lantern:k=4:neighbours=10:delta=0.05"
    assert main(["bench", "image", "--quick", "--methods", methods, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_document(doc)
    assert doc["suite"] == "image" and doc["config"]["quick"] is True
    assert doc["command"] == f"mmaccel bench image --quick --methods {methods}"
    rows = {(r["method"].split(":")[0], r["batch"]): r for r in doc["results"]}
    assert set(rows) == {(m, b) for m in ("ar", "lantern") for b in (1, 8)}
    for r in doc["results"]:
        q = r["quality"]
        assert r["nfe"] > 0 and r["latency_s"] > 0 and r["peak_mem_mb"] > 0
        assert q["samples"] in (2, 8) and 0 <= q["class_acc"] <= 1 and q["fid_domain"] >= 0
    for b in (1, 8):
        assert rows["ar", b]["tv_per_output"] == 0.0 and rows["ar", b]["lossless"]
        assert rows["lantern", b]["tv_per_output"] > 0 and not rows["lantern", b]["lossless"]   # its budget is reported
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()
    assert (tmp_path / "image_samples.png").stat().st_size > 0          # one row of samples per method


@pytest.mark.slow
def test_bench_image_quick_runs_every_default_method(tmp_path):
    """`mmaccel bench image --quick` as the README quotes it: every default method. The default suite covers
    the same CLI path with one relaxed method (test_bench_image_quick_writes_valid_json) and each
    method's own rules in tests/image."""
    out = tmp_path / "image.json"
    assert main(["bench", "image", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_document(doc)
    specs = {spec.key: spec for spec in DEFAULT_METHODS}
    assert doc["suite"] == "image" and doc["config"]["quick"] is True
    assert doc["command"] == "mmaccel bench image --quick"                  # what the README quotes
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
    assert rows[("zipar-s8", 8)]["nfe_ratio"] > 1.75                     # 256 passes -> 2 * 16 + 14 * 8 = 144
    relaxed = [r for r in doc["results"] if r["method"] in ("lantern", "gsd", "gsd-coupled")]
    assert all(r["tv_per_output"] > 0 for r in relaxed)                # the budget they spent is reported
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()
    assert (tmp_path / "image_samples.png").stat().st_size > 0          # one row of samples per method


def _tiny_pipe(seed: int = 0) -> ImagePipeline:
    torch.manual_seed(seed)
    vq = VQModel(VQConfig(codebook_size=32, codebook_embed_dim=8, ch=16, ch_mult=(1, 2, 2), num_res_blocks=1,
                          z_channels=16, norm_groups=8))
    gpt = LlamaGenGPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=32, num_classes=10, block_size=16,
                                multiple_of=32))
    return ImagePipeline(gpt, vq)


def test_quality_samples_are_cached_per_chunk_and_resume(tmp_path, monkeypatch):
    pipe = _tiny_pipe()
    spec = MethodSpec("sjd-coupled", {"window": 2})
    n = QUALITY_BATCH + 6                                                 # two chunks, the second cut
    first = quality_samples(pipe, spec, n, cache_dir=tmp_path, log=lambda m: None)
    assert len(first) == n and [label for label, _ in first] == [i % 10 for i in range(n)]
    folders = list(tmp_path.iterdir())
    assert len(folders) == 1 and sorted(p.name for p in folders[0].glob("chunk_*.pt")) == ["chunk_00000.pt",
                                                                                          "chunk_00001.pt"]
    (folders[0] / "chunk_00001.pt").unlink()                             # an interrupted run: the last chunk is missing
    made = []
    again = quality_samples(pipe, spec, n, cache_dir=tmp_path, log=made.append)
    assert len(made) == 1 and "chunk 2/2" in made[0]                     # only the missing chunk is generated
    assert all(torch.equal(a[1], b[1]) for a, b in zip(first, again))   # seeded: the same samples
    monkeypatch.setattr(pipe, "generate", lambda *a, **k: pytest.fail("a cached chunk was generated again"))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(first, quality_samples(pipe, spec, n, cache_dir=tmp_path)))
    # other parameters or other weights never reuse these samples
    quality_samples(_tiny_pipe(), MethodSpec("sjd-coupled", {"window": 3}), 2, cache_dir=tmp_path, log=lambda m: None)
    quality_samples(_tiny_pipe(seed=1), spec, 2, cache_dir=tmp_path, log=lambda m: None)
    assert len(list(tmp_path.iterdir())) == 3


def test_inception_features_are_cached_per_chunk(tmp_path, monkeypatch):
    import mmaccel.metrics.fid as fid

    calls = []

    def fake_features(images, extractor="inception", batch_size=None):   # the real extractor takes minutes
        calls.append(len(images))
        return images.float().mean(dim=(1, 2, 3))[:, None].expand(-1, 2048).clone()

    monkeypatch.setattr(fid, "extract_features", fake_features)
    pipe, spec = _tiny_pipe(), MethodSpec("ar")
    n = QUALITY_BATCH + 6
    feats = quality_inception_features(pipe, spec, n, cache_dir=tmp_path, log=lambda m: None)
    tokens = torch.stack([t for _, t in quality_samples(pipe, spec, n, cache_dir=tmp_path)])
    assert feats.shape == (n, 2048) and calls == [QUALITY_BATCH, QUALITY_BATCH]
    assert torch.allclose(feats, fake_features(pipe.decode_pixels(tokens)), rtol=1e-3)   # stored in fp16
    again = quality_inception_features(pipe, spec, n, cache_dir=tmp_path, log=lambda m: None)
    assert len(calls) == 3 and torch.equal(feats, again)                 # every chunk came from the cache


def test_bench_image_runs_on_a_cuda_device_with_graphs():
    """`mmaccel bench image --device cuda --cuda-graphs` end to end (decode, pixels, quality) on the emulated
    device of tests/emulated_cuda.py: no stray CPU tensor anywhere in the suite (a tiny model keeps it quick)."""
    from mmaccel.bench.harness import run_suite
    from mmaccel.bench.image_suite import build_image_suite
    from tests.emulated_cuda import emulated_cuda

    pipe = _tiny_pipe()
    with emulated_cuda() as report:
        pipe = ImagePipeline(pipe.model.to("cuda"), pipe.vq.to("cuda"))
        pipe.model.cuda_graphs = True
        suite = build_image_suite(quick=True, methods=[MethodSpec("ar"), MethodSpec("sjd-coupled", {"window": 2})],
                                  pipeline=pipe, log=lambda m: None)
        doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    assert report.replays > 0 and {r["batch"] for r in doc["results"]} == {1, 8}
    assert all(r["nfe"] > 0 and 0 <= r["quality"]["class_acc"] <= 1 for r in doc["results"])
