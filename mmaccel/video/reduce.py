"""Vision token reduction at ingest: which of a segment's tokens enter the KV cache.

- `TemporalDrop` (TimeChat-Online's Differential Token Drop, arXiv 2504.17343; reference video_core.md A.9):
  a token whose region did not change since the previous segment carries nothing new and is dropped.
  Change is the mean absolute pixel difference of the token's region, averaged over the segment's frames
  (`metric="pixel"`, in [0, 1]; a partly filled segment compares with a full one), or
  one minus the cosine similarity of its vision embedding with the same token of the previous segment
  (`metric="feature"`). The survivors keep their own M-RoPE positions, so the model still knows where
  and when each one is.
- `SpatialMerge` (token merging inside a frame, ToMe / MustDrop's spatial stage, A.6): the two most
  similar neighbouring groups of tokens are merged while their cosine similarity is at least
  `threshold`; a merged group enters as the mean of its embeddings at its first token's position.

Each reducer also takes a `keep_ratio` in (0, 1]: at most ceil(keep_ratio · N) of a segment's N tokens
survive (the most changed ones for `TemporalDrop`; merging goes on past the threshold for
`SpatialMerge`). The first segment of a stream has nothing to compare with and enters whole. The ratio
actually kept is reported per frame by the pipeline (`FrameReport.vision_tokens` against
`FrameReport.tokens_in`), so a budget and its outcome are both visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmaccel.errors import check

METRICS = ("pixel", "feature")


def _check_ratio(keep_ratio: float) -> None:
    check(isinstance(keep_ratio, (int, float)) and 0.0 < keep_ratio <= 1.0,
          f"keep_ratio must be in (0, 1], got {keep_ratio!r}")


def _budget(keep_ratio: float, n: int) -> int:
    return max(1, math.ceil(keep_ratio * n - 1e-9))


@dataclass
class Segment:
    """One temporal patch on its way into the cache: its frames (uint8 [T, H, W, 3], host), the vision
    embeddings [N, d] (a reducer may replace rows, e.g. with merged means), the token grid (rows, cols)
    with N = rows · cols, and `keep` [N] (bool): which tokens enter."""

    frames: Tensor
    embeds: Tensor
    grid: tuple[int, int]
    keep: Tensor = field(default=None)

    def __post_init__(self):
        if self.keep is None:
            self.keep = torch.ones(self.embeds.shape[0], dtype=torch.bool, device=self.embeds.device)


class Reducer:
    """Base of the ingest reducers: `__call__(segment)` narrows `segment.keep` (and may rewrite embeds);
    `reset()` forgets the stream (a new stream starts with a whole first segment)."""

    def reset(self) -> None:
        pass

    def __call__(self, segment: Segment) -> Segment:
        raise TypeError(f"{type(self).__name__} does not define how it reduces a segment")


class TemporalDrop(Reducer):
    """Drop tokens whose region did not change since the previous segment (DTD)."""

    def __init__(self, metric: str = "pixel", threshold: float | None = None, keep_ratio: float = 1.0):
        check(metric in METRICS, f"metric must be one of {METRICS}, got {metric!r}")
        _check_ratio(keep_ratio)
        threshold = {"pixel": 0.02, "feature": 0.05}[metric] if threshold is None else threshold
        check(isinstance(threshold, (int, float)) and 0.0 <= threshold <= 2.0,
              f"threshold must be a change in [0, 2] (pixel: mean |difference| in [0, 1]; feature: 1 - cosine), "
              f"got {threshold!r}")
        self.metric, self.threshold, self.keep_ratio = metric, float(threshold), float(keep_ratio)
        self.reset()

    def reset(self) -> None:
        self._previous: Tensor | None = None

    def change(self, segment: Segment) -> Tensor | None:
        """Per token change [N] against the previous segment, or None for a stream's first segment."""
        rows, cols = segment.grid
        if self.metric == "pixel":
            T, H, W, C = segment.frames.shape
            x = segment.frames.float().div(255.0).view(T, rows, H // rows, cols, W // cols, C)
            current = x.mean(0).permute(0, 2, 1, 3, 4).reshape(rows * cols, -1)     # time-averaged regions
        else:
            current = segment.embeds.float()
        previous, self._previous = self._previous, current
        if previous is None or previous.shape != current.shape:
            return None
        if self.metric == "pixel":
            return (current - previous).abs().mean(-1).to(segment.keep.device)
        return 1.0 - torch.nn.functional.cosine_similarity(current, previous, dim=-1)

    def __call__(self, segment: Segment) -> Segment:
        change = self.change(segment)
        if change is None:
            return segment
        change = change.masked_fill(~segment.keep, -1.0)
        keep = segment.keep & (change > self.threshold)
        limit = _budget(self.keep_ratio, change.numel())
        if int(keep.sum()) > limit:
            top = change.topk(limit).indices
            keep = torch.zeros_like(keep)
            keep[top] = True
        segment.keep = keep
        return segment


class SpatialMerge(Reducer):
    """Merge neighbouring tokens of a segment while they are similar (cosine >= threshold), and further
    down to the keep ratio; a merged group is its mean embedding at its first token's position."""

    def __init__(self, threshold: float = 0.9, keep_ratio: float = 1.0):
        check(isinstance(threshold, (int, float)) and -1.0 <= threshold <= 1.0,
              f"threshold must be a cosine similarity in [-1, 1], got {threshold!r}")
        _check_ratio(keep_ratio)
        self.threshold, self.keep_ratio = float(threshold), float(keep_ratio)

    def __call__(self, segment: Segment) -> Segment:
        rows, cols = segment.grid
        n = rows * cols
        alive = segment.keep.cpu().tolist()
        group = list(range(n))                          # each token's group leader (lowest index)
        members = {i: [i] for i in range(n) if alive[i]}
        sums = segment.embeds.float().clone()
        limit = _budget(self.keep_ratio, n)
        neighbours = [(i, i + 1) for i in range(n) if (i + 1) % cols and i + 1 < n] + \
                     [(i, i + cols) for i in range(n - cols)]
        while len(members) > 1:
            pairs = {(min(group[a], group[b]), max(group[a], group[b])) for a, b in neighbours
                     if alive[a] and alive[b] and group[a] != group[b]}
            if not pairs:
                break
            pairs = sorted(pairs)
            a = torch.tensor([p[0] for p in pairs])
            b = torch.tensor([p[1] for p in pairs])
            means = sums / torch.tensor([len(members.get(i, [1])) for i in range(n)], dtype=sums.dtype)[:, None]
            sim = torch.nn.functional.cosine_similarity(means[a], means[b], dim=-1)
            best = int(sim.argmax())
            if float(sim[best]) < self.threshold and len(members) <= limit:
                break
            keep_leader, gone = pairs[best]
            for i in members.pop(gone):
                group[i] = keep_leader
                members[keep_leader].append(i)
            sums[keep_leader] += sums[gone]
        keep = torch.zeros(n, dtype=torch.bool)
        embeds = segment.embeds.clone()
        for leader, group_members in members.items():
            keep[leader] = True
            if len(group_members) > 1:
                embeds[leader] = (sums[leader] / len(group_members)).to(embeds.dtype)
        segment.embeds, segment.keep = embeds, keep.to(segment.keep.device)
        return segment


def reduce_segment(reducers: list[Reducer], segment: Segment) -> Segment:
    for reducer in reducers:
        segment = reducer(segment)
    return segment


def as_reducers(reduction) -> list[Reducer]:
    """None, one reducer or a list of them (applied in order) -> a list, checked."""
    if reduction is None:
        return []
    reducers = list(reduction) if isinstance(reduction, (list, tuple)) else [reduction]
    for r in reducers:
        check(isinstance(r, Reducer), f"reduction must be reducers from mmaccel.video.reduce (TemporalDrop, "
              f"SpatialMerge), got {type(r).__name__}")
    return reducers
