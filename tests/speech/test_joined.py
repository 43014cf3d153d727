"""JoinedTranscription: requests whose windows join a call as its rows end get what each gets alone."""

import numpy as np
import pytest

from mmaccel.errors import InputError
from mmaccel.speech.audio import Audio, load_audio
from mmaccel.speech.fallback import Fallback
from mmaccel.speech.joined import JoinedTranscription
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)


class Source:
    """Requests `items` (handle, audio) taken one at a time; `gone` names handles whose clients go away after
    their rows have decoded a few steps."""

    def __init__(self, items, gone=()):
        self.items, self.away, self.out, self.taken = list(items), dict.fromkeys(gone, 0), {}, []
        self.released = {}                             # handle -> requests answered when the call let it go

    def take(self):
        if not self.items:
            return None
        self.taken.append(self.items[0][0])
        return self.items.pop(0)

    def finish(self, handle, transcript):
        self.out[handle] = transcript

    def gone(self, handle):
        if handle not in self.away or handle not in self.taken:
            return False
        self.away[handle] += 1                         # asked once when its window is placed, then every step
        return self.away[handle] > 4

    def release(self, handle):
        assert handle not in self.released
        self.released[handle] = len(self.out)


@pytest.fixture(scope="module")
def audios(files):  # noqa: F811
    clips = [load_audio(f) for f in files]
    pause = np.zeros(16000, np.float32)
    long = Audio(np.concatenate([x for c in clips + clips for x in (c.samples, pause)]), "long.wav")     # 59 s
    return [clips[0], long, clips[1], clips[2]]


def _view(t):
    return (t.text, t.tokens, [(s.start, s.end, s.text, [(w.word, w.start, w.end) for w in s.words or []])
                               for s in t.segments])


def _joined(asr, audios, rows, first=2, **options):
    items = list(enumerate(audios))
    source = Source(items[first:])
    JoinedTranscription(asr, source, items[:first], rows=rows, **options).run()
    assert not source.items                          # every request was taken into the one call
    return [source.out[i] for i in range(len(audios))]


@pytest.mark.parametrize("method, params, rows, options, long", [
    # the long audio window after window (each from where the last is complete), the clips joining beside it
    ("greedy", {}, 2, {"word_timestamps": True}, True),
    ("greedy", {}, 3, {}, False),                    # a spare row, taken by the third request at the first step
    ("eagle", {}, 3, {"timestamps": True}, False),
    pytest.param("ngram", {"k": 3}, 2, {}, False, marks=pytest.mark.slow),
])
def test_windows_joining_as_rows_end_get_what_each_gets_alone(tiny_en_asr, audios, method, params, rows, options,
                                                             long):
    audios = audios if long else [audios[0], audios[2], audios[3]]
    alone = [tiny_en_asr.transcribe(a, method, **options, **params).transcripts[0] for a in audios]
    together = _joined(tiny_en_asr, audios, rows, method=method, **options, **params)
    assert [_view(t) for t in together] == [_view(t) for t in alone]
    assert all(t.passes > 0 for t in together)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["speculative", "tree"])
def test_a_draft_decoder_joins_too_and_languages_are_detected(audios, method):
    from mmaccel.speech.pipeline import ASRPipeline
    from tests.conftest import installed

    base = installed(lambda: ASRPipeline.from_pretrained("builtin:base"), "Whisper base")
    alone = [base.transcribe(a, method, language=None).transcripts[0] for a in audios]
    together = _joined(base, audios, 3, method=method, language=None)
    assert [_view(t) for t in together] == [_view(t) for t in alone]
    assert [t.language for t in together] == ["en"] * 4 and together[0].language_probability > 0.5


def test_a_window_the_fallback_decodes_again_is_sampled_as_alone(tiny_en_asr, audios, monkeypatch):
    failed = Fallback.retry
    # the second clip fails its greedy decode (and passes at 0.2): it is sampled again at once, alone
    monkeypatch.setattr(Fallback, "retry", lambda self, result, attempt: (
        attempt == 0 and "old-sposed" in result.text) or failed(self, result, attempt))
    audios = [audios[3], audios[2]]
    alone = [tiny_en_asr.transcribe(a, "greedy").transcripts[0] for a in audios]
    assert alone[1].segments[0].temperature == 0.2
    together = _joined(tiny_en_asr, audios, 1, first=1)         # the clip joins as the first ends
    assert [_view(t) for t in together] == [_view(t) for t in alone]


def test_a_request_that_went_away_frees_its_rows(tiny_en_asr, audios):
    items = list(enumerate(audios))
    source = Source(items[1:], gone={1})             # the long audio's client goes away as it decodes
    JoinedTranscription(tiny_en_asr, source, items[:1], rows=2).run()
    assert set(source.out) == {0, 2, 3} and source.away[1] > 4
    assert source.released == {1: 0}                # let go at once, before any other request was answered
    assert source.out[3].text == tiny_en_asr.transcribe(audios[3]).texts[0]


def test_a_method_that_cannot_join_says_so(tiny_en_asr, audios):
    with pytest.raises(InputError, match="cannot take requests in the middle of a call"):
        JoinedTranscription(tiny_en_asr, Source([]), [(0, audios[0])], rows=1, method="beam")
    with pytest.raises(InputError, match="decodes greedily first"):
        JoinedTranscription(tiny_en_asr, Source([]), [(0, audios[0])], rows=1, temperature=0.4)
