"""ContinuousPipeline: class-conditional generation with continuous tokens (MAR-style) and CSpD.

>>> pipe = ContinuousPipeline.from_pretrained("builtin:fashion-mnist-mar")
>>> out = pipe.generate([0, 7, 9], method="cspd", seed=0)
>>> out.images[0].save("t-shirt.png"); out.stats.nfe, out.stats.draft_passes, out.stats.mean_accepted

The methods ("ar", "mar", "ar-draft", "cspd") and their parameters are
`mmaccel.image.continuous_methods.CONTINUOUS_REGISTRY` (`ContinuousPipeline.methods()`,
`mmaccel methods --pipeline image-continuous`). All methods share `NoiseBank` draws for a seed, so their outputs
differ only where the method does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.core.methods import Method, Resources
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.stats import DecodeStats, track_peak_memory
from mmaccel.devices import check_same_device, resolve_device, resolve_dtype
from mmaccel.errors import ModelNotFoundError, check
from mmaccel.image.continuous_methods import CONTINUOUS_REGISTRY, ContinuousInputs, build_continuous_method
from mmaccel.image.cspd import check_cspd_pair
from mmaccel.image.masked import MaskedSampling
from mmaccel.image.models.mar import MAR, load_mar
from mmaccel.image.pipeline import (
    FASHION_CLASSES,
    ImageOutput,
    check_labels,
    locate_checkpoints,
    to_pil,
    weights_fingerprint,
)
from mmaccel.image.tokenizers.kl import KLTokenizer, load_kl
from mmaccel.paths import assets_dir

BUILTIN_CONTINUOUS = "builtin:fashion-mnist-mar"
_ASSETS = assets_dir()
BUILTIN_CONTINUOUS_FILES = {"model": _ASSETS / "fashion_mar.safetensors",
                            "draft": _ASSETS / "fashion_mar_draft.safetensors",
                            "kl": _ASSETS / "fashion_kl.safetensors"}
CONTINUOUS_METHODS = tuple(CONTINUOUS_REGISTRY)
# The built-in models' sampling recipe (chosen on the development split, see docs/models.md).
CONTINUOUS_SAMPLING = {"cfg": 3.0, "cfg_schedule": "linear", "temperature": 1.0, "diffusion_steps": 10}
OUTPUT_SIZE = 64             # decoded images are resized to the other image pipelines' side (FID references)


@dataclass
class ContinuousOutput(ImageOutput):
    """`tokens` are the continuous tokens [B, L, C]."""


class ContinuousPipeline:
    """A MAR-style target, optionally a smaller draft model (CSpD), and their KL tokenizer."""

    def __init__(self, model: MAR, tokenizer: KLTokenizer, draft: MAR | None = None,
                 class_names: Sequence[str] | None = None):
        check(isinstance(model, MAR), f"model must be a MAR, got {type(model).__name__}")
        check(isinstance(tokenizer, KLTokenizer), f"tokenizer must be a KLTokenizer, got {type(tokenizer).__name__}")
        check(draft is None or isinstance(draft, MAR), f"draft must be a MAR, got {type(draft).__name__}")
        check_same_device([("model", model), ("tokenizer", tokenizer), ("draft", draft)])
        check((model.config.seq_len, model.config.token_dim) == (tokenizer.seq_len, tokenizer.token_dim),
              f"the model reads {model.config.seq_len} tokens of {model.config.token_dim} channels but the tokenizer "
              f"makes {tokenizer.seq_len} of {tokenizer.token_dim}")
        if draft is not None:
            check_cspd_pair(model, draft)
        self.model, self.tokenizer = model.eval(), tokenizer.eval()
        self.draft = None if draft is None else draft.eval()
        self.class_names = tuple(class_names) if class_names is not None else None

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = BUILTIN_CONTINUOUS, *, tokenizer: str | Path | None = None,
                        draft: str | Path | None = "builtin", device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None) -> ContinuousPipeline:
        """`"builtin:fashion-mnist-mar"` (the shipped KL tokenizer, target and draft), a directory holding
        `mar.safetensors`, `kl.safetensors` (and optionally `mar_draft.safetensors`), or a model file with
        `tokenizer=` its KL tokenizer. `draft`: "builtin" (the directory's or built-in one), a path, or None."""
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        builtins = {BUILTIN_CONTINUOUS: {k: BUILTIN_CONTINUOUS_FILES[k] for k in ("model", "kl", "draft")}}
        paths, builtin = locate_checkpoints(str(name_or_path), builtins, {"model": "mar", "kl": "kl", "draft": "mar_draft"},
                                            what="continuous-token model", tokenizer=tokenizer, tokenizer_arg="tokenizer")
        model_path, kl_path, draft_path = paths["model"], paths["kl"], paths["draft"]
        names = FASHION_CLASSES if builtin else None
        if draft is None:
            draft_path = None
        elif draft != "builtin":
            draft_path = Path(draft)
            if not draft_path.exists():
                raise ModelNotFoundError(f"draft checkpoint {draft_path} not found")
        model = load_mar(model_path, dtype=dtype).to(device)
        small = None if draft_path is None else load_mar(draft_path, dtype=dtype).to(device)
        return cls(model, load_kl(kl_path).to(device), small, names)

    def fingerprint(self) -> str:
        """A digest of the weights (cache keys of derived results)."""
        return weights_fingerprint(self.model, self.tokenizer, self.draft)

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The methods `generate` runs: name -> plug-in (`mmaccel methods --pipeline image-continuous`)."""
        return CONTINUOUS_REGISTRY

    def resources(self) -> Resources:
        """What continuous-token methods may use: the target and the draft model (see
        `mmaccel.image.continuous_methods`)."""
        return Resources(model=self.model, draft=self.draft)

    def generate(self, class_labels: Any, method: str | Method = "ar", *, num_iter: int | None = None,
                 cfg: float = CONTINUOUS_SAMPLING["cfg"], cfg_schedule: str = CONTINUOUS_SAMPLING["cfg_schedule"],
                 temperature: float = CONTINUOUS_SAMPLING["temperature"],
                 diffusion_steps: int = CONTINUOUS_SAMPLING["diffusion_steps"], seed: int = 0,
                 **params: Any) -> ContinuousOutput:
        """One image per class label, drawn by `method` (a name from `methods()` or a Method) with its `params`
        ("mar": `tokens_per_step`; "cspd": `num_draft`, `prefill_ratio`, `inner_temperature`; one given as None
        takes its default). `num_iter`: generation steps (default: the method's own, one token a step, or
        L / tokens_per_step for "mar"); `cfg` >= 1 with MAR's "linear" or a "constant" schedule; `temperature`
        scales the diffusion noise; `diffusion_steps` per token."""
        spec = build_continuous_method(method, **params)
        labels = check_labels(class_labels, self.model.config.num_classes, self.class_names)
        check(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be an int, got {seed!r}")
        resources = self.resources()
        spec.check_needs(resources)
        check(spec.runner is not None, f"method {spec.name!r} is not a continuous-token method (it has no runner)")
        sampling = MaskedSampling(num_iter=num_iter, cfg=cfg, cfg_schedule=cfg_schedule, temperature=temperature,
                                  diffusion_steps=diffusion_steps)
        device = self.model.token_proj.weight.device
        inputs = ContinuousInputs(torch.tensor(labels, device=device), sampling,
                                  torch.Generator(device=device).manual_seed(seed), DecodeStats())
        stats = inputs.stats
        with track_peak_memory(stats, device), stats.timed("total"):
            tokens = spec.runner(resources, inputs)
        return ContinuousOutput(to_pil(self.decode_pixels(tokens)), tokens, labels, stats)

    @torch.inference_mode()
    def decode_pixels(self, tokens: Tensor) -> Tensor:
        """Tokens [B, L, C] -> images [B, 3, 64, 64] in [-1, 1] (the tokenizer's output, resized bilinearly
        to the side the image benchmarks' FID references use)."""
        pixels = self.tokenizer.decode(tokens.to(self.tokenizer.vae.dtype).to(next(self.tokenizer.parameters()).device))
        if pixels.shape[-1] != OUTPUT_SIZE:
            pixels = F.interpolate(pixels, size=(OUTPUT_SIZE, OUTPUT_SIZE), mode="bilinear", align_corners=False)
        return pixels.clamp(-1, 1)
