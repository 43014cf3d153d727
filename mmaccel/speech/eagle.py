"""An EAGLE head for Whisper: a feature-level draft on the target's own hidden states.

EAGLE (Li et al. 2024) drafts at the level of the target's features. The head reads, at target
position t, the target's final hidden state f_t (what predicted token t + 1) and the embedding of
that token x_{t+1}. It mixes them (`fc`: [embedding; feature] -> d), runs one Whisper decoder layer
(self-attention over its own cache, cross-attention to the audio, MLP; initialised from the target's
last layer, whose cross-attention keys/values it shares; or several, each from a target layer), and
its final norm gives g_t, trained to be f_{t+1}. Read out through the tied embedding (a shortlist),
g_t guesses x_{t+2}.

Drafting: after each verification the head takes the (feature, token) pairs of every position the
target committed; its output at the newest one guesses the first draft. Each further draft feeds the
head its own output g in place of the target's feature, with the draft token: autoregression at the
feature level, one head pass per draft token. The drafted entries are dropped after verification (their
features are the head's guesses) and the committed positions' real features replace them.

Fused features (EAGLE-3): a head with `feature_layers` reads, besides f_t, the outputs of those
target layers at t (lower layers keep more of the token and its place in the audio than the final
state, which is shaped to predict t + 1). Each is normalised and `fuse` maps them with f_t to the
head's input; the target runs as a `feature_view`, whose hidden states carry those layer outputs
(kept from the verification pass, no extra computation). The head's own outputs still stand in for
the fused input while drafting.

Drafting from the prompt: the head has no target features before the target's prefill, so the
prompt's entries (prompt token t + 1 with a learned feature `start` in place of f_t) are what it is
trained on and fed first; its output at the last one guesses the first transcript token. The first
drafts then come before the prefill, which verifies them in the same pass (as for the draft
decoder), and the prompt's entries stay in the head's cache (the target's features take over from
the last prompt position on).

Unlike the draft decoder (`mmaccel.speech.draft`) this is no second model: it lives on the target's
features and shares its embeddings, vocabulary projection and cross-attention keys/values, like the
Medusa block (`mmaccel.speech.medusa_block`), which reads the same features but guesses several
tokens ahead without seeing the token in between. The target is untouched and verification is
greedy match, so transcripts are greedy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.core.model import DecodeState
from mmaccel.core.proposers import Draft, DraftContext, DraftModelProposer, RaggedRows
from mmaccel.errors import check
from mmaccel.speech.decoder import EncodedAudio, ShortlistProjection, WhisperDecoderModel
from mmaccel.speech.draft import WhisperDraft, new_draft


@dataclass
class EagleHead:
    layer: WhisperDraft          # decoder layers (one, from the target's last, by default) and a final norm
    fc: nn.Linear                # [token embedding; normalised feature] (2d) -> the layers' input (d)
    shift: Tensor                # the target's final LayerNorm bias and gain [d] (frozen): features are
    gain: Tensor                 # read as (f - shift) / gain, per dimension of unit scale
    start: Tensor | None = None  # [d] the normalised feature of the prompt's entries (None: the head
                                 # was trained without them and drafts only after the prefill)
    feature_layers: tuple[int, ...] = ()   # target layers (0-based) whose outputs join the final feature
    fuse: nn.Linear | None = None          # [those outputs, normalised; normalised final feature] -> d

    def normalized(self, features: Tensor) -> Tensor:
        """Undo the final norm's affine map: Whisper's final hidden states carry per-dimension gains of
        4-37 (base), which a mix with the token embedding and int8 products handle badly."""
        return (features - self.shift) / self.gain

    def read(self, features: Tensor, noise: float = 0.0) -> Tensor:
        """The target's features [..., (m + 1) d] (the outputs of the m `feature_layers`, then the
        final hidden state; what a `feature_view` of the target keeps) as the head's input [..., d]:
        each normalised (the layer outputs by a LayerNorm without gain, the final state by
        `normalized`), with uniform noise of half-width `noise` (training), and fused (EAGLE-3)."""
        d = self.shift.shape[0]
        parts = features.split(d, -1)
        check(len(parts) == len(self.feature_layers) + 1 and parts[-1].shape[-1] == d,
              f"the EAGLE head reads {len(self.feature_layers) + 1} features of size {d}, got {features.shape[-1]} values")
        x = torch.cat([F.layer_norm(p, (d,)) for p in parts[:-1]] + [self.normalized(parts[-1])], -1)
        if noise > 0:
            x = x + torch.empty_like(x).uniform_(-noise, noise)
        return x if self.fuse is None else self.fuse(x)


def new_fusion(d: int, feature_layers: tuple[int, ...]) -> nn.Linear:
    """EAGLE-3's fusion of m layer outputs and the final feature ((m + 1) d -> d), starting as the
    final feature alone (a head trained on it reads the same input)."""
    fuse = nn.Linear((len(feature_layers) + 1) * d, d)
    with torch.no_grad():
        fuse.weight.zero_()
        fuse.weight[:, -d:] = torch.eye(d)
        fuse.bias.zero_()
    return fuse


def new_eagle_head(target: WhisperDecoderModel, cross_window: int | None = None, layers: tuple[int, ...] = (-1,),
                   start: bool = True, feature_layers: tuple[int, ...] = ()) -> EagleHead:
    """A head whose layers start as copies of the target's `layers` and whose `fc` starts as the sum
    of the token embedding and half the normalised feature (about the residual stream's scale);
    `start`: with a feature for the prompt's entries (zeros until trained), to draft from the prompt;
    `feature_layers`: target layers whose outputs it fuses with the final feature (`new_fusion`)."""
    d = target.hidden_size
    fc = nn.Linear(2 * d, d)
    with torch.no_grad():
        fc.weight.copy_(torch.cat([torch.eye(d), torch.eye(d) * 0.5], 1))
        fc.bias.zero_()
    norm = target.decoder.layer_norm
    gain = norm.weight.detach().clone()
    gain = torch.where(gain < 0, gain.clamp(max=-1e-2), gain.clamp(min=1e-2))
    head = EagleHead(new_draft(target.hf, layers, cross_window), fc.to(target.device, target.dtype),
                     norm.bias.detach().clone(), gain, torch.zeros(d, device=target.device) if start else None)
    return with_fusion(head, target, feature_layers) if feature_layers else head


def with_fusion(head: EagleHead, target: WhisperDecoderModel, feature_layers: tuple[int, ...]) -> EagleHead:
    """`head` reading the outputs of target layers `feature_layers` (0-based, distinct, before the
    last) besides the final feature, through a new fusion (`new_fusion`)."""
    total = len(target.decoder.layers)
    check(len(set(feature_layers)) == len(feature_layers) and all(0 <= i < total - 1 for i in feature_layers),
          f"feature layers must be distinct target layers in [0, {total - 2}], got {list(feature_layers)}")
    check(head.fuse is None, "the EAGLE head already fuses target layers")
    head.feature_layers = tuple(sorted(feature_layers))
    head.fuse = new_fusion(target.hidden_size, feature_layers).to(target.device, target.dtype)
    return head


class EagleDecoder:
    """The head as the draft a `DraftModelProposer` drives: `prefill` sets up an empty cache (the
    head sees nothing before the target's features), `feed` appends (feature, token) pairs, and
    `step` / `shortlist_step` append draft tokens with the head's own newest output as their
    feature (`state.extras["feature"]`, [B, 1, d]). `quantized`: int8 layer and shortlist (as for
    the draft decoder on a CPU)."""

    def __init__(self, head: EagleHead, target: WhisperDecoderModel, quantized: bool = False):
        self.block = head.layer.decoder_model(target, quantized=quantized)
        self.embedding = target.decoder.embed_tokens.weight
        self.embed_scale = target.embed_scale
        self.head = head
        self.vocab_size = target.vocab_size

    @property
    def shortlist(self) -> Tensor | None:
        return self.block.shortlist

    @property
    def projection(self) -> ShortlistProjection | None:
        return self.block.projection

    def prefill(self, inputs: EncodedAudio, room: int) -> DecodeState:
        state = self.block.prefill(inputs, room, run=False)
        state.extras["feature"] = None
        return state

    def admit(self, state: DecodeState, row: int, inputs: EncodedAudio) -> DecodeState:
        """Row `row` starts over, empty, on window `inputs` (one row): a window that joins a call in progress."""
        state.extras["inputs"].take_row(row, inputs)
        alone = self.prefill(inputs, 0)
        state.cache.take_row(row, alone.cache)
        return alone

    def outputs(self, state: DecodeState, x: Tensor, tokens: Tensor) -> Tensor:
        """Append pairs (normalised features [B, T, d], tokens [B, T]); the head's outputs g [B, T, d] (causal)."""
        emb = F.embedding(self.block.as_read(state, tokens.to(self.embedding.device)), self.embedding) * self.embed_scale
        # fc stays in fp32: int8 products quantise their input per tensor, which would drown the
        # embedding half in the feature half's range
        h = self.head.fc(torch.cat([emb, x.to(emb.dtype)], -1))
        step, _ = self.block.begin(state, tokens.shape[1])
        for i in range(self.block.num_layers):
            h = self.block.layer(i, h, step)
        return self.block.decoder.layer_norm(h)

    @torch.inference_mode()
    def start(self, state: DecodeState, prompt: Tensor) -> Tensor:
        """Append the prompt's entries (prompt [B, P]: tokens 1.. P - 1 with the learned `start`
        feature); the logits of the first transcript token [B, S] over the shortlist (or [B, V])."""
        check(prompt.shape[1] >= 2, "drafting from the prompt needs a decoder prompt of at least two tokens")
        tokens = prompt[:, 1:]
        x = self.head.start.expand(*tokens.shape, -1)
        g = self.outputs(state, x, tokens)[:, -1:]
        state.extras["feature"] = g
        return self._readout(g, self.shortlist is not None)[:, 0]

    def _readout(self, g: Tensor, compact: bool) -> Tensor:
        if compact:
            return self.block.projection.compact(g) + self.block._shortlist_bias
        return self.block._project(g) + self.block.suppression

    @torch.inference_mode()
    def feed(self, state: DecodeState, features: Tensor, tokens: Tensor, counts: Tensor) -> Tensor:
        """Append row b's first counts[b] pairs (right-padded [B, L, ...]; the padding is rolled
        back); returns the logits after each row's last pair, [B, S] over the shortlist (or [B, V])."""
        g = self.outputs(state, self.head.read(features), tokens)
        state.rollback(tokens.shape[1] - counts)
        last = (counts - 1).clamp(min=0).to(g.device)
        g = g[torch.arange(g.shape[0], device=g.device), last][:, None]
        state.extras["feature"] = g
        return self._readout(g, self.shortlist is not None)[:, 0]

    def _step(self, state: DecodeState, tokens: Tensor, compact: bool) -> Tensor:
        check(tokens.shape[1] == 1, "the EAGLE head drafts one token per step")
        feature = state.extras["feature"]
        check(feature is not None, "the EAGLE head needs the target's features first (feed)")
        g = self.outputs(state, self.head.normalized(feature), tokens)
        state.extras["feature"] = g
        return self._readout(g, compact)

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Append draft tokens [B, 1] with the head's newest output as their feature; logits [B, 1, V]."""
        return self._step(state, tokens, compact=False)

    @torch.inference_mode()
    def shortlist_step(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """`step(...)[..., self.shortlist]` [B, 1, S]."""
        return self._step(state, tokens, compact=True)


class EagleProposer(DraftModelProposer):
    """Greedy EAGLE drafting (chains; with `stop_below` and `siblings` as for a draft model). Each
    proposal first feeds the head the target's features of the positions committed since the last
    one, paired with the tokens that followed them; every drafted entry is dropped afterwards. A
    head with a `start` feature drafts the first tokens from the prompt, ahead of the prefill.

    Those tokens are built on the device by `observe` (row b's accepted drafts, then the target's
    next token: a padded block [B, L] beside the committed features [B, L, d]), so on a GPU a pass
    reads nothing back, as for a draft model."""

    needs_committed_hidden = True

    def __init__(self, decoder: EagleDecoder, stop_below: float = 0.0, siblings: int = 0):
        check(isinstance(decoder, EagleDecoder), f"EagleProposer takes an EagleDecoder, got {type(decoder).__name__}")
        super().__init__(decoder, stop_below, siblings)
        self.drafts_from_prompt = decoder.head.start is not None
        self.committed: RaggedRows | None = None    # the token after each committed position (see observe)

    def start(self, inputs, room, ctx):
        check(ctx.committed_hidden is not None, "EAGLE needs the target's hidden states; the model returned none")
        self.opened, self.state = (inputs, room + 1), None      # the head's prefill waits for a first proposal (`ready`)
        self.committed = RaggedRows(ctx.pending[:, None], torch.ones_like(ctx.pending))   # the prompt's next token

    def can_start_drafting(self, inputs) -> bool:
        # the start feature goes with the tokens after the prompt's first (the opening's too)
        opening = self.draft.block.opening(inputs)
        return inputs.prompt.shape[1] + (0 if opening is None else opening.shape[1]) >= 2

    def start_drafting(self, inputs, room, k):
        check(k >= 1, f"draft length k must be >= 1, got {k}")
        self.state = self.draft.prefill(inputs, room + 1)
        # tokens the head takes as given (`WhisperDecoderModel.opening`): entries after the prompt's, dropped
        # after verification like the drafted ones, then its chain
        opening = self.draft.block.opening(inputs)
        given = 0 if opening is None else opening.shape[1]
        logits = self.draft.start(self.state, inputs.prompt if opening is None else torch.cat([inputs.prompt, opening], 1))
        self._passes += 1
        if k == given:
            self.state.rollback(given)
            return self._opened(opening)
        active = torch.ones(inputs.batch_size, dtype=torch.bool, device=logits.device)
        chain = self._chain(logits, self.draft.shortlist, active, k - given).tokens
        return chain if opening is None else self._opened(opening, chain)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        check(k >= 1, f"draft length k must be >= 1, got {k}")
        check(ctx.sampling.greedy, "EAGLE drafts are verified by greedy match here; it takes no temperature")
        hidden, counts, tokens = ctx.committed_hidden, ctx.committed_counts, self.committed
        self.ready()
        check(tokens is not None and tokens.width == hidden.shape[1],
              "EAGLE pairs each committed feature with the token after it: observe the last verification first")
        logits = self.draft.feed(self.state, hidden, tokens.block, counts)
        self._passes += 1
        active = ctx.active if ctx.active is not None else torch.ones_like(ctx.pending, dtype=torch.bool)
        return self._chain(logits, self.draft.shortlist, active, k)

    def admit(self, row, joiner, token):
        """The head's row starts empty; the joining row's first feature (its last prompt position's, which the
        loop keeps) goes with `token`."""
        self.ready()
        self.draft.admit(self.state, row, joiner.inputs)
        self.committed.reset_row(row, token)

    def skip(self, ctx, next_token):
        """The loop keeps the plain step's feature after the unread ones; its token goes after theirs."""
        self.committed.append(next_token[:, None], ctx.active.long())

    def observe(self, ctx, num_accepted, next_token, target_probs, accepted_tokens):
        self.state.rollback(self._fed)        # drafted entries hold the head's guessed features
        # the committed positions are pending's and the accepted drafts': position t's feature goes with
        # the token after it, so row b pairs them with its accepted drafts, then the next token (zeros
        # after those, and for rows that are done: their entries are rolled back)
        accepted = accepted_tokens.padded
        dev = accepted.device
        n = num_accepted.to(dev)
        seq = torch.cat([accepted, accepted.new_zeros(accepted.shape[0], 1)], 1)
        seq = seq.scatter(1, n[:, None], next_token.to(dev)[:, None])                # [B, L + 1]
        keep = torch.arange(seq.shape[1], device=dev)[None, :] <= n[:, None]
        if ctx.active is not None:
            keep = keep & ctx.active.to(dev)[:, None]
        self.committed = RaggedRows(torch.where(keep, seq, 0), keep.sum(1))
