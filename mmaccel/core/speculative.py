"""The draft → verify → accept loop, chain or tree, batched with ragged acceptance.

Plain AR decoding is this loop with no proposer (K = 0: each pass verifies nothing and emits one
token), so the baseline and every method share one code path, one sampler and one set of counters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.acceptance import RULES, Verdict
from mmaccel.core.model import DecoderModel, on_host
from mmaccel.core.proposers import DraftContext, Proposer
from mmaccel.core.sampling import Sampling, TokenSampler
from mmaccel.core.stats import DecodeStats, track_peak_memory
from mmaccel.core.tree import chain_tree, verify_tree_greedy, verify_tree_sampled
from mmaccel.errors import check


@dataclass
class Generation:
    tokens: list[list[int]]   # per row, the generated tokens (prompt excluded), cut at EOS / max_new_tokens
    stats: DecodeStats
    # per row and token, the target pass that committed it (1 = the prefill): tokens sharing a pass
    # came from accepted drafts (or a parallel wavefront); plain AR commits one token per pass
    commit_pass: list[list[int]] | None = None


@dataclass
class LoopConfig:
    """How one decode call runs. `k` drafts per pass (chain) or a `tree` of (depth, width)."""

    proposer: Proposer | None = None
    # a name in RULES, or a rule function with their signature (a method's own acceptance, outside the core)
    rule: str | Callable[..., Verdict] = "greedy"
    k: int = 0
    tree: tuple[int, int] | None = None
    coupled: bool = False
    rule_params: dict[str, Any] | None = None

    def __post_init__(self):
        check(callable(self.rule) or self.rule in RULES,
              f"unknown acceptance rule {self.rule!r}; choose from {', '.join(RULES)} or pass a rule function")
        check(isinstance(self.k, int) and self.k >= 0, f"k (draft length) must be an int >= 0, got {self.k}")
        check(self.proposer is not None or (self.k == 0 and self.tree is None),
              "drafting (k > 0 or a tree) needs a proposer")
        check(self.proposer is None or self.k > 0 or self.tree is not None,
              f"a proposer needs k >= 1 drafts or a tree, got k={self.k}")
        if self.tree is not None:
            depth, width = self.tree
            check(depth >= 1 and width >= 1, f"tree depth and width must be >= 1, got {self.tree}")


def _row_index(x: Tensor, idx: Tensor) -> Tensor:
    return x[torch.arange(x.shape[0], device=x.device), idx.to(x.device)]


def decode(model: DecoderModel, inputs: Any, config: LoopConfig, *, max_new_tokens: int,
           sampling: Sampling = Sampling(), seed: int = 0, eos_token_id: int | None = None,
           prompt_tokens: list[list[int]] | None = None) -> Generation:
    """Generate up to `max_new_tokens` per row of `inputs` (whatever `model.prefill` takes).

    Greedy (`sampling.temperature == 0`) with the greedy rule reproduces plain greedy decoding;
    sampled runs are seeded (same seed, same output).

    The bookkeeping (emitted tokens, counts, finished rows, acceptance, rollback) is tensors on the
    model's device, so on a GPU a pass never waits for the host: the loop learns that every row is
    done one pass late (`_AllDone`) and its length is otherwise bounded by counters it keeps itself.
    Proposers and models that read values on the host say so in their own code.
    """
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1, f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    rule_name = _effective_rule(config, sampling)
    params = (config.rule_params or {}) if rule_name == config.rule else {}
    width = config.k if config.tree is None else config.tree[0] * config.tree[1]
    stats = DecodeStats()
    device = getattr(model, "device", torch.device("cpu"))
    # a row may overshoot max_new_tokens by `width` accepted drafts, and finished rows still take one
    # more fed block (width + 1) before it is rolled back
    room = max_new_tokens + 2 * (width + 1)

    proposer = config.proposer
    ahead = _drafts_ahead(model, config, rule_name)
    skip_filler = rule_name == "greedy" and getattr(model, "skips_filler", False) and on_host(device)
    with torch.inference_mode(), track_peak_memory(stats, device), stats.timed("total"):
        block = None            # (drafts, logits) of a prefill that also scored the first drafts
        if ahead:
            with stats.timed("draft"):
                drafts = proposer.start_drafting(inputs, room, config.k)
            stats.draft_passes += proposer.passes()
        with stats.timed("prefill"):
            if ahead:
                state, logits = model.prefill_with(inputs, room, drafts.clamp(min=0))
                block = drafts, logits
            else:
                state = model.prefill(inputs, room)
                logits = state.logits
            stats.nfe += 1
        B, V = logits.shape[0], logits.shape[-1]
        dev = logits.device
        sampler = TokenSampler(seed, B, V, coupled=config.coupled, device=dev, positions=room + 1)
        out = _Emitted(B, max_new_tokens + width + 1, dev, eos_token_id, prompt_tokens)
        if ahead:               # nothing is emitted before the first block (pending -1: no token yet)
            pending = torch.full((B,), -1, device=dev)
        else:
            pending = _sample_first(logits, sampling, sampler)
            out.first(pending, stats.nfe, max_new_tokens)
        hist = torch.zeros(width + 2, dtype=torch.long, device=dev)          # accepted-length histogram
        spent = torch.zeros(B, dtype=torch.float64, device=dev)              # relaxed rules' deviation per row
        hidden = None if state.hidden is None else state.hidden[:, -1]
        committed = None if state.hidden is None or ahead else (
            state.hidden, torch.full((B,), state.hidden.shape[1], device=dev))

        def context() -> DraftContext:
            return DraftContext(pending=pending, history=out.history(), num_generated=out.count,
                                sampling=sampling, sampler=sampler, target_hidden=hidden, active=~out.done,
                                committed_hidden=None if committed is None else committed[0],
                                committed_counts=None if committed is None else committed[1], emitted=out.tokens)

        if proposer is not None and not ahead:
            with stats.timed("draft"):
                proposer.start(inputs, room, context())
            stats.draft_passes += proposer.passes()

        all_done = _AllDone(dev)
        # every pass emits at least one token per unfinished row: the host's own bound on the passes
        for _ in range(max_new_tokens - (0 if ahead else 1)):
            if all_done(out.done):
                break
            ctx = context()
            lengths = None      # [B] drafts (chain) or nodes (tree) per row before the filler, where known
            with stats.timed("draft"):
                if block is not None:
                    (drafts, logits), draft_probs, tree = block, None, None
                elif proposer is None:
                    drafts, draft_probs, tree = pending.new_zeros(B, 0), None, None
                elif config.tree is None:
                    d = proposer.propose(ctx, config.k)
                    drafts, draft_probs, tree, lengths = d.tokens, d.probs, None, d.lengths
                    if d.alternatives is not None:      # the chain with runner-up siblings: a tree
                        tree, lengths = chain_tree(pending, d.tokens, d.lengths, d.alternatives)
                else:
                    drafts, draft_probs = None, None
                    tree = proposer.propose_tree(ctx, *config.tree)
            if proposer is not None:
                stats.draft_passes += proposer.passes()

            with stats.timed("verify"):
                if block is not None:
                    fed, block = drafts, None                                       # scored by the prefill
                elif tree is None:
                    fed = torch.cat([pending[:, None], drafts.clamp(min=0)], 1)           # filler (-1) as any id
                    if skip_filler:
                        # finished rows and the filler after a row's own drafts need no logits;
                        # filler drafts become -1 for verification, so no row can accept them
                        done = out.done.cpu()
                        own = torch.full((B,), drafts.shape[1]) if lengths is None else lengths.cpu()
                        logits = model.step(state, fed, valid=torch.where(done, 0, own + 1))   # [B, K+1, V]
                        if lengths is not None:
                            drafts = drafts.masked_fill(torch.arange(drafts.shape[1])[None, :].to(drafts.device)
                                                        >= own[:, None].to(drafts.device), -1)
                    else:
                        logits = model.step(state, fed)                             # [B, K+1, V]
                    stats.nfe += 1
                else:
                    fed = tree.tokens.clamp(min=0)          # filler nodes (-1, never accepted) as any id
                    if skip_filler:                         # finished rows and filler nodes need no logits
                        nodes = torch.full((B,), fed.shape[1]) if lengths is None else lengths
                        logits = model.step(state, fed, tree_mask=tree.mask(), valid=torch.where(out.done.cpu(), 0, nodes))
                    else:
                        logits = model.step(state, fed, tree_mask=tree.mask())      # [B, N, V]
                    stats.nfe += 1
                verdict, path, target_probs = _verify(rule_name, params, logits, drafts,
                                                      draft_probs, tree, sampling, sampler, ctx)

            n, nxt = verdict.num_accepted.to(dev), verdict.next_token.to(dev)
            active = ~out.done
            if tree is None:
                state.rollback(torch.where(active, drafts.shape[1] - n, fed.shape[1]))
                kept = drafts.to(dev)                                               # row b keeps its first n[b]
                last_node = n
            else:
                state.keep_appended(path, torch.where(active, n + 1, 0), fed.shape[1])
                kept = tree.tokens.to(dev).gather(1, path[:, 1:].to(dev).clamp(min=0))
                last_node = _row_index(path, n)
            if state.hidden is not None:
                hidden = torch.where(active[:, None].to(state.hidden.device), _row_index(state.hidden, last_node), hidden)
                if getattr(proposer, "needs_committed_hidden", False):    # the accepted path, pending's first
                    picked = state.hidden if tree is None else state.hidden.gather(
                        1, path.clamp(0, state.hidden.shape[1] - 1).to(state.hidden.device)[:, :, None]
                        .expand(-1, -1, state.hidden.shape[-1]))
                    committed = (picked, torch.where(active, n + 1, 0))

            if proposer is not None:
                ctx.target_choices = verdict.choices if tree is None else None
                with stats.timed("draft"):
                    proposer.observe(ctx, verdict.num_accepted, nxt, target_probs, RowLists(lambda kept=kept, n=n: [
                        row[:c] for row, c in zip(kept.tolist(), n.tolist())], padded=kept))
                stats.draft_passes += proposer.passes()

            out.emit(kept, n, nxt, active, stats.nfe, max_new_tokens)
            hist.index_add_(0, (n + 1).clamp(max=width + 1), active.long())
            if verdict.deviation is not None:
                spent += torch.where(active, verdict.deviation.to(dev), 0.0).double()
            # rows that ended keep their last fed token (after the prefill block, that is none yet)
            pending = torch.where(out.done & (pending >= 0), pending, nxt)

    stats.accepted_hist.update({k: v for k, v in enumerate(hist.tolist()) if v})
    stats.deviation_per_row = spent.tolist()
    stats.deviation = float(sum(stats.deviation_per_row))
    tokens, passes = out.rows(max_new_tokens)
    stats.new_tokens = sum(len(r) for r in tokens)
    return Generation(tokens, stats, passes)


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


class _Emitted:
    """The tokens each row has emitted, the pass that committed each, counts and finished rows, kept
    as device tensors [B, capacity] (+ one scratch column that takes the writes of no token)."""

    def __init__(self, batch: int, capacity: int, device: torch.device, eos: int | None,
                 prompts: list[list[int]] | None):
        self.tokens = torch.full((batch, capacity + 1), -1, dtype=torch.long, device=device)
        self.passes = torch.zeros(batch, capacity + 1, dtype=torch.long, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.capacity, self.eos, self.prompts = capacity, eos, prompts or [[] for _ in range(batch)]

    def first(self, token: Tensor, nfe: int, max_new: int) -> None:
        """The prefill's token [B]."""
        self.tokens[:, 0] = token
        self.passes[:, 0] = nfe
        self.count += 1
        self.done = self._is_eos(token) | (max_new <= 1)

    def _is_eos(self, tokens: Tensor) -> Tensor:
        return torch.zeros_like(tokens, dtype=torch.bool) if self.eos is None else tokens == self.eos

    def emit(self, kept: Tensor, n: Tensor, nxt: Tensor, active: Tensor, nfe: int, max_new: int) -> None:
        """Active row b emits kept[b, :n[b]] then nxt[b], cut after an EOS or at max_new tokens."""
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

    def history(self) -> RowLists:
        """Per row: prompt tokens + every emitted token (read on demand)."""
        return RowLists(lambda: [p + row[:c] for p, row, c in zip(self.prompts, self.tokens.tolist(), self.count.tolist())])

    def rows(self, max_new: int) -> tuple[list[list[int]], list[list[int]]]:
        counts = self.count.clamp(max=max_new).tolist()
        return ([row[:c] for row, c in zip(self.tokens.tolist(), counts)],
                [row[:c] for row, c in zip(self.passes.tolist(), counts)])


class _AllDone:
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


def _drafts_ahead(model: DecoderModel, config: LoopConfig, rule_name: str) -> bool:
    """Whether the first drafts come before the target's prefill and are verified by it (one target
    pass fewer per call): greedy chains from a proposer that drafts from the prompt alone
    (`start_drafting`) for a target that scores prompt and drafts in one pass (`prefill_with`)."""
    return (rule_name == "greedy" and config.tree is None and getattr(config.proposer, "drafts_from_prompt", False)
            and hasattr(model, "prefill_with"))


def _sample_first(logits: Tensor, sampling: Sampling, sampler: TokenSampler) -> Tensor:
    if sampling.greedy:
        return logits.argmax(-1)
    index = torch.zeros(logits.shape[0], 1, dtype=torch.long, device=logits.device)
    return sampler.sample(sampling.probs(logits)[:, None], index)[:, 0]


def _effective_rule(config: LoopConfig, sampling: Sampling) -> str:
    """Greedy decoding always verifies greedily; sampling never does (that would change the output law)."""
    if sampling.greedy:
        return "greedy"
    if config.rule == "greedy":
        check(config.proposer is None, "the greedy rule needs temperature 0; for sampling use the speculative rule")
        return "speculative"
    return config.rule


def _verify(rule_name: str, params, logits: Tensor, drafts: Tensor | None, draft_probs: Tensor | None,
            tree, sampling: Sampling, sampler: TokenSampler, ctx: DraftContext):
    """Apply the acceptance rule; returns (Verdict, tree path or None, target probs or logits)."""
    B, T, V = logits.shape
    rule = RULES[rule_name] if isinstance(rule_name, str) else rule_name
    if tree is None:
        if rule_name == "greedy":
            return rule(drafts, None, logits), None, logits
        probs = sampling.probs(logits)
        index = ctx.num_generated[:, None] + torch.arange(T, device=logits.device)[None, :]
        noise = sampler.noise(index)
        uniforms = None if rule_name == "coupled" else sampler.uniform((B, T - 1))       # the coupled rule draws none
        return rule(drafts, draft_probs, probs, uniforms, noise, **params), None, probs
    if rule_name == "greedy":
        path, n, nxt = verify_tree_greedy(tree, logits)
        return Verdict(n, nxt), path, logits
    probs = sampling.probs(logits)
    index = ctx.num_generated[:, None] + tree.depth().to(logits.device)
    noise = sampler.noise(index)
    if rule_name == "coupled":
        path, n, nxt = verify_tree_greedy(tree, probs / noise)
    else:
        name = getattr(rule_name, "__name__", rule_name)
        check(rule_name == "speculative", f"tree verification supports the greedy, speculative and coupled rules, not {name!r}")
        path, n, nxt = verify_tree_sampled(tree, probs, sampler.uniform((B, T)), noise)
    return Verdict(n, nxt), path, probs
