"""ASRPipeline on the real builtin tiny.en: transcripts, long audio, bad input, heads files."""

import numpy as np
import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.audio import load_audio
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.heads import WhisperHeads, load_heads, new_exit_heads, new_medusa_heads, save_heads
from mmaccel.speech.methods import build_asr_method
from mmaccel.speech.pipeline import ASRPipeline
from tests.speech.conftest import encode_each_clip_once, tiny_whisper
from tests.speech.test_whisper import CLIPS, LIBRIVOX, TINY_EN

FILES = [str(LIBRIVOX / f"sense_and_sensibility_01_austen_64kb-{c}.wav") for c in CLIPS]


@pytest.fixture(scope="module")
def files():
    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    return FILES


def test_transcribes_librivox_like_hugging_face(tiny_en_asr, files):
    out = tiny_en_asr.transcribe(files, "greedy", batch_size=3)
    assert out.texts == [t.strip() for t in TINY_EN]
    assert out.stats.new_tokens == sum(len(t.tokens) for t in out.transcripts)
    assert out.audio_s == pytest.approx(sum(load_audio(f).duration for f in files)) and out.rtfx > 0
    assert {"features", "encoder", "decode"} <= set(out.stats.time_s)


def test_beam_and_ngram(tiny_en_asr, files):
    greedy = tiny_en_asr.transcribe(files[:2], "greedy")
    assert tiny_en_asr.transcribe(files[:2], "ngram", k=3).texts == greedy.texts
    beam = tiny_en_asr.transcribe(files[:2], "beam", num_beams=3)
    assert beam.texts[0] == greedy.texts[0] and beam.stats.nfe >= greedy.stats.nfe


def test_long_audio_is_chunked_and_joined(tiny_en_asr, files):
    clips = [load_audio(f).samples for f in files]
    pause = np.zeros(16000, np.float32)
    long = np.concatenate([x for c in clips + clips for x in (c, pause)])        # 59 s
    reports = []
    out = tiny_en_asr.transcribe((long, 16000), batch_size=1, progress=lambda done, total: reports.append((done, total)))
    text = out.texts[0]
    assert reports == [(1, 2), (2, 2)]                       # one report per batch of 30-s windows
    assert text.startswith("And Mr. John Dashwood") and text.count("John Dashwood") == 2
    assert len(set(out.transcripts[0].tokens)) > 1 and out.transcripts[0].passes == len(out.transcripts[0].tokens)
    assert text.endswith("He might even have been made amiable himself.")
    # in a list, windows are batched longest first; every transcript still gets its own, in order
    many = tiny_en_asr.transcribe([files[1], (long, 16000), files[0]], batch_size=2)
    assert many.texts[1] == text and many.texts[0] == tiny_en_asr.transcribe(files[1]).texts[0]
    assert many.texts[2] == tiny_en_asr.transcribe(files[0]).texts[0]


def test_a_bad_file_in_a_batch_is_reported_and_the_rest_transcribed(tiny_en_asr, files, tmp_path):
    notes = tmp_path / "notes.wav"
    notes.write_text("hello")
    out = tiny_en_asr.transcribe([files[1], str(tmp_path / "missing.wav"), str(notes), (np.zeros(8000), 16000)])
    assert out.texts[0] == TINY_EN[1].strip()
    assert "audio file not found" in out.transcripts[1].error and "cannot read" in out.transcripts[2].error
    assert "silent" in out.transcripts[3].error and out.transcripts[0].error is None
    with pytest.raises(InputError, match="audio file not found"):
        tiny_en_asr.transcribe(str(tmp_path / "missing.wav"))


def test_bad_arguments_are_refused(tiny_en_asr, files):
    with pytest.raises(InputError, match="unknown method 'fast'"):
        tiny_en_asr.transcribe(files[0], "fast")
    with pytest.raises(InputError, match="needs trained Medusa heads"):
        ASRPipeline(tiny_en_asr.bundle).transcribe(files[0], "medusa")
    with pytest.raises(InputError, match="no audio given"):
        tiny_en_asr.transcribe([])
    with pytest.raises(InputError, match="max_new_tokens must be in"):
        tiny_en_asr.transcribe(files[0], max_new_tokens=1000)
    with pytest.raises(InputError, match="English-only Whisper"):
        tiny_en_asr.transcribe(files[0], language="de")
    with pytest.raises(InputError, match="does not take parameter"):
        tiny_en_asr.transcribe(files[0], "greedy", k=3)


def test_heads_file_round_trip_and_errors(tmp_path):
    model = WhisperDecoderModel(tiny_whisper())
    vocab = torch.tensor([1, 4, 9, 30])
    heads = WhisperHeads(new_medusa_heads(model, 3, vocab=vocab), new_exit_heads(model, [1, 3], vocab), vocab)
    with torch.no_grad():
        for p in heads.medusa.parameters():
            p.copy_(torch.randn_like(p).half())          # fp16-representable: the file stores fp16
    path = save_heads(tmp_path / "h.safetensors", model, heads, {"note": "test"})
    back = load_heads(path, model)
    h = torch.randn(2, 32)
    torch.testing.assert_close(back.medusa[2](h), heads.medusa[2](h))
    assert sorted(back.exits) == [1, 3] and back.vocab.tolist() == [1, 4, 9, 30]
    assert back.exits[1].projection is not None and set(back.medusa[0](h).argmax(-1).tolist()) <= {1, 4, 9, 30}
    other = WhisperDecoderModel(tiny_whisper(1))
    other.decoder.layers = other.decoder.layers[:3]
    with pytest.raises(InputError, match="holds heads for a Whisper decoder with"):
        load_heads(path, other)
    with pytest.raises(ModelNotFoundError, match="heads file not found"):
        load_heads(tmp_path / "none.safetensors", model)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputError, match="not a readable safetensors file"):
        load_heads(corrupt, model)


@pytest.mark.slow     # 9 s; the shipped tiny.en EAGLE head (fused) drafts losslessly below
def test_an_eagle_head_with_fused_layers_reads_them_through_the_pipeline(tiny_en_asr, files):
    from mmaccel.speech.eagle import new_eagle_head

    asr = ASRPipeline(tiny_en_asr.bundle)
    torch.manual_seed(0)
    head = new_eagle_head(asr.model, 50, feature_layers=(0, 2))
    with torch.no_grad():
        head.fuse.weight.add_(torch.randn_like(head.fuse.weight) * 0.05)
    asr.heads = WhisperHeads(eagle=head)
    target = asr.resources(build_asr_method("eagle")).model
    assert target.feature_layers == (0, 2) and asr.resources(build_asr_method("greedy")).model.feature_layers == ()
    greedy = asr.transcribe(files[:2], "greedy")
    out = asr.transcribe(files[:2], "eagle", k=4, stop_below=0.0)
    assert out.texts == greedy.texts and out.stats.draft_passes > 0


def test_shipped_base_heads_and_draft_decoder_draft_losslessly(files):
    from mmaccel.speech.pipeline import builtin_heads_path

    if not builtin_heads_path("base").is_file():
        pytest.skip("no shipped heads")
    try:
        asr = ASRPipeline.from_pretrained("builtin:base")
    except ModelNotFoundError as err:
        pytest.skip(f"Whisper base not installed: {err}")
    assert asr.heads.medusa is not None and sorted(asr.heads.exits) == [1, 2, 3, 4, 5]
    encode_each_clip_once(asr)                             # every method decodes the same encoder states
    clips = [files[1], files[4]]                           # the two shortest clips, in one batch
    greedy = asr.transcribe(clips, "greedy")
    methods = [("medusa", {"depth": 2, "width": 2}), ("early-exit", {"k": 2, "exit_layer": 5})]
    if asr.heads.block is not None:
        methods.append(("medusa-block", {"depth": 3, "width": 2}))
    if asr.heads.eagle is not None:
        methods += [("eagle", {"k": 4, "stop_below": 0.0}), ("eagle", {"k": 8, "siblings": 2})]
    if asr.draft is not None:
        methods += [("speculative", {"k": 4}), ("tree", {"depth": 4, "width": 2})]
    for method, params in methods:
        out = asr.transcribe(clips, method, adaptive=False, **params)        # every pass drafts: the heads' own gain
        assert out.texts == greedy.texts and out.stats.mean_accepted > 1.0, method
    calm = asr.transcribe(clips, "calm", threshold=1.0)
    assert calm.texts == greedy.texts and calm.stats.mean_exit_layer == 6.0


def test_shipped_tiny_en_eagle_head_drafts_losslessly(tiny_en_asr, files):
    from mmaccel.speech.pipeline import builtin_eagle_path

    if not builtin_eagle_path("tiny.en").is_file():
        pytest.skip("no shipped tiny.en EAGLE head")
    head = tiny_en_asr.heads.eagle                         # "auto" found it beside the base files
    assert head is not None and list(head.feature_layers) == [0, 2]
    greedy = tiny_en_asr.transcribe(files[:3], "greedy", batch_size=3)
    for params in ({"k": 4, "stop_below": 0.0}, {"k": 8, "stop_below": 0.5}):
        out = tiny_en_asr.transcribe(files[:3], "eagle", batch_size=2, adaptive=False, **params)   # two, then one
        assert out.texts == greedy.texts and out.stats.mean_accepted > 1.0, params
    adapted = tiny_en_asr.transcribe(files[:3], "eagle", batch_size=2, k=8)    # drafting what pays (the default)
    assert adapted.texts == greedy.texts and adapted.stats.draft_passes > 0


def test_adaptive_drafting_reads_the_engines_pass_costs(tiny_en_asr, files, tmp_path, monkeypatch):
    from mmaccel.engine.pass_costs import WIDTHS

    monkeypatch.setenv("MMACCEL_CACHE", str(tmp_path))
    costs = tiny_en_asr.pass_costs(2)
    assert costs.source == "measured" and sorted(costs.ms) == list(WIDTHS) and costs(0) == 1.0 <= costs(8)
    assert tiny_en_asr.pass_costs(2).source == "cache" and tiny_en_asr.pass_costs(2, timestamps=True).source == "measured"
    asked = []
    measure = ASRPipeline.pass_costs
    monkeypatch.setattr(ASRPipeline, "pass_costs", lambda self, *a: asked.append(a) or measure(self, *a))
    pipe = ASRPipeline(tiny_en_asr.bundle, heads=tiny_en_asr.heads)
    greedy = tiny_en_asr.transcribe(files[:3], "greedy", batch_size=2)
    assert pipe.transcribe(files[:3], "eagle", batch_size=2, k=4).texts == greedy.texts
    assert asked == [(2, False), (1, False)]            # once per batch size: two windows, then one
