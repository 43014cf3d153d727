"""Qwen2-VL and Qwen2.5-VL (Hugging Face classes) as streaming decoders.

A stream is laid out as one vision segment per temporal patch of frames,
`<|vision_start|> [h * w / merge² video tokens] <|vision_end|>`, with text (questions, answers)
between segments. Positions follow the model's 3-D M-RoPE rule for exactly that sequence
(`get_rope_index` of transformers 5.x): a text token at position p has (p, p, p); a segment starting
after position p has its tokens at (p + 1, p + 1 + row, p + 1 + col) and the text after it resumes
at p + 1 + max(h, w) / merge. Computing each appended chunk's positions from that running counter,
instead of letting every chunk restart at zero, is what makes appending frames one by one equal to
one prefill of the whole sequence (reference video_core.md A.11: |Δlogit| 1e-7 against 3e-3).

The text side (our preallocated `KVCache`, appends, the DecoderModel contract, key rotation for
eviction) is `StreamDecoder`'s; this adapter adds Qwen's vision tower, patch layout and 3-D ids.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmaccel.errors import InputError, check
from mmaccel.video.stream_decoder import StreamDecoder

SUPPORTED = ("qwen2_vl", "qwen2_5_vl")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)     # the Qwen-VL processors' normalisation (OpenAI CLIP's)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class QwenVLStream(StreamDecoder):
    """A `Qwen2VLForConditionalGeneration` / `Qwen2_5_VLForConditionalGeneration` as a streaming decoder
    (`StreamDecoder`): text through `step`, frames through `append_frames`, one temporal patch per
    segment, at the model's 3-D M-RoPE positions."""

    def __init__(self, model: nn.Module):
        cfg = model.config
        check(getattr(cfg, "model_type", None) in SUPPORTED,
              f"{type(model).__name__} ({getattr(cfg, 'model_type', '?')}) is not a supported streaming VLM: "
              f"expected one of {', '.join(SUPPORTED)}")
        super().__init__(model, model.model.language_model)
        self.visual = model.model.visual
        vc = cfg.vision_config
        self.patch, self.merge, self.temporal_patch = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
        self.vision_start, self.vision_end = cfg.vision_start_token_id, cfg.vision_end_token_id
        self.video_token = cfg.video_token_id
        self.segment_open, self.segment_close = (self.vision_start,), (self.vision_end,)
        self.register_buffer("_mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    @property
    def frame_multiple(self) -> int:
        """Frame sides must be multiples of this (a merged token covers merge × patch pixels)."""
        return self.patch * self.merge

    def rope_ids(self, positions: Tensor) -> Tensor:
        """Text positions [B, T] as M-RoPE ids [3, B, T]: a text token has (p, p, p)."""
        return positions[None].expand(3, *positions.shape)

    # ---- vision --------------------------------------------------------------------------------

    def patchify(self, frames: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
        """uint8 frames [T, H, W, 3] (T <= temporal patch, the last repeated to fill it) -> the
        processor's flat patches [t·h·w, 3·temporal·patch²] and the grid (t, h, w) in patches."""
        check(frames.dim() == 4 and frames.shape[-1] == 3, f"frames must be [T, H, W, 3], got {tuple(frames.shape)}")
        T, H, W, _ = frames.shape
        m = self.frame_multiple
        check(H % m == 0 and W % m == 0, f"frame sides must be multiples of {m} for this model, got {H}x{W}")
        x = frames.to(self.device).permute(0, 3, 1, 2).float() / 255.0
        x = ((x - self._mean) / self._std)[None]                               # [1, T, 3, H, W]
        if pad := -T % self.temporal_patch:
            x = torch.cat([x, x[:, -1:].expand(-1, pad, -1, -1, -1)], 1)
        p, mg, tp = self.patch, self.merge, self.temporal_patch
        t, h, w = x.shape[1] // tp, H // p, W // p
        x = x.view(1, t, tp, 3, h // mg, mg, p, w // mg, mg, p).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
        return x.reshape(t * h * w, 3 * tp * p * p), (t, h, w)

    @torch.inference_mode()
    def encode(self, frames: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
        """Vision embeddings [t · h/merge · w/merge, d] of frames [T, H, W, 3], in the order of their
        positions (temporal, then merged rows, then columns), and the patch grid (t, h, w)."""
        pixels, grid = self.patchify(frames)
        out = self.visual(pixels.to(self.visual.dtype), grid_thw=torch.tensor([grid], device=self.device))
        return (out.pooler_output if hasattr(out, "pooler_output") else out), grid

    def token_grid(self, grid: tuple[int, int, int]) -> tuple[int, int]:
        """(rows, cols) of a one-temporal-patch segment's merged tokens, in `encode`'s order."""
        return grid[1] // self.merge, grid[2] // self.merge

    def segment_positions(self, start: int, grid: tuple[int, int, int]) -> tuple[Tensor, int]:
        """M-RoPE positions [3, N + 2] of `<vision_start> tokens <vision_end>` placed after text
        position start - 1, and the next text position."""
        t, h, w = grid[0], grid[1] // self.merge, grid[2] // self.merge
        ti = torch.arange(t).repeat_interleave(h * w)
        hi = torch.arange(h).repeat_interleave(w).repeat(t)
        wi = torch.arange(w).repeat(h * t)
        first = start + 1
        vision = torch.stack([ti, hi, wi]) + first
        end = first + max(h, w)
        return torch.cat([torch.full((3, 1), start), vision, torch.full((3, 1), end)], 1), end + 1


def load_qwen_vl(path, dtype: torch.dtype | None = None) -> nn.Module:
    """A local Qwen2-VL / Qwen2.5-VL checkpoint directory (config.json + safetensors) -> the HF model."""
    from pathlib import Path

    from transformers import AutoConfig

    path = Path(path)
    if not (path / "config.json").is_file():
        raise InputError(f"{path} is not a Hugging Face model directory (no config.json)")
    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    check(cfg.model_type in SUPPORTED, f"{path}: model_type {cfg.model_type!r} is not a supported streaming VLM "
          f"({', '.join(SUPPORTED)})")
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, local_files_only=True)
