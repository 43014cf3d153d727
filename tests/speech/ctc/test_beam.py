import itertools
import math

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.speech.ctc.beam import ctc_beam_search, ctc_greedy
from mmaccel.speech.ctc.boosting import phrase_table
from mmaccel.speech.ctc.fusion import FusionTable
from mmaccel.speech.ctc.vocab import CTCVocabulary

VOCAB = CTCVocabulary(["_", "|", "a", "b", "c", "t"], blank=0)


def peaky(labels: list[int], V: int = len(VOCAB), confidence: float = 4.0, seed: int = 0) -> torch.Tensor:
    """log-probs [T, V] whose best label per frame is `labels`, with random runner-ups."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(labels), V, generator=g)
    logits[torch.arange(len(labels)), torch.tensor(labels)] += confidence
    return logits.log_softmax(-1)


def random_table(S: int, V: int, seed: int) -> FusionTable:
    g = torch.Generator().manual_seed(seed)
    return FusionTable(torch.randint(0, S, (S, V), generator=g), -torch.rand(S, V, generator=g) * 3,
                       -torch.rand(S, generator=g), start=0, name="random")


def test_greedy_merges_repeats_removes_blanks_and_times_words():
    c, a, t, sp = 4, 2, 5, 1
    frames = [c, c, 0, a, a, t, sp, 0, c, a, 0, a, t]              # "cat|ca_at" -> "cat caat"
    [hyp] = ctc_greedy(peaky(frames)[None], VOCAB, frame_seconds=0.5)
    assert hyp.text == "cat caat" and hyp.tokens == [c, a, t, sp, c, a, a, t]
    assert hyp.frames == [0, 3, 5, 6, 8, 9, 11, 12]
    assert [(w.text, w.start, w.end) for w in hyp.words] == [("cat", 0.0, 3.0), ("caat", 4.0, 6.5)]


def test_a_beam_of_one_is_greedy_and_lengths_cut_rows():
    torch.manual_seed(0)
    lp = torch.randn(3, 40, len(VOCAB)).mul(3).log_softmax(-1)
    lengths = torch.tensor([40, 25, 7])
    for got, want in zip(ctc_beam_search(lp, VOCAB, lengths, beam=1, blank_skip=None), ctc_greedy(lp, VOCAB, lengths)):
        assert got.tokens == want.tokens and got.frames == want.frames
        assert got.score == pytest.approx(want.score, abs=1e-4)
    alone = ctc_beam_search(lp[1:2, :25], VOCAB, beam=8)
    assert ctc_beam_search(lp, VOCAB, lengths, beam=8)[1].tokens == alone[0].tokens


def brute_force(lp: torch.Tensor, tables, bonus: float, recombine: str = "max") -> tuple[float, list[int]]:
    """Best transcript of [T, V] log-probs and its score over every alignment: the best alignment's
    ("max", Viterbi) or the log-sum-exp of all of them ("sum")."""
    T, V = lp.shape
    by_transcript: dict[tuple, list[float]] = {}
    for path in itertools.product(range(V), repeat=T):
        score, previous, emitted = 0.0, 0, []
        states = [t.start for t, _ in tables]
        for frame, label in enumerate(path):
            score += float(lp[frame, label])
            if label != 0 and label != previous:
                emitted.append(label)
                score += bonus
                for i, (table, weight) in enumerate(tables):
                    score += weight * float(table.score[states[i], label])
                    states[i] = int(table.next[states[i], label])
            previous = label
        score += sum(w * float(t.final[s]) for (t, w), s in zip(tables, states))
        by_transcript.setdefault(tuple(emitted), []).append(score)
    pool = max if recombine == "max" else lambda xs: float(torch.tensor(xs, dtype=torch.float64).logsumexp(0))
    score, tokens = max((pool(scores), list(t)) for t, scores in by_transcript.items())
    return score, tokens


@pytest.mark.parametrize("recombine", ["max", "sum"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wide_beam_finds_the_best_transcript_of_all_alignments(seed, recombine):
    """With room for every hypothesis, the search is exact over alignments with fusion scores: Viterbi
    ("max") or the transcript's total probability ("sum", the CTC forward sum)."""
    vocab = CTCVocabulary(["_", "a", "b", "c"], blank=0)
    torch.manual_seed(seed)
    lp = torch.randn(6, 4).mul(1.5).log_softmax(-1)
    tables = [(random_table(5, 4, seed), 0.7), (random_table(3, 4, seed + 10), 0.3)]
    score, tokens = brute_force(lp, tables, bonus=0.4, recombine=recombine)
    [hyp] = ctc_beam_search(lp[None], vocab, beam=1024, fusion=tables, insertion_bonus=0.4, threshold=1e9,
                            blank_skip=None, recombine=recombine)
    assert hyp.tokens == tokens and hyp.score == pytest.approx(score, abs=1e-4)
    [narrow] = ctc_beam_search(lp[None], vocab, beam=2, fusion=tables, insertion_bonus=0.4, blank_skip=None,
                               recombine=recombine)
    assert narrow.score <= score + 1e-4


def test_summing_alignments_can_pick_another_transcript_than_the_best_alignment():
    """Blank is likelier than "a" on each of two frames (best alignment "__": 0.36), but "a" has three
    alignments (a_, _a, aa: 0.64 together): the CTC textbook case."""
    vocab = CTCVocabulary(["_", "a"], blank=0)
    lp = torch.tensor([[0.6, 0.4], [0.6, 0.4]]).log()
    for recombine in ("max", "sum"):
        want = brute_force(lp, [], 0.0, recombine)
        [hyp] = ctc_beam_search(lp[None], vocab, beam=64, threshold=1e9, blank_skip=None, recombine=recombine)
        assert (hyp.tokens, round(hyp.score, 4)) == (want[1], round(want[0], 4))
    assert brute_force(lp, [], 0.0, "max")[1] == [] and brute_force(lp, [], 0.0, "sum")[1] == [1]


def test_skipped_blank_frames_still_separate_repeated_labels():
    a = 2
    lp = peaky([a, 0, 0, a, a], confidence=12.0)            # the blanks are > 0.999 sure: skipped
    for skip in (None, 0.999):
        [hyp] = ctc_beam_search(lp[None], VOCAB, beam=4, blank_skip=skip)
        assert hyp.tokens == [a, a] and hyp.frames == [0, 3]
    full, skipped = (ctc_beam_search(lp[None], VOCAB, beam=4, blank_skip=s)[0].score for s in (None, 0.999))
    assert skipped == pytest.approx(full, abs=1e-4)          # skipped frames still count their blank score


def test_boosting_turns_a_close_call_and_pays_only_for_whole_phrases():
    c, b, a, t = 4, 3, 2, 5
    lp = peaky([c, a, t])
    lp[0, b] = lp[0, c] - 0.5                                # "bat" is a close second
    lp = lp.log_softmax(-1)
    assert ctc_beam_search(lp[None], VOCAB, beam=8)[0].text == "cat"
    boost = phrase_table(["bat"], VOCAB, token_score=1.0)
    assert ctc_beam_search(lp[None], VOCAB, beam=8, fusion=[(boost, 1.0)])[0].text == "bat"

    def walk(labels):
        state, total = boost.start, 0.0
        for label in labels:
            total += float(boost.score[state, label])
            state = int(boost.next[state, label])
        return total + float(boost.final[state])

    assert walk([c, b, a, t, c]) == pytest.approx(3.0)       # one whole phrase
    assert walk([b, a, c, a, t]) == pytest.approx(0.0)       # a partial match pays nothing
    assert walk([b, a, b, a, t]) == pytest.approx(3.0)       # the failure link restarts inside "ba"
    assert walk([b, a]) == pytest.approx(0.0)                # ending inside a phrase gives the potential back


def test_bad_input_is_a_clear_error():
    lp = peaky([2, 3])[None]
    with pytest.raises(InputError, match="NaN"):
        ctc_beam_search(torch.full_like(lp, float("nan")), VOCAB)
    with pytest.raises(InputError, match="beam must be"):
        ctc_beam_search(lp, VOCAB, beam=0)
    with pytest.raises(InputError, match="recombine must be one of max, sum"):
        ctc_beam_search(lp, VOCAB, recombine="mean")
    with pytest.raises(InputError, match="the vocabulary 4"):
        ctc_beam_search(lp, CTCVocabulary(["_", "a", "b", "c"]))
    with pytest.raises(InputError, match="covers 4 labels"):
        ctc_beam_search(lp, VOCAB, fusion=[(random_table(3, 4, 0), 1.0)])
    with pytest.raises(InputError, match="lengths"):
        ctc_beam_search(lp, VOCAB, torch.tensor([5]))
    with pytest.raises(InputError, match=r"\[batch, frames, labels\]"):
        ctc_greedy(lp[0], VOCAB)
    with pytest.raises(InputError, match="blank_skip"):
        ctc_beam_search(lp, VOCAB, blank_skip=1.0)
    with pytest.raises(InputError, match="boost list is empty"):
        phrase_table([], VOCAB)
    with pytest.raises(InputError, match="more than 100,000"):
        phrase_table(["ab"] * 100_001, VOCAB)
    with pytest.raises(InputError, match="not a token"):
        phrase_table(["dog"], VOCAB)


def test_the_search_runs_on_a_cuda_device_without_waiting_on_it_per_frame():
    """On a GPU every frame is device work: what the host reads back grows with the batch, not the frames."""
    from tests.emulated_cuda import emulated_cuda

    torch.manual_seed(3)
    boost = phrase_table(["cat", "at"], VOCAB)
    tables = [(random_table(7, len(VOCAB), 1), 0.3), (boost, 1.0)]
    seen = []
    for T in (20, 20, 60):
        lp = torch.randn(2, T, len(VOCAB)).mul(3).log_softmax(-1)
        want = ctc_beam_search(lp, VOCAB, torch.tensor([T, T - 5]), beam=6, fusion=tables)
        with emulated_cuda() as report:
            got = ctc_beam_search(lp.cuda(), VOCAB, torch.tensor([T, T - 5]).cuda(), beam=6,
                                  fusion=[(t.to("cuda"), w) for t, w in tables])
        assert [(h.tokens, h.frames) for h in got] == [(h.tokens, h.frames) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
        seen.append((report.kinds(), report.uploads))
    assert seen[1] == seen[2], seen


@pytest.mark.parametrize("beam", [3, 8, 16])
def test_reading_only_each_frames_best_labels_changes_nothing(beam):
    """Without fusion the search reads each frame's best `beam` labels only; with a fusion table that scores
    nothing it reads every label: the two must find the same transcripts with the same scores."""
    vocab = CTCVocabulary(["_", "|"] + [chr(ord("a") + i) for i in range(26)] + ["'"], blank=0)
    V = len(vocab)
    nothing = FusionTable(torch.zeros(1, V, dtype=torch.long), torch.zeros(1, V), torch.zeros(1), start=0, name="zero")
    torch.manual_seed(beam)
    lp = torch.randn(3, 40, V).mul(2.5).log_softmax(-1)
    lengths = torch.tensor([40, 31, 12])
    pruned = ctc_beam_search(lp, vocab, lengths, beam=beam)
    full = ctc_beam_search(lp, vocab, lengths, beam=beam, fusion=[(nothing, 1.0)])
    assert [(h.tokens, h.frames) for h in pruned] == [(h.tokens, h.frames) for h in full]
    assert [h.score for h in pruned] == pytest.approx([h.score for h in full], abs=1e-5)


@pytest.mark.parametrize("recombine", ["max", "sum"])
def test_an_impossible_frame_gives_minus_infinity_not_nan(recombine):
    torch.manual_seed(0)
    lp = torch.randn(2, 12, len(VOCAB)).log_softmax(-1)
    lp[1, 5] = -math.inf                                     # no label can be read at frame 5 of row 1
    good, impossible = ctc_beam_search(lp, VOCAB, beam=4, recombine=recombine)
    assert math.isfinite(good.score) and impossible.score == -math.inf
