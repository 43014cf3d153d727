"""The speech trainers' data options: which manifests a --text names, and the text shortlist."""

from argparse import Namespace
from pathlib import Path

import mmaccel.speech.data as data
from mmaccel.speech.train.data import manifest_paths, text_tokens


def test_each_text_has_its_own_manifests():
    assert manifest_paths(Namespace(corpus="/c", text="fortunes")) == {"train": Path("/c/train.jsonl"),
                                                                      "eval": Path("/c/eval.jsonl")}
    assert manifest_paths(Namespace(corpus="/c", text="varied")) == {"train": Path("/c/varied_train.jsonl"),
                                                                    "eval": Path("/c/varied_eval.jsonl")}


class Words:
    """A tokenizer of whole words, the first one marked when it follows a space (as BPE does)."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        words = text.split(" ")
        pieces = (["_" + words[1]] + words[2:]) if words[0] == "" else words
        return [self.ids.setdefault(p, len(self.ids)) for p in pieces]


def test_the_text_shortlist_covers_every_training_sentence_in_both_first_word_forms(monkeypatch):
    monkeypatch.setattr(data, "sentences", lambda split="train": ["Cats sleep here.", "Dogs sleep there."])
    monkeypatch.setattr(data, "varied_sentences", lambda split="train": ["Pipes carry bytes."])
    words = Words()
    fortunes = text_tokens(words, "fortunes").tolist()
    assert sorted(words.ids) == ["Cats", "Dogs", "_Cats", "_Dogs", "here.", "sleep", "there."]
    assert fortunes == list(range(7))
    varied = text_tokens(words, "varied").tolist()
    assert [p for p, i in words.ids.items() if i in varied] == ["_Pipes", "carry", "bytes.", "Pipes"]


def test_the_training_shortlist_widens_only_when_asked(monkeypatch):
    import torch

    import mmaccel.speech.train.data as train_data
    from mmaccel.speech.train.data import training_shortlist

    monkeypatch.setattr(train_data, "text_tokens", lambda tokenizer, text: torch.tensor([7, 8]))
    rows = [{"tokens": torch.tensor([50, 51, 3, 4]), "prompt_len": 2}, {"tokens": torch.tensor([50, 51, 4, 5]), "prompt_len": 2}]
    start = torch.tensor([9])
    plain = Namespace(shortlist_text=False, init=None, text="varied")
    assert training_shortlist(rows, plain, None, start).tolist() == [3, 4, 5]
    wide = Namespace(shortlist_text=True, init=None, text="varied")
    assert training_shortlist(rows, wide, None, start).tolist() == [3, 4, 5, 7, 8]
    wide.init = "a.safetensors"
    assert training_shortlist(rows, wide, None, start).tolist() == [3, 4, 5, 7, 8, 9]
