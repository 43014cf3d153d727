"""The 30-s windows an input is decoded in, and where each window's times lie in its input.

Without VAD an input is cut at quiet points into consecutive windows (`split_long`); with VAD its
speech regions are packed, in order, into windows of at most 30 s and the silence between them is left
out. Either way a window's `TimeMap` takes a time in the window (a timestamp the decoder wrote) to the
time in the input.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmaccel.errors import InputError, check
from mmaccel.speech.audio import SAMPLE_RATE, WINDOW_S, Audio, AudioLike, TimeMap, as_audio, is_silent, split_long
from mmaccel.speech.transcript import Transcript
from mmaccel.speech.vad import VadParameters, speech_regions

# timestamp mode with VAD: an input's speech is cut (between regions) into streams of at most STREAM_S seconds,
# decoded side by side, each window after window; stream c's windows are numbered from c * STREAM_WINDOWS
STREAM_S = 120.0
STREAM_WINDOWS = 1_000_000


@dataclass
class Window:
    """Up to 30 s of an input to decode: input `input`'s `index`-th window. `clip`: the whole input, when its
    windows are decoded one after another (the next is cut once this one is decoded: `next_window`)."""

    input: int
    index: int
    audio: Audio
    place: TimeMap
    clip: Audio | None = None
    attempt: int = 0            # which of the temperature fallback's temperatures decodes it (`fallback`)
    offset: float = 0.0         # where it starts in `clip` (s)
    clip_place: TimeMap | None = None     # where `clip`'s times lie in the input (VAD: its speech regions)

    @property
    def duration(self) -> float:
        return self.audio.duration

    @property
    def last(self) -> bool:
        """No window of its input follows this one."""
        return self.clip is None or self.offset + self.duration >= self.clip.duration - 1e-9


def audio_windows(audio: AudioLike | list, sample_rate: int | None, vad: VadParameters | None = None,
                  follow: bool = False) -> tuple[list[Transcript], list[Window]]:
    """One input or a list -> (a `Transcript` per input, its text still empty; the windows to decode, longest
    first, so that windows of similar length share a batch and its rows finish close together). In a list, an
    input that cannot be read (or is silent) gets its error in its transcript and no window; a single input
    raises it.

    The windows: with `follow` (timestamp mode), only the first 30 s, the next window to start where its
    transcript is complete (`next_window`), as openai-whisper and faster-whisper go through long audio; else
    consecutive windows cut at quiet points. With `vad`, the same over the input's speech alone (without
    `follow`, its speech regions packed into windows; an input without speech has none, and an empty
    transcript, not an error)."""
    many = isinstance(audio, list)
    items = audio if many else [audio]
    check(len(items) > 0, "no audio given: pass a file path, an array, or a non-empty list of them")
    transcripts, windows = [], []
    for i, item in enumerate(items):
        try:
            clip = as_audio(item, sample_rate)
            if vad is None and is_silent(clip):
                raise InputError(f"{clip.source}: the audio is silent (RMS below 1e-4); nothing to transcribe")
        except InputError as err:
            if not many:
                raise
            transcripts.append(Transcript("", _name(item), 0.0, error=str(err)))
            continue
        transcripts.append(Transcript("", clip.source, clip.duration))
        if vad is not None:
            windows += speech_windows(i, clip, vad, follow)
        elif follow:
            windows.append(window_at(i, 0, clip, 0.0))
        else:
            windows += contiguous_windows(i, clip)
    windows.sort(key=lambda w: -w.duration)
    return transcripts, windows


def window_at(i: int, index: int, clip: Audio, start: float, clip_place: TimeMap | None = None) -> Window:
    """The 30 s of `clip` (input `i`, or with `clip_place` its speech) from `start` (seconds), the `index`-th of
    its windows decoded one after another."""
    a = int(round(start * SAMPLE_RATE))
    samples = clip.samples[a : a + int(WINDOW_S * SAMPLE_RATE)]
    offset, duration = a / SAMPLE_RATE, len(samples) / SAMPLE_RATE
    place = TimeMap(((0.0, offset, duration),)) if clip_place is None else clip_place.window(offset, duration)
    return Window(i, index, Audio(samples, clip.source), place, clip, offset=offset, clip_place=clip_place)


def next_window(window: Window, complete: float) -> Window | None:
    """The window after `window` of one decoded one after another: from where its transcript is complete
    (`complete` seconds into it; a whole window when that is under a second, so that the input always moves
    on); None after the last."""
    if window.last:
        return None
    advance = complete if complete >= 1.0 else window.duration
    return window_at(window.input, window.index + 1, window.clip, window.offset + advance, window.clip_place)


def windows_left(pending: list[Window]) -> int:
    """How many windows are still to decode: `pending`, and about as many 30-s ones as follow them."""
    after = [w.clip.duration - w.offset - w.duration for w in pending if w.clip is not None]
    return len(pending) + sum(math.ceil(max(0.0, s - 1e-6) / WINDOW_S) for s in after)


def contiguous_windows(i: int, clip: Audio) -> list[Window]:
    """Input `i` cut at quiet points into consecutive windows."""
    windows, offset = [], 0.0
    for c, chunk in enumerate(split_long(clip)):
        windows.append(Window(i, c, chunk, TimeMap(((0.0, offset, chunk.duration),))))
        offset += chunk.duration
    return windows


def speech_windows(i: int, clip: Audio, vad: VadParameters, follow: bool = False) -> list[Window]:
    """Input `i`'s speech regions (silence left out) packed in order into windows of at most 30 s; with `follow`
    (timestamp mode), joined into one clip of which only the first 30 s, the next window to start where its
    transcript is complete, as faster-whisper goes through the speech VAD finds (a packed window decoded once
    loses the speech after the point where Whisper stops early)."""
    regions = speech_regions(clip.samples, vad)
    limit = int((STREAM_S if follow else WINDOW_S) * SAMPLE_RATE)
    groups: list[list[tuple[int, int]]] = []
    for a, b in regions:
        if not groups or sum(e - s for s, e in groups[-1]) + (b - a) > limit:
            groups.append([])
        groups[-1].append((a, b))
    if follow:
        return [_stream(i, c, clip, group, vad) for c, group in enumerate(groups)]
    return [Window(i, c, Audio(np.concatenate([clip.samples[a:b] for a, b in group]), clip.source),
                   _joined_place(group, vad)) for c, group in enumerate(groups)]


def _stream(i: int, c: int, clip: Audio, regions: list[tuple[int, int]], vad: VadParameters) -> Window:
    """The first window of speech regions joined into one clip (the next follows where it is complete)."""
    speech = Audio(JoinedSamples(clip.samples, regions), clip.source)     # a view, not a copy
    return window_at(i, c * STREAM_WINDOWS, speech, 0.0, _joined_place(regions, vad))


def _joined_place(regions: list[tuple[int, int]], vad: VadParameters) -> TimeMap:
    """Where the times of speech regions joined end to end lie in their input."""
    pieces, at = [], 0
    for a, b in regions:
        pieces.append((at / SAMPLE_RATE, a / SAMPLE_RATE, (b - a) / SAMPLE_RATE))
        at += b - a
    return TimeMap(tuple(pieces), vad.speech_pad_ms / 1000)


class JoinedSamples:
    """Sample ranges of one array read as one array, without a copy: `len()` and `[a:b]` (a new array of that span
    alone), which is all a clip decoded window after window is read by (`window_at`). An hour's speech is then held
    once, in the input's own samples."""

    def __init__(self, samples: np.ndarray, regions: list[tuple[int, int]]):
        self.samples, self.regions = samples, regions
        self.starts = np.cumsum([0] + [b - a for a, b in regions])        # where each region starts in the join

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, span: slice) -> np.ndarray:
        check(isinstance(span, slice) and span.step in (None, 1), "joined samples are read by [a:b] spans")
        a, b, _ = span.indices(len(self))
        parts = [self.samples[ra + max(a, lo) - lo : ra + min(b, hi) - lo]
                 for (ra, _), lo, hi in zip(self.regions, self.starts[:-1], self.starts[1:]) if lo < b and hi > a]
        return np.concatenate(parts) if parts else self.samples[:0].copy()


def _name(item: Any) -> str:
    if isinstance(item, (str, os.PathLike)):
        return str(item)
    if isinstance(item, Audio):
        return item.source
    return "array"
