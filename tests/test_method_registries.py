"""Conformance generated from the registries: every method of every plug-in family builds from its defaults,
refuses an unknown parameter and an out-of-range value in one line that names what is valid, and declares its
exactness (a relaxed one names its budget parameter), typed needs and the paper it follows. A new method gets these cases by its
registry line alone."""

from dataclasses import fields

import pytest

from mmaccel.core.methods import Method, build_method
from mmaccel.core.plugin import EXACT, EXACTNESS, NEEDS
from mmaccel.errors import InputError
from mmaccel.registries import FAMILIES, method_registry

PLUGINS = [(family, name) for family in FAMILIES for name in method_registry(family)]


@pytest.mark.parametrize("family, name", PLUGINS)
def test_builds_from_defaults_and_declares_itself(family, name):
    plugin = method_registry(family)[name]
    method = build_method(name, method_registry(family))
    assert isinstance(method, Method) and method.name == name
    assert plugin.exactness in EXACTNESS and set(plugin.needs) <= set(NEEDS) and plugin.summary
    assert plugin.paper or name in ("ar", "greedy"), f"{name} names no paper (the docs' methods reference shows it)"
    assert (plugin.budget is not None) == (plugin.exactness == "relaxed")
    if plugin.exactness in EXACT:
        assert method.lossless, f"{name} is declared exact but its default Method says it is not lossless"
    if plugin.exactness == "another-model":
        assert not method.lossless and plugin.exact_when is None, f"{name} runs another model: it is never lossless"
    for row in plugin.parameters():
        assert row["help"] and row["type"] in ("bool", "int", "float", "str")


@pytest.mark.parametrize("family, name", PLUGINS)
def test_refuses_unknown_parameters_in_one_line(family, name):
    plugin = method_registry(family)[name]
    with pytest.raises(InputError) as err:
        build_method(name, method_registry(family), warp_factor=9)
    message = str(err.value)
    assert "\n" not in message and "warp_factor" in message
    assert all(f.name in message for f in fields(plugin.params))


@pytest.mark.parametrize("family, name", PLUGINS)
def test_refuses_out_of_range_values_in_one_line(family, name):
    plugin = method_registry(family)[name]
    for f in fields(plugin.params):
        info, default = f.metadata["param"], f.default
        if isinstance(default, bool):
            bad = ["maybe"]
        elif isinstance(default, (int, float)):
            bad = [info.high + 1, info.low - 1, "many"]
        else:
            bad = ["no-such-choice"] if info.choices else []
        for value in bad:
            with pytest.raises(InputError) as err:
                build_method(name, method_registry(family), **{f.name: value})
            message = str(err.value)
            assert "\n" not in message and (f.name in message or (info.what is not None and info.what in message))


def test_one_function_reaches_every_family():
    assert set(FAMILIES) == {"text", "image", "image-scale", "image-continuous", "speech", "ctc", "whisfusion", "video"}
    with pytest.raises(InputError, match="unknown pipeline family 'audio'; choose from text, image, image-scale, "
                                         "image-continuous, speech"):
        method_registry("audio")


def test_each_pipeline_offers_its_family_registry():
    """`Pipeline.methods()` is the registry its family is listed under, so what a pipeline runs is what the CLI,
    the app and these cases read."""
    from mmaccel.speech.ctc.pipeline import CTCPipeline
    from mmaccel.speech.pipeline import ASRPipeline
    from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline
    from mmaccel.video.stream import VideoStreamPipeline

    for family, pipeline in (("speech", ASRPipeline), ("ctc", CTCPipeline), ("whisfusion", WhisfusionPipeline),
                             ("video", VideoStreamPipeline)):
        assert pipeline.methods() is method_registry(family), family
