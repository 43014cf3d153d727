"""TextPipeline on a local HF directory: methods by name, identical greedy text, clear errors."""

import pytest
import torch

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
    out = pipe.generate_ids(ids, method, max_new_tokens=12, on_tokens=lambda rows: heard.append(list(rows)), **params)
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


class Feed:
    """A RowFeed over `prompts` (prompt ids, most new tokens): the first `first` take the call's rows, the rest
    join as rows end; `drop` names prompts whose rows end at the next step after they are placed."""

    reserve = 8

    def __init__(self, prompts, first, drop=()):
        self.prompts, self.drop = prompts, set(drop)
        self.limits = [n for _, n in prompts[:first]]
        self.rows = dict(enumerate(range(first)))          # row -> prompt index
        self.queue, self.out, self.placed = list(range(first, len(prompts))), {}, []

    def finished(self, row, tokens, passes):
        if row in self.rows:
            self.out[self.rows.pop(row)] = tokens

    def next(self, row, max_prompt):
        if not self.queue:
            return None
        j = self.queue.pop(0)
        self.rows[row] = j
        self.placed.append((j, row))
        return self.prompts[j]

    def dropped(self):
        gone = [row for row, j in self.rows.items() if j in self.drop]
        for row in gone:
            del self.rows[row]
        return gone


@pytest.mark.parametrize("method, params", [("ar", {}), ("speculative", {"k": 3}), ("ngram", {}),
                                            ("early-exit", {"exit_layer": 1})])
def test_requests_joining_a_call_as_rows_end_get_what_they_get_alone(pipe, method, params):
    texts = ["the cat sat on the mat", "a dog ran", "the red mat", "go away dog", "a blue cat ran far", "stop"]
    prompts = [(ids, n) for ids, n in zip(pipe.encode(texts), [12, 3, 7, 5, 9, 2])]
    alone = [pipe.generate_ids([ids], method, max_new_tokens=n, **params).tokens[0] for ids, n in prompts]
    feed = Feed(prompts, first=2)
    pipe.generate_ids([ids for ids, _ in prompts[:2]], method, max_new_tokens=12, feed=feed, **params)
    assert [feed.out[j] for j in range(len(prompts))] == alone
    assert feed.placed[0] == (2, 1)             # the second row ended first (3 tokens) and took the next prompt


def test_sampled_rows_that_join_follow_the_target_law(pipe):
    """A joining row's first token is drawn with fresh noise from its own distribution (the first token of 600
    requests for one prompt, top-k 8), and the test tells that law from a sharper one (negative control)."""
    from mmaccel.core.sampling import Sampling
    from tests.core.test_speculative import chi2_rejects

    ids = pipe.encode(["the cat sat on the mat"])[0]
    feed = Feed([(ids, 1)] * 600, first=4)
    pipe.generate_ids([ids] * 4, "ar", max_new_tokens=1, temperature=1.0, top_k=8, seed=3, feed=feed)
    first = torch.tensor([feed.out[j][0] for j in range(4, 600)])
    logits = pipe.model.prefill([ids], 0).logits[0]
    law, sharper = (Sampling(temperature=t, top_k=8).probs(logits[None])[0] for t in (1.0, 0.5))
    kept = law > 0
    index = torch.cumsum(kept.long(), 0) - 1            # the top-k tokens, numbered 0..7
    assert bool(kept[first].all())
    assert not chi2_rejects(index[first], law[kept])
    assert chi2_rejects(index[first], sharper[kept])


def test_a_dropped_row_ends_and_its_place_is_taken(pipe):
    prompts = [(ids, 12) for ids in pipe.encode(["the cat sat on the mat", "a dog ran", "the red mat"])]
    feed = Feed(prompts, first=2, drop={0})
    pipe.generate_ids([ids for ids, _ in prompts[:2]], "ar", max_new_tokens=12, feed=feed)
    assert 0 not in feed.out and feed.placed == [(2, 0)]        # row 0 ended at once, the third prompt took it
    assert feed.out[2] == pipe.generate_ids([prompts[2][0]], "ar", max_new_tokens=12).tokens[0]


def test_methods_that_cannot_take_joining_requests_say_so(pipe):
    ids = pipe.encode(["the cat"])
    with pytest.raises(InputError, match="cannot take requests in the middle of a call"):
        pipe.generate_ids(ids, "sjd", max_new_tokens=4, feed=Feed([(ids[0], 4)], first=1))
    with pytest.raises(InputError, match="cannot take requests in the middle of a call"):
        pipe.generate_ids(ids, "ar", max_new_tokens=4, coupled=True, feed=Feed([(ids[0], 4)], first=1))
