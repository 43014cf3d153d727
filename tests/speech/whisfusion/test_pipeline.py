"""WhisfusionPipeline on the builtin tiny.en (decoder as initialised from Whisper's): windows, long audio,
bad input, sources."""

import numpy as np
import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.audio import Audio, load_audio
from mmaccel.speech.whisfusion.model import WhisfusionDecoder
from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def pipe(tiny_en_asr):
    return WhisfusionPipeline(tiny_en_asr.bundle, WhisfusionDecoder(tiny_en_asr.bundle.model, tokens_per_second=5.0))


def test_transcribes_windows_and_joins_long_audio(pipe, files):  # noqa: F811
    out = pipe.transcribe(files[:2], candidates=3, steps=2, select="confidence")
    assert len(out.transcripts) == 2 and all(t.passes == 2 for t in out.transcripts)
    assert out.stats.nfe == 2 and {"features", "encoder", "decode"} <= set(out.stats.time_s) and out.rtfx > 0
    assert out.stats.peak_mem_mb > 0
    first = load_audio(files[0])
    long = Audio(np.concatenate([first.samples] * int(np.ceil(35 / first.duration))))
    [joined] = pipe.transcribe([long], candidates=2, steps=2).transcripts
    assert joined.duration > 30 and joined.passes == 2 * 2                    # two windows, two steps each
    again = pipe.transcribe(files[:2], candidates=3, steps=2, select="confidence")
    assert again.texts == out.texts                                            # seeded


def test_bad_input_and_sources(pipe, files, tmp_path, monkeypatch):  # noqa: F811
    import mmaccel.speech.whisfusion.pipeline as pipeline

    with pytest.raises(InputError, match="non-empty"):
        pipe.transcribe([])
    with pytest.raises(InputError, match="candidates must be"):
        pipe.transcribe(files[:1], candidates=0)
    out = pipe.transcribe([files[0], str(tmp_path / "missing.wav")], candidates=2, steps=1)
    assert out.transcripts[1].error is not None and out.transcripts[0].error is None
    monkeypatch.setattr(pipeline, "assets_dir", lambda: tmp_path)
    with pytest.raises(ModelNotFoundError, match="train it with"):
        WhisfusionPipeline.from_pretrained()
    with pytest.raises(InputError, match="unknown built-in"):
        WhisfusionPipeline.from_pretrained("builtin:nope")
    with pytest.raises(InputError, match="neither a built-in"):
        WhisfusionPipeline.from_pretrained(str(tmp_path / "nowhere"))


def test_the_shared_contract(pipe, files):  # noqa: F811
    """`transcribe(audio, method, *, options, **params)` as every speech pipeline takes it: the params are the
    method's, checked by its plug-in in one line; `methods()` is the registry the CLI and the app read."""
    from mmaccel.speech.whisfusion.methods import WHISFUSION_REGISTRY

    assert WhisfusionPipeline.methods() is WHISFUSION_REGISTRY
    named = pipe.transcribe(files[:1], "whisfusion", candidates=2, steps=1, select="confidence")
    assert named.texts == pipe.transcribe(files[:1], candidates=2, steps=1, select="confidence").texts
    assert named.method == "whisfusion" and named.stats.nfe == 1
    with pytest.raises(InputError, match="method 'whisfusion' does not take parameter.s. beam; it takes candidates"):
        pipe.transcribe(files[:1], beam=4)
    with pytest.raises(InputError, match="unknown selection 'vote'; choose from rover, confidence"):
        pipe.transcribe(files[:1], select="vote")
    with pytest.raises(InputError, match="unknown method 'greedy'; choose from whisfusion"):
        pipe.transcribe(files[:1], "greedy")
