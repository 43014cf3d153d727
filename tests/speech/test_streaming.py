"""Live transcription: local agreement on scripted hypotheses, the streamer's buffer and delays on a fake clock
and a fake model, real-time playback of a file, and the real tiny.en streaming real speech."""

import numpy as np
import pytest

from mmaccel.errors import InputError
from mmaccel.metrics.wer import corpus_wer
from mmaccel.speech.alignment import Word
from mmaccel.speech.audio import SAMPLE_RATE, load_audio
from mmaccel.speech.streaming import LocalAgreement, Streamer, realtime_chunks, stream_updates
from mmaccel.speech.timestamps import Segment
from mmaccel.speech.transcript import Transcript
from tests.speech.test_pipeline import FILES, files  # noqa: F401  (fixture)


def words(*timed: tuple[str, float]) -> list[Word]:
    return [Word(t, t + 0.3, f" {w}", 0.9) for w, t in timed]


def test_local_agreement_commits_what_two_hypotheses_share_and_never_retracts():
    agree = LocalAgreement()
    assert agree.update(words(("the", 0.0), ("cat", 0.5))) == []                       # nothing to agree with yet
    assert [w.word for w in agree.update(words(("the", 0.0), ("cap", 0.5), ("sat", 1.0)))] == [" the"]
    # "cap" was not confirmed; the next hypothesis goes back to "cat" and repeats "the" with a shifted time
    assert agree.update(words(("The", 0.1), ("cat", 0.5), ("sat", 1.0))) == []         # "cat" != pending "cap"
    committed = agree.update(words(("the", 0.05), ("cat,", 0.55), ("sat", 1.0), ("down", 1.4)))
    assert [w.word for w in committed] == [" cat,", " sat"]                            # punctuation and case ignored
    assert [w.word for w in agree.committed] == [" the", " cat,", " sat"]
    assert [w.word for w in agree.finish()] == [" down"] and agree.pending == []


class FakeASR:
    """Hypotheses of the buffer it is given, as a model would hear them: a word in every second j of the stream
    (from j + 0.1 to j + 0.6 s), named w<j>, but the words of the buffer's last `unsure` s, which change with
    every call (so they are committed one decode later)."""

    def __init__(self, buffer_start, unsure: float = 1.0):
        self.start, self.unsure, self.calls, self.lengths = buffer_start, unsure, 0, []

    def __call__(self, audio):
        self.calls += 1
        self.lengths.append(audio.duration)
        offset, end = self.start(), self.start() + audio.duration
        out = [Word(j + 0.1 - offset, j + 0.6 - offset, f" w{j}" if j + 1 <= end - self.unsure else f" x{self.calls}",
                    0.9) for j in range(int(np.ceil(offset - 0.1)), int(end + 1e-9) + 1) if j + 0.6 <= end + 1e-9]
        segments = [Segment(i, w.start, w.end, w.word, [], words=[w]) for i, w in enumerate(out)]
        return type("Out", (), {"transcripts": [Transcript("", "stream", audio.duration, segments=segments)]})()


def test_the_streamer_commits_in_order_trims_its_buffer_and_measures_delays():
    now = [100.0]
    streamer = Streamer(lambda a: asr(a), min_chunk_s=1.0, trim_s=5.0, clock=lambda: now[0])
    asr = FakeASR(lambda: streamer.buffer_start)
    committed = []
    for _ in range(40):                                          # 20 s in 0.5-s chunks, at real time
        now[0] += 0.5
        update = streamer.feed(np.full(SAMPLE_RATE // 2, 0.1, np.float32))
        if update is not None:
            committed += update.committed
    committed += streamer.finish().committed
    names = [w.word.strip() for w in committed]
    assert names == [f"w{k}" for k in range(19)] + names[19:] and len(names) <= 21      # in order, never twice
    assert max(asr.lengths) <= 5.0 + 1.0 + 1e-9                  # trimmed once past trim_s
    assert all(b.start >= a.start for a, b in zip(committed, committed[1:]))
    # stream time 0 was spoken 0.5 s before the first chunk arrived; w3 (3.1-3.6 s) is sure from the decode at
    # 5 s on and committed by the one at 6 s, 2.4 s after it was spoken
    w3 = next(w for w in committed if w.word == " w3")
    assert w3.delay == pytest.approx(2.4)
    assert asr.calls == 20 + 1                                   # a decode per second of audio, and the last


def test_bad_stream_input_is_refused():
    streamer = Streamer(lambda a: None)
    with pytest.raises(InputError, match="mono sample arrays"):
        streamer.feed(np.zeros((2, 100), np.float32))
    with pytest.raises(InputError, match="NaN"):
        streamer.feed(np.full(100, np.nan, np.float32))
    with pytest.raises(InputError, match="trim_s"):
        Streamer(lambda a: None, trim_s=40)
    with pytest.raises(InputError, match="sample rate"):
        Streamer(lambda a: None, sample_rate=3)


def test_realtime_chunks_play_a_file_at_its_own_pace():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s

    chunks = realtime_chunks(np.arange(16000, dtype=np.float32), 16000, 0.25, clock=lambda: now[0], sleep=sleep)
    first = next(chunks)
    assert len(first) == 4000 and now[0] == pytest.approx(0.25)     # a chunk once it has been spoken
    now[0] += 0.6                                                   # the consumer was busy for 0.6 s
    assert len(next(chunks)) == 9600                                # everything spoken meanwhile
    rest = list(chunks)
    assert sum(map(len, rest)) == 2400 and now[0] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def speech(files):  # noqa: F811
    """17 s of real speech: three clips with pauses of 0.5 s."""
    pause = np.zeros(SAMPLE_RATE // 2, np.float32)
    return np.concatenate([x for f in files[:3] for x in (load_audio(f).samples, pause)])


def _stream(asr, speech, method, **params):
    chunks = [speech[a : a + SAMPLE_RATE // 2] for a in range(0, len(speech), SAMPLE_RATE // 2)]
    return [w for u in asr.stream(chunks, method, min_chunk_s=2.0, trim_s=8.0, **params) for w in u.committed]


@pytest.mark.slow     # 16 s; the CLI test streams the same speech through tiny.en
def test_tiny_en_streams_speech_as_it_transcribes_it_offline(tiny_en_asr, speech):
    committed = _stream(tiny_en_asr, speech, "greedy")
    offline = tiny_en_asr.transcribe((speech, SAMPLE_RATE)).texts[0]
    assert corpus_wer([offline], ["".join(w.word for w in committed)]).wer <= 0.05
    assert all(b.start >= a.start - 0.5 for a, b in zip(committed, committed[1:]))
    assert committed[-1].end <= len(speech) / SAMPLE_RATE + 0.1
    with pytest.raises(InputError, match="not supported|English-only|language"):
        tiny_en_asr.stream([speech], language="fr")
    updates = list(stream_updates(Streamer(lambda a: None), [np.zeros(SAMPLE_RATE, np.float32)] * 3))
    assert [u.committed for u in updates] == [[], [], [], []]     # silence: no decode, no words


@pytest.mark.slow
def test_a_lossless_method_streams_greedys_words(tiny_en_asr, speech):
    greedy, eagle = _stream(tiny_en_asr, speech, "greedy"), _stream(tiny_en_asr, speech, "eagle")
    assert [(w.word, w.start, w.end) for w in eagle] == [(w.word, w.start, w.end) for w in greedy]


def test_the_cli_streams_a_file_and_pcm_on_stdin(speech, tmp_path, capsys, monkeypatch):
    import io
    import json

    import soundfile as sf

    from mmaccel.cli import main

    sf.write(tmp_path / "speech.wav", speech, SAMPLE_RATE)
    tiny = ["--model", "builtin:tiny.en", "--heads", "none", "--draft", "none", "--min-chunk-s", "3", "--trim-s", "8"]
    assert main(["asr", "stream", str(tmp_path / "speech.wav"), "--words", *tiny]) == 0
    out, err = capsys.readouterr()
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) > 20 and all(len(r) == 4 and float(r[0]) <= float(r[1]) for r in rows)
    summary = json.loads(err.strip().splitlines()[-1])
    assert summary["words"] == len(rows) and not summary["realtime"] and "delay_median_s" not in summary
    pcm = (np.clip(speech[: 6 * SAMPLE_RATE], -1, 1) * 32767).astype("<i2").tobytes()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(pcm[:-1])))        # an odd byte count too
    assert main(["asr", "stream", "-", *tiny]) == 0
    out, err = capsys.readouterr()
    assert out.split()[:3] == [r[3] for r in rows[:3]] and json.loads(err.strip().splitlines()[-1])["realtime"]
