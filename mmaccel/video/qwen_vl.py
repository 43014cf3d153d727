"""Qwen2-VL and Qwen2.5-VL (Hugging Face classes) as streaming decoders.

A stream is laid out as one vision segment per temporal patch of frames,
`<|vision_start|> [h * w / merge² video tokens] <|vision_end|>`, with text (questions, answers)
between segments. Positions follow the model's 3-D M-RoPE rule for exactly that sequence
(`get_rope_index` of transformers 5.x): a text token at position p has (p, p, p); a segment starting
after position p has its tokens at (p + 1, p + 1 + row, p + 1 + col) and the text after it resumes
at p + 1 + max(h, w) / merge. Computing each appended chunk's positions from that running counter,
instead of letting every chunk restart at zero, is what makes appending frames one by one equal to
one prefill of the whole sequence (reference video_core.md A.11: |Δlogit| 1e-7 against 3e-3).

The adapter runs the model's own modules (vision tower, embedding, decoder layers, rotary embedding,
norm, head) over our preallocated `KVCache`, like `mmaccel.lm.hf.HFCausalLM`, so every core method
decodes the answers and the cache can be bounded by evicting entries (`mmaccel.video.memory`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmaccel.core.model import DecodeState, KVCache, check_step_args, default_positions, step_key
from mmaccel.errors import InputError, check
from mmaccel.video.memory import Units

SUPPORTED = ("qwen2_vl", "qwen2_5_vl")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)     # the Qwen-VL processors' normalisation (OpenAI CLIP's)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class QwenVLStream(nn.Module):
    """A `Qwen2VLForConditionalGeneration` / `Qwen2_5_VLForConditionalGeneration` as a DecoderModel
    over text tokens (`step`) that also takes frames (`append_frames`).

    Every state carries `extras["next_position"]`: the M-RoPE position of the next text token, a
    host int per stream, kept by `append_frames`/`append_text` (a segment advances positions by
    fewer steps than cache slots) and by eviction; `step` places text at cache slot + the offset
    `extras["rope_offset"]` [B], so the core's rollback and trees keep working unchanged.
    """

    cuda_graphs = False

    def __init__(self, model: nn.Module):
        super().__init__()
        cfg = model.config
        check(getattr(cfg, "model_type", None) in SUPPORTED,
              f"{type(model).__name__} ({getattr(cfg, 'model_type', '?')}) is not a supported streaming VLM: "
              f"expected one of {', '.join(SUPPORTED)}")
        self.hf = model.eval()
        self.text = model.model.language_model
        self.visual = model.model.visual
        vc = cfg.vision_config
        self.patch, self.merge, self.temporal_patch = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
        self.vision_start, self.vision_end = cfg.vision_start_token_id, cfg.vision_end_token_id
        self.video_token = cfg.video_token_id
        tc = cfg.text_config
        self.vocab_size = tc.vocab_size
        self.num_kv_heads = tc.num_key_value_heads
        self.head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        self.register_buffer("_mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.hf.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.lm_head.weight.dtype

    @property
    def frame_multiple(self) -> int:
        """Frame sides must be multiples of this (a merged token covers merge × patch pixels)."""
        return self.patch * self.merge

    # ---- state -------------------------------------------------------------------------------

    def new_state(self, batch_size: int, capacity: int) -> DecodeState:
        cfg = self.text.config
        state = DecodeState(KVCache(cfg.num_hidden_layers, batch_size, self.num_kv_heads, self.head_dim, capacity,
                                    dtype=self.dtype, device=self.device))
        state.extras["next_position"] = 0
        state.extras["units"] = Units()                  # what each entry is, for bounded memory (B = 1)
        state.extras["rope_offset"] = torch.zeros(batch_size, dtype=torch.long, device=state.cache.lengths.device)
        return state

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

    segment_marks = 2       # <vision_start>, <vision_end> around each segment's tokens

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

    # ---- appends -------------------------------------------------------------------------------

    @torch.inference_mode()
    def append_frames(self, state: DecodeState, frames: Tensor) -> Tensor:
        """Append one vision segment (frames [T <= temporal patch, H, W, 3]) to every row (B = 1 streams
        or rows sharing the frames); returns the logits [B, V] after its `<vision_end>`."""
        embeds, grid = self.encode(frames)                                      # [N, d]
        positions, nxt = self.segment_positions(state.extras["next_position"], grid)
        return self.append_segment(state, embeds, positions, nxt)

    @torch.inference_mode()
    def append_segment(self, state: DecodeState, embeds: Tensor, positions: Tensor, next_position: int,
                       keep: Tensor | None = None) -> Tensor:
        """Append `<vision_start> embeds <vision_end>` with their M-RoPE `positions` [3, N + 2]; `keep`
        [N] (bool) drops vision tokens before they enter the cache (token reduction: the survivors keep
        their own positions). Returns the logits [B, V] after `<vision_end>`."""
        B = state.batch_size
        marks = self.text.embed_tokens(torch.tensor([self.vision_start, self.vision_end], device=self.device))
        h = torch.cat([marks[:1], embeds.to(marks.dtype), marks[1:]])
        if keep is not None:
            check(keep.shape == (embeds.shape[0],), f"keep must be [{embeds.shape[0]}], got {tuple(keep.shape)}")
            keep = torch.cat([keep.new_ones(1), keep.to(torch.bool), keep.new_ones(1)]).to(self.device)
            h, positions = h[keep], positions[:, keep.cpu()]
        logits = self._forward(state, h[None].expand(B, -1, -1), positions.to(self.device)[:, None].expand(-1, B, -1))
        state.extras["units"].add_segment(int(positions[0, 0]), next_position, h.shape[0])
        self.move_to(state, next_position)
        return logits[:, -1]

    @torch.inference_mode()
    def append_text(self, state: DecodeState, tokens: list[int]) -> Tensor:
        """Append text tokens (the same for every row) at the next text positions; logits [B, V] after the last."""
        check(len(tokens) > 0, "nothing to append: the text has no tokens")
        start = state.extras["next_position"]
        positions = torch.arange(start, start + len(tokens), device=self.device).expand(3, state.batch_size, -1)
        ids = torch.tensor(tokens, device=self.device).expand(state.batch_size, -1)
        logits = self._forward(state, self.text.embed_tokens(ids), positions)
        state.extras["units"].add_text(start, len(tokens))
        self.move_to(state, start + len(tokens))
        return logits[:, -1]

    def move_to(self, state: DecodeState, next_position: int) -> None:
        """Record the next text position; text decoded from here sits at slot + offset."""
        state.extras["next_position"] = next_position
        lengths = state.cache.lengths
        state.extras["rope_offset"] = next_position - lengths.to(state.extras["rope_offset"].device)

    # ---- text: the DecoderModel contract ---------------------------------------------------------

    def prefill(self, inputs: list[list[int]], room: int) -> DecodeState:
        """A stream that starts with text only (a system prompt), room for `room` more entries."""
        check(isinstance(inputs, (list, tuple)) and len(inputs) == 1 and len(inputs[0]) > 0,
              "a stream prefill takes one non-empty token list")
        state = self.new_state(1, len(inputs[0]) + room)
        state.logits = self.append_text(state, list(inputs[0]))
        return state

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None) -> Tensor:
        """Append text tokens [B, T] (drafts, a tree) at slot + rope offset; logits [B, T, V]. Does not
        move `next_position`: the decode loop commits and rolls back; `commit_text` records the end."""
        check_step_args(state, tokens, tree_mask, self.vocab_size)
        tokens = tokens.to(self.device)
        if positions is None:
            start = state.cache.lengths.to(self.device)
            positions = default_positions(start, tokens.shape[1], tree_mask)
        positions = positions.to(self.device) + state.extras["rope_offset"].to(self.device)[:, None]
        tm = None if tree_mask is None else tree_mask.to(self.device)
        return self._forward(state, self.text.embed_tokens(tokens), positions[None].expand(3, -1, -1), tm)

    def commit_text(self, state: DecodeState, tokens: list[int]) -> None:
        """After a decode of `tokens` from the pending logits (B = 1): the cache keeps exactly them as its
        next text entries. The decode left the entries of all but the last committed token (and maybe
        rolled-forward ones after them): keep those, drop the rest, append what is missing."""
        units, length = state.extras["units"], int(state.cache.lengths[0])
        committed = len(units.entry_unit)
        have = max(0, min(length - committed, len(tokens) - 1))
        state.cache.rollback(length - committed - have)
        start = state.extras["next_position"]
        units.add_text(start, have)
        self.move_to(state, start + have)
        if len(tokens) > have:
            state.logits = self.append_text(state, tokens[have:])

    @torch.inference_mode()
    def rotate_keys(self, keys: Tensor, shift: Tensor) -> Tensor:
        """R(-shift)·keys for cached keys [B, H, n, D] moved `shift` [n] positions down (contiguous RoPE)."""
        ids = (-shift).to(self.device)[None, None].expand(3, 1, -1)
        cos, sin = self.text.rotary_emb(keys.transpose(1, 2), position_ids=ids)     # [1, n, D]
        cos, sin = cos[:, None].to(keys.dtype), sin[:, None].to(keys.dtype)
        half = keys.shape[-1] // 2
        rotated = torch.cat([-keys[..., half:], keys[..., :half]], -1)
        return keys * cos + rotated * sin

    # ---- the forward over the cache ----------------------------------------------------------------

    def _forward(self, state: DecodeState, h: Tensor, positions: Tensor, tree_mask: Tensor | None = None) -> Tensor:
        # h: [B, T, d]; positions: [3, B, T] M-RoPE ids
        cache, inner = state.cache, self.text

        def body(h: Tensor, positions: Tensor, tree_mask: Tensor | None) -> tuple[Tensor, Tensor]:
            write, start = cache.reserve(h.shape[1])
            mask = cache.attention_mask(start, h.shape[1], tree_mask)
            rope = inner.rotary_emb(h, position_ids=positions)
            for layer in inner.layers:
                h = layer(h, attention_mask=mask, position_ids=None, past_key_values=write, position_embeddings=rope)
                if isinstance(h, tuple):
                    h = h[0]
            h = inner.norm(h)
            return self.hf.lm_head(h).float(), h

        inputs = (h, positions, tree_mask)
        if self.cuda_graphs and cache.graphs_apply:
            logits, state.hidden = cache.graphs.run(step_key(inputs), body, *inputs)
        else:
            logits, state.hidden = body(*inputs)
        return logits


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
