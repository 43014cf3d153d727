"""The draft → verify → accept loop, chain or tree, batched with ragged acceptance.

Plain AR decoding is this loop with no proposer (K = 0: each pass verifies nothing and emits one
token), so the baseline and every method share one code path, one sampler and one set of counters.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from mmaccel.core.acceptance import RULES, Verdict
from mmaccel.core.adaptive import AdaptiveDrafting, DraftLengths
from mmaccel.core.driver import AcceptedLengths, AllDone, DecodeCall, Emission, Generation, RowLists
from mmaccel.core.model import DecoderModel, on_host
from mmaccel.core.proposers import DraftContext, Proposer, RaggedRows
from mmaccel.core.sampling import Sampling, TokenSampler
from mmaccel.core.tree import chain_tree, verify_tree_greedy, verify_tree_sampled
from mmaccel.errors import check


@dataclass
class LoopConfig:
    """How one decode call runs. `k` drafts per pass (chain) or a `tree` of (depth, width); with `adaptive`
    (the pass costs measured so far), each greedy pass on the host drafts at most that many, or none
    (`mmaccel.core.adaptive`)."""

    proposer: Proposer | None = None
    # a name in RULES, or a rule function with their signature (a method's own acceptance, outside the core)
    rule: str | Callable[..., Verdict] = "greedy"
    k: int = 0
    tree: tuple[int, int] | None = None
    coupled: bool = False
    rule_params: dict[str, Any] | None = None
    adaptive: AdaptiveDrafting | None = None

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


class Joiner(NamedTuple):
    """A request that takes a row of a call in progress: its prompt's tokens, its most new tokens, and what the
    model's `admit` reads for it (one row of what its `prefill` takes; None: the prompt's tokens)."""

    prompt: list[int]
    limit: int
    inputs: Any = None


class RowFeed(Protocol):
    """Requests that join a decode call in progress, a row each (continuous batching): when a row ends, the
    call hands its tokens to `finished` and asks `next` for a request to start over with."""

    reserve: int            # prompt tokens a joining request may have beyond the first rows' longest
    limits: list[int]       # the most new tokens of each first row (each <= the call's max_new_tokens)

    def finished(self, row: int, tokens: list[int], passes: list[int]) -> None:
        """Row `row` ended with `tokens` (and the pass that committed each)."""

    def next(self, row: int, max_prompt: int) -> Joiner | tuple[list[int], int] | None:
        """A waiting request (a `Joiner`, or its prompt and most new tokens) for row `row`, its prompt at most
        `max_prompt` tokens; None when none waits."""

    def dropped(self) -> list[int]:
        """Rows to end now (their requests went away)."""


def decode(model: DecoderModel, inputs: Any, config: LoopConfig, *, max_new_tokens: int,
           sampling: Sampling = Sampling(), seed: int = 0, eos_token_id: int | None = None,
           prompt_tokens: list[list[int]] | None = None, feed: RowFeed | None = None) -> Generation:
    """Generate up to `max_new_tokens` per row of `inputs` (whatever `model.prefill` takes).

    Greedy (`sampling.temperature == 0`) with the greedy rule reproduces plain greedy decoding;
    sampled runs are seeded (same seed, same output).

    The bookkeeping (emitted tokens, counts, finished rows, acceptance, rollback) is tensors on the
    model's device, so on a GPU a pass never waits for the host: the loop learns that every row is
    done one pass late (`AllDone`) and its length is otherwise bounded by counters it keeps itself.
    Proposers and models that read values on the host say so in their own code.

    With a `feed`, a row that ends takes a waiting request's prompt at once and the call goes on while any
    row decodes (`RowFeed`: each row's tokens go to the feed as it ends). The model must offer `admit`, the
    proposer (if any) `admit` (`Proposer.joins`), and the noise must not be coupled; every step reads the
    finished rows back to the host.
    """
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1, f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    loop = _Loop(model, config, sampling, max_new_tokens)
    if feed is not None:
        check(joins(model, config), "this method cannot take requests in the middle of a call")
        check(prompt_tokens is not None, "a call that takes joining requests needs prompt_tokens")
        loop.room += feed.reserve
    with DecodeCall(loop.device) as call:
        loop.start(call, inputs, seed, eos_token_id, prompt_tokens)
        if feed is not None:
            _decode_fed(loop, call, feed, max(map(len, prompt_tokens)) + feed.reserve)
            return call.result(loop.out, max_new_tokens, loop.lengths)
        all_done = AllDone(loop.out.done.device)
        # every pass emits at least one token per unfinished row: the host's own bound on the passes
        for _ in range(max_new_tokens - (0 if loop.ahead else 1)):
            if all_done(loop.out.done):
                break
            loop.step(call)
    call.stats.deviation_per_row = loop.spent.tolist()
    call.stats.deviation = float(sum(call.stats.deviation_per_row))
    return call.result(loop.out, max_new_tokens, loop.lengths)


def joins(model: DecoderModel, config: LoopConfig) -> bool:
    """Whether a call of `config` on `model` can take requests as its rows end (`decode`'s `feed`)."""
    return (hasattr(model, "admit") and not config.coupled and config.adaptive is None
            and (config.proposer is None or config.proposer.joins))


def _decode_fed(loop: _Loop, call: DecodeCall, feed: RowFeed, max_prompt: int) -> None:
    """Decode while any row does, handing each row that ends to `feed` and starting it over on a waiting prompt."""
    B = loop.out.done.shape[0]
    check(len(feed.limits) == B and all(1 <= n <= loop.max_new for n in feed.limits),
          f"feed.limits needs {B} values in [1, {loop.max_new}]")
    loop.limit = torch.tensor(feed.limits, device=loop.out.count.device)
    loop.out.done |= loop.out.count >= loop.limit
    free: list[int] = []
    for _ in itertools.count():
        for row in feed.dropped():
            loop.out.done[row] = True
        done = loop.out.done.tolist()
        for row in range(B):
            if done[row] and row not in free:
                tokens, passes = loop.out.row(row, int(loop.limit[row]))
                feed.finished(row, tokens, passes)
                free.append(row)
        # a prefill that scored the first drafts (`_drafts_ahead`) is verified at the first step: rows join after it
        while free and loop.block is None and (joining := feed.next(free[0], max_prompt)) is not None:
            loop.admit(call, free.pop(0), Joiner(*joining))
        if len(free) == B:
            return
        loop.step(call)


class _Drafted(NamedTuple):
    """A pass's drafts, as `_Loop._draft` returns them."""
    tokens: Tensor | None       # [B, K] a chain's drafts (None for a tree)
    probs: Tensor | None        # the draft's probabilities of them (sampled rules)
    tree: Any                   # a tree of drafts, or None
    lengths: Tensor | None      # drafts or nodes per row before the filler (None: every row has all)


class _Loop:
    """One chain/tree decode call between passes: the cache, the pending token of every row, what it
    emitted, the sampler, and the target features the proposer reads."""

    def __init__(self, model: DecoderModel, config: LoopConfig, sampling: Sampling, max_new: int):
        self.model, self.config, self.sampling, self.max_new = model, config, sampling, max_new
        self.rule = _effective_rule(config, sampling)
        self.params = (config.rule_params or {}) if self.rule == config.rule else {}
        self.width = config.k if config.tree is None else config.tree[0] * config.tree[1]
        self.device = getattr(model, "device", torch.device("cpu"))
        # a row may overshoot max_new_tokens by `width` accepted drafts, and finished rows still take one
        # more fed block (width + 1) before it is rolled back
        self.room = max_new + 2 * (self.width + 1)
        self.proposer = config.proposer
        self.ahead = _drafts_ahead(model, config, self.rule)
        self.skip_filler = self.rule == "greedy" and getattr(model, "skips_filler", False) and on_host(self.device)
        self.block = None       # (drafts, logits) of a prefill that also scored the first drafts
        self.lengths_chosen: DraftLengths | None = None     # adaptive drafting (set by `start`)
        self.limit: int | Tensor = max_new                  # the most new tokens, of every row or each ([B])
        self.first_k = self.width                           # drafts the first pass asks for

    def start(self, call: DecodeCall, inputs: Any, seed: int, eos: int | None, prompts: list[list[int]] | None) -> None:
        """The prefill (scoring the first drafts too where they come ahead), the first token and the proposer."""
        adaptive = self.config.adaptive
        if (adaptive is not None and getattr(self.proposer, "skips", False) and self.rule == "greedy"
                and on_host(self.device)):
            rows = len(prompts) if prompts is not None else getattr(inputs, "batch_size", None)
            check(rows is not None, "adaptive drafting needs the batch size before the prefill: pass prompt_tokens")
            method = (type(self.proposer).__name__, self.config.k, self.config.tree)
            self.lengths_chosen = adaptive.for_call(method, rows, self.width, self.config.tree and self.config.tree[0])
            self.first_k = self.lengths_chosen.choose([True] * rows)
        self.ahead = self.ahead and self.first_k > 0 and self.proposer.can_start_drafting(inputs)
        if self.ahead:
            with call.stats.timed("draft"):
                drafts = self.proposer.start_drafting(inputs, self.room, self.first_k)
            call.draft_passes(self.proposer.passes())
        with call.prefill():
            if self.ahead:
                self.state, logits = self.model.prefill_with(inputs, self.room, drafts.clamp(min=0))
                self.block = drafts, logits
            else:
                self.state = self.model.prefill(inputs, self.room)
                logits = self.state.logits
        B, V, dev = logits.shape[0], logits.shape[-1], logits.device
        self.sampler = TokenSampler(seed, B, V, coupled=self.config.coupled, device=dev, positions=self.room + 1)
        self.out = Emission(B, self.max_new + self.width + 1, dev, eos, prompts)
        if self.ahead:          # nothing is emitted before the first block (pending -1: no token yet)
            self.pending = torch.full((B,), -1, device=dev)
        else:
            self.pending = _sample_first(logits, self.sampling, self.sampler)
            self.out.first(self.pending, call.stats.nfe, self.max_new)
        self.lengths = AcceptedLengths(self.width + 1, dev)
        self.spent = torch.zeros(B, dtype=torch.float64, device=dev)        # relaxed rules' deviation per row
        hidden = self.state.hidden
        self.hidden = None if hidden is None else hidden[:, -1]
        # committed features start at the last prompt position's, which predicted pending
        self.committed = None if hidden is None or self.ahead else RaggedRows(hidden[:, -1:],
                                                                             torch.ones(B, dtype=torch.long, device=dev))
        self.unread = self.committed is not None      # committed features no proposal has read yet
        if self.proposer is not None and not self.ahead:
            with call.stats.timed("draft"):
                self.proposer.start(inputs, self.room, self.context())
            call.draft_passes(self.proposer.passes())

    def admit(self, call: DecodeCall, row: int, joiner: Joiner) -> None:
        """Row `row` (ended) starts over on `joiner`'s prompt, for at most its `limit` new tokens: its prefill,
        first token and proposer; the other rows go on where they are."""
        prompt, limit = joiner.prompt, joiner.limit
        check(1 <= limit <= self.max_new, f"a joining row's most new tokens must be in [1, {self.max_new}]")
        with call.prefill():
            alone = self.model.admit(self.state, row, prompt if joiner.inputs is None else joiner.inputs)
        token = _sample_first(alone.logits[:1], self.sampling, self.sampler)
        self.pending = self.pending.clone()
        self.pending[row] = token[0]
        self.out.restart(row, token, call.stats.nfe, limit, prompt)
        self.limit[row] = limit
        self.spent[row] = 0.0
        if self.hidden is not None and alone.hidden is not None:      # the features of its last prompt position
            self.hidden = self.hidden.clone()
            self.hidden[row] = alone.hidden[0, -1]
            if self.committed is not None:
                self.committed.reset_row(row, alone.hidden[0, -1:])
        if self.proposer is not None:
            with call.stats.timed("draft"):
                self.proposer.admit(row, joiner, token)
            call.draft_passes(self.proposer.passes())

    def context(self) -> DraftContext:
        committed = self.committed
        return DraftContext(pending=self.pending, history=self.out.history(), num_generated=self.out.count,
                            sampling=self.sampling, sampler=self.sampler, target_hidden=self.hidden,
                            active=~self.out.done, committed_hidden=None if committed is None else committed.block,
                            committed_counts=None if committed is None else committed.counts, emitted=self.out.tokens)

    def step(self, call: DecodeCall) -> None:
        """One pass: draft, score on the target, accept, roll back, emit."""
        ctx = self.context()
        chooser, block = self.lengths_chosen, self.block is not None
        active = None if chooser is None else ctx.active.tolist()
        k = self.width if chooser is None else self.first_k if block else chooser.choose(active)
        if chooser is not None and k and not block:     # outside the pass time the chooser measures
            with call.stats.timed("draft"):
                self.proposer.ready()
        started = time.perf_counter()
        d = self._draft(call, ctx, k)
        with call.stats.timed("verify"):
            fed, logits, drafts = self._score(call, d.tokens, d.tree, d.lengths)
            verdict, path, target_probs = _verify(self.rule, self.params, logits, drafts, d.probs, d.tree,
                                                  self.sampling, self.sampler, ctx)
        self._commit(call, ctx, verdict, path, target_probs, drafts, fed, d.tree, skipped=k == 0)
        if chooser is not None:
            chooser.record(k, verdict.num_accepted.tolist(), active,
                           None if block else time.perf_counter() - started)

    def _draft(self, call: DecodeCall, ctx: DraftContext, k: int) -> _Drafted:
        """What a pass drafting at most `k` (0: a plain step) feeds the target."""
        lengths = None
        with call.stats.timed("draft"):
            if self.block is not None:
                drafts, probs, tree = self.block[0], None, None
            elif self.proposer is None or k == 0:
                drafts, probs, tree = self.pending.new_zeros(self.pending.shape[0], 0), None, None
            elif self.config.tree is None:
                self.unread = False
                d = self.proposer.propose(ctx, min(k, self.config.k))
                drafts, probs, tree, lengths = d.tokens, d.probs, None, d.lengths
                if d.alternatives is not None:      # the chain with runner-up siblings: a tree
                    tree, lengths = chain_tree(self.pending, d.tokens, d.lengths, d.alternatives)
            else:
                self.unread = False
                drafts, probs, tree = None, None, self.proposer.propose_tree(ctx, *self.config.tree)
        if self.proposer is not None:
            call.draft_passes(self.proposer.passes())
        return _Drafted(drafts, probs, tree, lengths)

    def _score(self, call: DecodeCall, drafts: Tensor | None, tree, lengths: Tensor | None):
        """The target's logits over the fed block: (fed, logits, drafts as they are verified)."""
        if self.block is not None:                  # scored by the prefill
            (_, logits), self.block = self.block, None
            return drafts, logits, drafts
        B, step, done = self.pending.shape[0], self.model.step, self.out.done
        with call.target_pass(None):
            if tree is not None:
                fed = tree.tokens.clamp(min=0)      # filler nodes (-1, never accepted) as any id
                if not self.skip_filler:
                    return fed, step(self.state, fed, tree_mask=tree.mask()), drafts          # [B, N, V]
                nodes = torch.full((B,), fed.shape[1]) if lengths is None else lengths     # filler needs no logits
                return fed, step(self.state, fed, tree_mask=tree.mask(), valid=torch.where(done.cpu(), 0, nodes)), drafts
            fed = torch.cat([self.pending[:, None], drafts.clamp(min=0)], 1)                # filler (-1) as any id
            if not self.skip_filler:
                return fed, step(self.state, fed), drafts                                   # [B, K+1, V]
            # finished rows and the filler after a row's own drafts need no logits; filler drafts
            # become -1 for verification, so no row can accept them
            own = torch.full((B,), drafts.shape[1]) if lengths is None else lengths.cpu()
            logits = step(self.state, fed, valid=torch.where(done.cpu(), 0, own + 1))
            if lengths is not None:
                drafts = drafts.masked_fill(torch.arange(drafts.shape[1])[None, :].to(drafts.device)
                                            >= own[:, None].to(drafts.device), -1)
            return fed, logits, drafts

    def _commit(self, call: DecodeCall, ctx: DraftContext, verdict: Verdict, path: Tensor | None, target_probs: Tensor,
                drafts: Tensor | None, fed: Tensor, tree, skipped: bool = False) -> None:
        """Roll the cache back to the accepted tokens, tell the proposer (that the pass drafted nothing, where
        `skipped`), emit, count."""
        dev = self.out.done.device
        n, nxt = verdict.num_accepted.to(dev), verdict.next_token.to(dev)
        active = ~self.out.done
        if tree is None:
            self.state.rollback(torch.where(active, drafts.shape[1] - n, fed.shape[1]))
            kept, last_node = drafts.to(dev), n                                 # row b keeps its first n[b]
        else:
            self.state.keep_appended(path, torch.where(active, n + 1, 0), fed.shape[1])
            kept = tree.tokens.to(dev).gather(1, path[:, 1:].to(dev).clamp(min=0))
            last_node = _row_index(path, n)
        if self.state.hidden is not None:
            self._keep_hidden(active, n, path, last_node)
        if self.proposer is not None and skipped:
            with call.stats.timed("draft"):
                self.proposer.skip(ctx, nxt)
        elif self.proposer is not None:
            ctx.target_choices = verdict.choices if tree is None else None
            with call.stats.timed("draft"):
                self.proposer.observe(ctx, verdict.num_accepted, nxt, target_probs, RowLists(lambda kept=kept, n=n: [
                    row[:c] for row, c in zip(kept.tolist(), n.tolist())], padded=kept))
            call.draft_passes(self.proposer.passes())
        self.out.emit(kept, n, nxt, active, call.stats.nfe, self.limit)
        self.lengths.add(n + 1, active)
        if verdict.deviation is not None:
            self.spent += torch.where(active, verdict.deviation.to(dev), 0.0).double()
        # rows that ended keep their last fed token (after the prefill block, that is none yet)
        self.pending = torch.where(self.out.done & (self.pending >= 0), self.pending, nxt)

    def _keep_hidden(self, active: Tensor, n: Tensor, path: Tensor | None, last_node: Tensor) -> None:
        """The target features of each row's last accepted token (and of its accepted path, for proposers
        that read them)."""
        hidden = self.state.hidden
        self.hidden = torch.where(active[:, None].to(hidden.device), _row_index(hidden, last_node), self.hidden)
        if getattr(self.proposer, "needs_committed_hidden", False):    # the accepted path, pending's first
            picked = hidden if path is None else hidden.gather(
                1, path.clamp(0, hidden.shape[1] - 1).to(hidden.device)[:, :, None].expand(-1, -1, hidden.shape[-1]))
            counts = torch.where(active, n + 1, 0)
            # after a pass that drafted nothing, the features no proposal has read yet come first
            if self.unread:
                self.committed.append(picked, counts)
            else:
                self.committed = RaggedRows(picked, counts)
            self.unread = True


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
