"""What every decode loop shares, written once: the frame of one call (`DecodeCall`: no autograd, peak memory,
wall time, target passes counted in one place, the `Generation` it returns), the tokens each row emits with EOS,
the max-new-tokens cut and finished rows kept on the device (`Emission`), the accepted-length histogram kept on
the device (`AcceptedLengths`) and the all-rows-done check that never drains a GPU queue (`AllDone`).

The chain/tree loop (`core.speculative.decode`) and the loops with a schedule of their own (SJD2's denoised
window, CALM's early exits, ZipAR's wavefront, beam search, masked and next-scale decoding) run on these parts,
so a fix to emission, rollback bookkeeping, statistics or the GPU path is made here once.

`listen_to_emission(listener)` streams a call's tokens as they are committed, whatever the method: within the
block every `Emission` calls `listener(rows)` after each step, `rows` each row's tokens so far (a `RowLists`: read
back from the device only when the listener looks, so a continuous call that listens for a request that may join
and stream pays nothing while none does).

>>> with DecodeCall(model.device) as call:
...     with call.prefill():
...         state = model.prefill(inputs, room)
...     out = Emission(B, max_new_tokens, state.logits.device, eos)
...     ...
...     with call.target_pass():
...         logits = model.step(state, fed)
...     out.emit(kept, n, nxt, active, call.stats.nfe, max_new_tokens)
... generation = call.result(out, max_new_tokens)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.core.model import on_host
from mmaccel.core.stats import DecodeStats, track_peak_memory

_LISTENER: contextvars.ContextVar[Callable[[Sequence[list[int]]], None] | None] = contextvars.ContextVar(
    "emission_listener", default=None)


@contextlib.contextmanager
def listen_to_emission(listener: Callable[[Sequence[list[int]]], None]) -> Iterator[None]:
    """Within the block, each decode call tells `listener(rows)` after every step that emitted, `rows` each
    row's tokens so far (cut at the call's max_new_tokens; a `RowLists`, read on first look: look within the
    call to `listener`, or copy it)."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


@dataclass
class Generation:
    tokens: list[list[int]]   # per row, the generated tokens (prompt excluded), cut at EOS / max_new_tokens
    stats: DecodeStats
    # per row and token, the target pass that committed it (1 = the prefill): tokens sharing a pass
    # came from accepted drafts (or a parallel wavefront); plain AR commits one token per pass
    commit_pass: list[list[int]] | None = None


@contextlib.contextmanager
def target_pass(stats: DecodeStats, phase: str | None = "verify") -> Iterator[None]:
    """Count one pass of the target model in `stats` (timed as `phase`; None: timed by the caller). Loops
    whose caller owns the frame (masked, CSpD, next-scale decoding add to a pipeline's stats) use it directly."""
    with stats.timed(phase) if phase else contextlib.nullcontext():
        yield
    stats.nfe += 1


class DecodeCall:
    """The frame of one decode call: inside it autograd is off, peak memory and the total time are tracked
    into `stats`, and every target pass is counted by `target_pass` (the prefill by `prefill`)."""

    def __init__(self, device: torch.device | str = "cpu", stats: DecodeStats | None = None):
        self.stats = DecodeStats() if stats is None else stats
        self.device = torch.device(device)
        self._frame = contextlib.ExitStack()

    def __enter__(self) -> DecodeCall:
        self._frame.enter_context(torch.inference_mode())
        self._frame.enter_context(track_peak_memory(self.stats, self.device))
        self._frame.enter_context(self.stats.timed("total"))
        return self

    def __exit__(self, *exc) -> bool | None:
        return self._frame.__exit__(*exc)

    def target_pass(self, phase: str | None = "verify") -> contextlib.AbstractContextManager[None]:
        """One pass of the target model (timed as `phase`; None: timed by the caller)."""
        return target_pass(self.stats, phase)

    def prefill(self) -> contextlib.AbstractContextManager[None]:
        """The target's prefill: its first pass."""
        return self.target_pass("prefill")

    def draft_passes(self, n: int) -> None:
        self.stats.draft_passes += n

    def result(self, out: Emission, max_new: int, lengths: AcceptedLengths | None = None) -> Generation:
        """The `Generation` of emission `out` (one host read of the tokens, at the end)."""
        if lengths is not None:
            lengths.fold(self.stats)
        tokens, passes = out.rows(max_new)
        self.stats.new_tokens = sum(len(r) for r in tokens)
        return Generation(tokens, self.stats, passes)


class RowLists(Sequence):
    """Per-row token lists read back from the device only when a proposer asks for them (a proposer
    that keeps host-side state pays that read; the loop itself never does). `padded` [B, L], where
    given, holds the rows on the device, each followed by padding, for proposers that must not wait."""

    def __init__(self, read: Callable[[], list[list[int]]], padded: Tensor | None = None):
        self._read, self._rows, self.padded = read, None, padded

    def _get(self) -> list[list[int]]:
        if self._rows is None:
            self._rows = self._read()
        return self._rows

    def __getitem__(self, i):
        return self._get()[i]

    def __len__(self) -> int:
        return len(self._get())


class Emission:
    """The tokens each row has emitted, the pass that committed each, counts and finished rows, kept
    as device tensors [B, capacity] (+ one scratch column that takes the writes of no token)."""

    def __init__(self, batch: int, capacity: int, device: torch.device, eos: int | None = None,
                 prompts: list[list[int]] | None = None):
        self.tokens = torch.full((batch, capacity + 1), -1, dtype=torch.long, device=device)
        self.passes = torch.zeros(batch, capacity + 1, dtype=torch.long, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.capacity, self.eos, self.prompts = capacity, eos, prompts or [[] for _ in range(batch)]
        self.listener = _LISTENER.get()

    def _tell(self, max_new: int) -> None:
        if self.listener is not None:
            self.listener(RowLists(lambda: self.rows(max_new)[0]))

    def first(self, token: Tensor, nfe: int, max_new: int) -> None:
        """The prefill's token [B]."""
        self.tokens[:, 0] = token
        self.passes[:, 0] = nfe
        self.count += 1
        self.done = self._is_eos(token) | (max_new <= 1)
        self._tell(max_new)

    def restart(self, row: int, token: Tensor, nfe: int, max_new: int, prompt: list[int]) -> None:
        """Row `row` starts over for a request that joins the call (continuous batching): its prompt, and
        `token` (a one-element tensor) its first."""
        self.tokens[row] = -1
        self.passes[row] = 0
        self.tokens[row, 0] = token
        self.passes[row, 0] = nfe
        self.count[row] = 1
        self.done[row] = bool(self._is_eos(token).any()) or max_new <= 1
        self.prompts[row] = list(prompt)

    def _is_eos(self, tokens: Tensor) -> Tensor:
        return torch.zeros_like(tokens, dtype=torch.bool) if self.eos is None else tokens == self.eos

    def emit(self, kept: Tensor, n: Tensor, nxt: Tensor, active: Tensor, nfe: int, max_new: int) -> Tensor:
        """Active row b emits kept[b, :n[b]] then nxt[b], cut after an EOS or at max_new tokens; returns the
        number of tokens each row emitted [B]."""
        B, L = kept.shape
        seq = torch.cat([kept, kept.new_zeros(B, 1)], 1).scatter(1, n[:, None], nxt[:, None])   # [B, L+1]
        j = torch.arange(L + 1, device=seq.device)[None, :]
        eos = self._is_eos(seq) & (j <= n[:, None])
        upto_eos = (eos.cumsum(1) == 0).sum(1) + 1                     # through the first EOS (or all)
        take = torch.minimum(torch.minimum(n + 1, upto_eos), max_new - self.count)
        take = torch.where(active, take, 0)
        written = j < take[:, None]
        slots = torch.where(written, self.count[:, None] + j, self.capacity)
        self.tokens.scatter_(1, slots, seq)
        self.passes.scatter_(1, slots, torch.full_like(seq, nfe))
        self.count += take
        self.done = self.done | (active & ((eos & written).any(1) | (self.count >= max_new)))
        self._tell(max_new)
        return take

    def history(self) -> RowLists:
        """Per row: prompt tokens + every emitted token (read on demand)."""
        return RowLists(lambda: [p + row[:c] for p, row, c in zip(self.prompts, self.tokens.tolist(), self.count.tolist())])

    def row(self, row: int, limit: int) -> tuple[list[int], list[int]]:
        """Row `row`'s tokens and the pass that committed each, up to `limit`."""
        count = min(int(self.count[row]), limit)
        return self.tokens[row, :count].tolist(), self.passes[row, :count].tolist()

    def rows(self, max_new: int) -> tuple[list[list[int]], list[list[int]]]:
        counts = self.count.clamp(max=max_new).tolist()
        return ([row[:c] for row, c in zip(self.tokens.tolist(), counts)],
                [row[:c] for row, c in zip(self.passes.tolist(), counts)])


class AcceptedLengths:
    """How many tokens each active row committed per pass, as a histogram on the device (lengths above
    `most` share the last bin), folded into `DecodeStats.accepted_hist` once, at the end of the call."""

    def __init__(self, most: int, device: torch.device):
        self.most = most
        self.hist = torch.zeros(most + 1, dtype=torch.long, device=device)

    def add(self, lengths: Tensor, active: Tensor) -> None:
        self.hist.index_add_(0, lengths.clamp(max=self.most), active.long())

    def fold(self, stats: DecodeStats) -> None:
        stats.accepted_hist.update({k: v for k, v in enumerate(self.hist.tolist()) if v})


class AllDone:
    """Whether every row is done. On the host a plain read. On a GPU the answer as of the pass before,
    copied into pinned memory behind the queued work: the host reads it once the pass before is
    finished while the latest pass runs, so the queue never drains; the loop may run one pass more,
    on finished rows only (they emit nothing and roll it back)."""

    def __init__(self, device: torch.device):
        self.host = on_host(device)
        if not self.host:
            self.flag = torch.zeros((), dtype=torch.bool, pin_memory=True)
            self.event = None

    def __call__(self, done: Tensor) -> bool:
        if self.host:
            return bool(done.all())
        answer = False
        if self.event is not None:
            self.event.synchronize()
            answer = bool(self.flag)
        self.flag.copy_(done.all(), non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()
        return answer
