"""The preallocated KV cache under every decoder, and the pool that keeps caches across decode calls.

The cache follows gpt-fast: buffers are allocated once for `capacity` positions and a per-row length
pointer says how many entries are committed, so `rollback(n)` is moving that pointer (O(1)) and
rows of a batch may accept different numbers of draft tokens (ragged acceptance).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mmaccel.core.graphs import StepGraphs
from mmaccel.core.host_sync import as_row_counts, expect, on_host
from mmaccel.errors import InputError, check


class CacheWrite:
    """One append of T entries per row; passed to attention layers as their `past_key_values`.

    `update(key, value, layer_idx)` has the signature Hugging Face attention modules call, so HF
    decoder layers write straight into our buffers. Returns the keys/values of all used slots.
    """

    def __init__(self, cache: KVCache, slots: Tensor, used: int, start: int | None):
        # start: the first slot when every row writes at the same one (a slice write), else None
        self.cache, self.slots, self.used, self.start = cache, slots, used, start

    @property
    def same_start(self) -> bool:
        return self.start is not None

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        # key, value: [B, H, T, D]
        k_buf, v_buf = self.cache.k[layer_idx], self.cache.v[layer_idx]
        if self.start is not None:
            start = self.start
            k_buf[:, :, start : start + key.shape[2]] = key
            v_buf[:, :, start : start + key.shape[2]] = value
        else:
            index = self.slots[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[3])
            k_buf.scatter_(2, index, key.to(k_buf.dtype))
            v_buf.scatter_(2, index, value.to(v_buf.dtype))
        return k_buf[:, :, : self.used], v_buf[:, :, : self.used]

    def record(self, tokens: Tensor) -> None:
        """Write the append's token ids [B, T] into the cache's id record (see `KVCache.keep_ids`)."""
        ids = self.cache.ids
        if ids is None:
            return
        tokens = tokens.to(ids.device)
        if self.start is not None:
            ids[:, self.start : self.start + tokens.shape[1]] = tokens
        else:
            ids.scatter_(1, self.slots.to(ids.device), tokens)


class KVCache:
    """Preallocated keys/values `[B, H, capacity, D]` per layer and committed lengths `[B]`.

    On the host (CPU) the lengths live on the CPU: a step attends to the slots up to the longest row
    and writes with one slice when the rows are level. On a GPU they live on the device and a step
    attends over the whole capacity under a mask: fixed shapes, no host reads (the shapes a CUDA
    graph needs); overflow and rollback checks become device asserts. `full_width`: every step attends over the
    whole capacity under a mask on the host too (one key count for every step: `mmaccel.engine.attention`).
    """

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", full_width: bool = False):
        check(batch_size > 0, f"batch size must be > 0, got {batch_size}")
        check(capacity > 0, f"cache capacity must be > 0, got {capacity}")
        shape = (batch_size, num_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.capacity, self.device = capacity, torch.device(device)
        self.host = on_host(self.device)
        self.full_width = full_width or not self.host
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device="cpu" if self.host else self.device)
        self._placed: tuple[Tensor, Tensor] | None = None
        self._placed_mask: Tensor | None = None
        self.ids: Tensor | None = None      # [B, capacity] token id per slot, once `keep_ids` is called
        self.graphs = StepGraphs()      # captured steps over these buffers (used on a GPU when asked for)

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def graphs_apply(self) -> bool:
        """Whether the next append may run as a captured step: on a GPU, at the next free slots (a
        placed append writes where a planner says, a different place every time)."""
        return not self.host and self._placed is None

    def keep_ids(self) -> Tensor:
        """Record the token id of every slot beside its keys/values ([B, capacity], written by
        `CacheWrite.record`, moved by rollback, compaction and row selection like the entries): for
        decoding rules that read a row's committed tokens (Whisper's timestamp rules)."""
        if self.ids is None:
            self.ids = torch.zeros(self.batch_size, self.capacity, dtype=torch.long, device=self.device)
        return self.ids

    @torch.inference_mode()
    def reset(self) -> None:
        """Empty every row (the buffers stay, and so do the captured steps over them)."""
        self.lengths.zero_()
        self._placed = self._placed_mask = None

    def place_next(self, slots: Tensor, visible: Tensor) -> None:
        """Make the next append write its T entries at explicit `slots` [b, T] (overwriting what is
        there) and attend by `visible` [b, T, capacity] instead of the causal rule; `lengths` stay.

        This is how wavefront decoders (ZipAR) keep one slot per image position. b may divide the
        cache batch (CFG doubles the rows); the plan is then repeated. On the host the step attends
        over the slots up to the last visible one, on a GPU over the whole capacity (fixed shapes).
        """
        b, T = slots.shape
        check(self.batch_size % b == 0, f"placed slots for {b} rows do not tile a cache batch of {self.batch_size}")
        check(visible.shape == (b, T, self.capacity), f"visible must be [{b}, {T}, {self.capacity}], got {tuple(visible.shape)}")
        check(bool(((slots >= 0) & (slots < self.capacity)).all()), f"slots must lie in [0, {self.capacity})")
        self._placed = (slots, visible)

    def reserve(self, num_new: int) -> tuple[CacheWrite, Tensor]:
        """Claim the next `num_new` slots of every row; returns the writer and the old lengths [B]."""
        if self._placed is not None:
            slots, visible = self._placed
            self._placed = None
            check(slots.shape[1] == num_new, f"placed {slots.shape[1]} slots but the step appends {num_new} tokens")
            reps = self.batch_size // slots.shape[0]
            used = self.capacity
            if not self.full_width:     # attend over the slots up to the last visible one only (fewer keys to read)
                seen = visible.reshape(-1, self.capacity).any(0).nonzero()
                used = int(seen[-1]) + 1 if len(seen) else 1
            self._placed_mask = visible[..., :used].repeat(reps, 1, 1)[:, None].to(self.device)
            return CacheWrite(self, slots.repeat(reps, 1).to(self.device), used, None), self.lengths.clone()
        start = self.lengths.clone()
        if not self.host:
            slots = start[:, None] + torch.arange(num_new, device=self.device)[None, :]
            expect(slots[:, -1] < self.capacity, f"KV cache overflow: {num_new} more tokens do not fit the capacity "
                   f"{self.capacity}; allocate the state with a larger capacity")
            self.lengths.add_(num_new)      # in place, always: a captured step replays on this tensor
            return CacheWrite(self, slots, self.capacity, None), start
        starts = start.tolist()
        if max(starts) + num_new > self.capacity:
            raise InputError(
                f"KV cache overflow: {max(starts)} + {num_new} tokens > capacity {self.capacity}; "
                "allocate the state with a larger capacity (prompt length + max_new_tokens + draft width)"
            )
        slots = (start[:, None] + torch.arange(num_new)[None, :]).to(self.device)
        self.lengths.add_(num_new)
        same = starts.count(starts[0]) == len(starts)
        used = self.capacity if self.full_width else max(starts) + num_new
        return CacheWrite(self, slots, used, starts[0] if same else None), start

    def attention_mask(self, start: Tensor, num_new: int, tree_mask: Tensor | None) -> Tensor:
        """Boolean mask [B, 1, T, S] (True = attend) for T new tokens written at `start` [B].

        `tree_mask` [B or 1, T, W] (W >= T) says which of the last W slots (the W - T before the new
        block and the T new ones) each new token may see; everything before those W is prefix and
        visible. Without it the new block is causal.
        """
        if self._placed_mask is not None:
            mask, self._placed_mask = self._placed_mask, None
            return mask
        T, S = num_new, self.capacity if self.full_width else int(self.lengths.max())
        if tree_mask is None:
            tree_mask = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()[None]
        W = tree_mask.shape[-1]
        window_start = (start + T - W).to(self.device)                      # [B]
        rel = torch.arange(S, device=self.device)[None, :] - window_start[:, None]  # [B, S]
        in_window = (rel >= 0) & (rel < W)
        picked = tree_mask.to(self.device, torch.bool).expand(self.batch_size, T, W).gather(
            2, rel.clamp(0, W - 1)[:, None, :].expand(-1, T, -1))           # [B, T, S]
        mask = (rel < 0)[:, None, :] | (in_window[:, None, :] & picked)
        return mask[:, None]

    @torch.inference_mode()    # the buffers are inference tensors, changed in place
    def rollback(self, n: int | Tensor) -> None:
        """Drop the last `n` committed entries (an int, or one count per row) in O(1)."""
        counts = as_row_counts(n, self.batch_size, device=self.lengths.device)
        if self.host:
            if bool((counts > self.lengths).any()):
                raise InputError(f"cannot roll back {counts.tolist()} entries from lengths {self.lengths.tolist()}")
        else:
            expect(counts <= self.lengths, "cannot roll back more entries than a row holds")
        self.lengths.sub_(counts)

    @torch.inference_mode()    # the buffers are inference tensors, changed in place
    def select_rows(self, index: Tensor) -> None:
        """Keep rows `index` [B'] of the batch, in that order (repeats allowed): beam search. On a GPU,
        with as many rows as before, the buffers are rewritten in place (captured steps stay valid)."""
        idx = index.to(self.device)
        lengths = self.lengths.index_select(0, index.to(self.lengths.device))
        if not self.host and idx.shape[0] == self.batch_size:
            for buf in (*self.k, *self.v, *([] if self.ids is None else [self.ids])):
                buf.copy_(buf.index_select(0, idx))
            self.lengths.copy_(lengths)
            return
        self.k = [k.index_select(0, idx) for k in self.k]
        self.v = [v.index_select(0, idx) for v in self.v]
        self.ids = None if self.ids is None else self.ids.index_select(0, idx)
        self.lengths, self.graphs = lengths, StepGraphs()

    @torch.inference_mode()    # the buffers are inference tensors, changed in place
    def take_row(self, row: int, other: KVCache) -> None:
        """Row `row` becomes the one row of `other` (its entries and length; what the row held is dropped): a
        request that joins a call in progress (continuous batching). The other rows stay as they are."""
        check(other.batch_size == 1 and len(other.k) == len(self.k), "take_row takes a one-row cache of as many layers")
        n = int(other.lengths[0])
        check(n <= self.capacity, f"a joining row of {n} entries does not fit the cache's capacity {self.capacity}")
        for mine, theirs in zip((*self.k, *self.v), (*other.k, *other.v)):
            mine[row, :, :n] = theirs[0, :, :n]
        if self.ids is not None:
            self.ids[row, :n] = 0 if other.ids is None else other.ids[0, :n]
        self.lengths[row] = n

    @torch.inference_mode()    # the buffers are inference tensors, changed in place
    def keep_appended(self, offsets: Tensor, counts: Tensor, appended: int) -> None:
        """After appending `appended` entries, keep only those at `offsets` [B, L] (relative to the
        append, ascending), the first `counts[b]` of them per row, packed contiguously; drop the rest.

        This is the tree-verification compaction of Medusa/EAGLE: the accepted root-to-leaf path is
        copied to the slots right after the prefix. Costs O(L) copies per layer.
        """
        start = self.lengths - appended
        counts = as_row_counts(counts, self.batch_size, "counts", self.lengths.device)
        offsets = offsets.to(self.lengths.device).clamp(0, appended - 1)
        self.lengths.copy_(start + counts)
        first = 0
        if self.host:
            # entries already in place (a chain-shaped path) stay: only the columns from the first one
            # out of place on, which is none for a chain and one for a path that ends on a sibling
            places = torch.arange(offsets.shape[1])[None, :]
            moved = (offsets != places) & (places < counts[:, None])
            if not bool(moved.any()):
                return
            first = int(moved.any(0).nonzero()[0, 0])
        L = offsets.shape[1] - first
        src = (start[:, None] + offsets[:, first:]).to(self.device)
        dst = (start[:, None] + first + torch.arange(L, device=start.device)[None, :]).to(self.device)
        self._move(src, dst)
        if self.ids is not None:
            self.ids.scatter_(1, dst, self.ids.gather(1, src))

    def _move(self, src: Tensor, dst: Tensor) -> None:
        """Copy each row's entries at slots `src` [B, L] to slots `dst` [B, L] (a cache whose entries live
        elsewhere overrides this)."""
        self._move_in([*self.k, *self.v], src, dst)

    @staticmethod
    def _move_in(buffers: list[Tensor], src: Tensor, dst: Tensor) -> None:
        for buf in buffers:
            H, D = buf.shape[1], buf.shape[3]
            entries = buf.gather(2, src[:, None, :, None].expand(-1, H, -1, D))
            buf.scatter_(2, dst[:, None, :, None].expand(-1, H, -1, D), entries)


class CachePool:
    """A model's KV caches by shape, kept across decode calls when its steps run as CUDA graphs, so
    that the graphs captured over a cache are replayed by later calls too (a capture costs as much as
    many steps). Capacities are rounded up to `ROUND` so that nearby lengths share a cache. Taking a
    cache empties it: one live state per shape and `tag` (which layers, which head) at a time.
    """

    ROUND, KEEP = 64, 4

    def __init__(self):
        self.caches: dict[tuple, KVCache] = {}

    def take(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, capacity: int,
             dtype: torch.dtype, device: torch.device, tag: Any = None) -> KVCache:
        capacity = -(-capacity // self.ROUND) * self.ROUND
        key = (num_layers, batch_size, num_heads, head_dim, capacity, dtype, str(device), tag)
        cache = self.caches.pop(key, None)
        if cache is None:
            cache = KVCache(num_layers, batch_size, num_heads, head_dim, capacity, dtype=dtype, device=device)
        else:
            cache.reset()
        self.caches[key] = cache                            # most recent last
        while len(self.caches) > self.KEEP:
            del self.caches[next(iter(self.caches))]
        return cache
