"""Logits processing (temperature, top-k, top-p), seeded token sampling and classifier-free guidance.

Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. is an exact categorical
draw from p (unnormalised p is fine), needs no host sync and takes its randomness as a tensor, so
acceptance rules stay pure functions of pre-drawn noise (as in vLLM and FlashInfer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.core.model import DecoderModel, DecodeState, as_row_counts, on_host
from mmaccel.errors import check


@dataclass(frozen=True)
class Sampling:
    """How target (and draft) logits become a distribution. temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0          # 0 = no top-k
    top_p: float = 1.0      # 1 = no nucleus

    def __post_init__(self):
        check(isinstance(self.temperature, (int, float)) and self.temperature >= 0,
              f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        check(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an int >= 0, got {self.top_k}")
        check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def warp(self, logits: Tensor) -> Tensor:
        """Processed logits [..., V] (float32): temperature, then top-k, then top-p; removed = -inf."""
        logits = logits.float()
        if self.greedy:
            return logits
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            # drop a token when the mass *before* it already reaches top_p (the top token always stays)
            drop_sorted = (cum - sorted_logits.softmax(-1)) >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits

    def probs(self, logits: Tensor) -> Tensor:
        """Target distribution [..., V]; for greedy, the point mass on the argmax."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        return self.warp(logits).softmax(-1)


def race(probs: Tensor, exponentials: Tensor) -> Tensor:
    """Exact categorical sample per row of `probs` [..., V] given Exp(1) noise of the same shape."""
    return (probs / exponentials).argmax(-1)


class TokenSampler:
    """Source of the Exp(1) noise that sampling consumes; seeded, so same seed → same output.

    `noise(rows, index)` returns exponentials [B, T, V] for generated-token indices `index` [B, T].
    The default draws fresh noise on every call; `coupled=True` fixes one noise vector per
    (row, generated index), so re-sampling a position under a slightly changed distribution tends
    to give the same token (Gumbel coupling of SCD), and any method that uses it reproduces plain
    AR sampling with the same seed token for token.
    """

    BLOCK = 32  # generated positions per noise block in coupled mode

    def __init__(self, seed: int, batch_size: int, vocab_size: int, coupled: bool = False, device="cpu",
                 positions: int | None = None):
        """On a GPU the noise is drawn there (a host draw would be a copy the host waits for); coupled
        noise then needs `positions`, the most generated positions a call can ask for: the table is
        drawn once, so no request has to read an index on the host. On the host `positions`, where
        given, draws the table up front too (one gather per request); without it the table grows."""
        check(isinstance(seed, int), f"seed must be an int, got {type(seed).__name__}")
        self.seed, self.batch_size, self.vocab_size, self.coupled = seed, batch_size, vocab_size, coupled
        self.device = torch.device(device)
        self.host = on_host(self.device)
        where = "cpu" if self.host else self.device
        self.generator = torch.Generator(device=where).manual_seed(seed)
        self._row_gens = [torch.Generator(device=where).manual_seed(seed * 1_000_003 + r) for r in range(batch_size)]
        self._tables = [torch.empty(0, vocab_size, device=where) for _ in range(batch_size)]  # per row: noise so far
        self._table: Tensor | None = None                                   # [B, positions', V] when drawn up front
        if coupled and (positions is not None or not self.host):
            check(positions is not None, "coupled noise on a GPU needs the number of positions up front")
            for r in range(batch_size):
                self._grow(r, positions)
            self._table = torch.stack(self._tables)

    def uniform(self, shape: tuple[int, ...]) -> Tensor:
        if self.host:
            return torch.rand(shape, generator=self.generator).to(self.device)
        return torch.rand(shape, generator=self.generator, device=self.device)

    def exponential(self, shape: tuple[int, ...]) -> Tensor:
        if self.host:
            return torch.empty(shape).exponential_(generator=self.generator).to(self.device)
        return torch.empty(shape, device=self.device).exponential_(generator=self.generator)

    def _grow(self, r: int, need: int) -> None:
        """Row r's noise table to at least `need` positions, block by block: the same noise whatever
        the order of requests."""
        have = self._tables[r].shape[0]
        if have < need:
            fresh = [torch.empty(self.BLOCK, self.vocab_size, device=self._tables[r].device)
                     .exponential_(generator=self._row_gens[r]) for _ in range(-(-(need - have) // self.BLOCK))]
            self._tables[r] = torch.cat([self._tables[r], *fresh])

    def noise(self, index: Tensor) -> Tensor:
        """Exp(1) noise [B, T, V] for generated-token indices `index` [B, T]."""
        B, T = index.shape
        if not self.coupled:
            return self.exponential((B, T, self.vocab_size))
        if self._table is not None:         # one gather (on a GPU the only way: no index is read on the host)
            if self.host:
                check(int(index.max()) < self._table.shape[1],
                      f"coupled noise was drawn for {self._table.shape[1]} positions; index {int(index.max())} asked")
            rows = torch.arange(B, device=self.device)[:, None]
            return self._table[rows, index.to(self.device)]
        index = index.cpu()
        out = torch.empty(B, T, self.vocab_size)
        for r in range(B):
            self._grow(r, int(index[r].max()) + 1)
            out[r] = self._tables[r][index[r]]
        return out.to(self.device)

    def sample(self, probs: Tensor, index: Tensor) -> Tensor:
        """Tokens [B, T] drawn from `probs` [B, T, V] at generated indices `index` [B, T]."""
        return race(probs, self.noise(index))


class CFGState(DecodeState):
    """State of a CFG-wrapped model: the inner state holds the conditional rows then the unconditional."""

    def __init__(self, inner: DecodeState, batch_size: int):
        super().__init__(cache=inner.cache, logits=None, hidden=None)
        self.inner, self._batch = inner, batch_size

    @property
    def batch_size(self) -> int:
        return self._batch

    @property
    def lengths(self) -> Tensor:
        return self.inner.lengths[: self._batch]

    def rollback(self, n) -> None:
        counts = as_row_counts(n, self._batch, device=self.inner.lengths.device)
        self.inner.rollback(torch.cat([counts, counts]))

    def keep_appended(self, offsets: Tensor, counts: Tensor, appended: int) -> None:
        counts = as_row_counts(counts, self._batch, "counts", self.inner.lengths.device)
        self.inner.keep_appended(torch.cat([offsets, offsets]), torch.cat([counts, counts]), appended)


class CFG:
    """Classifier-free guidance as a model wrapper: logits = u + scale * (c - u).

    The batch is doubled (conditional rows, then unconditional), so every method works with CFG
    unchanged: drafts are verified against the guided distribution.
    `prefill(inputs)` takes `(cond_rows, uncond_rows)`, two sequences of equal length.
    """

    def __init__(self, model: DecoderModel, scale: float):
        check(isinstance(scale, (int, float)) and scale >= 0, f"cfg_scale must be >= 0, got {scale}")
        self.model, self.scale = model, float(scale)
        self.vocab_size = model.vocab_size

    def prefill(self, inputs, room: int) -> CFGState:
        check(isinstance(inputs, tuple) and len(inputs) == 2,
              "CFG.prefill takes (conditional_inputs, unconditional_inputs)")
        cond, uncond = list(inputs[0]), list(inputs[1])
        check(len(cond) == len(uncond) and len(cond) > 0,
              f"CFG needs as many unconditional rows as conditional ones, got {len(cond)} and {len(uncond)}")
        inner = self.model.prefill(cond + uncond, room)
        state = CFGState(inner, len(cond))
        state.logits = self._mix(inner.logits)
        state.hidden = None if inner.hidden is None else inner.hidden[: len(cond)]
        return state

    def admit(self, state: CFGState, row: int, inputs) -> DecodeState:
        """Row `row` starts over on `inputs` = (conditional input, unconditional input) (continuous batching): each
        into its half of the doubled batch. Returns the row's own state: guided logits [1, V], its hidden states."""
        cond, uncond = inputs
        c = self.model.admit(state.inner, row, cond)
        u = self.model.admit(state.inner, state.batch_size + row, uncond)
        return DecodeState(cache=c.cache, logits=self._mix(torch.cat([c.logits, u.logits])), hidden=c.hidden)

    def early_exit(self, exit_layer: int, head=None) -> CFG:
        """The guided early-exit draft view of the wrapped model (self-speculation under CFG)."""
        check(hasattr(self.model, "early_exit"), f"{type(self.model).__name__} offers no early-exit view")
        return CFG(self.model.early_exit(exit_layer, head), self.scale)

    def _mix(self, logits: Tensor) -> Tensor:
        c, u = logits.chunk(2, dim=0)
        return u + self.scale * (c - u)

    def step(self, state: CFGState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None, **inputs: Tensor) -> Tensor:
        """One guided step; `inputs` (a model's extra per-token inputs, e.g. `embeds`) are doubled like the tokens."""
        if positions is not None:  # explicit positions are given for the conditional rows
            shift = (state.inner.lengths[state.batch_size :] - state.lengths).to(positions.device)
            positions = torch.cat([positions, positions + shift[:, None]])
        if tree_mask is not None and tree_mask.shape[0] > 1:
            tree_mask = torch.cat([tree_mask, tree_mask])
        extra = {name: torch.cat([x, x]) for name, x in inputs.items()}
        logits = self.model.step(state.inner, torch.cat([tokens, tokens]), positions, tree_mask, **extra)
        if state.inner.hidden is not None:
            state.hidden = state.inner.hidden[: state.batch_size]
        return self._mix(logits)
