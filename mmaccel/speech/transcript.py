"""What a transcription returns per input (`Transcript`: text, segments with times, words) and how it is put
together from the 30-s windows the input was decoded in (`WindowResult`, `join_windows`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from mmaccel.speech.audio import TimeMap
from mmaccel.speech.scoring import TokenScores, compression_ratio
from mmaccel.speech.timestamps import Segment, TimestampRules, split_segments

if TYPE_CHECKING:
    from mmaccel.speech.windows import Window


@dataclass
class Transcript:
    text: str
    source: str
    duration: float                 # seconds of audio
    tokens: list[int] = field(default_factory=list)   # generated ids of all windows (specials included)
    passes: int = 0                 # decoder target passes that committed its tokens (prefills included)
    error: str | None = None        # why this input could not be transcribed (list inputs only)
    segments: list[Segment] = field(default_factory=list)  # with times (from timestamps, or a window each)
    language: str | None = None     # the language it was transcribed as
    language_probability: float | None = None     # when detected (`transcribe(language=None)`)


@dataclass
class WindowResult:
    """One decoded window: its tokens, text and segments (times in the window; `place` maps them to the input)."""

    tokens: list[int]
    text: str
    segments: list[Segment]
    duration: float                 # seconds of audio in the window
    place: TimeMap
    scores: TokenScores | None = None
    complete: float | None = None   # how far into the window its transcript is complete (where the next starts)
    compression_ratio: float = 0.0  # of the text of all its tokens (a decoding loop repeats itself: > 2.4)

    @property
    def avg_logprob(self) -> float:
        """Mean log-probability of its tokens (end of text included), as openai-whisper's; 0 when not scored."""
        return sum(self.scores.logprobs) / max(1, len(self.scores.logprobs)) if self.scores is not None else 0.0

    @property
    def no_speech_prob(self) -> float:
        return self.scores.no_speech_prob if self.scores is not None else 0.0

    def emptied(self) -> WindowResult:
        """This window without its text (no speech in it): the input moves on by the whole window."""
        return replace(self, text="", segments=[], complete=self.duration)


def window_result(tokenizer, generated: list[int], window: Window, rules: TimestampRules | None,
                  scores: TokenScores | None = None, temperature: float = 0.0) -> WindowResult:
    """A window's generated tokens read as text and segments: by its timestamps under `rules`, else the
    window is one segment. An unclosed last segment is dropped when another window of the input follows
    from where this one is complete (`mmaccel.speech.windows.next_window`), else kept."""
    def decode(tokens: list[int]) -> str:
        spoken = tokens if rules is None else [t for t in tokens if t < rules.timestamp_begin]
        return tokenizer.decode(spoken, skip_special_tokens=True)

    text = decode(generated).strip()
    whole = WindowResult(generated, text, [], window.duration, window.place, scores, window.duration,
                         compression_ratio(text))
    stats = {"temperature": temperature}
    if scores is not None:          # per window, as openai-whisper reports them (end of text included)
        stats.update(avg_logprob=whole.avg_logprob, no_speech_prob=whole.no_speech_prob,
                     compression_ratio=whole.compression_ratio)
    if rules is None:
        whole.segments = [Segment(0, 0.0, window.duration, text, generated, **stats)] if text else []
        return whole
    segments, complete = split_segments(generated, rules, window.duration, keep_tail=window.last)
    if complete < 1.0:          # the input moves on by a whole window (`next_window`): keep all of this one
        segments, complete = split_segments(generated, rules, window.duration)
    kept = [Segment(0, a, b, decode(t), t, **stats) for a, b, t in segments]
    return replace(whole, text=decode([t for s in kept for t in s.tokens]).strip(), segments=kept, complete=complete)


def join_windows(transcripts: list[Transcript], parts: dict[int, dict[int, WindowResult]]) -> None:
    """Stitch each transcript from its windows, `parts[input][window]`, in window order: text, tokens and
    segments (their times, and their words', taken to the input's by each window's `place`)."""
    for i, chunks in parts.items():
        ordered = [chunks[c] for c in sorted(chunks)]
        transcripts[i].tokens = [t for w in ordered for t in w.tokens]
        transcripts[i].text = " ".join(w.text for w in ordered if w.text)
        segments = transcripts[i].segments
        for w in ordered:
            for s in w.segments:
                s.id, s.start, s.end = len(segments), round(w.place(s.start), 3), round(w.place(s.end, end=True), 3)
                for word in s.words or []:
                    word.start, word.end = (round(t, 3) for t in w.place.span(word.start, word.end))
                if s.words:     # a segment spans its words (each mapped by the piece it lies in)
                    s.start, s.end = s.words[0].start, s.words[-1].end
                segments.append(s)
