import pytest
import torch

from mmaccel.speech.ctc.arpa import write_arpa
from mmaccel.speech.ctc.beam import ctc_beam_search
from mmaccel.speech.ctc.lm import ngram_table
from tests.speech.ctc.test_lm import VOCAB, char_lm

pytest.importorskip("pyctcdecode")
pytest.importorskip("flashlight.lib.text.decoder")


def clear_speech(seed: int) -> tuple[torch.Tensor, str]:
    """log-probs [1, T, V] that spell a random phrase with blanks between letters, and the phrase."""
    g = torch.Generator().manual_seed(seed)
    words = ["cat", "bat", "tab", "a", "at", "cab"]
    text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (4,), generator=g))
    frames = []
    for ch in text:
        frames += [VOCAB.index["|" if ch == " " else ch]] * int(torch.randint(1, 3, (1,), generator=g)) + [0]
    logits = torch.randn(len(frames), len(VOCAB), generator=g)
    logits[torch.arange(len(frames)), torch.tensor(frames)] += 5.0
    return logits.log_softmax(-1)[None], text


def test_the_peers_read_clear_speech_as_we_do():
    from mmaccel.speech.ctc.peers import flashlight_beam, pyctcdecode_beam

    for seed in range(5):
        lp, text = clear_speech(seed)
        ours = ctc_beam_search(lp, VOCAB, beam=8)[0]
        assert ours.text == text
        assert pyctcdecode_beam(lp, VOCAB, beam=8)[0].text == text
        flash = flashlight_beam(lp, VOCAB, beam=8)[0]
        assert flash.text == text and [w.text for w in flash.words] == [w.text for w in ours.words]


def test_flashlight_with_our_arpa_lm_settles_a_close_call_as_we_do(tmp_path):
    from mmaccel.speech.ctc.peers import flashlight_beam

    arpa = write_arpa(char_lm(3), tmp_path / "chars.arpa")
    c, b, a, t = (VOCAB.index[ch] for ch in "cbat")
    torch.manual_seed(0)
    logits = torch.randn(6, len(VOCAB))
    for frame, label in enumerate([0, a, 0, t, 0]):
        logits[frame + 1, label] += 6.0
    logits[0, b], logits[0, c] = 6.2, 6.0
    lp = logits.log_softmax(-1)[None]
    assert flashlight_beam(lp, VOCAB, beam=8)[0].text == "bat"
    assert flashlight_beam(lp, VOCAB, beam=8, lm=arpa, lm_weight=0.5)[0].text == "cat"
    assert ctc_beam_search(lp, VOCAB, beam=8, fusion=[(ngram_table(arpa, VOCAB), 0.5)])[0].text == "cat"
