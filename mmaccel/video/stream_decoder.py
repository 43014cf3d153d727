"""What every streaming VLM adapter shares: the language model over our preallocated `KVCache`, taking
vision segments and text one piece at a time at positions kept by a running counter, and the
DecoderModel contract (`prefill`, `step`) so every core method decodes the answers.

A family adds its vision side (`encode`, `token_grid`, `segment_positions`, `frame_multiple`,
`temporal_patch`), the mark tokens around a segment (`segment_open`, `segment_close`) and, for
multi-axis RoPE, `rope_ids`. `QwenVLStream` has the same text side with Qwen's 3-D M-RoPE ids.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from mmaccel.core.model import DecodeState, KVCache, check_step_args, default_positions
from mmaccel.errors import check
from mmaccel.lm.hf import run_layers
from mmaccel.video.memory import Units


class StreamDecoder(nn.Module):
    """A Hugging Face VLM (`model`, with `lm_head`) whose language model `text` (`embed_tokens, layers,
    rotary_emb, norm`) decodes over our cache.

    Every state carries `extras["next_position"]`: the RoPE position of the next text token, a host int
    per stream, kept by the appends (a segment may advance positions by other than its cache entries:
    dropped tokens, 3-D ids) and by eviction; `step` places text at cache slot + the offset
    `extras["rope_offset"]` [B], so the core's rollback and trees keep working unchanged.
    """

    cuda_graphs = False
    exit_layer: int | None = None           # decode through this many layers only (`early_exit`)
    segment_open: tuple[int, ...] = ()      # mark token ids before a segment's vision tokens
    segment_close: tuple[int, ...] = ()     # and after them

    def __init__(self, model: nn.Module, text: nn.Module):
        super().__init__()
        self.hf = model.eval()
        self.text = text
        tc = text.config
        self.vocab_size = tc.vocab_size
        self.num_kv_heads = tc.num_key_value_heads
        self.head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads

    @property
    def device(self) -> torch.device:
        return self.hf.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.lm_head.weight.dtype

    @property
    def segment_marks(self) -> int:
        return len(self.segment_open) + len(self.segment_close)

    @property
    def num_layers(self) -> int:
        """Decoder layers this adapter runs (and caches): all of them, or its exit layer."""
        return self.exit_layer or self.text.config.num_hidden_layers

    def early_exit(self, layers: int, head: nn.Module | None = None) -> StreamDecoder:
        """This model decoding through its first `layers` layers, then the final norm and head: the
        self-speculative draft (LayerSkip) of a model trained with early exits (`mmaccel.video.train`
        trains the built-in one so). It shares every weight and the vision encoder with this adapter;
        its states cache `layers` layers, so a draft step costs about layers / depth of a target step.
        A stream's draft reads out through the model's own head (`head` must be None)."""
        check(head is None, "a streaming model's early exit reads out through the model's own norm and head; "
              "separate exit heads are not supported here")
        total = self.text.config.num_hidden_layers
        check(isinstance(layers, int) and 1 <= layers < total,
              f"an early exit must be a layer count in [1, {total - 1}] (the model has {total}), got {layers!r}")
        draft = copy.copy(self)     # a shallow copy: the same modules, its own exit
        draft.exit_layer = layers
        return draft

    def shares_vision(self, other: StreamDecoder) -> bool:
        """Whether `other` is the same model (an early exit of it, or itself): its vision embeddings are ours."""
        return other.hf is self.hf

    def rope_ids(self, positions: Tensor) -> Tensor:
        """Text positions [B, T] as the rotary embedding takes them (1-D RoPE: as they are)."""
        return positions

    # ---- state -------------------------------------------------------------------------------

    def new_state(self, batch_size: int, capacity: int) -> DecodeState:
        state = DecodeState(KVCache(self.num_layers, batch_size, self.num_kv_heads, self.head_dim,
                                    capacity, dtype=self.dtype, device=self.device))
        state.extras["next_position"] = 0
        state.extras["units"] = Units()                  # what each entry is, for bounded memory (B = 1)
        state.extras["rope_offset"] = torch.zeros(batch_size, dtype=torch.long, device=state.cache.lengths.device)
        return state

    def move_to(self, state: DecodeState, next_position: int) -> None:
        """Record the next text position; text decoded from here sits at slot + offset."""
        state.extras["next_position"] = next_position
        lengths = state.cache.lengths
        state.extras["rope_offset"] = next_position - lengths.to(state.extras["rope_offset"].device)

    # ---- appends -------------------------------------------------------------------------------

    @torch.inference_mode()
    def append_frames(self, state: DecodeState, frames: Tensor) -> Tensor:
        """Append one vision segment (frames [T <= temporal patch, H, W, 3]) to every row (B = 1 streams
        or rows sharing the frames); returns the logits [B, V] after its last mark."""
        embeds, grid = self.encode(frames)                                      # [N, d]
        positions, nxt = self.segment_positions(state.extras["next_position"], grid)
        return self.append_segment(state, embeds, positions, nxt)

    @torch.inference_mode()
    def append_segment(self, state: DecodeState, embeds: Tensor, positions: Tensor, next_position: int,
                       keep: Tensor | None = None) -> Tensor:
        """Append `segment_open embeds segment_close` at `positions` [..., marks + N] (from
        `segment_positions`); `keep` [N] (bool) drops vision tokens before they enter the cache (token
        reduction: the survivors keep their own positions). Returns the logits [B, V] after the last mark."""
        B, opened = state.batch_size, len(self.segment_open)
        marks = self.text.embed_tokens(torch.tensor(self.segment_open + self.segment_close, device=self.device))
        h = torch.cat([marks[:opened], embeds.to(marks.dtype), marks[opened:]])
        if keep is not None:
            check(keep.shape == (embeds.shape[0],), f"keep must be [{embeds.shape[0]}], got {tuple(keep.shape)}")
            keep = keep.to(torch.bool)
            keep = torch.cat([keep.new_ones(opened), keep, keep.new_ones(len(self.segment_close))])
            h, positions = h[keep.to(self.device)], positions[..., keep.cpu()]
        first = int(positions.reshape(-1)[0])
        positions = positions.to(self.device)
        logits = self._forward(state, h[None].expand(B, -1, -1), positions[..., None, :].expand(*positions.shape[:-1], B, -1))
        state.extras["units"].add_segment(first, next_position, h.shape[0])
        self.move_to(state, next_position)
        return logits[:, -1]

    @torch.inference_mode()
    def append_text(self, state: DecodeState, tokens: list[int]) -> Tensor:
        """Append text tokens (the same for every row) at the next text positions; logits [B, V] after the last."""
        check(len(tokens) > 0, "nothing to append: the text has no tokens")
        start = state.extras["next_position"]
        positions = torch.arange(start, start + len(tokens), device=self.device).expand(state.batch_size, -1)
        ids = torch.tensor(tokens, device=self.device).expand(state.batch_size, -1)
        logits = self._forward(state, self.text.embed_tokens(ids), self.rope_ids(positions))
        state.extras["units"].add_text(start, len(tokens))
        self.move_to(state, start + len(tokens))
        return logits[:, -1]

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
            positions = default_positions(state.cache.lengths.to(self.device), tokens.shape[1], tree_mask)
        positions = positions.to(self.device) + state.extras["rope_offset"].to(self.device)[:, None]
        tm = None if tree_mask is None else tree_mask.to(self.device)
        return self._forward(state, self.text.embed_tokens(tokens), self.rope_ids(positions), tm)

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
        ids = self.rope_ids((-shift).to(self.device)[None])
        cos, sin = self.text.rotary_emb(keys.transpose(1, 2), position_ids=ids)     # [1, n, D]
        cos, sin = cos[:, None].to(keys.dtype), sin[:, None].to(keys.dtype)
        half = keys.shape[-1] // 2
        rotated = torch.cat([-keys[..., half:], keys[..., :half]], -1)
        return keys * cos + rotated * sin

    def _forward(self, state: DecodeState, h: Tensor, positions: Tensor, tree_mask: Tensor | None = None) -> Tensor:
        # h: [B, T, d]; positions: rotary ids ([B, T], or [3, B, T] for M-RoPE)
        return run_layers(state, self.text, self.hf.lm_head, h, positions, tree_mask, num_layers=self.exit_layer,
                          cuda_graphs=self.cuda_graphs)
