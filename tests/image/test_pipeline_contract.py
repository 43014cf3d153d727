"""One contract for the three image pipelines: `generate(class_labels, method, *, <sampling>, seed=0, **params)`
with the method's parameters checked by its plug-in, `methods()` returning the family's registry, outputs with
the same core fields and `from_pretrained(..., device=, dtype=)`."""

import inspect
from dataclasses import fields

import pytest

from mmaccel.image.continuous_pipeline import ContinuousOutput, ContinuousPipeline
from mmaccel.image.pipeline import ImageOutput, ImagePipeline
from mmaccel.image.scale_pipeline import ScaleOutput, ScalePipeline
from mmaccel.registries import method_registry

PIPELINES = [(ImagePipeline, ImageOutput, "image"), (ScalePipeline, ScaleOutput, "image-scale"),
             (ContinuousPipeline, ContinuousOutput, "image-continuous")]


@pytest.mark.parametrize("pipeline, output, family", PIPELINES)
def test_one_generate_signature_registry_and_output(pipeline, output, family):
    params = inspect.signature(pipeline.generate).parameters
    assert list(params)[:3] == ["self", "class_labels", "method"] and params["method"].default == "ar"
    assert params["seed"].kind is inspect.Parameter.KEYWORD_ONLY and params["seed"].default == 0
    assert list(params)[-1] == "params" and params["params"].kind is inspect.Parameter.VAR_KEYWORD
    assert pipeline.methods() is method_registry(family)
    assert issubclass(output, ImageOutput)
    assert [f.name for f in fields(output)][:4] == ["images", "tokens", "labels", "stats"]
    loading = inspect.signature(pipeline.from_pretrained).parameters
    assert {"device", "dtype"} <= set(loading)
