"""`bench asr` plumbing on the builtin tiny.en: methods and peers on the same audio, derived numbers."""

import pytest

from mmaccel.bench.asr_suite import build_asr_suite
from mmaccel.bench.harness import MethodSpec, markdown_table, run_suite, validate_document
from mmaccel.errors import InputError
from mmaccel.speech.data import SPHINX_DATA
from tests.conftest import NATIVE_CHEAP


class _FasterWhisperHere:
    """faster-whisper in the test's own process, running what the bench's child process runs (spawning that
    child, which imports torch afresh, took 40 s of a loaded CI run; the slow test below spawns it)."""

    def __init__(self, name, compute_type, threads, features=None):
        from mmaccel.bench import asr_suite

        self.peer = asr_suite._faster_whisper(name, compute_type, threads)
        self.options = asr_suite.fw_options(**(features or {}))

    def transcribe(self, audios):
        from mmaccel.bench.asr_suite import _run_faster_whisper

        return _run_faster_whisper(self.peer, audios, self.options)


@pytest.mark.slow      # the default suite's time budget
def test_quick_asr_suite_compares_methods_and_peers(tiny_en_asr, monkeypatch):
    """One ragged batch of three clips: a lossless method and faster-whisper beside greedy (the HF peer: below)."""
    from mmaccel.bench import asr_suite

    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    pytest.importorskip("faster_whisper")
    monkeypatch.setattr(asr_suite, "FasterWhisperProcess", _FasterWhisperHere)
    methods = [MethodSpec("greedy"), MethodSpec("ngram", {"k": 3}),
               MethodSpec("faster-whisper", {"compute_type": "int8"}, label="fw-int8")]
    suite = build_asr_suite(methods=methods, tts_utterances=0, pipeline=tiny_en_asr)
    suite.batches = {3: [suite.batches[8][0][:3]]}
    doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    rows = {(r["method"], r["batch"]): r for r in doc["results"]}
    greedy, ngram = rows["greedy", 3], rows["ngram", 3]
    assert doc["baseline"] == "greedy" and greedy["quality"]["passes_per_token"] == 1.0
    assert ngram["lossless"] and ngram["quality"]["identical_to_ar"] == 1.0
    assert rows["fw-int8", 3]["quality"]["rtfx"] > 0 and "decoder_speedup" in ngram["quality"]
    assert ngram["quality"]["generation_speedup"] > 0 and greedy["quality"]["generation_speedup"] == 1.0
    assert "| fw-int8 |" in markdown_table(doc)


def test_the_hf_generate_peer_gives_greedy_tokens_in_as_many_passes(tiny_en_asr):
    from mmaccel.bench.asr_suite import _hf_generate
    from mmaccel.speech.audio import load_audio
    from mmaccel.speech.data import real_utterances

    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    audios = [load_audio(real_utterances()[0].audio_filepath)]
    texts, stats = _hf_generate(tiny_en_asr, audios)
    greedy = tiny_en_asr.transcribe(audios, "greedy")
    assert texts == greedy.texts and stats.nfe == greedy.stats.nfe and stats.time_s["decode"] > 0


@pytest.mark.slow     # 25 s; the lossless decoding on cheaper encoders: tests/speech/test_pipeline_precision.py
def test_cheaper_encoder_rows_are_checked_against_greedy_on_the_same_encoder(tiny_en_asr):
    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    methods = [MethodSpec("greedy"), MethodSpec("greedy", {"encoder": NATIVE_CHEAP}, label="greedy-cheap"),
               MethodSpec("ngram", {"k": 3, "encoder": NATIVE_CHEAP}, label="ngram-cheap")]
    suite = build_asr_suite(methods=methods, tts_utterances=0, pipeline=tiny_en_asr)
    suite.batches = {1: suite.batches[1][:1]}
    rows = {r["method"]: r for r in run_suite(suite, log=lambda m: None)["results"]}
    assert not rows["greedy-cheap"]["lossless"] and not rows["ngram-cheap"]["lossless"]     # vs the fp32 model
    assert rows["ngram-cheap"]["quality"]["identical_to_greedy_same_encoder"] == 1.0
    assert "identical_to_greedy_same_encoder" not in rows["greedy"]["quality"]


def test_the_suite_takes_heads_and_draft_files(tiny_en_asr, tmp_path):
    # tiny_en_asr: skipped where the tiny.en package is missing
    from mmaccel.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="heads file not found"):
        build_asr_suite(model="builtin:tiny.en", heads=str(tmp_path / "none.safetensors"), tts_utterances=0)
    with pytest.raises(ModelNotFoundError):
        build_asr_suite(model="builtin:tiny.en", heads="none", draft=str(tmp_path / "none.safetensors"), tts_utterances=0)


@pytest.mark.slow               # ~5 min on 2 cores: the emulated graphs replay op by op in Python
def test_bench_asr_runs_on_a_cuda_device_with_graphs(tiny_en_asr):
    """`mmaccel bench asr --device cuda --cuda-graphs` end to end on the emulated device of
    tests/emulated_cuda.py (Whisper tiny.en keeps it quick): no stray CPU tensor, lossless rows identical."""
    from mmaccel.bench.asr_suite import build_asr_suite
    from mmaccel.bench.harness import MethodSpec, run_suite
    from mmaccel.speech.pipeline import ASRPipeline
    from tests.emulated_cuda import emulated_cuda

    with emulated_cuda() as report:
        pipe = ASRPipeline.from_pretrained("builtin:tiny.en", device="cuda", cuda_graphs=True)
        suite = build_asr_suite(quick=True, model="builtin:tiny.en", pipeline=pipe,
                                methods=[MethodSpec("greedy"), MethodSpec("ngram")])
        doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    assert report.replays > 0
    assert all(r["lossless"] for r in doc["results"]), doc["results"]


def test_the_out_of_domain_split(tiny_en_asr):
    from mmaccel.bench.asr_suite import load_corpus
    from mmaccel.errors import InputError

    with pytest.raises(InputError, match="unknown split 'test'"):
        load_corpus(2, "test")
    suite = build_asr_suite(methods=[MethodSpec("greedy")], tts_utterances=2, pipeline=tiny_en_asr, split="ood")
    assert suite.config["split"] == "ood" and "out-of-domain" in suite.config["audio"]
    assert sum(len(b) for b in suite.batches[1]) == 2


def test_faster_whisper_gets_the_same_features_and_hf_peers_are_refused_with_them(tiny_en_asr):
    from mmaccel.bench.asr_suite import fw_options
    from mmaccel.errors import InputError

    assert fw_options()["without_timestamps"] and not fw_options()["vad_filter"]
    words = fw_options(timestamps=True, word_timestamps=True, vad_filter=True)
    assert not words["without_timestamps"] and words["word_timestamps"] and words["vad_filter"]
    assert not words["condition_on_previous_text"] and words["beam_size"] == 1
    with pytest.raises(InputError, match="hf-generate decodes without timestamps"):
        build_asr_suite(methods=[MethodSpec("greedy"), MethodSpec("hf-generate")], tts_utterances=0,
                        pipeline=tiny_en_asr, vad=True)


@pytest.mark.slow
def test_features_on_for_every_method_and_for_faster_whisper(tiny_en_asr):
    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    pytest.importorskip("faster_whisper")
    pytest.importorskip("onnxruntime")

    methods = [MethodSpec("greedy"), MethodSpec("eagle", {"k": 4}, label="eagle-k4"),
               MethodSpec("faster-whisper", {"compute_type": "int8"}, label="fw-int8")]
    suite = build_asr_suite(methods=methods, tts_utterances=0, pipeline=tiny_en_asr, timestamps="words", vad=True)
    suite.batches = {1: suite.batches[1][:1], 2: [suite.batches[8][0][:2]]}
    doc = run_suite(suite, log=lambda m: None)
    rows = {(r["method"], r["batch"]): r for r in doc["results"]}
    assert doc["config"]["timestamps"] == "words" and doc["config"]["vad"] is True
    assert rows["eagle-k4", 2]["lossless"] and rows["eagle-k4", 2]["quality"]["identical_to_ar"] == 1.0
    assert rows["fw-int8", 2]["quality"]["wer"] < 20 and rows["greedy", 1]["quality"]["wer"] < 20


def test_precision_rows_run_a_converted_pipeline_checked_against_its_own_greedy(tiny_en_asr):
    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    methods = [MethodSpec("greedy"), MethodSpec("greedy", {"precision": "int8"}, label="greedy-int8"),
               MethodSpec("ngram", {"k": 3, "precision": "int8"}, label="ngram-int8")]
    suite = build_asr_suite(methods=methods, tts_utterances=0, pipeline=tiny_en_asr)
    suite.batches = {1: suite.batches[1][:1]}
    rows = {r["method"]: r for r in run_suite(suite, log=lambda m: None)["results"]}
    assert not rows["greedy-int8"]["lossless"] and not rows["ngram-int8"]["lossless"]     # vs the fp32 model
    assert rows["ngram-int8"]["quality"]["identical_to_greedy_same_precision"] == 1.0
    assert rows["greedy-int8"]["quality"]["wer"] < 30 and not tiny_en_asr.model.quantized


def test_an_eager_decoder_row_is_its_own_engine_checked_against_its_own_greedy(tiny_en_asr):
    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    eager = {"precision": "int8", "decoder": "eager"}
    methods = [MethodSpec("greedy"), MethodSpec("greedy", {"precision": "int8"}, label="greedy-int8"),
               MethodSpec("greedy", eager), MethodSpec("ngram", {"k": 3, **eager})]
    suite = build_asr_suite(methods=methods, tts_utterances=0, pipeline=tiny_en_asr)
    suite.batches = {1: suite.batches[1][:1]}
    rows = run_suite(suite, log=lambda m: None)["results"]
    ngram = next(r for r in rows if r["method"].startswith("ngram"))
    assert not ngram["lossless"] and ngram["quality"]["identical_to_greedy_same_precision"] == 1.0
    bad = build_asr_suite(methods=[MethodSpec("greedy"), MethodSpec("greedy", {"precision": "int8", "decoder": "x"})],
                          tts_utterances=0, pipeline=tiny_en_asr)
    bad.batches = {1: bad.batches[1][:1]}
    with pytest.raises(InputError, match="decoder= takes 'eager'"):
        run_suite(bad, log=lambda m: None)
