"""Every pipeline family's method registry, through one function (the CLI's `mmaccel methods`, the app and the
conformance tests read them here). Families whose methods are not plug-ins yet (next-scale, continuous-token,
CTC, Whisfusion, video) keep their own dispatch for now."""

from __future__ import annotations

import importlib

from mmaccel.core.plugin import MethodPlugin
from mmaccel.errors import check

# family -> (module, registry name, the command that runs it)
FAMILIES = {"text": ("mmaccel.core.methods", "REGISTRY", "mmaccel generate"),
            "image": ("mmaccel.image.methods", "IMAGE_REGISTRY", "mmaccel image generate"),
            "speech": ("mmaccel.speech.methods", "ASR_REGISTRY", "mmaccel asr transcribe")}


def method_registry(family: str) -> dict[str, MethodPlugin]:
    """The registry of pipeline family `family` (see FAMILIES): method name -> plug-in."""
    check(family in FAMILIES, f"unknown pipeline family {family!r}; choose from {', '.join(FAMILIES)}")
    module, name, _ = FAMILIES[family]
    return getattr(importlib.import_module(module), name)
