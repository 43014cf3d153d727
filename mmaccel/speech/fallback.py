"""Whisper's temperature fallback, as openai-whisper's and faster-whisper's `transcribe` apply it by default.

A window's transcript fails when it repeats itself (the compression ratio of its text above 2.4: a decoding
loop) or the model doubts it (mean log-probability of its tokens below -1). A failed window is decoded again,
sampled at the next temperature (0.2, 0.4, ... 1.0; `best_of` samples each, the likeliest kept) until one
passes; when none does, the likeliest of those that do not repeat themselves is kept. A doubtful window the
model also thinks holds no speech (<|nospeech|> probability above 0.6) is not retried but left empty.

The first temperature is the method's own (0: greedy, or a lossless method's greedy tokens); the re-decodes
are plain sampling, seeded, whatever the method: the same windows fail for every lossless method, so their
transcripts stay the same with the fallback on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mmaccel.errors import check
from mmaccel.speech.transcript import WindowResult

TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Fallback:
    """When a window is decoded again, and how (the defaults are openai-whisper's and faster-whisper's)."""

    temperatures: tuple[float, ...] = TEMPERATURES
    compression_ratio_threshold: float | None = 2.4     # None: never fail on repetition
    log_prob_threshold: float | None = -1.0             # None: never fail on doubt
    no_speech_threshold: float | None = 0.6             # None: never leave a window empty
    best_of: int = 5                                    # samples per sampled temperature
    seed: int = 0

    @classmethod
    def of(cls, temperature: float | Sequence[float], compression_ratio_threshold: float | None,
           log_prob_threshold: float | None, no_speech_threshold: float | None, best_of: int, seed: int) -> Fallback:
        """Checked `transcribe` arguments; `temperature` is one value (no fallback) or the ones to try in order."""
        temps = (temperature,) if isinstance(temperature, (int, float)) else temperature
        check(isinstance(temps, Sequence) and len(temps) > 0
              and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 2 for t in temps),
              f"temperature must be a number in [0, 2] or a non-empty sequence of them, got {temperature!r}")
        check(list(temps) == sorted(temps), f"temperatures are tried in order and must not decrease, got {temperature!r}")
        for name, value in (("compression_ratio_threshold", compression_ratio_threshold),
                            ("log_prob_threshold", log_prob_threshold), ("no_speech_threshold", no_speech_threshold)):
            check(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)),
                  f"{name} must be a number or None, got {value!r}")
        check(isinstance(best_of, int) and 1 <= best_of <= 16, f"best_of must be an int in [1, 16], got {best_of!r}")
        check(isinstance(seed, int), f"seed must be an int, got {seed!r}")
        return cls(tuple(float(t) for t in temps), compression_ratio_threshold, log_prob_threshold,
                   no_speech_threshold, best_of, seed)

    @property
    def scored(self) -> bool:
        """Whether a window's verdict needs its tokens' log-probabilities and no-speech probability."""
        retries = len(self.temperatures) > 1 and self.log_prob_threshold is not None
        return retries or self.no_speech_threshold is not None

    def samples(self, attempt: int) -> int:
        """Rows decoded for a window at its `attempt`-th temperature."""
        return self.best_of if self.temperatures[attempt] > 0 else 1

    def retry(self, result: WindowResult, attempt: int) -> bool:
        """Whether a window decoded at its `attempt`-th temperature is decoded again at the next."""
        return attempt + 1 < len(self.temperatures) and self._fails(result) and not self._silent(result)

    def final(self, tried: list[WindowResult]) -> WindowResult:
        """A window's result from its decodes in order: the last when it passed, else the likeliest of those
        that do not repeat themselves (or of all); emptied when the model thinks it holds no speech."""
        result = tried[-1]
        if self._fails(result) and len(tried) > 1:
            fluent = [r for r in tried if not self._repeats(r)]
            result = max(fluent or tried, key=lambda r: r.avg_logprob)
        return result.emptied() if self._skip(result) else result

    def _repeats(self, result: WindowResult) -> bool:
        return self.compression_ratio_threshold is not None and result.compression_ratio > self.compression_ratio_threshold

    def _doubtful(self, result: WindowResult) -> bool:
        return self.log_prob_threshold is not None and result.avg_logprob < self.log_prob_threshold

    def _fails(self, result: WindowResult) -> bool:
        return self._repeats(result) or self._doubtful(result)

    def _silent(self, result: WindowResult) -> bool:
        """Doubtful and probably no speech: left empty rather than decoded again."""
        return (self.no_speech_threshold is not None and result.no_speech_prob > self.no_speech_threshold
                and self._doubtful(result))

    def _skip(self, result: WindowResult) -> bool:
        """openai-whisper's rule: no speech, unless the transcript is confident (log-probability above the threshold)."""
        if self.no_speech_threshold is None or result.no_speech_prob <= self.no_speech_threshold:
            return False
        return self.log_prob_threshold is None or result.avg_logprob <= self.log_prob_threshold
