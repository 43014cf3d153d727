"""Whisper's temperature fallback: its verdicts on a window, and `transcribe` re-decoding failed windows."""

import pytest

from mmaccel.errors import InputError
from mmaccel.speech.audio import TimeMap
from mmaccel.speech.fallback import TEMPERATURES, Fallback
from mmaccel.speech.scoring import TokenScores
from mmaccel.speech.timestamps import Segment
from mmaccel.speech.transcript import WindowResult
from tests.speech.test_pipeline import files  # noqa: F401  (the fixture)


def result(avg_logprob: float, ratio: float = 1.5, no_speech: float = 0.01, text: str = "words") -> WindowResult:
    segments = [Segment(0, 0.0, 2.0, text, [1, 2])]
    return WindowResult([1, 2], text, segments, 10.0, TimeMap(((0.0, 0.0, 10.0),)),
                        TokenScores([avg_logprob, avg_logprob], no_speech), 2.0, ratio)


def test_a_window_is_retried_when_it_repeats_itself_or_is_doubtful_unless_it_is_silence():
    fb = Fallback()
    assert not fb.retry(result(-0.3), 0)
    assert fb.retry(result(-0.3, ratio=10.5), 0)               # a decoding loop
    assert fb.retry(result(-1.3), 0)                           # the model doubts it
    assert not fb.retry(result(-1.3, no_speech=0.9), 0)        # doubtful and no speech: silence, not retried
    assert fb.retry(result(-0.3, ratio=10.5, no_speech=0.9), 0)   # confident loop: retried
    assert not fb.retry(result(-1.3), len(TEMPERATURES) - 1)     # no temperature left
    assert not Fallback(log_prob_threshold=None).retry(result(-5.0), 0)


def test_the_final_result_is_the_passing_one_or_the_likeliest_fluent_one_and_silence_is_emptied():
    fb = Fallback()
    loop, doubt, good = result(-0.2, ratio=9.0), result(-1.5), result(-0.4)
    assert fb.final([loop, good]) is good
    assert fb.final([loop, doubt, result(-1.2)]).avg_logprob == -1.2      # the loop is left out though likelier
    assert fb.final([loop, result(-0.1, ratio=8.0)]).avg_logprob == -0.1  # all repeat: the likeliest
    silent = fb.final([result(-1.3, no_speech=0.9)])
    assert silent.text == "" and silent.segments == [] and silent.complete == 10.0
    assert fb.final([result(-0.5, no_speech=0.9)]).text == "words"       # confident: kept despite no-speech
    assert Fallback(no_speech_threshold=None).final([result(-1.3, no_speech=0.9)]).text == "words"


def test_arguments_are_checked_in_one_line():
    assert Fallback.of(0.0, 2.4, -1.0, 0.6, 5, 0).temperatures == (0.0,)
    assert Fallback.of([0, 0.5], None, None, None, 1, 3).samples(1) == 1
    for bad in ([], [0.4, 0.2], -0.1, "hot", [0, True]):
        with pytest.raises(InputError, match="temperature"):
            Fallback.of(bad, 2.4, -1.0, 0.6, 5, 0)
    with pytest.raises(InputError, match="best_of"):
        Fallback.of(0.0, 2.4, -1.0, 0.6, 0, 0)
    with pytest.raises(InputError, match="log_prob_threshold"):
        Fallback.of(0.0, 2.4, "low", 0.6, 5, 0)
    assert Fallback(temperatures=(0.0,), no_speech_threshold=None).scored is False
    assert Fallback().scored and Fallback(temperatures=(0.0,)).scored      # the no-speech verdict reads scores


def test_failed_windows_are_sampled_again_seeded_and_a_lossless_method_gives_greedys_transcript(tiny_en_asr, files):  # noqa: F811
    # every window fails (mean log-probability below 0): each is decoded again at 0.7, two samples each
    forced = dict(temperature=(0.0, 0.7), log_prob_threshold=0.0, no_speech_threshold=None, best_of=2,
                  max_new_tokens=40, batch_size=2)
    for timestamps in (False, True):
        out = tiny_en_asr.transcribe(files[:3], "greedy", timestamps=timestamps, **forced)
        lossless = tiny_en_asr.transcribe(files[:3], "ngram", k=3, timestamps=timestamps, **forced)
        assert [t.tokens for t in out.transcripts] == [t.tokens for t in lossless.transcripts]
        assert out.stats.time_s["fallback"] > 0 and {s.temperature for t in out.transcripts for s in t.segments} <= {0.0, 0.7}
    again = tiny_en_asr.transcribe(files[:3], "greedy", timestamps=True, **forced)
    plain = tiny_en_asr.transcribe(files[:3], "greedy", timestamps=True, temperature=0.0, max_new_tokens=40, batch_size=2)
    assert again.texts == out.texts and "fallback" not in plain.stats.time_s
    assert all(t.passes > p.passes for t, p in zip(out.transcripts, plain.transcripts))
    assert all(s.temperature == 0.0 for t in plain.transcripts for s in t.segments)
    # a sampled first temperature: the samples differ with the seed
    sampled = [tiny_en_asr.transcribe(files[:2], "greedy", temperature=1.0, best_of=1, seed=s,
                                      max_new_tokens=40).texts for s in (0, 1)]
    assert sampled[0] != sampled[1] and sampled[0] != plain.texts[:2]


def test_a_doubtful_window_with_no_speech_is_left_empty(tiny_en_asr, files):  # noqa: F811
    out = tiny_en_asr.transcribe(files[:2], "greedy", log_prob_threshold=0.0, no_speech_threshold=0.0)
    assert out.texts == ["", ""] and all(t.segments == [] and t.error is None for t in out.transcripts)
    assert "fallback" not in out.stats.time_s              # silence is not decoded again


def test_the_wall_time_covers_the_whole_call(tiny_en_asr, files):  # noqa: F811
    out = tiny_en_asr.transcribe(files[:2], "greedy", word_timestamps=True)
    phases = sum(out.stats.time_s[k] for k in ("features", "encoder", "decode", "scores", "words"))
    assert out.wall_s >= phases and out.wall_s == out.stats.time_s["transcribe"]
