"""ScalePipeline: class-conditional next-scale generation (VAR) with plain decoding or CoDe.

>>> pipe = ScalePipeline.from_pretrained("builtin:fashion-mnist-var")
>>> out = pipe.generate([0, 7, 9], method="code", draft_steps=6, seed=0)
>>> out.images[0].save("t-shirt.png"); out.stats.nfe, out.stats.draft_passes, out.stats.cache_mb

The methods ("ar", "ar-small", "code") and their parameters are `mmaccel.image.scale_methods.SCALE_REGISTRY`
(`ScalePipeline.methods()`, `mmaccel methods --pipeline image-scale`). With two independently trained VARs CoDe
is the paper's training-free mode (`training_free=True`, the default); `training_free=False` hands off to a
refiner specialised for that N (`specialised={N: checkpoint}`, trained by `mmaccel.image.train.train_code`; the
built-in pipeline ships the ones in `mmaccel/assets/fashion_var_small_code{N}.safetensors`; a refiner
specialised for N0 also serves every later hand-off N > N0, whose scales it was trained on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.methods import Method, Resources
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.stats import DecodeStats, track_peak_memory
from mmaccel.devices import check_same_device, resolve_device, resolve_dtype
from mmaccel.errors import ModelNotFoundError, check
from mmaccel.image.models.var import VAR, load_var
from mmaccel.image.next_scale import ScaleSampling, check_code_pair, check_pair
from mmaccel.image.pipeline import (
    CHECKPOINT_SUFFIXES,
    FASHION_CLASSES,
    ImageOutput,
    check_labels,
    locate_checkpoints,
    to_pil,
    weights_fingerprint,
)
from mmaccel.image.scale_methods import SCALE_REGISTRY, ScaleInputs, build_scale_method, specialised_refiner
from mmaccel.image.tokenizers.msvq import MSVQModel, load_msvq
from mmaccel.paths import assets_dir

BUILTIN_SCALE = "builtin:fashion-mnist-var"
_ASSETS = assets_dir()
BUILTIN_SCALE_FILES = {"var": _ASSETS / "fashion_var_large.safetensors",
                       "refiner": _ASSETS / "fashion_var_small.safetensors",
                       "vq": _ASSETS / "fashion_msvq.safetensors"}
SCALE_METHODS = tuple(SCALE_REGISTRY)
# The built-in models' sampling recipe (tuned on the development split, see docs/models.md).
SCALE_SAMPLING = {"cfg_scale": 3.0, "top_k": 128, "top_p": 1.0, "temperature": 1.0}


@dataclass
class ScaleOutput(ImageOutput):
    """`tokens` is the pyramid as one [B, L] tensor, scales concatenated coarse to fine; `indices` the same per
    scale, [B, pn^2] each."""

    indices: list[Tensor] = field(default_factory=list)


def _find(directory: Path, stem: str) -> Path | None:
    return next((directory / f"{stem}{s}" for s in CHECKPOINT_SUFFIXES if (directory / f"{stem}{s}").is_file()), None)


def _specialised_files(directory: Path, stem: str) -> dict[int, Path]:
    """{N: path} of the `<stem>{N}.<suffix>` checkpoints in `directory`."""
    return {int(p.stem[len(stem):]): p for p in sorted(directory.glob(f"{stem}*"))
            if p.suffix in CHECKPOINT_SUFFIXES and p.stem[len(stem):].isdigit()}


class ScalePipeline:
    """A VAR (the large model), its multi-scale tokenizer and optionally a small VAR (CoDe's refiner)."""

    def __init__(self, model: VAR, vq: MSVQModel, refiner: VAR | None = None,
                 class_names: Sequence[str] | None = None, specialised: dict[int, VAR] | None = None):
        check(isinstance(model, VAR), f"model must be a VAR, got {type(model).__name__}")
        check(isinstance(vq, MSVQModel), f"vq must be an MSVQModel, got {type(vq).__name__}")
        check(refiner is None or isinstance(refiner, VAR), f"refiner must be a VAR, got {type(refiner).__name__}")
        check_same_device([("VAR", model), ("tokenizer", vq), ("refiner", refiner)])
        if refiner is not None:
            check_code_pair(model, refiner, vq, 1)   # same tokenizer, schedule and classes
        else:
            check_pair(model, vq)
        self.model, self.vq = model.eval(), vq.eval()
        self.refiner = None if refiner is None else refiner.eval()
        self.specialised = {}
        for n, small in (specialised or {}).items():
            check(isinstance(small, VAR), f"specialised[{n}] must be a VAR, got {type(small).__name__}")
            check_same_device([("VAR", model), (f"specialised refiner {n}", small)])
            check_code_pair(model, small, vq, n)
            self.specialised[n] = small.eval()
        self.class_names = tuple(class_names) if class_names is not None else None

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = BUILTIN_SCALE, *, vq: str | Path | None = None,
                        refiner: str | Path | None = "builtin", specialised: dict[int, str | Path] | None = None,
                        patch_nums: Sequence[int] | None = None,
                        num_heads: int | None = None, device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None) -> ScalePipeline:
        """`"builtin:fashion-mnist-var"` (the shipped tokenizer, large and small VARs), a directory holding
        `var.*`, `vq.*` (and optionally `refiner.*`), or a VAR checkpoint file (an official `var_d16.pth`
        too) with `vq=` its tokenizer (`vae_ch160v4096z32.pth`). `refiner`: the small VAR for CoDe,
        "builtin" (the directory's or built-in one) or None; `specialised`: {N: refiner checkpoint specialised
        for hand-off scale N} (default: the built-in or directory's `refiner_code{N}.*` files). `patch_nums`:
        the scale schedule of an official tokenizer (default VAR's); `num_heads`: for a VAR file whose head
        count cannot be inferred; `device`/`dtype`: where the VARs run and their parameter dtype."""
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        name = str(name_or_path)
        builtins = {BUILTIN_SCALE: {k: BUILTIN_SCALE_FILES[k] for k in ("var", "vq", "refiner")}}
        paths, builtin = locate_checkpoints(name, builtins, {"var": "var", "vq": "vq", "refiner": "refiner"},
                                            what="next-scale model", tokenizer=vq, tokenizer_arg="vq",
                                            tokenizer_example=" (e.g. vae_ch160v4096z32.pth)")
        var_path, vq_path, refiner_path = paths["var"], paths["vq"], paths["refiner"]
        names = FASHION_CLASSES if builtin else None
        path = Path(name)
        found = _specialised_files(_ASSETS, "fashion_var_small_code") if builtin else \
            _specialised_files(path, "refiner_code") if path.is_dir() else {}
        if refiner is None:
            refiner_path = None
        elif refiner != "builtin":
            refiner_path = Path(refiner)
            if not refiner_path.exists():
                raise ModelNotFoundError(f"refiner checkpoint {refiner_path} not found")
        tokenizer = load_msvq(vq_path, patch_nums=patch_nums)
        model = load_var(var_path, num_heads=num_heads, dtype=dtype)
        small = load_var(refiner_path, num_heads=num_heads, dtype=dtype) if refiner_path is not None else None
        if specialised is not None:
            found = {int(n): Path(p) for n, p in specialised.items()}
        missing = [str(p) for p in found.values() if not p.is_file()]
        if missing:
            raise ModelNotFoundError(f"specialised refiner checkpoint(s) not found: {', '.join(missing)}")
        special = {n: load_var(p, num_heads=num_heads, dtype=dtype).to(device) for n, p in found.items()}
        return cls(model.to(device), tokenizer.to(device), None if small is None else small.to(device), names, special)

    def fingerprint(self) -> str:
        """A digest of the weights (cache keys of derived results)."""
        return weights_fingerprint(self.model, self.vq, self.refiner, *self.specialised.values())

    @property
    def num_scales(self) -> int:
        """The number of scales K of the token pyramid, one per entry of the VQ's `patch_nums`."""
        return len(self.vq.patch_nums)

    def specialised_refiner(self, draft_steps: int) -> VAR:
        """The refiner for hand-off scale N that was distilled on every scale it will draw: the one specialised
        for N, else for the largest N0 < N (trained on scales N0..K-1, a superset of N..K-1)."""
        return specialised_refiner(self.specialised, draft_steps)

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The methods `generate` runs: name -> plug-in (`mmaccel methods --pipeline image-scale`)."""
        return SCALE_REGISTRY

    def resources(self) -> Resources:
        """What next-scale methods may use: the large VAR; the tokenizer, the small VAR and the specialised
        refiners as extras (see `mmaccel.image.scale_methods`)."""
        return Resources(model=self.model, extras={"vq": self.vq, "refiner": self.refiner,
                                                   "specialised": self.specialised})

    def generate(self, class_labels: Any, method: str | Method = "ar", *,
                 cfg_scale: float = SCALE_SAMPLING["cfg_scale"], top_k: int = SCALE_SAMPLING["top_k"],
                 top_p: float = SCALE_SAMPLING["top_p"],
                 temperature: float | Sequence[float] = SCALE_SAMPLING["temperature"], seed: int = 0,
                 **params: Any) -> ScaleOutput:
        """One image per class label, drawn by `method` (a name from `methods()` or a Method) with its `params`
        ("code": `draft_steps`, `training_free`, `refiner_cfg`, `refiner_temperature`; one given as None takes
        its default). Guidance is VAR's ramp (0 = none); `temperature` may be one value per scale."""
        spec = build_scale_method(method, **params)
        labels = check_labels(class_labels, self.model.num_classes, self.class_names)
        check(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be an int, got {seed!r}")
        sampling = ScaleSampling(cfg=cfg_scale, top_k=top_k, top_p=top_p,
                                 temperature=tuple(temperature) if isinstance(temperature, (list, tuple)) else temperature)
        sampling.temperature_at(0, self.num_scales)   # a per-scale list must have one value per scale
        resources = self.resources()
        spec.check_needs(resources)
        check(spec.runner is not None, f"method {spec.name!r} is not a next-scale method (it has no runner)")
        device = self.model.class_emb.weight.device
        inputs = ScaleInputs(torch.tensor(labels, device=device), sampling,
                             torch.Generator(device=device).manual_seed(seed), DecodeStats())
        stats = inputs.stats
        with track_peak_memory(stats, device), stats.timed("total"):
            prefix, cache_bytes = spec.runner(resources, inputs)
        stats.cache_mb = cache_bytes / 2**20
        with torch.no_grad():
            images = to_pil(self.vq.decode_f_hat(prefix.f_hat))
        return ScaleOutput(images, torch.cat(prefix.indices, 1), labels, stats, indices=prefix.indices)

    @torch.inference_mode()
    def decode_pixels(self, tokens: Tensor) -> Tensor:
        """Pyramids [B, L] (`ScaleOutput.tokens`) -> images [B, 3, H, W] in [-1, 1]."""
        offsets = self.model.offsets
        return self.vq.decode([tokens[:, offsets[k]:offsets[k + 1]].to(self.vq.quantize.embedding.weight.device)
                               for k in range(self.num_scales)])
