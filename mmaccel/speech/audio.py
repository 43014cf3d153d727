"""Audio in: read a file or take an array, make it 16 kHz mono float32, cut long audio into
Whisper-sized chunks at quiet points, and compute log-mel features.

Files are read with soundfile (libsndfile: wav, flac, ogg/vorbis/opus, mp3, aiff, ...) and
resampled with soxr (the "HQ" preset). Nothing here modifies an array a caller passed in.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from mmaccel.errors import InputError, check

SAMPLE_RATE = 16_000
READ_BLOCK_S = 60.0        # a file is read and resampled a minute at a time
WINDOW_S = 30.0            # Whisper's receptive field
SILENCE_RMS = 1e-4         # below this root-mean-square level a clip counts as silent
CUT_SEARCH_S = 5.0         # a long-audio cut is placed at the quietest point of the last 5 s of a window
CUT_FRAME_S = 0.1          # ... measured over 100 ms frames
HOP = 160                  # samples per log-mel frame
PADDINGS = ("zeros", "silence")     # how `log_mel` fills a window's frames after a clip shorter than 30 s

AudioLike = str | os.PathLike | np.ndarray | Tensor | tuple


@dataclass
class Audio:
    """16 kHz mono float32 samples and where they came from (a path, or "array")."""

    samples: np.ndarray
    source: str = "array"

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


@dataclass(frozen=True)
class TimeMap:
    """Where a window's times lie in its input: pieces (at, start, length) in seconds, window time
    [at, at + length) being input time [start, start + length). One piece for a window cut from the input
    as it is; one per speech region for a window VAD packed. `snap`: a segment that starts less than this
    before its piece ends starts at the next piece (it is the padding around a region; the speech is
    after it), and one that ends less than this into a piece ends at the piece before."""

    pieces: tuple[tuple[float, float, float], ...]
    snap: float = 0.0

    def _piece(self, t: float, end: bool) -> int:
        ends = [at + length for at, _, length in self.pieces]
        return min(bisect.bisect_left(ends, t) if end else bisect.bisect_right(ends, t), len(self.pieces) - 1)

    def __call__(self, t: float, end: bool = False) -> float:
        """The input time of window time `t`, a segment's start (or with `end` its end). A time on the border
        of two pieces is the later piece's start, or with `end` the earlier piece's end; a time past the
        last piece runs on from it."""
        k = self._piece(t, end)
        at, start, length = self.pieces[k]
        if not end and k + 1 < len(self.pieces) and at + length - t < self.snap:
            return self.pieces[k + 1][1]
        if end and k > 0 and t - at < self.snap:
            _, before, before_length = self.pieces[k - 1]
            return before + before_length
        return start + t - at

    def window(self, offset: float, duration: float) -> TimeMap:
        """The map of the window [offset, offset + duration) of the audio this maps (its pieces that overlap it,
        clipped and shifted to start at 0)."""
        pieces = tuple((max(at, offset) - offset, start + max(at, offset) - at, min(at + length, offset + duration)
                        - max(at, offset)) for at, start, length in self.pieces
                       if at < offset + duration and at + length > offset)
        return TimeMap(pieces or ((0.0, self(offset), duration),), self.snap)

    def span(self, a: float, b: float) -> tuple[float, float]:
        """Input times of window span [a, b] (a word's), both in the piece of its middle."""
        at, start, _ = self.pieces[self._piece((a + b) / 2, False)]
        return start + a - at, start + b - at


def load_audio(path: str | os.PathLike) -> Audio:
    """Read an audio file and return it as 16 kHz mono float32. The file is read, mixed down and resampled
    `READ_BLOCK_S` at a time, so an hour of 48 kHz stereo never sits in memory at its own rate.

    Raises InputError for a missing, unreadable, empty or non-audio file, naming the file.
    """
    import soundfile as sf

    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"audio file not found: {p}")
    if p.stat().st_size == 0:
        raise InputError(f"audio file is empty (0 bytes): {p}")
    try:
        with sf.SoundFile(str(p)) as f:
            resample = Resampler(f.samplerate, str(p))
            # the header's length at 16 kHz, but never more than 64 samples a byte of file (a header may lie)
            out = _Filled(min(int(max(f.frames, 0) * SAMPLE_RATE / f.samplerate) + SAMPLE_RATE, 64 * p.stat().st_size))
            for b in f.blocks(int(READ_BLOCK_S * f.samplerate), dtype="float32", always_2d=True):
                out.add(resample(_mono(b, str(p))))
    except (sf.LibsndfileError, RuntimeError, TypeError) as err:
        raise InputError(f"cannot read {p} as audio ({err}); supported: wav, flac, ogg, mp3 and other "
                         "libsndfile formats") from None
    check(out.size > 0, f"{p}: audio has no samples")
    out.add(resample.flush())
    return Audio(out.samples(), str(p))


def as_audio(audio: AudioLike, sample_rate: int | None = None) -> Audio:
    """Accept a path, an `Audio`, a 1-D/2-D array or tensor (with `sample_rate`), or an
    `(array, sample_rate)` pair; return 16 kHz mono float32 (a new array)."""
    if isinstance(audio, Audio):
        return audio
    if isinstance(audio, (str, os.PathLike)):
        check(sample_rate is None, "sample_rate is read from the file; pass it only with an array")
        return load_audio(audio)
    if isinstance(audio, tuple):
        check(len(audio) == 2 and sample_rate is None, "pass audio as (samples, sample_rate)")
        audio, sample_rate = audio
    if isinstance(audio, Tensor):
        audio = audio.detach().cpu().numpy()
    check(isinstance(audio, np.ndarray), f"audio must be a path, an array or a tensor, got {type(audio).__name__}")
    check(sample_rate is not None, "an audio array needs its sample_rate (e.g. sample_rate=16000)")
    check(audio.ndim in (1, 2), f"audio array must be [samples] or [samples, channels], got shape {audio.shape}")
    check(np.issubdtype(audio.dtype, np.number) and not np.issubdtype(audio.dtype, np.complexfloating),
          f"audio samples must be real numbers, got dtype {audio.dtype}")
    samples = audio if audio.ndim == 2 else audio[:, None]
    if samples.shape[1] > samples.shape[0] and samples.shape[1] > 16:
        raise InputError(f"audio array of shape {audio.shape} looks like [channels, samples]; pass [samples, channels]")
    if np.issubdtype(samples.dtype, np.integer):   # PCM integers -> [-1, 1)
        samples = samples / float(np.iinfo(samples.dtype).max + 1)
    return Audio(_to_mono_16k(np.asarray(samples, dtype=np.float32), sample_rate, "array"))


def _to_mono_16k(samples: np.ndarray, rate: int, name: str) -> np.ndarray:
    check(samples.shape[0] > 0, f"{name}: audio has no samples")
    resample = Resampler(rate, name)
    return _joined([resample(_mono(samples, name)), resample.flush()])


def _check_rate(rate, name: str) -> int:
    check(isinstance(rate, (int, np.integer)) and 1000 <= rate <= 384_000,
          f"{name}: sample rate must be an integer in [1000, 384000] Hz, got {rate!r}")
    return int(rate)


def check_finite(samples: np.ndarray, name: str) -> None:
    """Refuse samples with a NaN or inf in one line naming their source."""
    check(bool(np.isfinite(samples).all()), f"{name}: audio contains NaN or inf samples")


def _mono(samples: np.ndarray, name: str) -> np.ndarray:
    """[samples, channels] float32 -> [samples], the channels' mean (a new array)."""
    check_finite(samples, name)
    return samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0].copy()


class Resampler:
    """Mono blocks at `rate`, one after another -> 16 kHz (soxr's "HQ", streamed: the same samples as
    resampling the blocks joined); `flush()` gives the last samples after the last block."""

    def __init__(self, rate: int, name: str = "audio"):
        import soxr

        rate = _check_rate(rate, name)
        self.stream = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32",
                                                                             quality="HQ")

    def __call__(self, block: np.ndarray) -> np.ndarray:
        return block if self.stream is None else self.stream.resample_chunk(block.astype(np.float32, copy=False))

    def flush(self) -> np.ndarray:
        empty = np.zeros(0, np.float32)
        return empty if self.stream is None else self.stream.resample_chunk(empty, last=True)


class _Filled:
    """Blocks of samples written one after another into one float32 array, allocated for `capacity` samples (the
    file's length at 16 kHz) and grown by doubling past it: a long file is never held twice (blocks and join)."""

    def __init__(self, capacity: int):
        self.buffer, self.size = np.empty(max(capacity, 1), np.float32), 0

    def add(self, block: np.ndarray) -> None:
        if self.size + len(block) > len(self.buffer):
            self.buffer = np.resize(self.buffer, max(2 * len(self.buffer), self.size + len(block)))
        self.buffer[self.size : self.size + len(block)] = block
        self.size += len(block)

    def samples(self) -> np.ndarray:
        """The samples written (a copy only where the capacity was far more than they fill)."""
        kept = self.buffer[: self.size]
        return kept if 2 * self.size >= len(self.buffer) else kept.copy()


def _joined(blocks: list[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate(blocks), dtype=np.float32)


def is_silent(audio: Audio) -> bool:
    return float(np.sqrt(np.mean(np.square(audio.samples, dtype=np.float64)))) < SILENCE_RMS


def split_long(audio: Audio, window_s: float = WINDOW_S) -> list[Audio]:
    """`audio` as consecutive chunks of at most `window_s` seconds.

    Each chunk but the last ends at the centre of the quietest 100 ms frame of its last
    `CUT_SEARCH_S` seconds, so cuts fall between words wherever the speech pauses; chunks do not
    overlap, so their transcripts are joined without de-duplication.
    """
    window = int(window_s * SAMPLE_RATE)
    check(window > int(CUT_SEARCH_S * SAMPLE_RATE), f"window_s must exceed {CUT_SEARCH_S} s, got {window_s}")
    return [Audio(audio.samples[a:b], audio.source) for a, b in _cuts(len(audio.samples), window, audio.samples)]


def _cuts(n: int, window: int, samples: np.ndarray):
    frame, search = int(CUT_FRAME_S * SAMPLE_RATE), int(CUT_SEARCH_S * SAMPLE_RATE)
    start = 0
    while n - start > window:
        end = start + window
        region = samples[end - search : end]
        energy = np.square(region[: len(region) // frame * frame].reshape(-1, frame), dtype=np.float64).mean(1)
        best = len(energy) - 1 - int(np.argmin(energy[::-1]))     # the quietest frame; ties go to the latest
        end = end - search + best * frame + frame // 2
        yield start, end
        start = end
    yield start, n


def log_mel(feature_extractor, audios: list[Audio], padding: str = "zeros") -> Tensor:
    """Whisper log-mel features [B, mels, 3000] of clips of at most 30 s (transformers'
    `WhisperFeatureExtractor` computes the clip's frames). The frames after a shorter clip:

    - "zeros": 0 in the normalised log-mel, as openai-whisper's `transcribe` (it cuts a window's
      frames at the end of the audio and pads the log-mel with zeros) and faster-whisper do. With it
      our greedy gives faster-whisper float32's tokens on the same weights (`benchmarks/asr_gap`);
    - "silence": the log-mel of the clip padded with digital silence (what the feature extractor
      alone gives: at the floor, 8 decades below the clip's loudest bin), on which the Whisfusion
      decoder was trained.

    The choice moves transcripts far more than numerics do (the window is mostly padding for a short
    clip): on the WER-gap split it was the whole difference between our greedy and faster-whisper's."""
    check(len(audios) > 0, "no audio to featurise")
    check(padding in PADDINGS, f"unknown log-mel padding {padding!r}; choose from {', '.join(PADDINGS)}")
    for a in audios:
        check(a.duration <= WINDOW_S + 1e-6, f"{a.source}: {a.duration:.1f} s is longer than one "
              f"{WINDOW_S:.0f} s window; split it with split_long first")
    features = feature_extractor([a.samples for a in audios], sampling_rate=SAMPLE_RATE,
                                 return_tensors="pt")["input_features"]
    if padding == "zeros":
        for row, a in zip(features, audios):
            row[:, len(a.samples) // HOP:] = 0.0        # the clip's frames: as many as whole hops in it
    return features
