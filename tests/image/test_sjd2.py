"""SJD2: greedy output equals greedy AR, sampled output follows the model's AR law (with a negative
control that must fail), the window schedule, the noise model, the method's errors."""

import itertools

import pytest
import torch

from mmaccel.core.sampling import CFG, Sampling
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.errors import InputError
from mmaccel.image.methods import build_image_method
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT
from mmaccel.image.sjd2 import embedding_scale, initial_levels, noisy_embeddings, sjd2_decode
from tests.core.test_speculative import chi2_rejects

torch.set_num_threads(1)

LABELS = [1, 4, 8]


def tiny_gpt(vocab: int, grid: int, dtype=torch.float32, spread: float = 0.5) -> LlamaGenGPT:
    torch.manual_seed(0)
    cfg = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=vocab, num_classes=10, block_size=grid * grid,
                    multiple_of=32)
    m = LlamaGenGPT(cfg).eval()
    with torch.no_grad():
        m.output.weight.normal_(0, spread)
        m.cls_embedding.embedding_table.weight.normal_(0, 1.0)
        m.tok_embeddings.weight.normal_(0, 1.0)
    return m.to(dtype)


def run(model, inputs, guided=None, **kw):
    target = model if guided is None else CFG(model, guided)
    return sjd2_decode(target, inputs, embeddings=model.tok_embeddings.weight, sigma=embedding_scale(model), **kw)


@pytest.mark.parametrize("window, steps", [(1, 1), (4, 2), (8, 3), (12, 12)])
@pytest.mark.parametrize("guided", [None, 2.5])
def test_greedy_sjd2_is_greedy_ar_token_for_token(window, steps, guided):
    model = tiny_gpt(48, 6, torch.float64)
    inputs = LABELS if guided is None else (LABELS, [10] * len(LABELS))
    target = model if guided is None else CFG(model, guided)
    base = decode(target, inputs, LoopConfig(), max_new_tokens=36)
    out = run(model, inputs, guided, max_new_tokens=36, window=window, steps=steps)
    assert out.tokens == base.tokens
    assert out.stats.nfe <= base.stats.nfe and out.stats.new_tokens == 3 * 36
    passes = torch.tensor(out.commit_pass)
    assert passes.min() >= 1 and bool((passes[:, 1:] >= passes[:, :-1]).all())


@pytest.mark.parametrize("guided", [None, 2.5])
def test_coupled_sjd2_is_coupled_ar_sampling_token_for_token(guided):
    model = tiny_gpt(48, 6, torch.float64)
    inputs = LABELS if guided is None else (LABELS, [10] * len(LABELS))
    target = model if guided is None else CFG(model, guided)
    sampled = Sampling(temperature=1.0, top_k=20)
    base = decode(target, inputs, LoopConfig(coupled=True), max_new_tokens=36, sampling=sampled, seed=7)
    for window, steps in [(4, 1), (8, 3)]:
        out = run(model, inputs, guided, max_new_tokens=36, window=window, steps=steps, sampling=sampled, seed=7,
                  coupled=True)
        assert out.tokens == base.tokens and out.stats.nfe <= base.stats.nfe


def exact_law(model: LlamaGenGPT, label: int, length: int) -> torch.Tensor:
    """P(x_0 .. x_{length-1} | label) over all V^length sequences, by teacher forcing (float64)."""
    V = model.vocab_size
    seqs = torch.tensor(list(itertools.product(range(V), repeat=length)))
    with torch.no_grad():
        logp = model([label] * len(seqs), seqs[:, :-1]).double().log_softmax(-1)
    return logp.gather(2, seqs[..., None]).squeeze(2).sum(1).exp()


def sampled_codes(model, length, seeds, rows, **kw) -> torch.Tensor:
    V = model.vocab_size
    codes = []
    for seed in seeds:
        out = run(model, [3] * rows, max_new_tokens=length, sampling=Sampling(temperature=1.0), seed=seed, **kw)
        tokens = torch.tensor(out.tokens)
        codes.append((tokens * V ** torch.arange(length - 1, -1, -1)).sum(1))
    return torch.cat(codes)


@pytest.fixture(scope="module")
def law_model():
    model = tiny_gpt(3, 2, torch.float64, spread=0.15)
    return model, exact_law(model, 3, 4)


def test_sampled_sjd2_follows_the_ar_law(law_model):
    model, law = law_model
    for steps in (1, 2):
        codes = sampled_codes(model, 4, seeds=range(6), rows=1000, window=3, steps=steps)
        assert not chi2_rejects(codes, law)


def test_negative_control_verifying_noisy_context_drafts_fails(law_model, monkeypatch):
    """Verifying every window entry, also those behind noisy inputs, breaks the AR law."""
    import mmaccel.image.sjd2 as sjd2

    monkeypatch.setattr(sjd2, "clean_prefix", lambda level: torch.full_like(level[:, 0], level.shape[1]))
    model, law = law_model
    codes = sampled_codes(model, 4, seeds=range(6), rows=1000, window=3, steps=1)
    assert chi2_rejects(codes, law)


def test_initial_levels_rise_along_the_window():
    assert initial_levels(8, 4).tolist() == [1, 1, 2, 2, 3, 3, 4, 4]
    assert initial_levels(3, 3).tolist() == [1, 2, 3] and initial_levels(4, 1).tolist() == [1, 1, 1, 1]


def test_noise_interpolates_clean_and_scaled_noise():
    e, eps = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    assert torch.equal(noisy_embeddings(e, torch.tensor(0.0), eps, 3.0), e)
    assert torch.allclose(noisy_embeddings(e, torch.tensor(1.0), eps, 3.0), 3.0 * eps)
    model = tiny_gpt(48, 6)
    assert abs(float(embedding_scale(model)) - 1.0) < 0.1          # the table was drawn N(0, 1)


def test_bad_parameters_are_clear_errors():
    model = tiny_gpt(48, 6)
    for kw, msg in [({"window": 0}, "window must be an int >= 1"), ({"window": 4, "steps": 5}, "steps must be"),
                    ({"steps": 0}, "steps must be")]:
        with pytest.raises(InputError, match=msg):
            run(model, LABELS, max_new_tokens=8, **kw)
    with pytest.raises(InputError, match="embedding table has 5 rows"):
        sjd2_decode(model, LABELS, embeddings=torch.zeros(5, 32), sigma=1.0, max_new_tokens=4)
    with pytest.raises(InputError, match="cannot exceed the window"):
        build_image_method("sjd2", window=4, steps=8)
    with pytest.raises(InputError):
        build_image_method("sjd2", window=0)


def test_embeds_must_match_tokens_and_width():
    model = tiny_gpt(48, 6)
    state = model.prefill([1], 4)
    with pytest.raises(InputError, match="embeds must be a float tensor of shape"):
        model.step(state, torch.zeros(1, 2, dtype=torch.long), embeds=torch.zeros(1, 2, 31))
    x = torch.zeros(1, 3, dtype=torch.long)
    assert torch.equal(model(torch.tensor([1]), x), model(torch.tensor([1]), x, embeds=model.tok_embeddings(x)))
