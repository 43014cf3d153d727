"""TextPipeline on a local HF directory: methods by name, identical greedy text, clear errors."""

import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.lm.pipeline import TextPipeline


@pytest.fixture(scope="module")
def pipe(tiny_lm_dir):
    return TextPipeline.from_pretrained(str(tiny_lm_dir), draft=str(tiny_lm_dir))


@pytest.mark.parametrize("method, params", [("speculative", {"k": 3}), ("ngram", {}), ("sjd", {"window": 3}),
                                            ("tree", {"depth": 2, "width": 2}), ("early-exit", {"exit_layer": 1})])
def test_methods_give_the_ar_text(pipe, method, params):
    prompts = ["the cat sat on the mat", "a dog ran"]
    base = pipe.generate(prompts, "ar", max_new_tokens=12)
    out = pipe.generate(prompts, method, max_new_tokens=12, **params)
    assert out.texts == base.texts and out.tokens == base.tokens
    assert out.stats.nfe <= base.stats.nfe


@pytest.mark.parametrize("method, params", [("ar", {}), ("speculative", {"k": 3}), ("sjd", {"window": 3})])
def test_on_tokens_hears_each_rows_tokens_as_they_are_committed(pipe, method, params):
    heard = []
    ids = pipe.encode(["the cat sat on the mat", "a dog ran"])
    out = pipe.generate_ids(ids, method, max_new_tokens=12, on_tokens=heard.append, **params)
    assert len(heard) >= 2 and heard[-1] == out.tokens
    for before, after in zip(heard, heard[1:]):              # each step extends each row's tokens
        assert all(b == a[:len(b)] for b, a in zip(before, after))
    if method == "speculative":
        assert len(heard) < sum(map(len, out.tokens)) / 2 + 2     # several tokens a step


@pytest.mark.parametrize("call, error, message", [
    (lambda p: p.generate(["the cat"], "warp-drive"), InputError, "unknown method"),
    (lambda p: p.generate(["the cat"], "speculative", k=0), InputError, "k must be"),
    (lambda p: p.generate(["the cat"], temperature=-0.5), InputError, "temperature"),
    (lambda p: p.generate([]), InputError, "non-empty"),
    (lambda p: p.generate([""]), InputError, "non-empty string"),
    (lambda p: p.generate(["the cat"], max_new_tokens=10_000), InputError, "positions"),
])
def test_bad_input(pipe, call, error, message):
    with pytest.raises(error, match=message):
        call(pipe)


def test_missing_checkpoint_paths(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        TextPipeline.from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        TextPipeline.from_pretrained(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="unknown built-in"):
        TextPipeline.from_pretrained("builtin:gpt-17")
