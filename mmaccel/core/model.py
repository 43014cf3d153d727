"""The decoder contract every model adapter implements: its state, its `step` checks and the ragged appends over it.

The preallocated KV cache under it lives in `mmaccel.core.kv_cache` and the host/device helpers in
`mmaccel.core.host_sync`; both are re-exported here, where adapters have always imported them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmaccel.core.host_sync import as_row_counts, expect, on_host
from mmaccel.core.kv_cache import CachePool, CacheWrite, KVCache
from mmaccel.errors import check

__all__ = [
    "CachePool", "CacheWrite", "DecodeState", "DecoderModel", "KVCache", "append_padded", "append_ragged",
    "as_row_counts", "check_step_args", "default_positions", "expect", "on_host", "step_key",
]


@dataclass
class DecodeState:
    """What a model carries between steps: the cache and the outputs of the last step."""

    cache: KVCache
    logits: Tensor | None = None            # [B, V] next-token logits after the last committed token
    hidden: Tensor | None = None            # [B, T, d] final hidden states of the last step
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    @property
    def lengths(self) -> Tensor:
        return self.cache.lengths

    def rollback(self, n: int | Tensor) -> None:
        self.cache.rollback(n)

    def keep_appended(self, offsets: Tensor, counts: Tensor, appended: int) -> None:
        self.cache.keep_appended(offsets, counts, appended)


@runtime_checkable
class DecoderModel(Protocol):
    """What a model must provide to be decoded by any mmaccel method.

    - `prefill(inputs, room)` runs the prompt/condition (one entry per batch row) and returns a
      state whose `logits` [B, V] give the first new token, with cache room for `room` more tokens;
    - `step(state, tokens [B, T], positions=None, tree_mask=None)` appends T tokens per row and
      returns logits [B, T, V]; `positions` are the model's own position ids (absolute cache
      positions for a causal LM, image-token indices for LlamaGen) and default to the next free
      positions (for a tree, to the prefix length + depth read off `tree_mask`);
    - `state.rollback(n)` drops the last n entries in O(1).

    Optional: a model whose logits are -inf outside a fixed token list offers `shortlist` (those ids
    [S], ascending) and `shortlist_step` (`step`'s logits at those ids only, [B, T, S]); greedy
    drafting (`DraftModelProposer`) then never builds full-vocabulary logits. A model offering
    `prefill_with(inputs, room, tokens [B, T]) -> (state, logits [B, 1 + T, V])` (prefill and a step
    over `tokens` in one pass) has greedy drafts of its first tokens verified by its prefill pass; a
    draft model offering `opening(inputs) -> Tensor [B, W] | None` starts those drafts with the W
    tokens it returns, taken as given (Whisper's first timestamp in timestamp mode).
    A model with `skips_filler = True` takes `step(..., valid=[B])`: only the first valid[b] tokens
    (tree nodes) of row b need logits, and it may leave the rest out of its products (their logits
    and cache entries are arbitrary; the loop rolls them back). Greedy verification then skips
    finished rows and the drafts a proposer marks as filler (`Draft.lengths`), which batched verify
    passes otherwise compute. A model offering `admit(state, row, inputs) -> DecodeState` (one row of what
    `prefill` takes run alone into row `row` of `state`; the returned one-row state holds its logits and hidden
    states) lets requests join a call as rows end (continuous batching: `decode(..., feed=)`).
    """

    vocab_size: int

    def prefill(self, inputs: Any, room: int) -> DecodeState: ...

    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None) -> Tensor: ...


def check_step_args(state: DecodeState, tokens: Tensor, tree_mask: Tensor | None, vocab_size: int) -> None:
    """Validate a `step` call with messages a user can act on."""
    check(isinstance(tokens, Tensor), f"tokens must be a tensor, got {type(tokens).__name__}")
    check(tokens.dim() == 2, f"tokens must have shape [batch, T], got {tuple(tokens.shape)}")
    check(not tokens.is_floating_point() and tokens.dtype != torch.bool,
          f"tokens must be an integer tensor, got {tokens.dtype}")
    check(tokens.shape[0] == state.batch_size,
          f"tokens batch {tokens.shape[0]} does not match the state's batch {state.batch_size}")
    check(tokens.shape[1] > 0, "tokens must hold at least one token per row")
    expect((tokens >= 0) & (tokens < vocab_size), f"token ids must lie in [0, {vocab_size})")
    if tree_mask is not None:
        T = tokens.shape[1]
        check(tree_mask.dim() == 3 and tree_mask.shape[1] == T and tree_mask.shape[2] >= T
              and tree_mask.shape[0] in (1, tokens.shape[0]),
              f"tree_mask must have shape [B or 1, {T}, W >= {T}], got {tuple(tree_mask.shape)}")


def step_key(inputs: tuple[Tensor | None, ...], *extra: Any) -> tuple:
    """What identifies the graph of a step (`KVCache.graphs`): its inputs' shapes and dtypes (None
    where absent) and `extra` (which layers, which head)."""
    return tuple(None if x is None else (tuple(x.shape), x.dtype) for x in inputs) + tuple(
        id(e) if isinstance(e, torch.nn.Module) else e for e in extra)


def default_positions(start: Tensor, num_new: int, tree_mask: Tensor | None) -> Tensor:
    """Positions [B, T] of new tokens: consecutive after `start`, or prefix + depth for a tree."""
    if tree_mask is None:
        return start[:, None] + torch.arange(num_new, device=start.device)[None, :]
    W = tree_mask.shape[-1]
    depth = tree_mask.to(torch.long).sum(-1) - 1                      # ancestors inside the window
    return (start[:, None] + num_new - W) + depth.to(start.device).expand(start.shape[0], -1)


def append_ragged(model: DecoderModel, state: DecodeState, rows: list[Tensor], step=None) -> Tensor:
    """Append a different number of tokens to each row; returns logits [B, V] after each row's last
    (or, with `step` (state, tokens [B, T]) -> [B, T, ...] in place of `model.step`, its output there).

    Rows are right-padded to the longest, run as one step, and the padding is rolled back per row;
    padding sits after the real tokens, so causal attention never lets a real token see it.
    """
    sizes = [len(r) for r in rows]
    check(min(sizes) > 0, "every row needs at least one token")
    if sizes.count(sizes[0]) == len(sizes):                            # equal rows: one plain step
        out = (step or model.step)(state, torch.stack(list(rows)).to(state.cache.device))
        if state.hidden is not None:
            state.hidden = state.hidden[:, -1:]
        return out[:, -1]
    lengths = torch.tensor(sizes)
    T = max(sizes)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, : len(r)] = r
    out = (step or model.step)(state, tokens.to(state.cache.device))
    state.rollback(T - lengths)
    last = (lengths - 1).to(out.device)
    if state.hidden is not None:
        state.hidden = state.hidden[torch.arange(len(rows)), last][:, None]
    return out[torch.arange(len(rows), device=out.device), last]


def append_padded(model: DecoderModel, state: DecodeState, tokens: Tensor, counts: Tensor, step=None) -> Tensor:
    """`append_ragged` over a padded batch: row b appends its first `counts[b]` (>= 1) of `tokens`
    [B, P]; returns the logits [B, V] after each row's last (or `step`'s output there).

    On the host the counts are read and the block is cut to the longest row (one plain step when the
    rows are level). On a GPU all P columns run as one fixed-shape step and each row's padding is
    rolled back by a device tensor, so nothing is read back.
    """
    B, P = tokens.shape
    counts = counts.to(state.cache.lengths.device)
    if on_host(state.cache.device):
        sizes = counts.tolist()
        check(min(sizes) > 0 and max(sizes) <= P, f"every row appends between 1 and {P} tokens, got {sizes}")
        P = max(sizes)
        tokens = tokens[:, :P]
        if sizes.count(P) == B:                                         # level rows: one plain step
            out = (step or model.step)(state, tokens.to(state.cache.device))
            if state.hidden is not None:
                state.hidden = state.hidden[:, -1:]
            return out[:, -1]
    else:
        expect((counts > 0) & (counts <= P), f"every row appends between 1 and {P} tokens")
    out = (step or model.step)(state, tokens.to(state.cache.device))
    state.rollback(P - counts)
    last = (counts - 1).to(out.device)
    rows = torch.arange(B, device=out.device)
    if state.hidden is not None:
        state.hidden = state.hidden[rows.to(state.hidden.device), last.to(state.hidden.device)][:, None]
    return out[rows, last]
