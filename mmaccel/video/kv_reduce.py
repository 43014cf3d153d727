"""Vision token reduction in the KV cache, at each question: which cached vision tokens the rest of the
stream keeps.

Ingest reducers (`mmaccel.video.reduce`) decide before a segment enters the cache, without knowing
what will be asked. In a stream the frames are already in the cache when a question comes, so
reduction that reads the question acts on the cache itself (reference video_core.md part A):

- `QuestionPrune` (text-guided pruning, ZipVL A.5 / MustDrop A.6's dual-attention filtering): once
  the question is appended, every cached vision token is scored by the attention the question's
  tokens give it at one decoder layer (mean over heads and question tokens), and only the top
  ceil(keep_ratio · n) of them stay.
- `RoundDecay` (StreamBridge's round-decayed compression, A.1): a question closes a dialogue round;
  at each question the segments that entered before the previous question keep ceil(factor · n) of
  their n tokens, so a segment of round r holds factor^(rounds since r) of its tokens: recent frames
  stay sharp, old rounds fade. StreamBridge mean-pools old rounds; dropping tokens keeps each
  survivor's own key, value and position, which needs no new model pass.

Reduction is permanent (`mmaccel.video.memory.evict_entries`): dropped tokens leave the cache, the
survivors keep their positions, and the budget they free keeps older segments from being evicted
whole. The question is appended over the full cache, so the first answer token's logits see every
token; the rest of the answer decodes over the reduced cache. `VideoAnswer.vision_entries_before` /
`vision_entries_after` report the ratio kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.video.memory import Units, evict_entries, segment_runs
from mmaccel.video.reduce import _budget, _check_ratio


class KVReducer:
    """Base of the question-time reducers: `__call__(question)` drops cached vision tokens through
    `question.drop`; `layers` are the decoder layers whose attention inputs it reads (captured while the
    question is appended); `reset()` forgets the stream."""

    layers: tuple[int, ...] = ()

    def reset(self) -> None:
        pass

    def __call__(self, question: Question) -> None:
        raise TypeError(f"{type(self).__name__} does not define how it reduces the cache")


class Question:
    """The question just appended to a B = 1 stream, as the reducers see it: the stream (`model`,
    `state`), the question's cache slots [start, start + length), the attention inputs of the captured
    layers, and `scores` [entries]: the last attention scores computed at this question (`attention`),
    which follow the entries through `drop` (None until some reducer computes them)."""

    def __init__(self, model, state, length: int, captured: dict[int, tuple[Tensor, tuple[Tensor, Tensor]]]):
        self.model, self.state, self.length, self.captured = model, state, length, captured
        self.start = int(state.cache.lengths[0]) - length
        self.scores: Tensor | None = None

    @property
    def units(self) -> Units:
        return self.state.extras["units"]

    def segments(self) -> list[tuple[int, Tensor]]:
        """(unit, cache entries [n] of its vision tokens, marks excluded) of every cached segment."""
        opened, closed = segment_marks(self.model)
        return [(u, torch.arange(first + opened, stop - closed)) for u, first, stop in segment_runs(self.units)]

    @torch.inference_mode()
    def attention(self, layer: int) -> Tensor:
        """Attention [entries] each cache entry gets from the question's tokens at decoder `layer` (mean over
        heads and question tokens), computed as the layer computed it: its q projection of the question's
        attention inputs, rotated by their (M-)RoPE, against the cached keys (GQA: each key head serves
        its group of query heads), causal. Sets `scores`."""
        check(layer in self.captured, f"layer {layer}'s attention inputs were not captured during the question")
        hidden, (cos, sin) = self.captured[layer]                       # [1, T, d], [1, T, D]
        attn = self.model.text.layers[layer].self_attn
        T, D = hidden.shape[1], self.model.head_dim
        q = attn.q_proj(hidden).view(1, T, -1, D)
        if getattr(attn, "q_norm", None) is not None:                   # Qwen3-style per-head query norm
            q = attn.q_norm(q)
        q = q.transpose(1, 2).float()                                   # [1, Hq, T, D]
        half = D // 2
        q = q * cos[:, None].float() + torch.cat([-q[..., half:], q[..., :half]], -1) * sin[:, None].float()
        L = self.start + self.length
        keys = self.state.cache.k[layer][:, :, :L].float()              # [1, Hkv, L, D]
        groups = q.shape[1] // keys.shape[1]
        logits = torch.einsum("bkgtd,bkld->bkgtl", q.view(1, keys.shape[1], groups, T, D), keys)
        logits = logits * getattr(attn, "scaling", D ** -0.5)
        slots = torch.arange(L, device=keys.device)
        visible = slots[None, :] <= self.start + torch.arange(T, device=keys.device)[:, None]     # [T, L]
        probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
        self.scores = probs.mean((0, 1, 2, 3))
        return self.scores

    def drop(self, keep: Tensor) -> int:
        """Drop the cache entries where `keep` [entries] (bool) is False (vision tokens only) and move the
        stream so text continues at the same position from the new cache length. Returns the count dropped."""
        keep = keep.to(torch.bool).cpu()
        position = self.state.extras["next_position"]
        dropped = evict_entries(self.state, self.units, keep.tolist(), segment_marks(self.model))
        if dropped:
            self.model.move_to(self.state, position)
            self.start -= dropped                                       # only entries before the question go
            if self.scores is not None:
                self.scores = self.scores[keep.to(self.scores.device)]
        return dropped


class QuestionPrune(KVReducer):
    """Keep the ceil(keep_ratio · n) of the n cached vision tokens that the question attends to most at
    decoder `layer` (text-guided pruning: ZipVL, MustDrop)."""

    def __init__(self, keep_ratio: float, layer: int = -1):
        _check_ratio(keep_ratio)
        check(isinstance(layer, int) and not isinstance(layer, bool), f"layer must be a decoder layer index (an int, "
              f"negative counts from the last), got {layer!r}")
        self.keep_ratio, self.layer = float(keep_ratio), layer
        self.layers = (layer,)

    def __call__(self, question: Question) -> None:
        layer = self.layer % len(question.model.text.layers)
        scores = question.attention(layer)
        vision = torch.cat([entries for _, entries in question.segments()] or [torch.zeros(0, dtype=torch.long)])
        if len(vision) == 0:
            return
        count = _budget(self.keep_ratio, len(vision))
        keep = torch.ones(len(scores), dtype=torch.bool)
        keep[vision] = False
        keep[vision[scores.cpu()[vision].topk(count).indices]] = True
        question.drop(keep)


class RoundDecay(KVReducer):
    """StreamBridge's round-decayed compression: at each question, every segment that entered before the
    previous question keeps max(min_tokens, ceil(factor · n)) of its n vision tokens (all of them when
    n is smaller); the newest round (segments since the previous question) is never touched.

    Survivors are the tokens with the highest attention scores of this question when a reducer before
    this one computed them (`QuestionPrune` earlier in the list), else the ones with the smallest key
    norm, averaged over layers and heads (QuickVideo's `key_norms_small`, the best of its rules: A.4).
    """

    def __init__(self, factor: float = 0.5, min_tokens: int = 1):
        check(isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0.0 < factor <= 1.0,
              f"factor must be in (0, 1] (the share of its tokens an old segment keeps per round), got {factor!r}")
        check(isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens >= 1,
              f"min_tokens must be an int >= 1, got {min_tokens!r}")
        self.factor, self.min_tokens = float(factor), min_tokens
        self.reset()

    def reset(self) -> None:
        self._previous: int | None = None        # serial number of the first unit after the previous question

    def __call__(self, question: Question) -> None:
        units = question.units
        previous, self._previous = self._previous, units.added
        if previous is None:
            return
        old = [(u, entries) for u, entries in question.segments() if units.born[u] < previous]
        if not old:
            return
        scores = question.scores.cpu() if question.scores is not None else -key_norms(question.state).cpu()
        keep = torch.ones(len(units.entry_unit), dtype=torch.bool)
        for _, entries in old:
            n = len(entries)
            count = min(n, max(self.min_tokens, math.ceil(self.factor * n - 1e-9)))
            if count < n:
                keep[entries] = False
                keep[entries[scores[entries].topk(count).indices]] = True
        question.drop(keep)


@torch.inference_mode()
def key_norms(state) -> Tensor:
    """L2 norm [entries] of each cached key, averaged over layers and heads (B = 1); rotation keeps norms."""
    n = int(state.cache.lengths[0])
    return torch.stack([k[0, :, :n].float().norm(dim=-1).mean(0) for k in state.cache.k]).mean(0)


def segment_marks(model) -> tuple[int, int]:
    """(entries opening, entries closing) each of `model`'s segments: the marks no reducer drops."""
    return len(model.segment_open), len(model.segment_close)


def vision_tokens(model, state) -> int:
    """Vision tokens in a B = 1 stream's cache (segment marks not counted)."""
    opened, closed = segment_marks(model)
    return sum(stop - first - opened - closed for _, first, stop in segment_runs(state.extras["units"]))


@contextmanager
def capture_attention_inputs(model, layers) -> Iterator[dict[int, tuple[Tensor, tuple[Tensor, Tensor]]]]:
    """Record, for each decoder layer in `layers`, the inputs of its attention (hidden states [B, T, d]
    after the layer's norm and the rotary (cos, sin) [B, T, D]) during the appends inside the block."""
    captured: dict[int, tuple[Tensor, tuple[Tensor, Tensor]]] = {}

    def recorder(layer: int):
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            check("position_embeddings" in kwargs, f"{type(module).__name__} does not take its rotary embedding as "
                  "`position_embeddings`: its attention cannot be scored")
            captured[layer] = (hidden, kwargs["position_embeddings"])
        return hook

    graphs = model.cuda_graphs
    if layers:
        model.cuda_graphs = False                               # a replayed CUDA graph runs no hooks
    handles = []
    try:
        for layer in layers:
            handles.append(model.text.layers[layer].self_attn.register_forward_pre_hook(recorder(layer),
                                                                                       with_kwargs=True))
        yield captured
    finally:
        for handle in handles:
            handle.remove()
        model.cuda_graphs = graphs


def append_question(model, state, tokens: list[int], reducers: list[KVReducer]) -> Tensor:
    """Append a question's `tokens` to a B = 1 stream, then let `reducers` (in order) drop cached vision
    tokens. Returns the logits [1, V] after the question, computed over the full cache."""
    num_layers = len(model.text.layers)
    layers = sorted({layer % num_layers for reducer in reducers for layer in reducer.layers})
    with capture_attention_inputs(model, layers) as captured:
        logits = model.append_text(state, tokens)
    question = Question(model, state, len(tokens), captured)
    for reducer in reducers:
        reducer(question)
    return logits


def as_kv_reducers(reduction, model) -> list[KVReducer]:
    """None, one KV reducer or a list of them (applied in order) -> a list, checked against `model`."""
    if reduction is None:
        return []
    reducers = list(reduction) if isinstance(reduction, (list, tuple)) else [reduction]
    num_layers = len(model.text.layers)
    for r in reducers:
        check(isinstance(r, KVReducer), f"kv_reduction must be reducers from mmaccel.video.kv_reduce (QuestionPrune, "
              f"RoundDecay), got {type(r).__name__}")
        for layer in r.layers:
            check(-num_layers <= layer < num_layers, f"{type(r).__name__} reads decoder layer {layer}, the model has "
                  f"{num_layers} (valid: {-num_layers} … {num_layers - 1})")
    return reducers
