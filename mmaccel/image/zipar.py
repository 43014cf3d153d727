"""ZipAR next-set decoding for raster-order image models, optionally with a Jacobi window per row.

ZipAR (He et al., ICML 2025) starts image row r+1 once row r is `s` tokens ahead: column j of
row r may be decoded when the row above has min(j + s, W) tokens. Every forward pass then advances
all active rows at once (a wavefront). As in the official LlamaGen port, row 1 waits for row 0 to
finish, so a W x H grid takes 2W + (H - 2) * s passes instead of W * H; `s = W` is plain raster decoding.

The cache keeps one slot per image position (slot 0 is the class token), written with
`KVCache.place_next`, so

- a query at position p attends to the class token and to the *decoded* positions <= p only;
  positions not generated yet are masked (the official LlamaGen port lets them in as zero keys);
- the first token of a row is predicted from a stand-in for the unfinished row above's last token,
  fed at that token's position; when the row above finishes, its true last token overwrites the
  stand-in's slot in the next pass.

The stand-in (`stand_in`):

- "vertical" (default): the last-column token of the nearest finished row, the decoded token
  closest to the missing one along the image's right edge;
- "copy": the row above's last decoded token, as the official LlamaGen port does. On our models the
  copy puts a mid-row token in the last column, which the model has never seen there: measured on
  the built-in model with teacher forcing, the row-start distribution is 0.39-0.78 TV away from the
  full-context one (s = 8..15), against 0.04-0.05 with the vertical stand-in.

With `jacobi = L > 0` each active row also carries up to L Jacobi drafts (its own SJD window) that
one acceptance rule verifies for every row in the same pass (exact, coupled, or a relaxed rule such
as GSD's groups). A draft's keys are computed when it is fed, one token of the row above earlier than
plain ZipAR feeds that position, so for s < W the output is close to, not token for token, that of
plain ZipAR; for s = W it is exactly raster decoding.

ZipAR shares the decode driver's frame and pass counting (`DecodeCall`) but keeps its own loops: its
tokens land at wavefront positions across the image grid, not at the end of each row's sequence.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.acceptance import RULES
from mmaccel.core.driver import DecodeCall, Generation
from mmaccel.core.model import DecoderModel
from mmaccel.core.sampling import Sampling, TokenSampler, race
from mmaccel.errors import check

STAND_INS = ("vertical", "copy")


def zipar_passes(grid: int, s: int) -> int:
    """Target passes of plain ZipAR on a grid x grid image (prefill included)."""
    return 2 * grid + (grid - 2) * s if s < grid else grid * grid


class _Row:
    """Bookkeeping of one image row of one batch element."""

    __slots__ = ("count", "input", "stand_in", "drafts", "q", "fresh")

    def __init__(self):
        self.count = 0              # tokens decoded in this row (a prefix of its columns)
        self.input: int | None = None  # the token to feed next (at the position before column `count`)
        self.stand_in = False       # the slot before column 0 holds a stand-in, not the true token
        self.drafts: list[int] = []  # Jacobi window: guesses for columns count, count + 1, ...
        self.q: Tensor | None = None  # [len(drafts), V] their draft distributions (SJD), None = point masses
        self.fresh: list[bool] = []


def zipar_decode(model: DecoderModel, inputs: Any, *, grid: int, s: int, jacobi: int = 0, rule: str = "speculative",
                 rule_params: dict[str, Any] | None = None, sampling: Sampling = Sampling(), seed: int = 0,
                 coupled: bool = False, stand_in: str = "vertical") -> Generation:
    """Generate grid x grid image tokens per row of `inputs` with ZipAR window `s` (1 <= s <= grid).

    `jacobi` drafts per active image row are verified with `rule` (any `mmaccel.core.acceptance`
    rule; greedy decoding always verifies greedily). `coupled` fixes the sampling noise per image
    position. `stand_in` picks the row-start stand-in (see the module doc). Returns the raster-order
    tokens and the stats (nfe counts target passes).
    """
    check(isinstance(grid, int) and grid >= 1, f"grid must be an int >= 1, got {grid!r}")
    check(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= grid,
          f"ZipAR window s must be an integer in [1, {grid}] (the grid width), got {s!r}")
    check(isinstance(jacobi, int) and not isinstance(jacobi, bool) and 0 <= jacobi <= grid - 1,
          f"the Jacobi window per row must be an integer in [0, {grid - 1}], got {jacobi!r}")
    check(stand_in in STAND_INS, f"unknown ZipAR stand-in {stand_in!r}; choose from {', '.join(STAND_INS)}")
    check(rule in RULES, f"unknown acceptance rule {rule!r}; choose from {', '.join(RULES)}")
    rule_name = "greedy" if sampling.greedy else rule
    check(rule_name != "greedy" or sampling.greedy, "the greedy rule needs temperature 0")
    params = (rule_params or {}) if rule_name == rule else {}
    if jacobi == 0:
        return _decode_plain(model, inputs, grid, s, sampling, seed, coupled, stand_in)
    return _decode_rows(model, inputs, grid, s, jacobi, rule_name, params, sampling, seed, coupled, stand_in)


def _prefill(model: DecoderModel, inputs: Any, N: int, sampling: Sampling, seed: int, coupled: bool, call: DecodeCall):
    """The prefill (slot 0: class token, 1..N: image, N + 1: scratch) and the first token [B]."""
    with call.prefill():
        state = model.prefill(inputs, N + 1)
    B, V = state.logits.shape
    check(state.cache.capacity >= N + 2, f"the model's cache has {state.cache.capacity} slots, ZipAR needs {N + 2}")
    sampler = TokenSampler(seed, B, V, coupled=coupled, device=state.logits.device, positions=N)
    probs0 = sampling.probs(state.logits)[:, None]
    index = torch.zeros(B, 1, dtype=torch.long, device=state.logits.device)
    first = probs0.argmax(-1)[:, 0] if sampling.greedy else sampler.sample(probs0, index)[:, 0]
    return state, sampler, first


def _decode_plain(model: DecoderModel, inputs: Any, grid: int, s: int, sampling: Sampling, seed: int, coupled: bool,
                  stand_in: str) -> Generation:
    """ZipAR without drafts: every fed row entry decodes one token, so the wavefront is the same for
    every image and known up front (`plain_schedule`); a pass is a gather, one step and one draw for
    the whole batch, with no per-row bookkeeping on the host."""
    N = grid * grid
    with DecodeCall(getattr(model, "device", torch.device("cpu"))) as call:
        stats = call.stats
        state, sampler, first = _prefill(model, inputs, N, sampling, seed, coupled, call)
        B, dev = first.shape[0], first.device
        stats.deviation_per_row = [0.0] * B
        tokens = torch.full((B, N), -1, dtype=torch.long, device=dev)
        tokens[:, 0] = first
        passes = torch.zeros(B, N, dtype=torch.long, device=dev)     # the target pass that committed each token
        passes[:, 0] = stats.nfe
        stats.record_accepted([1] * B)
        for slots, pos, fed, decodes, visible in plain_schedule(grid, s, stand_in, state.cache.capacity, dev):
            state.cache.place_next(slots, visible)
            with call.target_pass():
                logits = model.step(state, tokens[:, fed], pos.expand(B, -1))     # [B, T, V]
                probs = sampling.probs(logits[:, decodes])
                index = (pos[0, decodes] + 1).expand(B, -1)                          # the decoded raster indices
                new = probs.argmax(-1) if sampling.greedy else sampler.sample(probs, index)
            tokens[:, index[0]] = new
            passes[:, index[0]] = stats.nfe
            stats.record_accepted([1] * (B * index.shape[1]))
    stats.new_tokens = B * N
    return Generation(tokens.tolist(), stats, passes.tolist())


@functools.lru_cache(maxsize=32)
def plain_schedule(grid: int, s: int, stand_in: str, capacity: int, device: torch.device) -> tuple[tuple[Tensor, ...], ...]:
    """Plain ZipAR's passes after the prefill, each (slots [1, T], positions [1, T], fed raster indices
    [T], which entries decode [T] bool, visible [1, T, capacity]): `_plan_row_element` run on one image
    whose tokens are their own raster indices, every decode entry emitting its token."""
    W = H = grid
    rows = [_Row() for _ in range(H)]
    raster = torch.full((W * H,), -1, dtype=torch.long)
    raster[0] = rows[0].input = 0
    rows[0].count = 1
    filled = torch.zeros(1, capacity, dtype=torch.bool)
    filled[:, 0] = True
    schedule = []
    while entries := _plan_row_element(rows, raster, W, H, s, 0, stand_in):
        pos = torch.tensor([[p for _, p, _, _ in entries]])
        slots = pos + 1
        stream = torch.tensor([[r for r, _, _, _ in entries]])
        visible = _visibility(filled, slots, pos, stream, torch.ones_like(pos, dtype=torch.bool), capacity)
        decodes = torch.tensor([rows[r].count < W and p == r * W + rows[r].count - 1 for r, p, _, _ in entries])
        for r, p, _, _ in entries:
            if rows[r].count < W and p == r * W + rows[r].count - 1:
                raster[p + 1] = rows[r].input = p + 1
                rows[r].count += 1
        filled[0, slots[0]] = True
        fed = torch.tensor([f for _, _, f, _ in entries])
        schedule.append(tuple(t.to(device) for t in (slots, pos, fed, decodes, visible)))
    return tuple(schedule)


def _decode_rows(model: DecoderModel, inputs: Any, grid: int, s: int, jacobi: int, rule_name: str,
                 params: dict[str, Any], sampling: Sampling, seed: int, coupled: bool, stand_in: str) -> Generation:
    """ZipAR with a Jacobi window per row: each image's rows advance by what their drafts earn, so
    the passes are planned on the host, image by image."""
    H = W = grid
    N = H * W
    device = getattr(model, "device", torch.device("cpu"))
    with DecodeCall(device) as call:
        stats = call.stats
        state, sampler, first = _prefill(model, inputs, N, sampling, seed, coupled, call)
        B = first.shape[0]
        stats.deviation_per_row = [0.0] * B
        capacity = state.cache.capacity
        scratch = N + 1
        tokens = torch.full((B, N), -1, dtype=torch.long)
        tokens[:, 0] = first.cpu()
        passes = torch.zeros(B, N, dtype=torch.long)           # the target pass that committed each token
        passes[:, 0] = stats.nfe
        filled = torch.zeros(B, capacity, dtype=torch.bool)
        filled[:, 0] = True
        rows = [[_Row() for _ in range(H)] for _ in range(B)]
        for b in range(B):
            rows[b][0].count, rows[b][0].input = 1, int(first[b])
        stats.record_accepted([1] * B)

        while True:
            plan = [_plan_row_element(rows[b], tokens[b], W, H, s, jacobi, stand_in) for b in range(B)]
            if all(not entries for entries in plan):
                break
            T = max(len(e) for e in plan)
            pad = (-1, -2, 0, False)                              # padding: no row, scratch slot, token 0
            table = [entries + [pad] * (T - len(entries)) for entries in plan]
            stream = torch.tensor([[e[0] for e in row] for row in table])          # image row (-1 = padding)
            pos = torch.tensor([[e[1] for e in row] for row in table])
            feed = torch.tensor([[e[2] for e in row] for row in table])
            real = torch.tensor([[e[3] for e in row] for row in table])           # decoded tokens, not drafts
            slots = torch.where(stream >= 0, pos + 1, scratch)
            pos = pos.clamp_min(0)
            visible = _visibility(filled, slots, pos, stream, real, capacity)
            state.cache.place_next(slots, visible)
            with call.target_pass():
                logits = model.step(state, feed.to(device), pos.to(device))          # [B, T, V]
                probs = sampling.probs(logits)
                noise = sampler.noise((pos + 1).clamp(max=N - 1))
            new_filled = filled.clone()
            new_filled.scatter_(1, torch.where(real, slots, 0), True)               # slot 0 is always visible
            emitted = _verify_rows(plan, rows, tokens, new_filled, probs, noise, sampler, sampling, rule_name, params,
                                   W, stats)
            passes.masked_fill_((tokens >= 0) & (passes == 0), stats.nfe)
            filled = new_filled
            stats.record_accepted(emitted)

    out = tokens.tolist()
    stats.new_tokens = B * N
    return Generation(out, stats, passes.tolist())


def _plan_row_element(rows: list[_Row], tokens: Tensor, W: int, H: int, s: int, jacobi: int,
                      stand_in: str) -> list[tuple]:
    """The entries (image row, position, token, is_real) one batch element feeds in the next pass."""
    entries = []
    finished = -1                                              # the last finished row (rows finish in order)
    for r, row in enumerate(rows):
        if row.count == W:
            finished = r
            continue
        above = rows[r - 1].count if r > 0 else W
        if r > 0 and row.count == 0:
            if above < (W if r == 1 else min(s, W)):           # row 1 waits for row 0 (official LlamaGen port)
                continue
            last = int(tokens[r * W - 1])
            if last >= 0:
                row.input, row.stand_in = last, False
            else:
                source = finished * W + W - 1 if stand_in == "vertical" else (r - 1) * W + above - 1
                row.input, row.stand_in = int(tokens[source]), True
        elif above < W and above < row.count + s:
            continue                                           # the row above is not far enough ahead
        limit = W if above == W else above - s + 1             # columns < limit may be decoded now
        k = max(0, min(jacobi, limit - row.count - 1, W - 1 - row.count))
        base = r * W + row.count                               # raster index of the next token
        entries.append((r, base - 1, row.input, True))
        _fit_window(row, k)
        entries.extend((r, base + j, row.drafts[j], False) for j in range(k))
    # rows whose stand-in can now be replaced by the finished row above
    for r in range(1, H):
        row = rows[r]
        if row.stand_in and rows[r - 1].count == W and row.count > 0:
            entries.append((r, r * W - 1, int(tokens[r * W - 1]), True))
            row.stand_in = False
    return entries


def _fit_window(row: _Row, k: int) -> None:
    """Make the row's Jacobi window exactly k long (fresh guesses repeat the last one, as SJD's
    horizontal-repeat init)."""
    if len(row.drafts) > k:
        row.drafts, row.fresh = row.drafts[:k], row.fresh[:k]
        row.q = None if row.q is None else row.q[:k]
    while len(row.drafts) < k:
        row.drafts.append(row.drafts[-1] if row.drafts else row.input)
        row.fresh.append(True)
        if row.q is not None:
            row.q = torch.cat([row.q, row.q.new_zeros(1, row.q.shape[1])])


def _visibility(filled: Tensor, slots: Tensor, pos: Tensor, stream: Tensor, real: Tensor, capacity: int) -> Tensor:
    """visible [B, T, capacity]: the class token, decoded positions <= the query's, and the query's own
    row's earlier entries in this pass (its drafts); padding sees only the class token."""
    B, T = slots.shape
    key_pos = torch.arange(capacity)[None, None, :] - 1                       # slot -> image position
    before = key_pos <= pos[:, :, None]
    old = filled[:, None, :] & before
    # entries written in this pass overwrite their slots: decide those from the pass itself
    written = torch.zeros(B, capacity, dtype=torch.bool).scatter_(1, slots, True)
    old &= ~written[:, None, :]
    same_pass = (pos[:, None, :] <= pos[:, :, None]) & (real[:, None, :] | (stream[:, None, :] == stream[:, :, None]))
    same_pass &= (stream[:, None, :] >= 0) & (stream[:, :, None] >= 0)
    new = torch.zeros(B, T, capacity, dtype=torch.bool).scatter_(2, slots[:, None, :].expand(-1, T, -1), same_pass)
    visible = old | new
    visible[:, :, 0] = True
    return visible


def _verify_rows(plan, rows, tokens, filled, probs, noise, sampler, sampling, rule_name, params, W,
                 stats) -> list[int]:
    """Verify every fed row's drafts with one rule call; commit tokens; update the Jacobi windows."""
    V = probs.shape[-1]
    items = []                                                  # (b, r, first column in the pass, k)
    for b, entries in enumerate(plan):
        t = 0
        while t < len(entries):
            r, p, _, is_real = entries[t]
            k = 0
            while t + 1 + k < len(entries) and not entries[t + 1 + k][3] and entries[t + 1 + k][0] == r:
                k += 1
            if rows[b][r].count < W and p == r * W + rows[b][r].count - 1:
                items.append((b, r, t, k))
            t += 1 + k
    if not items:
        return []
    M, K = len(items), max(k for *_, k in items)
    cols = torch.tensor([[t + min(j, k) for j in range(K + 1)] for (_, _, t, k) in items])   # [M, K+1]
    bidx = torch.tensor([b for b, *_ in items])
    p_rows = probs[bidx[:, None], cols]                          # [M, K+1, V]
    e_rows = noise[bidx[:, None], cols]
    drafts = torch.zeros(M, K, dtype=torch.long)
    q = None if rule_name == "greedy" or all(rows[b][r].q is None for b, r, _, _ in items) else torch.zeros(M, K, V)
    for m, (b, r, _, k) in enumerate(items):
        row = rows[b][r]
        drafts[m, :k] = torch.tensor(row.drafts[:k], dtype=torch.long)
        if q is not None:
            one_hot = torch.nn.functional.one_hot(drafts[m, :k], V).float()
            if row.q is not None:
                fresh = torch.tensor(row.fresh[:k], dtype=torch.bool)[:, None]
                q[m, :k] = torch.where(fresh, one_hot, row.q[:k])
            else:
                q[m, :k] = one_hot
    drafts = drafts.to(probs.device)
    if rule_name == "greedy":
        verdict = RULES["greedy"](drafts, None, p_rows)
    else:
        uniforms = sampler.uniform((M, K))
        verdict = RULES[rule_name](drafts, None if q is None else q.to(probs.device), p_rows, uniforms, e_rows, **params)
    n_raw = verdict.num_accepted.cpu()
    ks = torch.tensor([k for *_, k in items])
    n = torch.minimum(n_raw, ks)
    bonus = p_rows.argmax(-1) if sampling.greedy else race(p_rows, e_rows)          # [M, K+1]
    nxt = torch.where(n_raw >= ks, bonus[torch.arange(M), ks].cpu(), verdict.next_token.cpu())   # host-side rows
    if verdict.deviation is not None:
        spent = verdict.deviation.cpu()
        stats.deviation += float(spent.sum())
        for m, (b, *_) in enumerate(items):
            stats.deviation_per_row[b] += float(spent[m])
    emitted = []
    for m, (b, r, _t, k) in enumerate(items):
        row, nm = rows[b][r], int(n[m])
        new = row.drafts[:nm] + [int(nxt[m])]
        base = r * W + row.count
        tokens[b, base : base + len(new)] = torch.tensor(new)
        for j in range(nm):                                      # accepted drafts' slots now hold real tokens
            filled[b, base + j + 1] = True
        row.count += len(new)
        row.input = new[-1]
        emitted.append(len(new))
        # Jacobi update: the pass's outputs after the emitted token become the next guesses
        later = list(range(nm + 1, k + 1))
        if later and row.count < W:
            lp = p_rows[m, later]                                  # column j predicts raster index base + j
            if sampling.greedy:
                guess = lp.argmax(-1)
            elif sampler.coupled:
                guess = race(lp, _row_noise(sampler, b, [base + j for j in later]))
            else:
                guess = race(lp, sampler.exponential(tuple(lp.shape)))
            row.drafts, row.fresh = guess.tolist(), [False] * len(later)
            row.q = None if sampling.greedy or sampler.coupled else lp.cpu()
        else:
            row.drafts, row.fresh, row.q = [], [], None
    return emitted


def _row_noise(sampler: TokenSampler, b: int, index: list[int]) -> Tensor:
    """The position-fixed noise [len(index), V] of batch element b at raster indices `index`."""
    full = torch.zeros(sampler.batch_size, len(index), dtype=torch.long)
    full[b] = torch.tensor(index)
    return sampler.noise(full)[b]
