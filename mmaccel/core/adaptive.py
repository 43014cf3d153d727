"""Adaptive drafting: each pass drafts as many tokens as are expected to pay, none when drafting does not.

A draft method's best draft length depends on how often its drafts are accepted (high in the domain its
drafter was trained on, low outside it) and on what a verify pass costs at this batch size (on a CPU a
pass over k + 1 tokens costs nearly (k + 1) plain steps at batch 8, hardly more than one at batch 1). Neither
is known before decoding. So, as ADED (Liu et al. 2024) and SVIP (Zhang et al. 2025) do for LLMs, the
length is chosen as the call decodes: from each row's acceptance so far and, unlike them, from the measured
seconds of this process's passes by the draft length (0: a plain greedy step), read against the engine's
measurement of what the target's pass costs at each width and batch size (`prior`, e.g.
`mmaccel.engine.pass_costs`): a pass drafting d then costs a * shape(d) + b * d, the target's pass at width
d + 1 plus d drafting steps, with a and b fitted to the passes seen. A row's acceptance is kept
as how often it accepted at least j drafts, for each j (not one rate per draft: drafts are accepted in
runs, so a rate would undervalue long chains), starting from what the method's earlier rows and calls
showed. A pass drafts the k that maximises expected tokens per second (a tree: all of it or nothing), and
k = 0 (a plain step, the proposer catching up later) when no k beats plain decoding. After a run of plain
steps of the method (`PROBE_AFTER`, longer where a draft pass costs several plain steps) it drafts once
more to see whether acceptance came back.

Greedy verification emits greedy's tokens whatever k each pass takes, so the choice changes the speed
only. It reads the accepted counts and the clock every pass, so it runs on the host; on a GPU (where the
loop never waits for the host) and under sampled rules (whose seeded draws depend on the pass widths) k
stays fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

PROBE_AFTER = 2         # plain steps of a method, at least, before it drafts again to re-measure acceptance
PROBE_SHARE = 0.015     # ... and more where a probe costs more: its expected loss is at most this share of them
DECAY = 0.8             # weight of a row's earlier passes in its acceptance estimate, per pass
PRIOR_TRIES = 2.0       # pseudo-passes of the method's pooled reach that start every row's estimate
PRIOR_REACH = 0.8       # before any pass: a row accepts at least j drafts 0.8 ** j of the time
MEAN_RATE = 0.2         # how fast a draft length's mean seconds follow new passes
POOLED_RATE = 0.05      # ... and the method's pooled reach (a prior: the method's usual, not its latest)
SURE_AFTER = 3          # passes of one draft length after which its own mean is used rather than the line


Shape = Callable[[int], float]     # drafts -> the target's pass feeding drafts + 1 tokens, relative to one token


@dataclass
class PassCosts:
    """Seconds of one pass by its draft length (0: a plain step; a tree: its nodes) for one target, method and
    batch size; `shape`: what the engine measured the target's pass to cost by width at this batch size."""

    seconds: dict[int, float] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    shape: Shape | None = None

    def add(self, drafts: int, seconds: float) -> None:
        mean = self.seconds.get(drafts)
        self.seconds[drafts] = seconds if mean is None else mean + MEAN_RATE * (seconds - mean)
        self.seen[drafts] = self.seen.get(drafts, 0) + 1

    def estimate(self, drafts: int) -> float | None:
        """Expected seconds of a pass feeding `drafts` drafts: their own mean once seen `SURE_AFTER` times (a
        plain step: once), else the fit of a * shape(d) + b * d to the passes seen (weighted by how often; before
        any, shape(d) itself: seconds in units of a plain step). Without a shape, a line through the means of
        the draft counts seen; with one count d seen besides plain steps, half the extra cost of d drafts is
        taken as the price of drafting at all and half as growing with the count. None while unknown."""
        if (drafts == 0 and 0 in self.seconds) or self.seen.get(drafts, 0) >= SURE_AFTER:
            return self.seconds[drafts]
        if self.shape is not None:
            a, b = self._fit(self.shape)
            return max(a * self.shape(drafts) + b * drafts, 1e-9)
        if drafts == 0:
            return None
        points = [(d, s, min(self.seen[d], 8)) for d, s in self.seconds.items() if d > 0]
        if len(points) == 1 and 0 in self.seconds:
            (d, s, _), plain = points[0], self.seconds[0]
            return plain + (s - plain) * (1 + drafts / d) / 2
        if len(points) < 2:
            return self.seconds.get(drafts)
        total = sum(w for _, _, w in points)
        mean_d = sum(w * d for d, _, w in points) / total
        mean_s = sum(w * s for _, s, w in points) / total
        spread = sum(w * (d - mean_d) ** 2 for d, _, w in points)
        slope = max(sum(w * (d - mean_d) * (s - mean_s) for d, s, w in points) / spread, 0.0)
        return max(mean_s + slope * (drafts - mean_d), 1e-9)

    def _fit(self, shape: Shape) -> tuple[float, float]:
        """(a, b) of seconds = a * shape(d) + b * d by weighted least squares over the passes seen, b >= 0 (with
        a single draft count seen, or none, b = 0: drafting is taken to cost what the target's width does)."""
        points = [(shape(d), d, s, min(self.seen[d], 8)) for d, s in self.seconds.items()]
        if not points:
            return 1.0, 0.0
        ff = sum(w * f * f for f, _, _, w in points)
        fs = sum(w * f * s for f, _, s, w in points)
        if len({d for _, d, _, _ in points}) > 1:
            fd = sum(w * f * d for f, d, _, w in points)
            dd = sum(w * d * d for _, d, _, w in points)
            ds = sum(w * d * s for _, d, s, w in points)
            det = ff * dd - fd * fd
            if det > 0:
                a, b = (fs * dd - fd * ds) / det, (ff * ds - fd * fs) / det
                if a > 0 and b >= 0:
                    return a, b
        return fs / ff, 0.0


@dataclass
class Pooled:
    """What one method measured over every call and row: how often a pass that drafted j accepted at least j
    (`reach[j - 1]`: a new row's prior), and its plain steps since it last drafted (probes count them)."""

    reach: list[float] = field(default_factory=list)
    plain_run: int = 0


@dataclass
class AdaptiveDrafting:
    """What a pipeline has measured: pass costs by (method, batch size) and acceptance by method (`Pooled`). Hand
    it to `LoopConfig(adaptive=...)`; a pipeline keeps one for its lifetime, so each call starts from what the
    earlier ones measured."""

    costs: dict[tuple, PassCosts] = field(default_factory=dict)
    pooled: dict[tuple, Pooled] = field(default_factory=dict)
    # rows -> the shape of the target's pass by width at that batch size (`PassCosts.shape`), None: unknown
    prior: Callable[[int], Shape | None] | None = None

    def for_call(self, method: tuple, rows: int, most: int, depth: int | None = None) -> DraftLengths:
        """The chooser of one decode call of `method` (a key) over `rows` rows, drafting at most `most` tokens a
        pass; a tree of `depth` (`most` nodes) drafts all of them or none."""
        key = (*method, rows)
        if key not in self.costs:
            self.costs[key] = PassCosts(shape=None if self.prior is None else self.prior(rows))
        return DraftLengths(self.costs[key], self.pooled.setdefault(method, Pooled()), rows, most, depth)


class DraftLengths:
    """The draft length of each pass of one decode call (see the module doc)."""

    def __init__(self, costs: PassCosts, pooled: Pooled, rows: int, most: int, depth: int | None = None):
        self.costs, self.pooled, self.most = costs, pooled, most
        self.tree = depth is not None
        self.depth = most if depth is None else depth          # the most drafts one path can accept
        pooled.reach.extend(PRIOR_REACH ** j for j in range(len(pooled.reach) + 1, self.depth + 1))
        # row r's decayed count of passes that accepted at least j drafts (hits[r][j - 1]) of those drafting j
        self.hits = [[0.0] * self.depth for _ in range(rows)]
        self.tries = [[0.0] * self.depth for _ in range(rows)]

    def choose(self, active: list[bool]) -> int:
        costs = self.costs
        if costs.estimate(self.most) is None:
            return self.most                    # without a shape, the first pass shows what drafting costs
        if costs.seconds and 0 not in costs.seconds:
            return 0                            # ... and, once a pass drafted, a plain step what it has to beat
        plain = costs.estimate(0)
        options = [self.most] if self.tree else range(1, self.most + 1)
        tokens = {k: self._tokens(k, active) for k in options}
        seconds = {k: costs.estimate(k) or float("inf") for k in options}
        best = max(options, key=lambda k: tokens[k] / seconds[k])
        if tokens[best] / seconds[best] > 1.0 / plain:
            return best
        # a probe costs what its pass takes beyond the plain steps it is expected to save
        loss = (seconds[best] - plain * tokens[best]) / plain
        return best if self.pooled.plain_run >= max(PROBE_AFTER, loss / PROBE_SHARE) else 0

    def record(self, drafts: int, accepted: list[int], active: list[bool], seconds: float | None) -> None:
        """A pass chose `drafts` (a tree: its nodes), row r kept `accepted[r]` of them; it took `seconds` (None:
        not a pass of its own, e.g. drafts the prefill scored). A row that drafted fewer (a chain that stops
        where the drafter is unsure, an n-gram without a match) accepted none of those it did not draft: the
        estimate is of what a pass asking `drafts` yields, as its measured cost is."""
        if seconds is not None:
            self.costs.add(drafts, seconds)
        if drafts == 0:
            self.pooled.plain_run += 1
            return
        self.pooled.plain_run = 0
        rows = [r for r, a in enumerate(active) if a]
        reach = self.pooled.reach
        for j in range(1, min(drafts, self.depth) + 1):
            for r in rows:
                self.hits[r][j - 1] = DECAY * self.hits[r][j - 1] + (accepted[r] >= j)
                self.tries[r][j - 1] = DECAY * self.tries[r][j - 1] + 1
            if rows:
                share = sum(accepted[r] >= j for r in rows) / len(rows)
                reach[j - 1] += POOLED_RATE * (share - reach[j - 1])

    def _tokens(self, k: int, active: list[bool]) -> float:
        """Expected tokens per active row of a pass drafting `k` (a tree: its depth): 1 + the sum over j <= k of
        how often the row accepts at least j drafts."""
        rows = [r for r, a in enumerate(active) if a] or [0]
        reach, total = self.pooled.reach, float(len(rows))
        for r in rows:
            for j in range(1, min(k, self.depth) + 1):
                total += (self.hits[r][j - 1] + PRIOR_TRIES * reach[j - 1]) / (self.tries[r][j - 1] + PRIOR_TRIES)
        return total / len(rows)
