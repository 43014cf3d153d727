"""`mmaccel bench image-scale`: the published JSON shape, CoDe rows with fewer large-model passes and
less KV cache, the memory table."""

import pytest
import torch

from mmaccel.bench.harness import MethodSpec, run_suite, validate_document
from mmaccel.bench.image_scale import build_image_scale_suite, extra_markdown
from mmaccel.errors import InputError
from mmaccel.image.models.var import save_var
from mmaccel.image.scale_pipeline import ScalePipeline
from mmaccel.image.tokenizers.msvq import save_msvq
from tests.image.test_msvq import tiny_model
from tests.image.test_var import tiny_var

METHODS = [MethodSpec("ar"), MethodSpec("ar-small"), MethodSpec("code", {"draft_steps": 2}, label="code-n2")]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("var")
    save_msvq(tiny_model(), path / "vq.safetensors")
    save_var(tiny_var(0, num_classes=10), path / "var.safetensors")
    save_var(tiny_var(1, num_classes=10, depth=1, embed_dim=16, num_heads=2), path / "refiner.safetensors")
    return ScalePipeline.from_pretrained(path)


def test_quick_suite_writes_valid_rows_with_memory(pipe, monkeypatch):
    import mmaccel.bench.image_suite as image_suite
    import mmaccel.metrics.domain as domain
    import mmaccel.metrics.fid as fid

    # the tiny tokenizer makes 16x16 images: score them with stand-ins for the 64x64 extractors
    def features(images, extractor="domain", **kwargs):
        return images.flatten(1)[:, :4].double() + images.mean((1, 2, 3))[:, None].double()

    monkeypatch.setattr(fid, "extract_features", features)
    monkeypatch.setattr(fid, "reference_stats", lambda *a, **k: (torch.zeros(4).double(), torch.eye(4).double()))
    monkeypatch.setattr(domain, "classify", lambda pixels: torch.zeros(len(pixels), dtype=torch.long))
    suite = build_image_scale_suite(quick=True, methods=METHODS, pipeline=pipe, log=lambda m: None)
    doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    rows = {(r["method"], r["batch"]): r for r in doc["results"]}
    for b in (1, 8):
        ar, code, small = rows[("ar", b)], rows[("code-n2", b)], rows[("ar-small", b)]
        assert ar["lossless"] and not code["lossless"] and not small["lossless"]
        assert ar["nfe"] == 4 * (2 if b == 1 else 1) and code["nfe_ratio"] == 2.0
        assert code["cache_mb"] < ar["cache_mb"] and code["weights_mb"] > ar["weights_mb"]
        assert ar["model_mem_ratio"] == 1.0 and small["model_mem_ratio"] < 1.0
        assert "fid_domain" in ar["quality"]
    table = extra_markdown(doc)
    assert table.count("\n") == 2 + len(doc["results"]) and "| code-n2 | 8 |" in table
    assert image_suite.SAMPLING["cfg_scale"] == 2.0                     # the LlamaGen suite's recipe is untouched


def test_unknown_methods_and_a_wrong_baseline_are_refused(pipe):
    with pytest.raises(InputError, match="unknown next-scale method"):
        build_image_scale_suite(quick=True, methods=[MethodSpec("ar"), MethodSpec("sjd")], pipeline=pipe)
    with pytest.raises(InputError, match="first method"):
        build_image_scale_suite(quick=True, methods=[MethodSpec("code", {"draft_steps": 2})], pipeline=pipe)


def test_the_refiner_guidance_sweep_runs_ar_and_each_setting(pipe, monkeypatch, tmp_path):
    import json

    import mmaccel.bench.image_suite as image_suite
    from mmaccel.bench import image_scale

    seen = []

    def fake_tune(pipeline, grid, method, samples, reference_images, seed, tag, extractor):
        seen.extend(grid)
        used.append((reference_images, extractor))
        return [{"fid_domain_dev": 1.0, **g} for g in grid]

    used = []

    monkeypatch.setattr(image_suite, "tune_recipes", fake_tune)
    monkeypatch.setattr(ScalePipeline, "from_pretrained", staticmethod(lambda name: pipe))
    out = tmp_path / "code.json"
    assert image_scale.main(["--tune", "--refiner-cfg", "1", "2", "--draft-steps", "2", "--specialised",
                             "--out", str(out)]) == 0
    assert [g["method"] for g in seen] == ["ar", "code", "code"]
    assert [g.get("refiner_cfg") for g in seen[1:]] == [1.0, 2.0]
    assert all(g["training_free"] is False and g["draft_steps"] == 2 for g in seen[1:])
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m mmaccel.bench.image_scale --tune") and len(doc["rows"]) == 3
    seen.clear()
    assert image_scale.main(["--tune", "--refiner-cfg", "3", "--refiner-temperature", "1", "0.8", "--draft-steps", "2",
                             "--specialised", "--extractor", "inception", "--reference-images", "2000"]) == 0
    assert [(g.get("refiner_cfg"), g.get("refiner_temperature")) for g in seen[1:]] == [(3.0, 1.0), (3.0, 0.8)]
    assert used == [(10_000, "domain"), (2000, "inception")]
