"""Whisper's timestamp mode: the decoding rules for timestamp tokens, and segments read from them.

With the prompt's <|notimestamps|> left out, Whisper writes `<|t0|> text <|t1|><|t1'|> text <|t2|> ...`:
each segment between a pair of timestamp tokens (times in units of 0.02 s from the window's start).
Its rules (openai-whisper's `ApplyTimestampRules`, which CTranslate2 and Hugging Face apply too) mask the
logits of every step from what the row has written so far:

- <|notimestamps|> never;
- after a timestamp that follows text, a timestamp or end of text (a segment's end needs its pair or
  ends the window); after two timestamps (or after the first token), text or end of text;
- timestamps never decrease, and a segment's start is strictly after the previous segment's end;
- the first token is a timestamp no later than `max_initial` (1.0 s);
- when the timestamps' total probability exceeds every text token's, a timestamp.

`TimestampRules.apply` evaluates them for every position of a decoder pass at once, tree passes
included: a position's history is the slots it attends to, whose token ids the KV cache records
(`KVCache.keep_ids`), so draft tokens are judged by the path they extend and rolled-back slots are
never read. Every method that scores through the model therefore decodes under the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.speech.whisper_vocab import TIME_PRECISION

MAX_INITIAL_TIMESTAMP = 1.0     # seconds; openai-whisper's and faster-whisper's default


@dataclass(frozen=True)
class TimestampRules:
    """The rules for a vocabulary: ids of <|notimestamps|> (the first timestamp follows it) and
    <|endoftext|>, the decoder prompt's length (slots before it are not the transcript's) and the
    latest first timestamp as a token offset (None: any)."""

    no_timestamps: int
    end_of_text: int
    prompt_length: int
    max_initial: int | None = round(MAX_INITIAL_TIMESTAMP / TIME_PRECISION)

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    def apply(self, logits: Tensor, ids: Tensor, visible: Tensor) -> Tensor:
        """Mask `logits` [B, T, V] (T positions of one pass; changed in place and returned) by the rules.
        `ids` [B, S]: the token of each cache slot; `visible` [B, T, S] (or broadcastable): the slots
        position t has written or attends to, itself included (the prompt's last position sees only
        prompt slots)."""
        B, T, V = logits.shape
        S = visible.shape[-1]
        ids = ids[:, None, :S].expand(B, T, S)
        slot = torch.arange(S, device=logits.device)
        seen = visible.to(logits.device, torch.bool) & (slot >= self.prompt_length)       # transcript slots
        count = seen.sum(-1)                                                # [B, T] tokens written
        top2 = torch.where(seen, slot, -1).topk(min(2, S), dim=-1).values   # the last two written slots
        last = ids.gather(2, top2[..., :1].clamp(min=0))[..., 0]
        before = ids.gather(2, top2[..., -1:].clamp(min=0))[..., 0]
        last_time = (count >= 1) & (last >= self.timestamp_begin)
        before_time = (count < 2) | (before >= self.timestamp_begin)
        latest = torch.where(seen & (ids >= self.timestamp_begin), ids, -1).max(-1).values
        # timestamps never decrease, and a segment's start comes after the previous one's end
        floor = torch.where(latest < 0, self.timestamp_begin, torch.where(last_time & ~before_time, latest, latest + 1))
        first = count == 0
        text, times = logits[..., : self.timestamp_begin], logits[..., self.timestamp_begin :]
        text[..., self.no_timestamps] = float("-inf")
        offsets = torch.arange(times.shape[-1], device=logits.device)
        latest_first = self.max_initial if self.max_initial is not None else times.shape[-1]
        times.masked_fill_((offsets < (floor - self.timestamp_begin)[..., None])
                           | (last_time & before_time)[..., None]
                           | (first[..., None] & (offsets > latest_first)), float("-inf"))
        text.masked_fill_(first[..., None], float("-inf"))
        logits[..., : self.end_of_text].masked_fill_((last_time & ~before_time)[..., None], float("-inf"))
        # a timestamp when the timestamps together are likelier than any text token
        force = times.float().logsumexp(-1) > text.float().max(-1).values
        text.masked_fill_(force[..., None], float("-inf"))
        return logits

    def seconds(self, token: int) -> float:
        """The time of a timestamp token, in seconds from its window's start."""
        return (token - self.timestamp_begin) * TIME_PRECISION


@dataclass
class Segment:
    """A stretch of one input's transcript between two timestamps (seconds from the input's start)."""

    id: int
    start: float
    end: float
    text: str
    tokens: list[int]                   # its tokens as generated (timestamps included)
    avg_logprob: float | None = None    # of its tokens (in timestamp mode; see `scoring`)
    compression_ratio: float | None = None
    no_speech_prob: float | None = None     # of its window
    words: list | None = None
    temperature: float | None = None        # its window was decoded at (above 0: the temperature fallback's)


def split_segments(tokens: list[int], rules: TimestampRules, window_s: float,
                   keep_tail: bool = True) -> tuple[list[tuple[float, float, list[int]]], float]:
    """One window's generated tokens -> (start s, end s, its tokens) per segment, and how far into the
    window the transcript is complete, as openai-whisper reads them.

    Two consecutive timestamps close a segment and open the next. A window that ends on a single
    timestamp is complete. One that ends inside an unclosed segment is complete up to the last closed
    segment's end: the next window of a long input starts there and the tail is dropped, unless
    `keep_tail` (no window follows) makes it a segment ending at the window's end. Without consecutive
    timestamps the window is one segment, ending at its last timestamp (if any after 0.00). No time is
    past the window's audio (`window_s`): the model may place the last timestamp in the padding after a
    short clip, where faster-whisper lets a segment run past the end of the file."""
    tokens = [t for t in tokens if t != rules.end_of_text]
    segments, complete = _segments(tokens, rules, window_s, keep_tail)
    return [(min(a, window_s), min(b, window_s), piece) for a, b, piece in segments], min(complete, window_s)


def _segments(tokens: list[int], rules: TimestampRules, window_s: float,
              keep_tail: bool) -> tuple[list[tuple[float, float, list[int]]], float]:
    begin = rules.timestamp_begin
    timed = [t >= begin for t in tokens]
    cuts = [i for i in range(1, len(tokens)) if timed[i] and timed[i - 1]]
    if not cuts:
        times = [t for t in tokens if t >= begin]
        end = rules.seconds(times[-1]) if times and times[-1] != begin else window_s
        return ([(0.0, end, tokens)] if any(t < begin for t in tokens) else []), window_s
    single_ending = len(timed) >= 2 and timed[-1] and not timed[-2]
    if single_ending:
        cuts.append(len(tokens))
    out, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        out.append((rules.seconds(piece[0]), rules.seconds(piece[-1]), piece))
        last = cut
    if single_ending:
        return out, window_s
    tail = tokens[last:]
    if keep_tail and any(t < begin for t in tail):
        out.append((rules.seconds(tail[0]), window_s, tail))
        return out, window_s
    return out, rules.seconds(tokens[last - 1])


def rule_logits(state, logits: Tensor, tree_mask: Tensor | None = None, rows: Tensor | None = None) -> Tensor:
    """`logits` [B, T, V] of the last T positions appended to `state` (a Whisper decoder's), under its
    audio's timestamp rules; unchanged when the audio has none. `tree_mask`: the pass's, if any. `rows`
    (batch indices [R]): the logits are of those rows only ([R, T, V])."""
    rules = state.extras["inputs"].rules
    if rules is None:
        return logits
    T = logits.shape[1]
    visible = state.cache.attention_mask(state.cache.lengths - T, T, tree_mask)[:, 0]
    ids = state.cache.ids
    if rows is not None:
        visible, ids = visible.index_select(0, rows.to(visible.device)), ids.index_select(0, rows.to(ids.device))
    return rules.apply(logits, ids, visible)
