import numpy as np
import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.audio import Audio
from mmaccel.speech.ctc.beam import ctc_beam_search, ctc_greedy
from mmaccel.speech.ctc.pipeline import CTCPipeline
from tests.speech.ctc.test_wav2vec2 import checkpoint  # noqa: F401  (fixture)
from tests.speech.ctc.test_whisper_ctc import bundle, clips, ctc  # noqa: F401  (fixtures)


def test_the_pipeline_decodes_as_the_decoders_do_and_joins_long_audio(ctc):  # noqa: F811
    pipe = CTCPipeline(ctc)
    audio = clips()[:3]
    log_probs, lengths = ctc.log_probs(audio)
    greedy = pipe.transcribe(audio, "greedy")
    assert [t.tokens for t in greedy.transcripts] == [h.tokens for h in ctc_greedy(log_probs, ctc.vocab, lengths)]
    beam = pipe.transcribe(audio, "beam", beam=4)
    want = ctc_beam_search(log_probs, ctc.vocab, lengths, beam=4)
    assert [t.text for t in beam.transcripts] == [h.text for h in want]
    assert beam.audio_seconds == pytest.approx(sum(a.duration for a in audio)) and beam.rtfx > 0
    early = pipe.transcribe(audio, "greedy", exit=("entropy", 0.5))
    assert len(early.exit_layers) == 3 and set(early.exit_layers) <= set(ctc.exit_layers)


def test_long_audio_is_cut_into_windows_on_the_clip_clock(monkeypatch, ctc):  # noqa: F811
    import mmaccel.speech.ctc.pipeline as pipeline

    a, b = clips()[1].samples, clips()[4].samples
    whole = Audio(np.concatenate([a, b]))
    monkeypatch.setattr(pipeline, "split_long", lambda clip: [Audio(a), Audio(b)] if len(clip.samples) == len(whole.samples)
                        else [clip])
    pipe = CTCPipeline(ctc)
    [joined] = pipe.transcribe([whole], "greedy").transcripts
    first, second = pipe.transcribe([Audio(a), Audio(b)], "greedy").transcripts
    assert joined.tokens == first.tokens + second.tokens
    shift = len(a) / 16000
    assert [w.start for w in joined.words] == pytest.approx([w.start for w in first.words]
                                                            + [w.start + shift for w in second.words])


def test_sources_and_bad_input(checkpoint, ctc, tmp_path, monkeypatch):  # noqa: F811
    import mmaccel.speech.ctc.pipeline as pipeline

    monkeypatch.setattr(pipeline, "assets_dir", lambda: tmp_path)
    with pytest.raises(ModelNotFoundError, match="train it with"):
        CTCPipeline.from_pretrained("builtin:ctc-base")
    pipe = CTCPipeline.from_pretrained(str(checkpoint))
    assert len(pipe.transcribe([(np.zeros(8000, dtype=np.float32), 16000)], "greedy").transcripts) == 1
    with pytest.raises(ModelNotFoundError, match="no CTC model"):
        CTCPipeline.from_pretrained(str(tmp_path))
    with pytest.raises(InputError, match="unknown built-in"):
        CTCPipeline.from_pretrained("builtin:nope")
    with pytest.raises(InputError, match="unknown method 'fastest'; choose from greedy, beam"):
        pipe.transcribe([(np.zeros(8000, dtype=np.float32), 16000)], "fastest")
    with pytest.raises(InputError, match="early exit needs a WhisperCTC"):
        pipe.transcribe([(np.zeros(8000, dtype=np.float32), 16000)], exit=("entropy", 0.5))
    with pytest.raises(InputError, match="non-empty"):
        CTCPipeline(ctc).transcribe([])
    with pytest.raises(InputError, match="greedy decoding reads no LM"):
        CTCPipeline(ctc).transcribe(clips()[:1], "greedy", boost=["ab"])


def test_the_shared_contract_methods_params_and_output(ctc):  # noqa: F811
    """`transcribe(audios, method, *, options, **params)`: the params are the method's, checked by its plug-in in
    one line; the output has ASROutput's core fields; `methods()` is the registry the CLI and the app read."""
    from mmaccel.speech.ctc.methods import CTC_REGISTRY

    pipe = CTCPipeline(ctc)
    assert CTCPipeline.methods() is CTC_REGISTRY and list(CTC_REGISTRY) == ["greedy", "beam"]
    audio = clips()[:3]
    log_probs, lengths = ctc.log_probs(audio)
    out = pipe.transcribe(audio, "beam", beam=4, blank_skip=1.0, recombine="sum")
    want = ctc_beam_search(log_probs, ctc.vocab, lengths, beam=4, blank_skip=None, recombine="sum")
    assert out.texts == [h.text for h in want] and out.method == "beam"
    assert set(out.stats.time_s) == {"model", "decode", "total"} and out.stats.nfe == 1
    assert out.stats.new_tokens == sum(len(h.tokens) for h in want)
    assert out.wall_s == out.stats.time_s["total"] and out.audio_s == pytest.approx(sum(a.duration for a in audio))
    assert out.seconds is out.stats.time_s and out.audio_seconds == out.audio_s          # the names before
    one_by_one = pipe.transcribe(audio, "greedy", batch_size=1)
    assert one_by_one.stats.nfe == 3 and one_by_one.texts == pipe.transcribe(audio, "greedy").texts
    with pytest.raises(InputError, match="method 'greedy' does not take parameter.s. beam; it takes none") as err:
        pipe.transcribe(audio, "greedy", beam=4)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"beam must be an integer in \[1, 1024\], got 0"):
        pipe.transcribe(audio, "beam", beam=0)
    with pytest.raises(InputError, match="unknown recombination 'mean'; choose from max, sum"):
        pipe.transcribe(audio, recombine="mean")
