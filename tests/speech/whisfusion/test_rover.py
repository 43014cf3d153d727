"""ROVER word voting: majorities win substitutions, insertions and deletions; weights count;
a transcript with a strict majority is always the result, in any input order."""

import itertools
import math
import random

import pytest

from mmaccel.errors import InputError
from mmaccel.speech.whisfusion.rover import rover


def test_majority_wins_a_substitution():
    assert rover(["a b c", "a x c", "a b c"]) == "a b c"
    assert rover(["a x c", "a b c", "a x c"]) == "a x c"


def test_inserted_word_is_kept_only_when_the_majority_has_it():
    assert rover(["a b c", "a b d c", "a b c"]) == "a b c"
    assert rover(["a b d c", "a b c", "a b d c"]) == "a b d c"
    assert rover(["a b c", "a b c", "a b c e"]) == "a b c"
    assert rover(["a b c e", "a b c", "a b c e"]) == "a b c e"


def test_deleted_word_is_restored_by_the_majority():
    assert rover(["a b c", "a c", "a b c"]) == "a b c"
    assert rover(["a c", "a b c", "a b c"]) == "a b c"
    assert rover(["a c", "a b c", "a c"]) == "a c"


def test_voting_fixes_errors_that_every_hypothesis_has():
    # each hypothesis has one error in a different place; no input is right, the vote is
    assert rover(["x b c d", "a y c d", "a b z d", "a b c w"]) == "a b c d"
    assert rover(["the cat sat", "a cat sat on", "the dog sat on", "the cat sat on"]) == "the cat sat on"


def test_alignment_follows_the_words_not_their_positions():
    # "a b" is shifted by one word in the later hypotheses; a positional vote would give "a b b"
    assert rover(["x a b", "a b y", "a b z"]) == "a b"
    assert rover(["a b c d e", "b c d e", "b c d e f", "z b c d e"]) == "b c d e"


def test_weights_can_overturn_a_majority():
    hyps = ["a b c", "a x c", "a x c"]
    assert rover(hyps) == "a x c"
    assert rover(hyps, weights=[3.0, 1.0, 1.0]) == "a b c"
    assert rover(["a b c", "a b c d", "a b c d"], weights=[2.5, 1.0, 1.0]) == "a b c"
    assert rover(["a b c", "a c", "a c"], weights=[0.5, 0.2, 0.2]) == "a b c"


def test_vote_ties_go_to_the_earliest_hypothesis():
    assert rover(["a b", "a c"]) == "a b"
    assert rover(["a c", "a b"]) == "a c"
    assert rover(["a b", "a c"], weights=[1.0, 2.0]) == "a c"
    assert rover(["a b", "a c"], weights=[0.0, 0.0]) == "a b"


def test_a_clear_majority_does_not_depend_on_the_input_order():
    hyps = ["the cat sat on the mat", "the cat sat on a mat", "a cat sat on the mat now",
            "the cat sat on the mat", "the cat sat on the mat"]
    for perm in itertools.permutations(hyps):
        assert rover(perm) == "the cat sat on the mat"


def test_a_single_hypothesis_is_returned_with_normalised_spacing():
    assert rover(["  hello   world "]) == "hello world"
    assert rover(["hello world"], weights=[0.0]) == "hello world"
    assert rover([""]) == ""


def test_all_empty_hypotheses_give_the_empty_transcript():
    assert rover(["", "", ""]) == ""
    assert rover(["", " ", "\t"]) == ""
    assert rover(["", "", "a"]) == ""
    assert rover(["a", "", "a"]) == "a"


def test_copies_of_the_majority_are_not_split_across_slots():
    # Regression: aligning each copy of "c c" on its own put the first copy's "c" and the later
    # copies' "c" in different slots, so "b" won one of them ("b c c").
    assert rover(["c c", "b b d", "b d", "a b c a b c c", "c c", "c c", "c c"]) == "c c"
    assert rover(["a", "c", "c b a c c", "a c b a c", "b a b b a c c", "a", "a", "a", "a"]) == "a"


def random_words(rng: random.Random, vocab: str, longest: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(0, longest)))


def test_identical_hypotheses_give_themselves():
    rng = random.Random(0)
    for _ in range(50):
        text = random_words(rng, "abcd", 10)
        k = rng.randint(1, 8)
        weights = [rng.uniform(0.0, 2.0) for _ in range(k)]
        assert rover([text] * k) == text
        assert rover([text] * k, weights=weights) == text


def test_a_strict_majority_transcript_is_the_result():
    rng = random.Random(1)
    for _ in range(300):
        vocab = "abcd"[: rng.randint(1, 4)]
        k = rng.randint(1, 9)
        major = random_words(rng, vocab, 8)
        hyps = [major] * (k // 2 + 1) + [random_words(rng, vocab, 8) for _ in range(k - k // 2 - 1)]
        rng.shuffle(hyps)
        assert rover(hyps) == major, hyps


def test_a_transcript_with_more_than_half_the_weight_is_the_result():
    rng = random.Random(2)
    for _ in range(200):
        vocab = "abc"[: rng.randint(1, 3)]
        others = [random_words(rng, vocab, 6) for _ in range(rng.randint(1, 6))]
        weights = [rng.uniform(0.0, 1.0) for _ in others]
        major = random_words(rng, vocab, 6)
        at = rng.randint(0, len(others))
        hyps = others[:at] + [major] + others[at:]
        weights = weights[:at] + [sum(weights) + 0.01] + weights[at:]
        assert rover(hyps, weights=weights) == major, (hyps, weights)


@pytest.mark.parametrize("hyps,weights,message", [
    ([], None, "no hypotheses given"),
    ("a b c", None, "not one string"),
    (["a b", None], None, "must be a str"),
    (["a b", "a c"], [1.0], "got 1 weights for 2 hypotheses"),
    (["a b", "a c"], [1.0, 1.0, 1.0], "got 3 weights for 2 hypotheses"),
    (["a b", "a c"], [1.0, -0.5], "finite and >= 0"),
    (["a b", "a c"], [1.0, math.nan], "finite and >= 0"),
    (["a b", "a c"], [math.inf, 1.0], "finite and >= 0"),
])
def test_bad_input_gets_a_clear_error(hyps, weights, message):
    with pytest.raises(InputError, match=message):
        rover(hyps, weights=weights)
