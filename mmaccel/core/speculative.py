"""The draft → verify → accept loop, chain or tree, batched with ragged acceptance.

Plain AR decoding is this loop with no proposer (K = 0: each pass verifies nothing and emits one
token), so the baseline and every method share one code path, one sampler and one set of counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.acceptance import RULES, Verdict
from mmaccel.core.model import DecoderModel
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
    rule: str = "greedy"
    k: int = 0
    tree: tuple[int, int] | None = None
    coupled: bool = False
    rule_params: dict[str, Any] | None = None

    def __post_init__(self):
        check(self.rule in RULES, f"unknown acceptance rule {self.rule!r}; choose from {', '.join(RULES)}")
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
    skip_filler = rule_name == "greedy" and getattr(model, "skips_filler", False)
    with torch.inference_mode(), track_peak_memory(stats, device), stats.timed("total"):
        block = None            # (drafts, logits) of a prefill that also scored the first drafts
        if ahead:
            with stats.timed("draft"):
                drafts = proposer.start_drafting(inputs, room, config.k)
            stats.draft_passes += proposer.passes()
        with stats.timed("prefill"):
            if ahead:
                state, logits = model.prefill_with(inputs, room, drafts)
                block = drafts, logits
            else:
                state = model.prefill(inputs, room)
                logits = state.logits
            stats.nfe += 1
        B, V = logits.shape[0], logits.shape[-1]
        stats.deviation_per_row = [0.0] * B
        sampler = TokenSampler(seed, B, V, coupled=config.coupled, device=logits.device)
        if ahead:               # nothing is emitted before the first block (pending -1: no token yet)
            pending = torch.full((B,), -1, device=logits.device)
            out = [[] for _ in range(B)]
        else:
            pending = _sample_first(logits, sampling, sampler)
            out = [[t] for t in pending.tolist()]
        passes = [[stats.nfe] * len(r) for r in out]
        history = [list(p) + r for p, r in zip(prompt_tokens or [[]] * B, out)]
        done = torch.tensor([bool(r) and (r[-1] == eos_token_id or max_new_tokens <= 1) for r in out])
        hidden = None if state.hidden is None else state.hidden[:, -1]
        committed = None if state.hidden is None or ahead else (state.hidden, torch.full((B,), state.hidden.shape[1]))

        def context() -> DraftContext:
            return DraftContext(pending=pending, history=history,
                                num_generated=torch.tensor([len(r) for r in out], device=pending.device),
                                sampling=sampling, sampler=sampler, target_hidden=hidden,
                                active=~done.to(pending.device),
                                committed_hidden=None if committed is None else committed[0],
                                committed_counts=None if committed is None else committed[1])

        if proposer is not None and not ahead:
            with stats.timed("draft"):
                proposer.start(inputs, room, context())
            stats.draft_passes += proposer.passes()

        while not bool(done.all()):
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
                    fed = torch.cat([pending[:, None], drafts], 1)
                    if skip_filler:
                        # finished rows and the filler after a row's own drafts need no logits;
                        # filler drafts become -1 for verification, so no row can accept them
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
                        logits = model.step(state, fed, tree_mask=tree.mask(), valid=torch.where(done, 0, nodes))
                    else:
                        logits = model.step(state, fed, tree_mask=tree.mask())      # [B, N, V]
                    stats.nfe += 1
                verdict, path, target_probs = _verify(rule_name, params, logits, drafts,
                                                      draft_probs, tree, sampling, sampler, ctx)

            n, nxt = verdict.num_accepted.cpu(), verdict.next_token
            active = ~done
            if tree is None:
                state.rollback(torch.where(active, drafts.shape[1] - n, fed.shape[1]))
                accepted = [drafts[b, : int(n[b])].tolist() for b in range(B)]
                last_node = n
            else:
                state.keep_appended(path, torch.where(active, n + 1, 0), fed.shape[1])
                accepted = [tree.tokens[b, path[b, 1 : int(n[b]) + 1]].tolist() for b in range(B)]
                last_node = _row_index(path, n)
            if state.hidden is not None:
                hidden = torch.where(active[:, None].to(state.hidden.device), _row_index(state.hidden, last_node), hidden)
                if getattr(proposer, "needs_committed_hidden", False):    # the accepted path, pending's first
                    picked = state.hidden if tree is None else state.hidden.gather(
                        1, path.clamp(0, state.hidden.shape[1] - 1).to(state.hidden.device)[:, :, None]
                        .expand(-1, -1, state.hidden.shape[-1]))
                    committed = (picked, torch.where(active, n + 1, 0))

            if proposer is not None:
                with stats.timed("draft"):
                    proposer.observe(ctx, verdict.num_accepted, nxt, target_probs, accepted)
                stats.draft_passes += proposer.passes()

            emitted = []
            for b in range(B):
                if not bool(active[b]):
                    continue
                new = accepted[b] + [int(nxt[b])]
                emitted.append(len(new))
                for t in new:
                    out[b].append(t)
                    passes[b].append(stats.nfe)
                    history[b].append(t)
                    if t == eos_token_id or len(out[b]) >= max_new_tokens:
                        done[b] = True
                        break
            stats.record_accepted(emitted)
            if verdict.deviation is not None:
                spent = torch.where(active, verdict.deviation.cpu(), 0.0)
                stats.deviation += float(spent.sum())
                stats.deviation_per_row = [a + b for a, b in zip(stats.deviation_per_row, spent.tolist())]
            # rows that ended keep their last fed token (after the prefill block, that is none yet)
            pending = torch.where(done.to(nxt.device) & (pending >= 0), pending, nxt)

    tokens = [r[:max_new_tokens] for r in out]
    stats.new_tokens = sum(len(r) for r in tokens)
    return Generation(tokens, stats, [p[:max_new_tokens] for p in passes])


def _drafts_ahead(model: DecoderModel, config: LoopConfig, rule_name: str) -> bool:
    """Whether the first drafts come before the target's prefill and are verified by it (one target
    pass fewer per call): greedy chains from a proposer that drafts from the prompt alone
    (`start_drafting`) for a target that scores prompt and drafts in one pass (`prefill_with`)."""
    return (rule_name == "greedy" and config.tree is None and getattr(config.proposer, "drafts_from_prompt", False)
            and hasattr(model, "prefill_with"))


def _sample_first(logits: Tensor, sampling: Sampling, sampler: TokenSampler) -> Tensor:
    if sampling.greedy:
        return logits.argmax(-1)
    index = torch.zeros(logits.shape[0], 1, dtype=torch.long)
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
    rule = RULES[rule_name]
    if tree is None:
        if rule_name == "greedy":
            return rule(drafts, None, logits), None, logits
        probs = sampling.probs(logits)
        index = ctx.num_generated[:, None] + torch.arange(T, device=logits.device)[None, :]
        noise = sampler.noise(index)
        uniforms = sampler.uniform((B, T - 1))
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
        check(rule_name == "speculative", f"tree verification supports the greedy, speculative and coupled rules, not {rule_name!r}")
        path, n, nxt = verify_tree_sampled(tree, probs, sampler.uniform((B, T)), noise)
    return Verdict(n, nxt), path, probs
