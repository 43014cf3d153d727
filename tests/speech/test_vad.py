"""Voice activity detection: Silero's speech probabilities and regions, and the pipeline's `vad_filter` on the
real tiny.en (no text where there is no speech, the speech at its times in the input)."""

import json

import numpy as np
import pytest
import soundfile as sf
import torch

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.speech.audio import SAMPLE_RATE, Audio, load_audio
from mmaccel.speech.vad import FRAME, VadParameters, silero, speech_probabilities, speech_regions
from tests.speech.test_pipeline import FILES, files  # noqa: F401  (fixture)

GAP_S = 20.0


def test_bad_vad_parameters_are_refused_in_one_line():
    for bad, says in (({"threshold": 1.5}, "threshold"), ({"max_speech_duration_s": 40}, "max_speech_duration_s"),
                      ({"min_silence_ms": 10}, "unknown vad parameter"), ({"speech_pad_ms": -1}, "speech_pad_ms")):
        with pytest.raises(InputError, match=says):
            VadParameters.of(bad)
    with pytest.raises(InputError, match="vad_parameters must be a dict"):
        VadParameters.of([0.5])


def test_loading_silero_keeps_torch_threads():
    threads = torch.get_num_threads()
    silero()
    assert torch.get_num_threads() == threads


def test_finding_speech_first_keeps_torch_threads(monkeypatch):
    """Whichever VAD call imports the package first (here the region rules, as `transcribe(vad_filter=True)`
    does), torch keeps its threads: a bench once ran every method on one thread after the first VAD call."""
    import sys

    from mmaccel.speech import vad

    for name in [m for m in sys.modules if m.startswith("silero_vad")]:
        monkeypatch.delitem(sys.modules, name)
    vad._package.cache_clear()
    found = torch.get_num_threads()
    torch.set_num_threads(2)            # not the package's 1, on any machine
    try:
        vad.speech_regions(np.zeros(SAMPLE_RATE, dtype=np.float32))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(found)
        vad._package.cache_clear()


@pytest.fixture(scope="module")
def gapped(files):  # noqa: F811
    """Two real sentences with 20 s of noise between them: (samples, the gap's [start, end) in seconds)."""
    first, second = (load_audio(f).samples for f in FILES[:2])
    noise = (0.02 * np.random.default_rng(0).standard_normal(int(GAP_S * SAMPLE_RATE))).astype(np.float32)
    start = len(first) / SAMPLE_RATE
    return np.concatenate([first, noise, second]), (start, start + GAP_S)


def test_batched_probabilities_are_the_models_frame_by_frame(gapped, monkeypatch):
    samples = gapped[0][: 12 * SAMPLE_RATE + 100]                   # a speech start, noise, a ragged last frame
    model = silero()
    model.reset_states()
    with torch.inference_mode():
        one_by_one = torch.cat([model(torch.nn.functional.pad(f, (0, FRAME - len(f))), SAMPLE_RATE).flatten()
                                for f in torch.from_numpy(samples).split(FRAME)])
    monkeypatch.setattr("mmaccel.speech.vad.BLOCK", 7)             # several blocks, the LSTM state carried across
    batched = speech_probabilities(samples)
    assert batched.shape == one_by_one.shape and torch.allclose(batched, one_by_one, atol=1e-5)
    assert one_by_one.max() > 0.9 and one_by_one.min() < 0.1


def test_silero_finds_the_sentences_and_not_the_noise(gapped):
    samples, (gap_start, gap_end) = gapped
    regions = [(a / SAMPLE_RATE, b / SAMPLE_RATE) for a, b in speech_regions(samples)]
    pad = VadParameters().speech_pad_ms / 1000
    assert len(regions) == 2
    assert regions[0][0] <= 0.5 and gap_start - 1.0 < regions[0][1] <= gap_start + pad
    assert gap_end - pad <= regions[1][0] < gap_end + 1.0 and regions[1][1] >= len(samples) / SAMPLE_RATE - 0.5


def test_vad_filter_leaves_no_text_in_the_noise_and_keeps_input_times(tiny_en_asr, gapped):
    samples, (gap_start, gap_end) = gapped
    alone = [tiny_en_asr.transcribe(f, word_timestamps=True).transcripts[0] for f in FILES[:2]]
    out = tiny_en_asr.transcribe((samples, SAMPLE_RATE), word_timestamps=True, vad_filter=True).transcripts[0]
    words = [w for s in out.segments for w in s.words]
    assert out.segments and all(s.end <= gap_start + 0.5 or s.start >= gap_end - 0.5 for s in out.segments)
    assert all(w.end <= gap_start + 0.5 or w.start >= gap_end - 0.5 for w in words)
    # the second sentence where it is in the input: its first word's time is that of the sentence decoded alone,
    # shifted by where it starts (its later words may read differently: the first sentence is now its context)
    later, first_alone = [w for w in words if w.start >= gap_end - 0.5], alone[1].segments[0].words[0]
    assert later[0].word == first_alone.word and abs(later[0].start - (gap_end + first_alone.start)) < 0.5
    assert later[-1].end <= len(samples) / SAMPLE_RATE + 0.1


def test_the_cli_writes_subtitles_of_the_speech_only(gapped, tmp_path, capsys):
    samples, (gap_start, gap_end) = gapped
    sf.write(tmp_path / "gapped.wav", samples, SAMPLE_RATE)
    code = main(["asr", "transcribe", str(tmp_path / "gapped.wav"), "--model", "builtin:tiny.en", "--heads", "none",
                 "--draft", "none", "--vad-param", "threshold=0.6", "--output-format", "json", "--output-dir",
                 str(tmp_path)])
    segments = json.loads((tmp_path / "gapped.json").read_text())["segments"]
    assert code == 0 and len(segments) >= 2 and segments[-1]["start"] >= gap_end - 0.5
    assert all(s["end"] <= gap_start + 0.5 or s["start"] >= gap_end - 0.5 for s in segments)
    assert main(["asr", "transcribe", str(tmp_path / "gapped.wav"), "--vad-param", "speech_pad=1"]) == 2
    assert "unknown vad parameter" in capsys.readouterr().err


def test_an_input_without_speech_has_an_empty_transcript(tiny_en_asr):
    hum = (0.01 * np.sin(np.arange(5 * SAMPLE_RATE) * 2 * np.pi * 50 / SAMPLE_RATE)).astype(np.float32)
    out = tiny_en_asr.transcribe([Audio(np.zeros(3 * SAMPLE_RATE, np.float32)), (hum, SAMPLE_RATE)], vad_filter=True)
    assert [(t.text, t.segments, t.error) for t in out.transcripts] == [("", [], None)] * 2
    with pytest.raises(InputError, match="silent"):                       # without VAD, silence is an error
        tiny_en_asr.transcribe(Audio(np.zeros(3 * SAMPLE_RATE, np.float32)))
    with pytest.raises(InputError, match="vad_filter must be True or False"):
        tiny_en_asr.transcribe(Audio(hum), vad_filter="yes")
