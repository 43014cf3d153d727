"""Draft proposers: where the tokens a target pass verifies come from.

A proposer is told what the loop knows (`DraftContext`), proposes K tokens per row (`Draft`) or a
token tree, and after verification is told how many of them each row kept (`observe`), so it can
roll its own state back. Proposers never decide acceptance: that is the rule's job
(acceptance.py), which keeps every proposer usable with every rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from mmaccel.core.model import DecoderModel, append_padded, on_host
from mmaccel.core.sampling import Sampling, TokenSampler
from mmaccel.core.tree import TokenTree
from mmaccel.errors import check

if TYPE_CHECKING:
    from mmaccel.core.speculative import Joiner


@dataclass
class Draft:
    tokens: Tensor              # [B, K]; -1: filler, never accepted (fed to the target as any id)
    probs: Tensor | None = None  # [B, K, V] distributions the tokens were drawn from; None = point masses
    # [B] drafts worth verifying per row (its chain would have stopped there; the later ones are
    # filler, drafted because other rows went on); None: all K
    lengths: Tensor | None = None
    # [B, M] runner-up tokens for each row's last own draft, verified beside it as siblings (a token
    # tree, `tree.chain_tree`); -1: none
    alternatives: Tensor | None = None


@dataclass
class DraftContext:
    pending: Tensor             # [B] last emitted token, not yet in the target's cache (-1: none yet, when
                                # the target's prefill verifies the first drafts: `start_drafting`)
    history: list[list[int]]    # per row: prompt tokens (if any) + every emitted token, pending last
    num_generated: Tensor       # [B] tokens emitted so far (pending included)
    sampling: Sampling
    sampler: TokenSampler
    target_hidden: Tensor | None = None  # [B, d] target hidden state that predicted `pending`
    active: Tensor | None = None         # [B] rows still generating
    # for proposers with `needs_committed_hidden`: the target's hidden states [B, L, d] of the positions
    # committed since the previous proposal (at first: the last prompt position's, which predicted
    # pending), row b's first counts[b]
    committed_hidden: Tensor | None = None
    committed_counts: Tensor | None = None
    # [B, C] every row's emitted tokens on the device (generated index order, -1 after the first
    # num_generated[b]; no prompt): for proposers that must not read the history on the host
    emitted: Tensor | None = None
    # [B, K+1] after a chain's verification under the greedy or coupled rule: the target's own pick at
    # every column (the greedy argmax, or its draw under the position-fixed noise); None otherwise
    target_choices: Tensor | None = None


class Proposer:
    """Base class. Subclasses implement `propose` (chain) and optionally `propose_tree`."""

    needs_hidden = False            # reads DraftContext.target_hidden
    needs_committed_hidden = False  # reads DraftContext.committed_hidden (all newly committed positions)
    drafts_from_prompt = False      # offers `start_drafting`: greedy drafts before the target's prefill
    skips = True                    # keeps up through passes that draft nothing (`skip`): adaptive drafting

    def start(self, inputs: Any, room: int, ctx: DraftContext) -> None:
        """Called once after the target's prefill and first token."""

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """At most `k` drafts per row. `k` may change from pass to pass, up to the method's k (the loop's room):
        adaptive drafting asks for what pays, and a plug-in may set its own width each pass this way."""
        raise TypeError(f"{type(self).__name__} does not propose token chains")

    def propose_tree(self, ctx: DraftContext, depth: int, width: int) -> TokenTree:
        raise TypeError(f"{type(self).__name__} does not propose token trees; use a chain method")

    def observe(self, ctx: DraftContext, num_accepted: Tensor, next_token: Tensor,
                target_probs: Tensor | None, accepted_tokens: Sequence[list[int]]) -> None:
        """After verification: row b kept `num_accepted[b]` drafts (`accepted_tokens[b]`) then `next_token[b]`.

        `accepted_tokens` reads the lists back from the device when indexed; its `padded` [B, L] holds
        the same tokens on the device (row b's first num_accepted[b]), for a proposer that must not wait."""

    def ready(self) -> None:
        """Before a pass that drafts (outside the time adaptive drafting measures for it): set up, once per call,
        what proposals need (a draft model's prefill, which a call that never drafts does not run)."""

    def skip(self, ctx: DraftContext, next_token: Tensor) -> None:
        """A pass drafted nothing (adaptive drafting: a plain step): active row b (`ctx.active`, which the loop
        always sets) emitted `next_token[b]`. Proposers that read what they need from the context each time have
        nothing to do."""

    def passes(self) -> int:
        """Draft forward passes run since the last call (for DecodeStats)."""
        return 0

    joins = False                   # offers `admit`: rows may start over mid-call (continuous batching)

    def admit(self, row: int, joiner: Joiner, token: Tensor) -> None:
        """Row `row` starts over for `joiner` (its prompt, and what the model's `admit` reads) with its first
        token `token` [1] (a request joining the call)."""
        raise TypeError(f"{type(self).__name__} cannot take a new row in the middle of a call")


class RaggedRows:
    """Rows of different lengths in one padded block: row r's first `counts[r]` entries of `block` [B, L, ...]
    count, the rest is padding. `append` writes each row's new entries after its own in place, into spare
    columns that grow by doubling, so appending to a long block costs what the new entries do (a proposer that
    waits through many plain steps appends one entry per step). The block it starts from is never written."""

    def __init__(self, block: Tensor, counts: Tensor):
        self._store, self.counts, self.width = block, counts, block.shape[1]

    @property
    def block(self) -> Tensor:
        """[B, L, ...]: every row's entries, then padding."""
        return self._store[:, : self.width]

    def reset_row(self, row: int, entries: Tensor) -> None:
        """Row `row` holds only `entries` [n, ...] (a row that starts over)."""
        n = entries.shape[0]
        if self.width < n:
            self.append(self._store.new_zeros(self._store.shape[0], n - self.width, *self._store.shape[2:]),
                        torch.zeros_like(self.counts))
        self._store = self._store.clone()             # the block it started from is never written
        self._store[row, :n] = entries.to(self._store.device, self._store.dtype)
        self.counts = self.counts.clone()
        self.counts[row] = n

    def append(self, more: Tensor, counts: Tensor) -> RaggedRows:
        """Row r's first `counts[r]` entries of `more` [B, M, ...] go after its own; returns self."""
        B, M = more.shape[:2]
        store = self._store
        if store.shape[1] < self.width + M + 1:      # one spare column takes the writes of padding
            store = store.new_zeros(B, max(2 * store.shape[1], self.width + M + 1), *store.shape[2:])
            store[:, : self.width] = self.block
            self._store = store
        counts = counts.to(store.device)
        j = torch.arange(M, device=store.device)[None, :]
        slots = torch.where(j < counts[:, None], self.counts.to(store.device)[:, None] + j, store.shape[1] - 1)
        slots = slots.view(B, M, *[1] * (store.dim() - 2)).expand(-1, -1, *store.shape[2:])
        store.scatter_(1, slots, more.to(store.device, store.dtype))
        self.counts, self.width = self.counts + counts.to(self.counts.device), self.width + M
        return self


def _sample_draft(logits: Tensor, ctx: DraftContext, index: Tensor) -> tuple[Tensor, Tensor | None]:
    """Draw one draft token per row from logits [B, V] at generated index [B] with the loop's sampler."""
    if ctx.sampling.greedy:
        return logits.argmax(-1), None
    q = ctx.sampling.probs(logits)
    return ctx.sampler.sample(q[:, None], index[:, None])[:, 0], q


def grow_tree(root_logprobs: Tensor, expand, depth: int, width: int, root: Tensor) -> TokenTree:
    """Best-first tree (EAGLE-2 style): each level keeps the `width` children with the highest
    cumulative log-probability among the top-`width` children of every node of the previous level.

    root_logprobs [B, V]; `expand(level_tokens [B, W], tree_so_far) -> logprobs [B, W, V]` scores the
    children of the newest level. Returns a tree of 1 + depth * width nodes.
    """
    check(depth >= 1 and width >= 1, f"tree depth and width must be >= 1, got {depth}, {width}")
    B = root.shape[0]
    scores, tokens = root_logprobs.topk(width, dim=-1)                    # [B, W]
    all_tokens = [root[:, None], tokens]
    all_parents = [torch.full((B, 1), -1, device=root.device), torch.zeros(B, width, dtype=torch.long, device=root.device)]
    level_start = 1
    for _ in range(depth - 1):
        tree = TokenTree(torch.cat(all_tokens, 1), torch.cat(all_parents, 1))
        logprobs = expand(tokens, tree)                                    # [B, W, V]
        child_scores, child_tokens = logprobs.topk(width, dim=-1)          # [B, W, W]
        total = (scores[:, :, None] + child_scores).reshape(B, -1)
        scores, pick = total.topk(width, dim=-1)
        tokens = child_tokens.reshape(B, -1).gather(1, pick)
        all_tokens.append(tokens)
        all_parents.append(level_start + pick // width)
        level_start += width
    return TokenTree(torch.cat(all_tokens, 1), torch.cat(all_parents, 1))


class DraftModelProposer(Proposer):
    """A smaller model with the target's tokenizer drafts autoregressively (Leviathan et al. 2023).
    Greedy drafts read out through the model's `shortlist` where it has one (`shortlist_step`
    returns the logits of those tokens only). With `stop_below` > 0 a greedy chain ends early once
    no active row's draft token has at least that probability under the draft (dynamic draft
    length: k is then the most drafted per pass); each row's drafts after its own first unsure one
    are marked as filler (`Draft.lengths`), which a verify pass need not compute. With `siblings`
    = M > 0 as well, a row whose chain ended on an unsure draft also offers the draft's M next-best
    tokens for that position (`Draft.alternatives`): when the unsure draft is wrong, the target's
    token is often among them, and the pass then gains one more token.

    Its cache is kept in step with the target's: tokens the target emitted but the draft has not
    yet seen wait in `pending` (a padded block [B, P] and counts [B] on the draft's device) and are
    fed (ragged, one pass) at the start of the next proposal. On a GPU nothing is read back: the
    pending block is fed at its full width with the padding rolled back per row, a chain with
    `stop_below` runs all k steps (the drafts after the point where the host would have stopped are
    -1, filler that is never accepted) and siblings are always offered (-1 where a row has none).
    """

    drafts_from_prompt = True

    def __init__(self, draft: DecoderModel, stop_below: float = 0.0, siblings: int = 0):
        check(hasattr(draft, "prefill") and hasattr(draft, "step"),
              f"a draft model must implement prefill/step (the DecoderModel protocol), got {type(draft).__name__}")
        check(0.0 <= stop_below < 1.0, f"stop_below (a draft probability) must be in [0, 1), got {stop_below}")
        check(isinstance(siblings, int) and siblings >= 0, f"siblings must be an int >= 0, got {siblings!r}")
        check(siblings == 0 or stop_below > 0, "siblings are offered for unsure drafts: they need stop_below > 0")
        self.draft, self.stop_below, self.siblings = draft, stop_below, siblings
        self._passes = 0
        self._branched = False      # the last chain offered alternatives

    def passes(self) -> int:
        n, self._passes = self._passes, 0
        return n

    def start(self, inputs, room, ctx):
        self.opened, self.state = (inputs, room), None      # the draft's prefill waits for a first proposal (`ready`)
        self.pending = RaggedRows(ctx.pending[:, None], torch.ones_like(ctx.pending))     # tokens the draft has not seen

    def can_start_drafting(self, inputs: Any) -> bool:
        """Whether `start_drafting` can draft from these inputs' prompt (else the call starts as usual)."""
        return True

    def start_drafting(self, inputs: Any, room: int, k: int) -> Tensor:
        """`start` ahead of the target: greedy drafts [B, <= k] of the first tokens from the prompt
        alone, for a target that scores its prompt and these drafts in one pass (`prefill_with`)."""
        check(k >= 1, f"draft length k must be >= 1, got {k}")
        self.state = self.draft.prefill(inputs, room)
        self._passes += 1
        logits = self.state.logits
        none = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self.pending, self._fed_pending = RaggedRows(none[:, None][:, :0], none), none
        opening = self.draft.opening(inputs) if hasattr(self.draft, "opening") else None     # see DecoderModel
        if opening is None:
            return self._chain(logits, None, None, k).tokens
        if k == opening.shape[1]:
            return self._opened(opening)
        step, shortlist = self._greedy_step()
        logits = step(self.state, opening)[:, -1]
        self._passes += 1
        return self._opened(opening, self._chain(logits, shortlist, None, k - opening.shape[1]).tokens)

    def _opened(self, opening: Tensor, chain: Tensor | None = None) -> Tensor:
        """Drafts ahead that start with tokens the draft takes as given (`opening` [B, W], fed to it before `chain`,
        so verified and rolled back as drafts are); without a chain, the opening is all and nothing was fed."""
        if chain is None:
            self._fed, self._tree, self._branched, self._drafts = 0, None, False, opening
        else:
            self._fed, self._drafts = self._fed + opening.shape[1], torch.cat([opening, chain], 1)
        return self._drafts

    @property
    def joins(self) -> bool:        # a draft model that can take a row mid-call
        return hasattr(self.draft, "admit")

    def admit(self, row, joiner, token):
        """The draft reads the joining row's prompt now; its first token waits with the pending ones."""
        self.ready()
        self.draft.admit(self.state, row, joiner.prompt if joiner.inputs is None else joiner.inputs)
        self._passes += 1
        self.pending.reset_row(row, token)

    def skip(self, ctx, next_token):
        """The token waits with the others the draft has not seen, fed with them at the next proposal."""
        self.pending.append(next_token[:, None], ctx.active.long())

    def ready(self) -> None:
        if self.state is None:
            self.state = self.draft.prefill(*self.opened)
            self._passes += 1

    def _feed_pending(self, step=None) -> Tensor:
        self.ready()
        self._fed_pending = self.pending.counts
        out = append_padded(self.draft, self.state, self.pending.block, self.pending.counts, step)
        self._passes += 1
        return out

    def _greedy_step(self) -> tuple[Callable, Tensor | None]:
        """The draft's step for greedy drafting and the token ids of its logit columns (None: all)."""
        shortlist = getattr(self.draft, "shortlist", None)
        return (self.draft.step, None) if shortlist is None else (self.draft.shortlist_step, shortlist)

    def propose(self, ctx, k):
        check(k >= 1, f"draft length k must be >= 1, got {k}")
        if ctx.sampling.greedy:
            step, ids = self._greedy_step()
            return self._chain(self._feed_pending(step), ids, ctx.active, k)
        logits = self._feed_pending()
        tokens, probs = [], []
        for j in range(k):
            x, q = _sample_draft(logits, ctx, ctx.num_generated + j)
            tokens.append(x)
            probs.append(q)
            if j < k - 1:
                logits = self.draft.step(self.state, x[:, None])[:, 0]
                self._passes += 1
        self._fed, self._tree, self._branched = k - 1, None, False
        self._drafts = torch.stack(tokens, 1)
        return Draft(self._drafts, torch.stack(probs, 1))

    def _chain(self, logits: Tensor, ids: Tensor | None, active: Tensor | None, k: int) -> Draft:
        """Arg-max drafts from the next token's `logits` [B, V or S] (column j is token `ids[j]`, or
        j itself), through the model's shortlist (`shortlist_step`) where it has one; with
        `stop_below`, drafting ends after a position where no `active` row's (None: no row's) draft
        is that likely: on the host it stops there; on a GPU, which cannot know it without waiting,
        it drafts on and marks the later drafts -1."""
        step, shortlist = self._greedy_step()
        B, dev = logits.shape[0], logits.device
        host, stop = on_host(dev), self.stop_below > 0
        active = None if active is None else active.to(dev)
        lengths = torch.full((B,), k, device=dev) if stop else None
        alternatives = torch.full((B, self.siblings), -1, device=dev) if self.siblings else None
        tokens = []
        going = None            # GPU, with stop_below: [] whether the host would still be drafting
        drafted = []            # ... that flag as each draft after the first was made
        for j in range(k):
            if stop:
                confidence, index = logits.softmax(-1).max(-1)
                first = (confidence < self.stop_below) & (lengths == k)
                first = first if going is None else first & going
                lengths = torch.where(first, j + 1, lengths)
                if alternatives is not None and (not host or bool(first.any())):
                    runners = logits.topk(1 + self.siblings, dim=-1).indices[:, 1:]
                    runners = runners if ids is None else ids[runners]
                    alternatives = torch.where(first[:, None], runners, alternatives)
            else:
                index = logits.argmax(-1)
            tokens.append(index if ids is None else ids[index])
            if going is not None:
                drafted.append(going)
            if j == k - 1:
                break
            if stop:
                sure = confidence >= self.stop_below
                sure = (sure if active is None else sure & active).any()
                if host and not bool(sure):
                    break
                if not host:
                    going = sure if going is None else going & sure
            logits, ids = step(self.state, tokens[-1][:, None])[:, 0], shortlist
            self._passes += 1
        drafts = torch.stack(tokens, 1)                                     # [B, K]
        if drafted:             # filler after the host's stop: never accepted (the loop feeds -1 as any id)
            made = torch.stack([drafted[0].new_ones(())] + drafted)        # [K]
            drafts = drafts.masked_fill(~made[None, :], -1)
            lengths = torch.minimum(lengths, made.sum())
        elif lengths is not None:
            lengths = lengths.clamp(max=len(tokens))
        self._fed, self._tree, self._drafts = len(tokens) - 1, None, drafts
        self._branched = alternatives is not None and (not host or bool((alternatives >= 0).any()))
        return Draft(drafts, lengths=lengths, alternatives=alternatives if self._branched else None)

    def propose_tree(self, ctx, depth, width):
        logits = self._feed_pending()
        warp = (lambda x: x.float()) if ctx.sampling.greedy else ctx.sampling.warp

        def expand(level_tokens, tree):
            mask = tree.mask()[:, -level_tokens.shape[1]:]                 # rows of the newest level
            out = self.draft.step(self.state, level_tokens, tree_mask=mask)
            self._passes += 1
            return warp(out).log_softmax(-1)

        tree = grow_tree(warp(logits).log_softmax(-1), expand, depth, width, ctx.pending)
        self._fed, self._tree, self._branched = (depth - 1) * width, tree, False
        return tree

    def observe(self, ctx, num_accepted, next_token, target_probs, accepted_tokens):
        pending = self.pending.block
        dev = pending.device
        n = num_accepted.to(dev)
        accepted = accepted_tokens.padded.to(dev)          # [B, L]: row b's first n[b] (no read-back)
        L = accepted.shape[1]
        if self._tree is not None:
            keep = torch.zeros_like(n)
        elif self._branched:        # an accepted sibling ends the part of the chain kept
            K = min(L, self._drafts.shape[1])
            j = torch.arange(K, device=dev)[None, :]
            agree = (accepted[:, :K] == self._drafts[:, :K]) | (j >= n[:, None])
            keep = agree.long().cumprod(1).sum(1).minimum(n).clamp(max=self._fed)
        else:
            keep = n.clamp(max=self._fed)
        active = torch.ones_like(n, dtype=torch.bool) if ctx.active is None else ctx.active.to(dev)
        # inactive rows drop everything fed this round and keep their pending tokens
        self.state.rollback(torch.where(active, self._fed - keep, self._fed + self._fed_pending))
        # row b's pending: its accepted tokens after the first keep[b], then next_token[b]. At most
        # 1 + (drafts not fed) of a chain (only a sibling ends the kept part before that), 1 + L of a tree
        P = max(1 + (L if self._tree is not None else max(1, self._drafts.shape[1] - self._fed)), pending.shape[1])
        count = n - keep + 1
        j = torch.arange(P, device=dev)[None, :]
        after = accepted.gather(1, (keep[:, None] + j).clamp(max=L - 1))     # L >= 1: a proposal has a draft
        fresh = torch.where(j < count[:, None] - 1, after, torch.where(j == count[:, None] - 1, next_token.to(dev)[:, None], 0))
        old = nn.functional.pad(pending, (0, P - pending.shape[1]))
        self.pending = RaggedRows(torch.where(active[:, None], fresh, old), torch.where(active, count, self.pending.counts))


class EarlyExitProposer(DraftModelProposer):
    """Self-speculation: the target's first `exit_layer` layers plus an exit head draft (LayerSkip).

    The model must offer `early_exit(exit_layer, head=None) -> DecoderModel` sharing its weights.
    """

    def __init__(self, model: DecoderModel, exit_layer: int, head: nn.Module | None = None):
        check(hasattr(model, "early_exit"), f"{type(model).__name__} offers no early-exit view (early_exit method)")
        super().__init__(model.early_exit(exit_layer, head))


class MedusaHead(nn.Module):
    """One Medusa head: `num_layers` residual SiLU blocks (zero-initialised, so a new head starts as
    the identity), then a projection to the vocabulary.

    `project` replaces the head's own projection with a frozen shared one (Whisper-Medusa reads every
    head out through the model's tied embedding); it is kept out of the head's parameters and
    state dict, so saving heads does not save the vocabulary matrix.
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_layers: int = 1,
                 project: Callable[[Tensor], Tensor] | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.proj = nn.Linear(hidden_size, vocab_size, bias=False) if project is None else None
        self._project = project

    def transform(self, hidden: Tensor) -> Tensor:
        """The head's hidden state before the vocabulary projection."""
        for block in self.blocks:
            hidden = hidden + nn.functional.silu(block(hidden))
        return hidden

    def forward(self, hidden: Tensor) -> Tensor:
        hidden = self.transform(hidden)
        return self.proj(hidden) if self.proj is not None else self._project(hidden)


class HeadsProposer(Proposer):
    """Medusa (Cai et al. 2024): head i reads the target's last hidden state and guesses the token
    i + 1 places after the pending one; drafts are point masses (top-1 chain or top-k tree)."""

    needs_hidden = True

    def __init__(self, heads: nn.ModuleList | list[nn.Module]):
        check(len(heads) > 0, "Medusa needs at least one head")
        self.heads = nn.ModuleList(heads)

    def _logits(self, ctx: DraftContext, n: int) -> Tensor:
        check(ctx.target_hidden is not None, "Medusa heads need the target's hidden state; the model did not return one")
        check(n <= len(self.heads), f"asked for {n} drafts but only {len(self.heads)} Medusa heads are loaded")
        h = ctx.target_hidden
        dtype = next(self.heads.parameters()).dtype
        return torch.stack([self.heads[i](h.to(dtype)) for i in range(n)], 1).float()

    def propose(self, ctx, k):
        return Draft(self._logits(ctx, k).argmax(-1))

    def propose_tree(self, ctx, depth, width):
        logprobs = self._logits(ctx, depth).log_softmax(-1)                 # [B, D, V]
        level = iter(range(1, depth))

        def expand(level_tokens, tree):
            d = next(level)
            return logprobs[:, d][:, None].expand(-1, level_tokens.shape[1], -1)

        return grow_tree(logprobs[:, 0], expand, depth, width, ctx.pending)


class NGramProposer(Proposer):
    """Prompt lookup (Saxena 2023; HF `prompt_lookup_num_tokens`): find the latest earlier occurrence
    of the last n tokens (n from `max_ngram` down to `min_ngram`) and propose what followed it.

    A host algorithm by design (a string search over Python lists): every proposal reads the history
    back from the device and uploads its drafts, so on a GPU each pass waits for the queued work."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        check(1 <= min_ngram <= max_ngram, f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def _lookup(self, seq: list[int], k: int) -> list[int]:
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == tail:
                    follow = seq[start + n : start + n + k]
                    return follow + [follow[-1]] * (k - len(follow))
        return [seq[-1]] * k

    joins = True                    # it reads each row's history from the context: nothing to set up

    def admit(self, row, joiner, token):
        pass

    def propose(self, ctx, k):
        check(k >= 1, f"draft length k must be >= 1, got {k}")
        rows = [self._lookup(h, k) for h in ctx.history]
        return Draft(torch.tensor(rows, dtype=torch.long, device=ctx.pending.device))
