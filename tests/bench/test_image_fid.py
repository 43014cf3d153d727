"""`bench image-fid`: Inception FID of cached quality samples, its table and its benchmark page."""

import json

import pytest
import torch

from mmaccel.bench import image_fid
from mmaccel.bench.harness import MethodSpec
from mmaccel.bench.report import suite_pages
from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.metrics import fid


def test_scores_each_method_against_one_reference(monkeypatch, tmp_path):
    calls = []

    def fake_features(pipe, spec, count, log=print, sampling=None):
        calls.append((spec.key, count))
        g = torch.Generator().manual_seed(len(calls))
        return torch.randn(count, 8, generator=g) + (0.5 if spec.key != "ar" else 0.0)

    def fake_reference(split, limit, extractor):
        assert (split, limit, extractor) == ("test", None, "inception")     # the whole split from 5000 samples on
        x = torch.randn(4000, 8, generator=torch.Generator().manual_seed(0))
        return x.mean(0).double(), torch.cov(x.T).double()

    monkeypatch.setattr(image_fid, "quality_inception_features", fake_features)
    monkeypatch.setattr(fid, "reference_stats", fake_reference)
    doc = image_fid.run_image_fid([MethodSpec("ar"), MethodSpec("sjd-coupled", {"window": 16})], samples=5008,
                                  log=lambda m: None)
    assert calls == [("ar", 5008), ("sjd-coupled", 5008)]
    ar, sjd = doc["results"]
    assert ar["fid_ratio"] == 1.0 and sjd["fid"] > ar["fid"] and sjd["lossless"] and sjd["samples"] == 5008
    doc["command"] = "mmaccel bench image-fid --samples 5008"
    (tmp_path / "image_fid.json").write_text(json.dumps(doc))
    text = suite_pages(tmp_path)["image-fid.md"]
    assert "## `mmaccel bench image-fid --samples 5008`" in text and "| sjd-coupled | window=16 |" in text


def test_bad_options_are_refused(capsys):
    assert main(["bench", "image-fid", "--inception-samples", "10"]) == 2
    assert "image-fid takes --samples" in capsys.readouterr().err
    assert main(["bench", "image-fid", "--samples", "1"]) == 2
    with pytest.raises(InputError, match="the first method must be the AR baseline"):
        image_fid.run_image_fid([MethodSpec("sjd")], samples=10)


def test_scores_the_next_scale_samples_with_their_recipe(monkeypatch):
    from mmaccel.image.scale_pipeline import SCALE_SAMPLING, ScalePipeline

    seen = []

    def fake_features(pipe, spec, count, log=print, sampling=None):
        seen.append((type(pipe).__name__, spec.key, sampling))
        return torch.randn(count, 8, generator=torch.Generator().manual_seed(len(seen)))

    monkeypatch.setattr(image_fid, "quality_inception_features", fake_features)
    monkeypatch.setattr(fid, "reference_stats", lambda *a, **k: (torch.zeros(8).double(), torch.eye(8).double()))
    doc = image_fid.run_image_fid([MethodSpec("ar"), MethodSpec("code", {"draft_steps": 6}, label="code-n6")],
                                  samples=100, log=lambda m: None, model="builtin:fashion-mnist-var")
    assert seen == [(ScalePipeline.__name__, "ar", SCALE_SAMPLING), (ScalePipeline.__name__, "code-n6", SCALE_SAMPLING)]
    assert [r["lossless"] for r in doc["results"]] == [True, False] and doc["config"]["sampling"] == SCALE_SAMPLING
    with pytest.raises(Exception, match="image-fid scores"):
        image_fid.run_image_fid([MethodSpec("ar")], samples=10, model="builtin:imagenet")
