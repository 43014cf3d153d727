"""Word timestamps: dynamic time warping over the cross-attention of Whisper's alignment heads.

As openai-whisper and faster-whisper find them: one teacher-forced pass over the window's prompt (without
timestamps), its text tokens and <|endoftext|> records the cross-attention of the model's alignment heads
(listed in its generation config); each head's weights over the window's audio frames are softmaxed,
standardised over the tokens and median-filtered over time, then averaged; the cheapest monotonic path
through their negation pairs tokens with encoder frames (50 per second), and a word starts and ends where
the path enters its first token and leaves its last. Punctuation is merged into its neighbour words and
words that stretch over a pause are cut to twice the median word length.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.errors import InputError
from mmaccel.speech.decoder import EncodedAudio, WhisperDecoderModel

FRAMES_PER_SECOND = 50          # encoder frames (one per 20 ms)
MEDIAN_FILTER = 7
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = ".。!！?？"
UNSPACED = {"zh", "ja", "th", "lo", "my", "yue"}     # languages written without spaces between words


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float
    tokens: list[int] | None = None


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost` [N, M] from (0, 0) to (N - 1, M - 1), steps (1, 1), (1, 0)
    or (0, 1), as (row indices, column indices). Filled one anti-diagonal at a time (the cells of one
    depend only on the two before it); ties prefer the diagonal, then the step down in time, as
    openai-whisper's `dtw` does."""
    N, M = cost.shape
    total = np.full((N + 1, M + 1), np.inf, dtype=np.float64)
    total[0, 0] = 0.0
    trace = np.zeros((N + 1, M + 1), dtype=np.int8)
    for k in range(2, N + M + 1):                    # cells (i, j), i + j = k, 1 <= i <= N, 1 <= j <= M
        i = np.arange(max(1, k - M), min(N, k - 1) + 1)
        j = k - i
        c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        total[i, j] = cost[i - 1, j - 1] + np.choose(step, [c0, c1, c2])
        trace[i, j] = step
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = N, M, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    rows, cols = np.array(path[::-1]).T
    return rows, cols


def median_filter(x: Tensor, width: int) -> Tensor:
    """Median of each run of `width` (odd) values along the last dimension, the ends reflected."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    L = x.shape[-1]
    padded = F.pad(x.reshape(-1, 1, L), (pad, pad), mode="reflect").reshape(*x.shape[:-1], L + 2 * pad)
    return padded.unfold(-1, width, 1).sort(-1).values[..., pad]


def split_words(tokenizer, tokens: list[int], eot: int, language: str | None) -> list[tuple[str, list[int]]]:
    """`tokens` (text, then <|endoftext|> last) as (word, its tokens): a word starts at a token that begins
    with a space, is punctuation or special; in languages written without spaces, at every character."""
    pieces: list[tuple[str, list[int]]] = []
    pending: list[int] = []
    for token in tokens:
        pending.append(token)
        text = tokenizer.decode(pending)
        if "\ufffd" in text and token != tokens[-1]:         # a character split across tokens: wait for the rest
            continue
        pieces.append((text, pending))
        pending = []
    if language in UNSPACED:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, group in pieces:
        starts = group[0] >= eot or text.startswith(" ") or text.strip() in string.punctuation or not words
        if starts:
            words.append((text, list(group)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + group)
    return words


@torch.inference_mode()
def align_words(model: WhisperDecoderModel, inputs: EncodedAudio, row: int, prompt: list[int], text: list[int],
                frames: int, heads: list[tuple[int, int]], tokenizer, eot: int,
                language: str | None) -> list[Word]:
    """Words of `text` (one window's text tokens) with times in seconds from the window's start. `inputs`:
    the window's encoded audio (row `row` of a batch); `prompt`: the decoder prompt without timestamps;
    `frames`: encoder frames that hold audio; `heads`: (layer, head) pairs."""
    if not text:
        return []
    if not heads:
        raise InputError("this Whisper has no alignment heads (generation_config.alignment_heads); word "
                         "timestamps need them")
    w = inputs.window_of(row)
    audio = EncodedAudio(inputs.encoder_states[w : w + 1], torch.tensor([prompt]),
                         {i: (k[w : w + 1], v[w : w + 1]) for i, (k, v) in inputs.cross_kv.items()},
                         projections=dict(inputs.projections))
    seq = torch.tensor([prompt + text + [eot]], device=model.device)
    state = model.prefill(audio, seq.shape[1] - len(prompt), run=False)
    queries: dict[int, torch.Tensor] = {}
    logits = model._forward(state, seq, None, None, probe=queries, any_shape=True)[0]     # [P + N + 1, V]
    P = len(prompt)
    probs = logits[P - 1 : P - 1 + len(text), :eot].float().softmax(-1)
    token_probs = probs[torch.arange(len(text)), torch.tensor(text)].tolist()
    weights = []
    for layer, head in heads:
        keys, _ = model._cross(audio, layer)                                # [1, H, S, Dh]
        q = queries[layer][0, head]                                          # [T, Dh]
        weights.append((q @ keys[0, head, :frames].T).float() / q.shape[-1] ** 0.5)
    w = torch.stack(weights).softmax(-1)                                   # [heads, T, frames]
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    w = median_filter((w - mean) / std, MEDIAN_FILTER)
    matrix = w.mean(0)[P - 1 : -1]                                          # the prompt's last + text rows
    rows, cols = dtw(-matrix.double().cpu().numpy())
    jumps = np.pad(np.diff(rows), (1, 0), constant_values=1).astype(bool)
    jump_times = cols[jumps] / FRAMES_PER_SECOND
    words = split_words(tokenizer, text + [eot], eot, language)
    bounds = np.pad(np.cumsum([len(t) for _, t in words[:-1]]), (1, 0))
    out = []
    for (word, tokens), a, b in zip(words[:-1], bounds[:-1], bounds[1:]):
        out.append(Word(float(jump_times[a]), float(jump_times[b]), word, float(np.mean(token_probs[a:b])), tokens))
    return out


def tidy_words(words: list[Word]) -> tuple[list[Word], float, float]:
    """Cut words over a sentence end to twice the median word length and merge punctuation into the words
    next to it; returns the words with text and the (median, max) word duration."""
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = 2 * median
    if len(durations):
        for prev, w in zip(words, words[1:]):
            if w.end - w.start > longest:
                if w.word in SENTENCE_END:
                    w.end = w.start + longest
                elif prev.word in SENTENCE_END:
                    w.start = w.end - longest
    _merge_punctuation(words)
    return [w for w in words if w.word], median, longest


def _merge_punctuation(words: list[Word]) -> None:
    following = len(words) - 1
    for i in range(len(words) - 2, -1, -1):                   # opening marks join the word after them
        prev, nxt = words[i], words[following]
        if prev.word.startswith(" ") and prev.word.strip() in PREPEND:
            nxt.word, nxt.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(words)):                            # closing marks join the word before them
        prev, nxt = words[previous], words[j]
        if not prev.word.endswith(" ") and nxt.word in APPEND:
            prev.word, prev.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            previous = j


def attach_words(segments: list, words: list[Word], median: float, longest: float, last_speech: float,
                 eot: int) -> float:
    """Give each segment (`Segment`s of one window, window times) its words, in order by token count, and
    settle their edges as faster-whisper does: the first word after a pause is cut to `longest`; a segment
    takes its first word's start and last word's end unless that word runs more than 0.5 s past the
    segment's own timestamp, which then bounds the word. Returns the end of the last speech."""
    index = 0
    for segment in segments:
        count = sum(1 for t in segment.tokens if t < eot)
        taken, mine = 0, []
        while index < len(words) and taken < count:
            mine.append(words[index])
            taken += len(words[index].tokens or [])
            index += 1
        if mine:
            first, last = mine[0], mine[-1]
            if first.end - last_speech > 4 * median and (
                    first.end - first.start > longest or (len(mine) > 1 and mine[1].end - first.start > 2 * longest)):
                if len(mine) > 1 and mine[1].end - mine[1].start > longest:
                    first.end = mine[1].start = max(mine[1].end / 2, mine[1].end - longest)
                first.start = max(0.0, first.end - longest)
            if segment.start < first.end and segment.start - 0.5 > first.start:
                first.start = max(0.0, min(first.end - median, segment.start))
            else:
                segment.start = first.start
            if segment.end > last.start and segment.end + 0.5 < last.end:
                last.end = max(last.start + median, segment.end)
            else:
                segment.end = last.end
            last_speech = segment.end
        segment.words = mine
    return last_speech


def add_words(model: WhisperDecoderModel, inputs: EncodedAudio, row: int, window, prompt: list[int],
              heads: list[tuple[int, int]], tokenizer, eot: int, language: str | None) -> None:
    """Give the segments of `window` (a `WindowResult` decoded as row `row` of `inputs`) their words, in
    the window's times. `prompt`: the decoder prompt without timestamps (the alignment pass's)."""
    text = [t for s in window.segments for t in s.tokens if t < eot]
    frames = int(round(window.duration * 100)) // 2          # encoder frames of the window's audio
    words = align_words(model, inputs, row, prompt, text, frames, heads, tokenizer, eot, language)
    words, median, longest = tidy_words(words)
    attach_words(window.segments, words, median, longest, 0.0, eot)
