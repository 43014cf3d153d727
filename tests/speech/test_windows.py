"""The windows an input is decoded in: VAD's regions packed in order; in timestamp mode, long audio (or its
speech, with VAD) decoded window after window from where the last one's transcript is complete — segment for
segment what faster-whisper gives on the same weights (greedy, fp32, not conditioned on the previous text)."""

import numpy as np
import pytest

from mmaccel.speech import windows as windows_module
from mmaccel.speech.audio import SAMPLE_RATE, load_audio
from mmaccel.speech.vad import VadParameters
from mmaccel.speech.windows import audio_windows, next_window, windows_left
from tests.speech.test_pipeline import FILES, files  # noqa: F401  (fixture)

RATE = SAMPLE_RATE


def test_regions_are_packed_into_windows_in_order(monkeypatch):
    regions = [(0, 12 * RATE), (20 * RATE, 32 * RATE), (40 * RATE, 50 * RATE), (60 * RATE, 61 * RATE)]
    monkeypatch.setattr(windows_module, "speech_regions", lambda samples, vad: regions)
    samples = np.arange(70 * RATE, dtype=np.float32)
    transcripts, found = audio_windows((samples, RATE), None, VadParameters())
    found.sort(key=lambda w: w.index)
    assert [w.duration for w in found] == [24.0, 11.0]          # 12 + 12 s; 10 + 1 s (12 + 12 + 10 > 30)
    first, second = found
    assert np.array_equal(first.audio.samples, np.concatenate([samples[: 12 * RATE], samples[20 * RATE : 32 * RATE]]))
    assert first.place.pieces == ((0.0, 0.0, 12.0), (12.0, 20.0, 12.0)) and first.place.snap == 0.4
    assert second.place(10.5) == 60.5 and transcripts[0].duration == 70.0


def test_joined_samples_read_spans_across_regions():
    samples = np.arange(100, dtype=np.float32)
    joined = windows_module.JoinedSamples(samples, [(10, 20), (50, 55), (90, 100)])
    whole = np.concatenate([samples[10:20], samples[50:55], samples[90:100]])
    assert len(joined) == 25
    for a, b in ((0, 25), (3, 12), (10, 15), (12, 40), (24, 25), (25, 30), (0, 0)):
        assert np.array_equal(joined[a:b], whole[a:b]), (a, b)


def test_following_windows_start_where_the_transcript_is_complete():
    samples = np.arange(75 * RATE, dtype=np.float32)
    _, (long, short) = audio_windows([(samples[: 20 * RATE], RATE), (samples, RATE)], None, follow=True)  # longest first
    assert (short.duration, short.last) == (20.0, True) and next_window(short, 5.0) is None
    assert (long.duration, long.offset, long.last) == (30.0, 0.0, False) and windows_left([long]) == 3
    second = next_window(long, 26.4)                                     # complete up to 26.4 s: start there
    assert (second.index, second.offset, second.duration, second.place(1.0)) == (1, 26.4, 30.0, 27.4)
    assert np.array_equal(second.audio.samples, samples[int(26.4 * RATE) : int(56.4 * RATE)])
    third = next_window(second, 0.5)                      # under a second complete: the whole window moves on
    assert (third.offset, third.duration, third.last) == (56.4, 18.6, True) and windows_left([third]) == 1


def test_speech_in_timestamp_mode_is_followed_window_after_window(monkeypatch):
    regions = [(0, 12 * RATE), (20 * RATE, 32 * RATE), (40 * RATE, 50 * RATE), (60 * RATE, 61 * RATE)]
    monkeypatch.setattr(windows_module, "speech_regions", lambda samples, vad: regions)
    samples = np.arange(70 * RATE, dtype=np.float32)
    _, (first,) = audio_windows((samples, RATE), None, VadParameters(), follow=True)     # 35 s of speech, one stream
    assert (first.duration, first.last, first.clip.duration) == (30.0, False, 35.0)
    assert first.place.pieces == ((0.0, 0.0, 12.0), (12.0, 20.0, 12.0), (24.0, 40.0, 6.0))
    second = next_window(first, 26.0)                   # from 26 s of the speech: 42 s of the input, then 60 s
    assert (second.index, second.offset, second.duration, second.last) == (1, 26.0, 9.0, True)
    assert second.place.pieces == ((0.0, 42.0, 8.0), (8.0, 60.0, 1.0)) and second.place(8.5) == 60.5
    assert np.array_equal(second.audio.samples, np.concatenate([samples[42 * RATE : 50 * RATE], samples[60 * RATE : 61 * RATE]]))
    assert isinstance(first.clip.samples, windows_module.JoinedSamples)       # the speech is not copied whole
    monkeypatch.setattr(windows_module, "STREAM_S", 20.0)      # streams of at most 20 s, cut between regions
    _, streams = audio_windows((samples, RATE), None, VadParameters(), follow=True)
    streams.sort(key=lambda w: w.index)
    assert [(w.index, w.duration, w.place.pieces[0][1]) for w in streams] == [
        (0, 12.0, 0.0), (windows_module.STREAM_WINDOWS, 12.0, 20.0), (2 * windows_module.STREAM_WINDOWS, 11.0, 40.0)]
    assert all(w.last for w in streams)


def test_long_audio_in_timestamp_mode_is_faster_whispers_segment_for_segment(tiny_en_asr, files):  # noqa: F811
    fw = pytest.importorskip("faster_whisper")
    from mmaccel.speech.whisper import ct2_model_dir

    clips = [load_audio(f).samples for f in files]
    pause = np.zeros(RATE, np.float32)
    long = np.concatenate([x for c in clips + clips for x in (c, pause)])        # 59 s: 3 windows
    reports = []
    ours = tiny_en_asr.transcribe((long, RATE), timestamps=True, progress=lambda *r: reports.append(r)).transcripts[0]
    peer = fw.WhisperModel(str(ct2_model_dir("tiny.en")), device="cpu", compute_type="float32", cpu_threads=2)
    theirs, _ = peer.transcribe(long, language="en", beam_size=1, temperature=0.0, condition_on_previous_text=False)
    theirs = list(theirs)
    assert [s.text for s in ours.segments] == [s.text for s in theirs] and len(theirs) >= 10
    # the same times, but for the last segment's end (faster-whisper lets it run past the audio's end)
    assert [(s.start, s.end) for s in ours.segments[:-1]] == [(round(s.start, 3), round(s.end, 3)) for s in theirs[:-1]]
    assert ours.segments[-1].start == round(theirs[-1].start, 3) and ours.segments[-1].end <= ours.duration
    assert ours.text == " ".join(s.text.strip() for s in ours.segments)
    assert reports[-1][0] == reports[-1][1] == 3
