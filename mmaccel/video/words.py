"""The word-level tokenizer of the built-in streaming model: one token per word of the task's closed
vocabulary (`mmaccel.video.data.VOCAB`), plus the specials a Qwen-VL layout needs."""

from __future__ import annotations

from mmaccel.errors import InputError

SPECIALS = ("<eos>", "<q>", "<a>", "<vision_start>", "<vision_end>", "<video>", "<image>", "<pad>")


class WordTokenizer:
    """A question "what is on screen now ?" -> [<q>, what, is, on, screen, now, ?, <a>]; an answer is
    words then <eos>. Unknown words are an error that lists the vocabulary (the model knows no others)."""

    def __init__(self, words: tuple[str, ...] | list[str]):
        self.tokens = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.ids = {w: i for i, w in enumerate(self.tokens)}
        self.eos_token_id, self.question, self.answer = self.ids["<eos>"], self.ids["<q>"], self.ids["<a>"]
        self.vision_start, self.vision_end = self.ids["<vision_start>"], self.ids["<vision_end>"]
        self.video, self.image, self.pad = self.ids["<video>"], self.ids["<image>"], self.ids["<pad>"]

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        words = text.lower().replace("?", " ?").split()
        unknown = [w for w in words if w not in self.ids or w in SPECIALS]
        if unknown:
            raise InputError(f"unknown word(s) {', '.join(map(repr, unknown))}: this model knows only "
                             f"{', '.join(self.tokens[len(SPECIALS):])}")
        return [self.ids[w] for w in words]

    def question_ids(self, text: str) -> list[int]:
        return [self.question] + self.encode(text) + [self.answer]

    def answer_ids(self, text: str) -> list[int]:
        return self.encode(text) + [self.eos_token_id]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.tokens[i] for i in ids if i not in (self.eos_token_id, self.pad))
