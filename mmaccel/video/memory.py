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

Inside a segment single vision entries can go too (`evict_entries`, KV-side token reduction:
`mmaccel.video.kv_reduce`): the segment stays one unit with its position run, its survivors keep their
own positions (no rotation), and its size is from then on its surviving entries, which is all that
`plan_eviction` and `evict` count.

Eviction is a pass over the whole cache (pack, rotate), so it goes in chunks: a window that overflows is
cut to `1 - chunk` of its size, and the next eviction comes only after that many more entries. Appends
between evictions cost what they cost before the cache filled (the cache never exceeds its budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mmaccel.errors import check

TEXT, VISION = 0, 1


@dataclass
class KVBudget:
    """Cache entries kept per stream: `sink` first entries, the last `vision` entries of frames, the last
    `text` entries of questions and answers. The cache never holds more than their sum plus the room an
    answer needs. The defaults hold a 300-frame stream of the built-in model (9 entries a frame) whole,
    about as long as its training streams (up to 320 frames); longer streams evict. A window that
    overflows is cut by a `chunk` of its size at once (0: by just enough, on every append)."""

    sink: int = 16
    vision: int = 3072
    text: int = 512
    chunk: float = 0.125

    def __post_init__(self):
        for name in ("sink", "vision", "text"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, f"KV budget {name} must be an int >= 0, got {value!r}")
        check(self.vision > 0, "the KV budget must keep at least one frame's vision entries (vision > 0)")
        check(isinstance(self.chunk, (int, float)) and 0.0 <= self.chunk < 1.0,
              f"KV budget chunk must be a fraction in [0, 1), got {self.chunk!r}")

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
    born: list[int] = field(default_factory=list)             # per unit: its serial number in the stream
    added: int = 0                                            # units ever added (the next serial number)

    def add_text(self, first_position: int, count: int) -> None:
        for i in range(count):
            self._add(TEXT, first_position + i, first_position + i + 1, 1)

    def add_segment(self, start: int, stop: int, entries: int) -> None:
        self._add(VISION, start, stop, entries)

    def truncate(self, entries: int) -> None:
        """Forget entries past `entries` (a decode rolled them back)."""
        del self.entry_unit[entries:]
        last = self.entry_unit[-1] + 1 if self.entry_unit else 0
        for column in (self.kind, self.start, self.stop, self.born):
            del column[last:]

    def _add(self, kind: int, start: int, stop: int, entries: int) -> None:
        unit = len(self.kind)
        self.kind.append(kind)
        self.start.append(start)
        self.stop.append(stop)
        self.born.append(self.added)
        self.added += 1
        self.entry_unit.extend([unit] * entries)


def plan_eviction(units: Units, budget: KVBudget, incoming: int, incoming_kind: int) -> list[bool] | None:
    """Which units to keep so that `incoming` more entries of `incoming_kind` fit the budget, or None
    when nothing has to go. The units wholly inside the first `sink` entries stay; then, per kind, the newest
    units while they fit its window less the budget's chunk (the first that does not fit ends the window:
    it stays contiguous)."""
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
    limit = {kind: size - int(budget.chunk * size) for kind, size in limit.items()}
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
    units.born = [units.born[u] for u in kept]
    return position


def segment_runs(units: Units) -> list[tuple[int, int, int]]:
    """(unit, first entry, one past its last entry) of every vision segment, in cache order."""
    runs, first = [], 0
    for i, u in enumerate(units.entry_unit):
        if i + 1 == len(units.entry_unit) or units.entry_unit[i + 1] != u:
            if units.kind[u] == VISION:
                runs.append((u, first, i + 1))
            first = i + 1
    return runs


@torch.inference_mode()
def evict_entries(state, units: Units, keep: list[bool], marks: tuple[int, int] = (1, 1)) -> int:
    """Drop single vision entries (B = 1): `keep` [entries] says which cache entries stay. Text entries and
    the `marks` (entries opening, closing) of every segment must stay; segments keep their units and
    position runs and the survivors keep their positions, so they are packed to the front of every
    layer's cache without rotation. Returns the entries dropped; the caller moves the stream
    (`model.move_to(state, next_position)`): the next text position is unchanged, its cache slot is not."""
    cache = state.cache
    length = len(units.entry_unit)
    check(length == int(cache.lengths[0]), f"stream bookkeeping ({length} entries) is out of step with the cache "
          f"({int(cache.lengths[0])})")
    check(len(keep) == length, f"keep must say for each of the {length} cache entries whether it stays, "
          f"got {len(keep)}")
    protected = [units.kind[u] == TEXT for u in units.entry_unit]
    opened, closed = marks
    for _, first, stop in segment_runs(units):
        check(stop - first >= opened + closed, f"a segment of {stop - first} entries cannot hold its {opened} + "
              f"{closed} marks")
        for i in (*range(first, first + opened), *range(stop - closed, stop)):
            protected[i] = True
    check(all(k for k, p in zip(keep, protected) if p), "only vision tokens inside segments can be dropped: "
          "text entries and segment marks stay (evict whole units with `evict`)")
    index = [i for i, k in enumerate(keep) if k]
    dropped = length - len(index)
    if dropped == 0:
        return 0
    first = next(i for i, k in enumerate(keep) if not k)      # entries before the first dropped one stay put
    idx = torch.tensor(index[first:], dtype=torch.long, device=cache.device)
    n = len(index)
    for layer in range(len(cache.k)):
        cache.k[layer][:, :, first:n] = cache.k[layer][:, :, idx]
        cache.v[layer][:, :, first:n] = cache.v[layer][:, :, idx]
    cache.lengths.fill_(n)
    units.entry_unit = [units.entry_unit[i] for i in index]
    return dropped
