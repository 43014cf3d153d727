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


def test_eagle_batches_share_one_prompt_and_cover_every_row_once():
    import torch

    from mmaccel.speech.train.eagle import prompt_batches

    plain, timed = [50, 51, 52], [50, 51]
    rows = [{"tokens": torch.tensor((plain if i % 3 else timed) + [7]), "prompt_len": 3 if i % 3 else 2}
            for i in range(11)]
    order = [10, 3, 0, 7, 1, 9, 6, 2, 5, 8, 4]
    found = prompt_batches(rows, 3, order)
    assert sorted(i for b in found for i in b) == list(range(11))
    for b in found:
        assert len(b) <= 3 and len({rows[i]["prompt_len"] for i in b}) == 1
    assert [i for b in found for i in b if i % 3 == 0] == [i for i in order if i % 3 == 0]     # order kept


def test_every_kth_chunk_is_labelled_in_timestamp_mode(tiny_en_asr, tmp_path):
    from mmaccel.speech.data import Utterance, write_manifest
    from mmaccel.speech.train.data import collect, load_rows
    from tests.speech.test_pipeline import FILES

    manifest = write_manifest(tmp_path / "m.jsonl", [Utterance(f, "", 1.0, f"u{i}") for i, f in enumerate(FILES[:2])])
    collect(tiny_en_asr, manifest, tmp_path / "data", 1, None, tmp_path, timestamp_every=2)
    rows = load_rows(tmp_path / "data")
    marks = tiny_en_asr.bundle.tokens
    plain, timed = (r["tokens"][r["prompt_len"]:].tolist() for r in rows)
    assert rows[0]["tokens"][: rows[0]["prompt_len"]].tolist() == tiny_en_asr.bundle.prompt("en")
    assert rows[1]["tokens"][: rows[1]["prompt_len"]].tolist() == tiny_en_asr.bundle.prompt("en", timestamps=True)
    begin = marks.no_timestamps + 1
    assert not any(t >= begin for t in plain)
    assert timed[0] >= begin and sum(t >= begin for t in timed) >= 2       # a segment opens and closes
    for r in rows:                                          # one stored state per transcript token
        assert r["final"].shape[0] == len(r["tokens"]) - r["prompt_len"]
