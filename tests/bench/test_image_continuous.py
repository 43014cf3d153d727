"""`mmaccel bench image-continuous`: the published JSON shape and the pass counts of each row."""

import pytest
import torch

from mmaccel.bench.harness import MethodSpec, run_suite, validate_document
from mmaccel.bench.image_continuous import build_image_continuous_suite, cspd_grid
from mmaccel.errors import InputError
from mmaccel.image.continuous_pipeline import ContinuousPipeline
from tests.image.test_continuous_pipeline import write_tiny_models

METHODS = [MethodSpec("ar"), MethodSpec("mar", label="mar-4"), MethodSpec("ar-draft"),
           MethodSpec("cspd", {"num_draft": 4})]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    return ContinuousPipeline.from_pretrained(write_tiny_models(tmp_path_factory.mktemp("mar")))


def test_quick_suite_writes_valid_rows(pipe, monkeypatch):
    import mmaccel.image.continuous_pipeline as cp
    import mmaccel.metrics.domain as domain
    import mmaccel.metrics.fid as fid

    def features(images, extractor="domain", **kwargs):       # stand-ins for the slow extractors
        return images.flatten(1)[:, :4].double() + images.mean((1, 2, 3))[:, None].double()

    monkeypatch.setattr(fid, "extract_features", features)
    monkeypatch.setattr(fid, "reference_stats", lambda *a, **k: (torch.zeros(4).double(), torch.eye(4).double()))
    monkeypatch.setattr(domain, "classify", lambda pixels: torch.zeros(len(pixels), dtype=torch.long))
    monkeypatch.setitem(cp.CONTINUOUS_SAMPLING, "diffusion_steps", 3)
    suite = build_image_continuous_suite(quick=True, methods=METHODS, pipeline=pipe, log=lambda m: None)
    doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    rows = {(r["method"], r["batch"]): r for r in doc["results"]}
    for b in (1, 8):
        images = 2 if b == 1 else 8
        ar, mar, cspd = rows[("ar", b)], rows[("mar-4", b)], rows[("cspd", b)]
        assert ar["lossless"] and not mar["lossless"] and not cspd["lossless"]
        assert ar["nfe"] == 16 * images // b and mar["nfe_ratio"] == 4.0
        assert cspd["nfe_ratio"] == round(16 / 7, 4) and cspd["draft_passes"] == 13 * images // b
        assert rows[("ar-draft", b)]["nfe"] == 0
        assert "fid_domain" in ar["quality"]
    assert doc["config"]["sampling"]["diffusion_steps"] == 3


def test_unknown_methods_and_a_wrong_baseline_are_refused(pipe):
    with pytest.raises(InputError, match="unknown continuous-token method"):
        build_image_continuous_suite(quick=True, methods=[MethodSpec("ar"), MethodSpec("sjd")], pipeline=pipe)
    with pytest.raises(InputError, match="first method"):
        build_image_continuous_suite(quick=True, methods=[MethodSpec("cspd")], pipeline=pipe)


def test_the_cspd_sweep_covers_mar_and_the_draft_at_every_schedule():
    grid = cspd_grid([4, 16], [42.0], [0.05], [None, 16, 4])
    assert grid[:4] == [{"method": "ar"}, {"method": "mar"}, {"method": "mar", "num_iter": 8}, {"method": "ar-draft"}]
    assert {"method": "mar", "num_iter": 4} in grid and {"method": "mar", "num_iter": 16} not in grid
    assert [g for g in grid if g["method"] == "ar-draft"][1:] == [{"method": "ar-draft", "num_iter": 16},
                                                                 {"method": "ar-draft", "num_iter": 4}]
    cspd = [g for g in grid if g["method"] == "cspd"]
    assert len(cspd) == 6 and cspd[0] == {"method": "cspd", "num_draft": 4, "inner_temperature": 42.0,
                                          "prefill_ratio": 0.05}
    assert cspd[-1] == {"method": "cspd", "num_iter": 4, "num_draft": 16, "inner_temperature": 42.0,
                        "prefill_ratio": 0.05}
