"""Every pipeline family's method registry, through one function (the CLI's `mmaccel methods`, the app and the
conformance tests read them here)."""

from __future__ import annotations

import importlib

from mmaccel.core.plugin import MethodPlugin
from mmaccel.errors import check

# family -> (module, registry name, the command that runs it: `--method NAME` is added, or NAME fills {name})
FAMILIES = {"text": ("mmaccel.core.methods", "REGISTRY", "mmaccel generate"),
            "image": ("mmaccel.image.methods", "IMAGE_REGISTRY", "mmaccel image generate"),
            "image-scale": ("mmaccel.image.scale_methods", "SCALE_REGISTRY", "mmaccel image generate-scale"),
            "image-continuous": ("mmaccel.image.continuous_methods", "CONTINUOUS_REGISTRY",
                                 "mmaccel image generate-continuous"),
            "speech": ("mmaccel.speech.methods", "ASR_REGISTRY", "mmaccel asr transcribe"),
            "ctc": ("mmaccel.speech.ctc.methods", "CTC_REGISTRY", "mmaccel asr ctc"),
            "whisfusion": ("mmaccel.speech.whisfusion.methods", "WHISFUSION_REGISTRY", "mmaccel asr whisfusion"),
            "video": ("mmaccel.video.methods", "VIDEO_REGISTRY", "VideoStreamPipeline.ask(question, method='{name}')")}


def method_registry(family: str) -> dict[str, MethodPlugin]:
    """The registry of pipeline family `family` (see FAMILIES): method name -> plug-in."""
    check(family in FAMILIES, f"unknown pipeline family {family!r}; choose from {', '.join(FAMILIES)}")
    module, name, _ = FAMILIES[family]
    return getattr(importlib.import_module(module), name)
