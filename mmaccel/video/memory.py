"""Bounded KV memory for streams of any length: attention sinks + a recent-vision window + a longer
text window (StreamingVLM, arXiv 2510.09608; reference video_core.md A.9), with contiguous RoPE.

The cache holds *units*: a text token, or a whole vision segment (`<vision_start>`, its tokens,
`<vision_end>`). Each unit occupies a run of M-RoPE positions [start, stop). When the cache would
overflow, the oldest vision units beyond the vision window and the oldest text beyond the text window
are evicted (the first `sink` entries never are), the survivors are packed to the front of the cache,
and every surviving unit is moved down the position axis so the units stay contiguous: positions
never grow past sink + windows, the range the model was trained on, however long the stream.

Moving a unit by d positions rotates its cached keys by -d: RoPE keys are R(p)·k, and
R(p - d)·k = R(-d)·R(p)·k. With M-RoPE each frequency band reads one of the (t, h, w) components;
shifting all three by the same d rotates every band by -d·θ, which is the plain 1-D rotation, so
one rotation serves Qwen's 3-D ids too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmaccel.errors import check

TEXT, VISION = 0, 1


@dataclass
class KVBudget:
    """Cache entries kept per stream: `sink` first entries, the last `vision` entries of frames, the last
    `text` entries of questions and answers. The cache never holds more than their sum plus the room an
    answer needs."""

    sink: int = 16
    vision: int = 1024
    text: int = 256

    def __post_init__(self):
        for name in ("sink", "vision", "text"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, f"KV budget {name} must be an int >= 0, got {value!r}")
        check(self.vision > 0, "the KV budget must keep at least one frame's vision entries (vision > 0)")

    @property
    def total(self) -> int:
        return self.sink + self.vision + self.text


@dataclass
class Units:
    """Host bookkeeping of a B = 1 stream's cache: per entry its unit, per unit its kind and position run."""

    entry_unit: list[int] = field(default_factory=list)       # per cache entry
    kind: list[int] = field(default_factory=list)             # per unit: TEXT or VISION
    start: list[int] = field(default_factory=list)            # per unit: first M-RoPE position
    stop: list[int] = field(default_factory=list)             # per unit: one past its last position

    def add_text(self, first_position: int, count: int) -> None:
        for i in range(count):
            self._add(TEXT, first_position + i, first_position + i + 1, 1)

    def add_segment(self, start: int, stop: int, entries: int) -> None:
        self._add(VISION, start, stop, entries)

    def truncate(self, entries: int) -> None:
        """Forget entries past `entries` (a decode rolled them back)."""
        del self.entry_unit[entries:]
        last = self.entry_unit[-1] + 1 if self.entry_unit else 0
        for column in (self.kind, self.start, self.stop):
            del column[last:]

    def _add(self, kind: int, start: int, stop: int, entries: int) -> None:
        unit = len(self.kind)
        self.kind.append(kind)
        self.start.append(start)
        self.stop.append(stop)
        self.entry_unit.extend([unit] * entries)


def plan_eviction(units: Units, budget: KVBudget, incoming: int, incoming_kind: int) -> list[bool] | None:
    """Which units to keep so that `incoming` more entries of `incoming_kind` fit the budget, or None
    when nothing has to go. The units wholly inside the first `sink` entries stay; then, per kind, the newest
    units while they fit its window (the first that does not fit ends the window: it stays contiguous)."""
    check(incoming <= (budget.vision if incoming_kind == VISION else budget.text),
          f"{incoming} new {'vision' if incoming_kind == VISION else 'text'} entries are more than the KV budget "
          f"keeps for them ({budget}); raise the budget")
    sizes = [0] * len(units.kind)
    for u in units.entry_unit:
        sizes[u] += 1
    sinks = set(units.entry_unit[: budget.sink]) - set(units.entry_unit[budget.sink:])     # units wholly inside
    limit = {VISION: budget.vision, TEXT: budget.text}
    used = {VISION: 0, TEXT: 0}
    used[incoming_kind] = incoming
    for u, size in enumerate(sizes):
        if u not in sinks:
            used[units.kind[u]] += size
    if used[VISION] <= limit[VISION] and used[TEXT] <= limit[TEXT]:
        return None
    keep = [u in sinks for u in range(len(sizes))]
    used = {VISION: 0, TEXT: 0}
    used[incoming_kind] = incoming
    closed = set()
    for u in range(len(sizes) - 1, -1, -1):
        kind = units.kind[u]
        if keep[u] or kind in closed:
            continue
        if used[kind] + sizes[u] <= limit[kind]:
            used[kind] += sizes[u]
            keep[u] = True
        else:
            closed.add(kind)
    return keep


@torch.inference_mode()
def evict(state, units: Units, keep: list[bool], rotate) -> int:
    """Pack the kept units' entries to the front of every layer's cache (B = 1), move the kept units down
    the position axis so they are contiguous from 0, and rotate their keys to match (`rotate(keys
    [1, H, n, D], shift [n]) -> keys` applies R(-shift)). Returns the next text position."""
    cache = state.cache
    check(len(units.entry_unit) == int(cache.lengths[0]), f"stream bookkeeping ({len(units.entry_unit)} entries) is "
          f"out of step with the cache ({int(cache.lengths[0])})")
    kept = [u for u, k in enumerate(keep) if k]
    new_start, position = {}, 0
    for u in kept:
        new_start[u] = position
        position += units.stop[u] - units.start[u]
    index = [i for i, u in enumerate(units.entry_unit) if keep[u]]
    shift = torch.tensor([units.start[units.entry_unit[i]] - new_start[units.entry_unit[i]] for i in index],
                         dtype=torch.long)
    idx = torch.tensor(index, dtype=torch.long, device=cache.device)
    n = len(index)
    for layer in range(len(cache.k)):
        keys = cache.k[layer][:, :, idx]
        cache.k[layer][:, :, :n] = rotate(keys, shift) if bool((shift != 0).any()) else keys
        cache.v[layer][:, :, :n] = cache.v[layer][:, :, idx]
    cache.lengths.fill_(n)
    renumber = {u: j for j, u in enumerate(kept)}
    units.entry_unit = [renumber[units.entry_unit[i]] for i in index]
    units.stop = [new_start[u] + units.stop[u] - units.start[u] for u in kept]
    units.start = [new_start[u] for u in kept]
    units.kind = [units.kind[u] for u in kept]
    return position
