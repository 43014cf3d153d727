import math
import random

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.speech.ctc import fusion
from mmaccel.speech.ctc.arpa import read_arpa, write_arpa
from mmaccel.speech.ctc.beam import ctc_beam_search
from mmaccel.speech.ctc.kneser_ney import char_tokens, estimate_kneser_ney
from mmaccel.speech.ctc.lm import ngram_table
from mmaccel.speech.ctc.vocab import CTCVocabulary

VOCAB = CTCVocabulary(["_", "|", "a", "b", "c", "t", "z"], blank=0)          # "z" is never in the LM's text
TEXT = ["a cat", "the cat ate", "a bat", "cat at a cat", "tab cab", "at a bat", "a cat a cat"] * 3


def char_lm(order: int):
    return estimate_kneser_ney([char_tokens(line) for line in TEXT], order, discounts="fallback")


def walk(table, labels):
    state, total = table.start, 0.0
    for label in labels:
        total += float(table.score[state, label])
        state = int(table.next[state, label])
    return total + float(table.final[state])


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_the_dense_table_scores_every_sequence_as_the_arpa_backoff_rule(order, tmp_path):
    model = read_arpa(write_arpa(char_lm(order), tmp_path / "lm.arpa"))
    table = ngram_table(model, VOCAB)
    rng = random.Random(order)
    for _ in range(40):
        labels = [rng.randrange(1, len(VOCAB)) for _ in range(rng.randrange(0, 12))]
        words = ["<unk>" if VOCAB.tokens[v] == "z" else VOCAB.tokens[v] for v in labels]
        assert walk(table, labels) == pytest.approx(math.log(10) * model.score_sentence(words), abs=1e-4)


def test_lm_fusion_settles_what_the_acoustics_leave_open():
    c, b, a, t = (VOCAB.index[ch] for ch in "cbat")
    torch.manual_seed(0)
    logits = torch.randn(6, len(VOCAB))
    for frame, label in enumerate([0, a, 0, t, 0]):
        logits[frame + 1, label] += 6.0
    logits[0, b], logits[0, c] = 6.2, 6.0                      # "bat" sounds a little likelier than "cat"
    lp = logits.log_softmax(-1)[None]
    assert ctc_beam_search(lp, VOCAB, beam=8)[0].text == "bat"
    lm = ngram_table(char_lm(3), VOCAB)
    assert ctc_beam_search(lp, VOCAB, beam=8, fusion=[(lm, 0.5)])[0].text == "cat"   # the text says "cat" 10:3


def test_a_mismatched_or_oversized_lm_is_a_clear_error(monkeypatch):
    words = estimate_kneser_ney([line.split() for line in TEXT], 2, discounts="fallback")
    with pytest.raises(InputError, match="do not match the CTC labels"):
        ngram_table(words, VOCAB)
    monkeypatch.setattr(fusion, "MAX_ENTRIES", 50)
    with pytest.raises(InputError, match="lower order"):
        ngram_table(char_lm(3), VOCAB)
