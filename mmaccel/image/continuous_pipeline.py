"""ContinuousPipeline: class-conditional generation with continuous tokens (MAR-style) and CSpD.

>>> pipe = ContinuousPipeline.from_pretrained("builtin:fashion-mnist-mar")
>>> out = pipe.generate([0, 7, 9], method="cspd", seed=0)
>>> out.images[0].save("t-shirt.png"); out.stats.nfe, out.stats.draft_passes, out.stats.mean_accepted

| method   | what runs                                                               | law |
|----------|-------------------------------------------------------------------------|-----|
| ar       | the target, one token per step (`num_iter` = L, CSpD's baseline)       | the target's |
| mar      | the target, MAR's multi-token mode (`num_iter` = L / 4 by default)     | the target's, parallel steps |
| ar-draft | the draft model alone, one token per step (the quality floor)          | another model's |
| cspd     | CSpD: draft `num_draft` steps, verify them in one target pass          | see `mmaccel.image.cspd` |

All methods share `NoiseBank` draws for a seed, so their outputs differ only where the method does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.core.stats import DecodeStats, track_peak_memory
from mmaccel.devices import check_same_device, resolve_device, resolve_dtype
from mmaccel.errors import ModelNotFoundError, check
from mmaccel.image.cspd import CSpDSettings, check_cspd_pair, cspd_decode
from mmaccel.image.masked import MaskedSampling, masked_decode
from mmaccel.image.models.mar import MAR, load_mar
from mmaccel.image.pipeline import FASHION_CLASSES, check_labels, locate_checkpoints, to_pil, weights_fingerprint
from mmaccel.image.tokenizers.kl import KLTokenizer, load_kl
from mmaccel.paths import assets_dir

BUILTIN_CONTINUOUS = "builtin:fashion-mnist-mar"
_ASSETS = assets_dir()
BUILTIN_CONTINUOUS_FILES = {"model": _ASSETS / "fashion_mar.safetensors",
                            "draft": _ASSETS / "fashion_mar_draft.safetensors",
                            "kl": _ASSETS / "fashion_kl.safetensors"}
CONTINUOUS_METHODS = ("ar", "mar", "ar-draft", "cspd")
# The built-in models' sampling recipe (chosen on the development split, see mmaccel/assets/README.md).
CONTINUOUS_SAMPLING = {"cfg": 3.0, "cfg_schedule": "linear", "temperature": 1.0, "diffusion_steps": 10}
MAR_TOKENS_PER_STEP = 4      # MAR's default multi-token mode (64 steps for 256 tokens)
OUTPUT_SIZE = 64             # decoded images are resized to the other image pipelines' side (FID references)


@dataclass
class ContinuousOutput:
    images: list                   # PIL images, one per label
    tokens: Tensor                 # [B, L, C] continuous tokens
    labels: list[int]
    stats: DecodeStats


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

    def generate(self, class_labels: Any, method: str = "ar", *, num_iter: int | None = None,
                 cfg: float = CONTINUOUS_SAMPLING["cfg"], cfg_schedule: str = CONTINUOUS_SAMPLING["cfg_schedule"],
                 temperature: float = CONTINUOUS_SAMPLING["temperature"],
                 diffusion_steps: int = CONTINUOUS_SAMPLING["diffusion_steps"], num_draft: int | None = None,
                 prefill_ratio: float | None = None, inner_temperature: float | None = None,
                 seed: int = 0) -> ContinuousOutput:
        """One image per class label. `method`: "ar", "mar", "ar-draft" or "cspd" (module table). `num_iter`:
        generation steps (default: one token per step, L / 4 for "mar"); `cfg` >= 1 with MAR's "linear" or a
        "constant" schedule; `temperature` scales the diffusion noise; `diffusion_steps` per token. CSpD only:
        `num_draft` (default 8), `prefill_ratio` (0.15) and `inner_temperature` (42; 1 = exact ratio)."""
        check(method in CONTINUOUS_METHODS, f"unknown continuous-token method {method!r}; choose from "
                                            f"{', '.join(CONTINUOUS_METHODS)}")
        labels = check_labels(class_labels, self.model.config.num_classes, self.class_names)
        check(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be an int, got {seed!r}")
        cspd_params = {"num_draft": num_draft, "prefill_ratio": prefill_ratio, "inner_temperature": inner_temperature}
        if method != "cspd":
            given = [k for k, v in cspd_params.items() if v is not None]
            check(not given, f"{', '.join(given)} {'is a parameter' if len(given) == 1 else 'are parameters'} of "
                             f"method='cspd', not {method!r}")
        else:
            check(self.draft is not None, "method='cspd' needs a draft model: pass draft=PATH")
        L = self.model.config.seq_len
        if num_iter is None:
            num_iter = max(1, L // MAR_TOKENS_PER_STEP) if method == "mar" else L
        sampling = MaskedSampling(num_iter=num_iter, cfg=cfg, cfg_schedule=cfg_schedule, temperature=temperature,
                                  diffusion_steps=diffusion_steps)
        sampling.check(L, self.model.diffusion.timesteps)
        settings = CSpDSettings(**{k: v for k, v in cspd_params.items() if v is not None})
        device = self.model.token_proj.weight.device
        y = torch.tensor(labels, device=device)
        generator = torch.Generator(device=device).manual_seed(seed)
        stats = DecodeStats()
        with track_peak_memory(stats, device), stats.timed("total"):
            if method == "cspd":
                tokens = cspd_decode(self.model, self.draft, y, sampling, settings, generator, stats)
            else:
                if method == "ar-draft":
                    check(self.draft is not None, "method='ar-draft' needs a draft model: pass draft=PATH")
                model = self.draft if method == "ar-draft" else self.model
                tokens = masked_decode(model, y, sampling, generator, stats)
                if method == "ar-draft":
                    stats.draft_passes, stats.nfe = stats.nfe, 0
        return ContinuousOutput(to_pil(self.decode_pixels(tokens)), tokens, labels, stats)

    @torch.inference_mode()
    def decode_pixels(self, tokens: Tensor) -> Tensor:
        """Tokens [B, L, C] -> images [B, 3, 64, 64] in [-1, 1] (the tokenizer's output, resized bilinearly
        to the side the image benchmarks' FID references use)."""
        pixels = self.tokenizer.decode(tokens.to(self.tokenizer.vae.dtype).to(next(self.tokenizer.parameters()).device))
        if pixels.shape[-1] != OUTPUT_SIZE:
            pixels = F.interpolate(pixels, size=(OUTPUT_SIZE, OUTPUT_SIZE), mode="bilinear", align_corners=False)
        return pixels.clamp(-1, 1)
