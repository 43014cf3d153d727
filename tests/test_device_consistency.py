"""Every method of every modality runs on a CUDA device without a stray CPU tensor, checked on the CPU
through the emulated device of tests/emulated_cuda.py: the pipeline is loaded with device="cuda", every
method decodes, and the output equals the same call on the CPU token for token (the emulation computes on
CPU data, so equality also says the device path changes nothing)."""

import pytest
import torch

from mmaccel.errors import ModelNotFoundError
from tests.emulated_cuda import Emulated, emulated_cuda, on_host
from tests.speech.conftest import encode_each_clip_once

LIBRIVOX = "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-{}.wav"


def test_the_emulated_device_fails_where_cuda_fails():
    with emulated_cuda() as report:
        x = torch.arange(6, device="cuda").reshape(2, 3)
        assert isinstance(x, Emulated) and x.is_cuda and x.device == torch.device("cuda", 0)
        assert torch.equal(on_host(x * 2 + torch.tensor(1)), torch.arange(6).reshape(2, 3) * 2 + 1)   # 0-dim: a scalar
        with pytest.raises(RuntimeError, match="same device.*where got a CPU tensor"):
            torch.where(x > 2, x, torch.zeros(2, 3, dtype=torch.long))
        assert x[torch.tensor([1, 0])].shape == (2, 3)          # CPU indices are copied over, as CUDA does
        linear = torch.nn.Linear(3, 2).to("cuda")
        assert isinstance(linear.weight, torch.nn.Parameter) and linear.weight.is_cuda
        with pytest.raises(RuntimeError, match="same device"):
            linear(torch.ones(1, 3))
        x.tolist()
        bool(x.any())
    assert report.kinds() == {"cpu index": 1, "tolist": 1, "__bool__": 1}


# greedy for every method, sampled for each sampling rule (sjd-coupled equals sjd when greedy)
IMAGE_CASES = [(m, 0.0, {}) for m in ("ar", "speculative", "tree", "sjd", "early-exit", "lantern", "gsd", "zipar")] + \
              [(m, 1.0, {}) for m in ("speculative", "tree", "sjd-coupled", "lantern", "gsd", "zipar")] + \
              [("sjd-coupled", 1.0, {"init": "above", "window": 20}), ("zipar", 1.0, {"s": 2, "coupled": True}),
               ("zipar", 1.0, {"s": 3, "window": 2})]


@pytest.fixture(scope="module")
def image_pipes():
    from mmaccel.image.pipeline import ImagePipeline

    with emulated_cuda():
        on_device = ImagePipeline.from_pretrained(device="cuda")
    return ImagePipeline.from_pretrained(), on_device


@pytest.fixture(scope="module")
def tiny_image_pipes(tmp_path_factory):
    """The conformance benches' tiny GPT, its drafter and VQ (tests/conformance.py) as a model directory, loaded
    as the built-in is: 8 x 8 tokens instead of 16 x 16 and half the layers, since the emulated device costs
    per op. The draft chains and the decode loop below run on the built-in model."""
    from mmaccel.image.models.gpt import save_gpt
    from mmaccel.image.pipeline import ImagePipeline
    from mmaccel.image.tokenizers.vq import save_vq
    from tests.conformance import tiny_image_pipeline

    path = tmp_path_factory.mktemp("tiny_image")
    tiny = tiny_image_pipeline()
    save_gpt(tiny.model, path / "gpt.safetensors")
    save_gpt(tiny.draft, path / "draft.safetensors")
    save_vq(tiny.vq, path / "vq.safetensors")
    with emulated_cuda():
        on_device = ImagePipeline.from_pretrained(path, device="cuda")
    return ImagePipeline.from_pretrained(path), on_device


@pytest.mark.parametrize("method, temperature, params", IMAGE_CASES)
def test_image_methods_on_a_cuda_device(tiny_image_pipes, method, temperature, params):
    cpu, cuda = tiny_image_pipes
    expected = cpu.generate([3], method, seed=0, temperature=temperature, **params)
    with emulated_cuda():
        out = cuda.generate([3], method, seed=0, temperature=temperature, **params)
    assert torch.equal(on_host(out.tokens), expected.tokens)
    # on a GPU the loop learns that every row is done one pass late (it never waits for the host)
    assert expected.stats.nfe <= out.stats.nfe <= expected.stats.nfe + 1


def _reads_by_length(decode) -> list:
    """What the host reads back (by kind) and uploads during `decode(n)` on the emulated device, for n = 8
    and 24 tokens. An unmeasured call goes first: first-use caches (rotary tables) upload once per process."""
    seen = []
    for n in (8, 8, 24):
        with emulated_cuda() as report:
            out = decode(n)
        assert out.stats.nfe > 2 and all(len(row) == n for row in out.tokens)
        seen.append((report.kinds(), report.uploads))
    return seen[1:]


# the draft-model methods (speculative, tree, early-exit, lantern) keep the proposer's state on the device too;
# with stop_below the chain runs all k steps there and marks the drafts after the host's stop as filler
@pytest.mark.parametrize("method, temperature, params", [
    ("ar", 0.0, {}), ("ar", 1.0, {}), ("sjd", 0.0, {}), ("sjd", 1.0, {}), ("sjd-coupled", 1.0, {}), ("gsd", 1.0, {}),
    ("sjd-coupled", 1.0, {"init": "above"}), ("sjd", 1.0, {"init": "above", "window": 20}),
    ("speculative", 0.0, {}), ("speculative", 1.0, {}), ("speculative", 0.0, {"stop_below": 0.5}),
    ("speculative", 0.0, {"stop_below": 0.5, "siblings": 2}), ("tree", 0.0, {}), ("tree", 1.0, {}),
    ("early-exit", 0.0, {}), ("lantern", 0.0, {}), ("lantern", 1.0, {})])
def test_the_decode_loop_never_waits_for_the_host(image_pipes, method, temperature, params):
    """What the host reads back from the device, or uploads to it, does not grow with the number of
    passes: the bookkeeping of a step stays on the device (only the final tokens are read)."""
    from mmaccel.core.sampling import Sampling
    from mmaccel.image.methods import build_image_method

    cuda = image_pipes[1]
    with emulated_cuda():
        resources, _ = cuda.resources(2.0)
    seen = _reads_by_length(lambda n: build_image_method(method, **params).run(
        resources, ([1, 2], [cuda.model.num_classes] * 2), max_new_tokens=n, sampling=Sampling(temperature=temperature), seed=0))
    assert seen[0] == seen[1], seen
    assert seen[0][1] == 0 and set(seen[0][0]) <= {"tolist"}, seen


@pytest.mark.parametrize("temperature, params", [
    (0.0, {"stop_below": 0.5}), pytest.param(0.0, {"stop_below": 0.5, "siblings": 2}, marks=pytest.mark.slow),
    pytest.param(1.0, {"stop_below": 0.5}, marks=pytest.mark.slow)])           # 11 s each
def test_draft_chains_that_stop_early_on_a_cuda_device(image_pipes, temperature, params):
    """On a GPU a chain with stop_below drafts all k (it cannot know where the host stops without waiting)
    and marks the later drafts as filler: every pass still commits the same tokens as on the CPU."""
    cpu, cuda = image_pipes
    expected = cpu.generate([3, 5], "speculative", seed=0, temperature=temperature, **params)
    with emulated_cuda():
        out = cuda.generate([3, 5], "speculative", seed=0, temperature=temperature, **params)
    assert torch.equal(on_host(out.tokens), expected.tokens)
    assert torch.equal(on_host(out.commit_pass), expected.commit_pass)


@pytest.fixture(scope="module")
def text_pipes(tiny_lm_dir):
    from mmaccel.lm.pipeline import TextPipeline

    with emulated_cuda():
        on_device = TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir), device="cuda")
    return TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir)), on_device


@pytest.mark.parametrize("method, params, temperature", [
    ("ar", {}, 0.0), ("speculative", {"k": 3}, 0.0), ("ngram", {}, 0.0), ("sjd", {"window": 3}, 0.0),
    ("tree", {"depth": 2, "width": 2}, 0.0), ("early-exit", {"exit_layer": 1}, 0.0), ("sjd-coupled", {}, 1.0),
    ("speculative", {"k": 3}, 1.0), ("tree", {"depth": 2, "width": 2}, 1.0)])
def test_text_methods_on_a_cuda_device(text_pipes, method, params, temperature):
    cpu, cuda = text_pipes
    prompts = ["the cat sat on the mat", "a dog ran"]
    expected = cpu.generate(prompts, method, max_new_tokens=10, temperature=temperature, **params)
    with emulated_cuda():
        out = cuda.generate(prompts, method, max_new_tokens=10, temperature=temperature, **params)
    assert out.tokens == expected.tokens


@pytest.mark.parametrize("method, params, temperature", [
    ("speculative", {"k": 3}, 0.0), ("speculative", {"k": 3}, 1.0), ("early-exit", {"exit_layer": 1, "k": 3}, 0.0)])
def test_text_drafting_never_waits_for_the_host(text_pipes, method, params, temperature):
    """As for images: the draft model's proposer reads nothing back per pass (the prompts are uploaded once)."""
    from mmaccel.core.methods import build_method
    from mmaccel.core.sampling import Sampling

    cuda = text_pipes[1]
    prompts = [[3, 4, 5, 6, 7], [8, 9, 10]]
    seen = _reads_by_length(lambda n: build_method(method, **params).run(
        cuda.resources, prompts, max_new_tokens=n, sampling=Sampling(temperature=temperature), seed=0))
    assert seen[0] == seen[1], seen


@pytest.fixture(scope="module")
def speech_pipes():
    from mmaccel.speech.pipeline import ASRPipeline, builtin_heads_path

    if not builtin_heads_path("base").is_file():
        pytest.skip("no shipped heads")
    try:
        cpu = ASRPipeline.from_pretrained("builtin:base", assistant="builtin:tiny.en")
    except ModelNotFoundError as err:
        pytest.skip(f"Whisper base or tiny.en not installed: {err}")
    with emulated_cuda():
        on_device = ASRPipeline.from_pretrained("builtin:base", assistant="builtin:tiny.en", device="cuda")
    for pipe in (cpu, on_device):
        encode_each_clip_once(pipe)          # its first call per clip runs on the device; every method decodes its states
    return cpu, on_device


@pytest.mark.parametrize("method, params", [
    ("greedy", {}), ("beam", {"num_beams": 2}), ("speculative", {"k": 4}), ("speculative-cross", {"k": 3}),
    ("tree", {"depth": 3, "width": 2}), ("medusa", {"depth": 2, "width": 2}), ("medusa-typical", {"depth": 2}),
    ("medusa-block", {"depth": 3, "width": 2}), ("eagle", {"k": 4}), ("eagle", {"k": 4, "siblings": 2}),
    ("early-exit", {"k": 2, "exit_layer": 5}), ("calm", {"threshold": 0.9}), ("ngram", {})])
def test_speech_methods_on_a_cuda_device(speech_pipes, method, params):
    import os

    clip = LIBRIVOX.format("0880")
    if not os.path.isfile(clip):
        pytest.skip("apt-get install pocketsphinx-testdata")
    cpu, cuda = speech_pipes
    # one temperature: the fallback's samples are drawn on the device, from another generator than the host's
    expected = cpu.transcribe([clip], method, adaptive=False, temperature=0.0, **params)     # a GPU drafts k every pass
    with emulated_cuda():
        out = cuda.transcribe([clip], method, temperature=0.0, **params)
    assert out.texts == expected.texts and expected.stats.nfe <= out.stats.nfe <= expected.stats.nfe + 1


@pytest.mark.parametrize("method, params", [
    ("greedy", {}), ("speculative", {"k": 4}), ("tree", {"depth": 3, "width": 2}),
    pytest.param("early-exit", {"k": 2, "exit_layer": 5}, marks=pytest.mark.slow),         # 4-5 s each
    pytest.param("medusa", {"depth": 2, "width": 2}, marks=pytest.mark.slow), ("medusa-block", {"depth": 3, "width": 2}),
    pytest.param("eagle", {"k": 4}, marks=pytest.mark.slow), ("eagle", {"k": 4, "stop_below": 0.5, "siblings": 2})])
def test_speech_drafting_never_waits_for_the_host(speech_pipes, method, params):
    """What one transcribe reads back from the device, or uploads to it, does not grow with the transcript:
    per call the audio and the prompt go up and the tokens and counters come back, nothing per pass (the
    proposers' state, EAGLE's and the Medusa block's committed positions included, stays on the device)."""
    import os
    from types import SimpleNamespace

    clip = LIBRIVOX.format("0870")      # 7 s: more than 24 tokens
    if not os.path.isfile(clip):
        pytest.skip("apt-get install pocketsphinx-testdata")
    cuda = speech_pipes[1]

    def transcribe(n):
        out = cuda.transcribe([clip], method, max_new_tokens=n, **params)
        return SimpleNamespace(tokens=[t.tokens for t in out.transcripts], stats=out.stats)

    seen = _reads_by_length(transcribe)
    assert seen[0] == seen[1], seen
    assert set(seen[0][0]) <= {"tolist"}, seen


@pytest.mark.parametrize("method, params", [("ar", {}), ("mar", {}), ("ar-draft", {}), ("cspd", {"num_draft": 4}),
                                            ("cspd", {"num_draft": 4, "inner_temperature": 1.0})])
def test_continuous_token_methods_on_a_cuda_device(tmp_path_factory, method, params):
    from mmaccel.image.continuous_pipeline import ContinuousPipeline
    from tests.image.test_continuous_pipeline import write_tiny_models

    folder = write_tiny_models(tmp_path_factory.mktemp("mar"))
    # the transformer's inference fast path skips tensor subclasses (the emulation): both sides run the plain path
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        expected = ContinuousPipeline.from_pretrained(folder).generate([3, 5], method, seed=0, diffusion_steps=3, **params)
        with emulated_cuda():
            cuda = ContinuousPipeline.from_pretrained(folder, device="cuda")
            out = cuda.generate([3, 5], method, seed=0, diffusion_steps=3, **params)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    assert torch.equal(on_host(out.tokens), expected.tokens)
    assert (out.stats.nfe, out.stats.draft_passes) == (expected.stats.nfe, expected.stats.draft_passes)
