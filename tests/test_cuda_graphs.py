"""cuda_graphs=True on every modality, checked on the CPU through the emulated CUDA device and graphs of
tests/emulated_cuda.py: the fixed-shape steps are captured once and replayed (no Python runs at replay,
as on a GPU), and every method's output equals the CPU's eager one."""

import os

import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from tests.emulated_cuda import emulated_cuda, on_host
from tests.speech.conftest import encode_each_clip_once

LIBRIVOX = "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-{}.wav"
IMAGE_CASES = [(m, 0.0) for m in ("ar", "speculative", "tree", "sjd", "early-exit", "lantern", "gsd", "zipar")] + \
              [(m, 1.0) for m in ("ar", "speculative", "tree", "sjd-coupled", "lantern", "gsd", "zipar")]


@pytest.fixture(scope="module")
def image_pipes():
    from mmaccel.image.pipeline import ImagePipeline

    with emulated_cuda():
        graphed = ImagePipeline.from_pretrained(device="cuda", cuda_graphs=True)
    return ImagePipeline.from_pretrained(), graphed


def _image_run(pipe, method, temperature, n):
    from mmaccel.core.sampling import Sampling
    from mmaccel.image.methods import build_image_method

    resources, _ = pipe.resources(2.0)
    return build_image_method(method).run(resources, ([1, 2], [pipe.model.num_classes] * 2), max_new_tokens=n,
                                          sampling=Sampling(temperature=temperature), seed=0)


@pytest.mark.parametrize("method, temperature", IMAGE_CASES)
def test_every_image_method_replays_exactly(image_pipes, method, temperature):
    cpu, graphed = image_pipes
    n = 256 if method == "zipar" else 24            # ZipAR decodes whole grids
    expected = _image_run(cpu, method, temperature, n)
    with emulated_cuda() as report:
        out = _image_run(graphed, method, temperature, n)
    assert on_host(out.tokens) == expected.tokens
    if method != "zipar":           # ZipAR's steps write where its planner says: they run eagerly
        assert report.replays >= out.stats.nfe // 2, (report.replays, out.stats.nfe)


def test_later_calls_replay_the_graphs_of_earlier_ones(image_pipes):
    """The model keeps its caches (and the graphs over them) across calls: a second call captures nothing
    and every step after its prefill is a replay."""
    graphed = image_pipes[1]
    with emulated_cuda():
        _image_run(graphed, "ar", 0.0, 24)
    pool = graphed.model._caches.caches
    captured = sum(len(cache.graphs) for cache in pool.values())
    with emulated_cuda() as report:
        out = _image_run(graphed, "ar", 0.0, 24)
    assert captured > 0 and sum(len(cache.graphs) for cache in pool.values()) == captured
    assert report.replays == out.stats.nfe - 1


def test_graphs_add_no_host_reads(image_pipes):
    seen = []
    for n in (8, 24):
        with emulated_cuda() as report:
            _image_run(image_pipes[1], "sjd", 1.0, n)
        assert report.replays > 0
        seen.append((report.kinds(), report.uploads))
    assert seen[0] == seen[1] and seen[0][1] == 0 and set(seen[0][0]) <= {"tolist"}, seen


@pytest.fixture(scope="module")
def text_pipes(tiny_lm_dir):
    from mmaccel.lm.pipeline import TextPipeline

    with emulated_cuda():
        graphed = TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir), device="cuda", cuda_graphs=True)
    return TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir)), graphed


@pytest.mark.parametrize("method, params, temperature", [
    ("ar", {}, 0.0), ("speculative", {"k": 3}, 0.0), ("tree", {"depth": 2, "width": 2}, 0.0),
    ("early-exit", {"exit_layer": 1}, 0.0), ("sjd-coupled", {}, 1.0), ("speculative", {"k": 3}, 1.0)])
def test_text_methods_replay_exactly(text_pipes, method, params, temperature):
    cpu, graphed = text_pipes
    prompts = ["the cat sat on the mat", "a dog ran"]
    expected = cpu.generate(prompts, method, max_new_tokens=10, temperature=temperature, **params)
    with emulated_cuda() as report:
        out = graphed.generate(prompts, method, max_new_tokens=10, temperature=temperature, **params)
    assert out.tokens == expected.tokens and report.replays > 0


@pytest.fixture(scope="module")
def speech_pipes():
    from mmaccel.speech.pipeline import ASRPipeline, builtin_heads_path

    if not builtin_heads_path("base").is_file():
        pytest.skip("no shipped heads")
    if not os.path.isfile(LIBRIVOX.format("0880")):
        pytest.skip("apt-get install pocketsphinx-testdata")
    try:
        cpu = ASRPipeline.from_pretrained("builtin:base", assistant="builtin:tiny.en")
    except ModelNotFoundError as err:
        pytest.skip(f"Whisper base or tiny.en not installed: {err}")
    with emulated_cuda():
        graphed = ASRPipeline.from_pretrained("builtin:base", assistant="builtin:tiny.en", device="cuda", cuda_graphs=True)
    for pipe in (cpu, graphed):
        encode_each_clip_once(pipe)          # the encoder is not graphed; every method decodes the same states
    return cpu, graphed


@pytest.mark.parametrize("method, params", [
    ("greedy", {}), ("beam", {"num_beams": 2}), ("speculative", {"k": 4}), ("speculative-cross", {"k": 3}),
    ("tree", {"depth": 3, "width": 2}), ("medusa", {"depth": 2, "width": 2}), ("eagle", {"k": 4}),
    ("early-exit", {"k": 2, "exit_layer": 5}), ("ngram", {})])
def test_speech_methods_replay_exactly(speech_pipes, method, params):
    cpu, graphed = speech_pipes
    clip = LIBRIVOX.format("0880")
    expected = cpu.transcribe([clip], method, **params)
    with emulated_cuda() as report:
        out = graphed.transcribe([clip], method, **params)
    assert out.texts == expected.texts and report.replays > 0


def test_cuda_graphs_need_a_gpu():
    from mmaccel.image.pipeline import ImagePipeline

    with pytest.raises(InputError, match="cuda_graphs=True needs device='cuda'"):
        ImagePipeline.from_pretrained(cuda_graphs=True)
    with pytest.raises(InputError, match="cuda_graphs must be True or False"):
        ImagePipeline.from_pretrained(cuda_graphs="yes")
