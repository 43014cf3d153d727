"""Drafting with a Whisper of another tokenizer (tiny.en for base): text re-tokenisation.

The idea of Hugging Face's universal assisted generation, for Whisper. Before each proposal, the
target's transcript so far is decoded to text and re-encoded with the assistant's tokenizer; the
assistant's cache keeps the longest common prefix with what it holds and takes in the rest (one
ragged pass), then it generates k tokens greedily. Their text, appended to the transcript and
encoded with the target's tokenizer, gives the drafts: the target tokens after the committed ones,
when the committed ones are a prefix of that encoding (a word cut by the tokenizers differently
gives no drafts that round), then the target's end-of-text if the assistant ended. Verification is
the target's greedy match, so transcripts are greedy's whatever the assistant proposes.

The assistant runs its own encoder on the same log-mel features once per utterance (both models
take 80 mel bins).

This proposer works on the host by design: tokenizers map text, so every proposal reads the
transcript so far (`DraftContext.history`) and the assistant's tokens back from the device, and
uploads the drafts. On a GPU each pass therefore waits for the queued work, unlike the same-tokenizer
proposers (draft decoder, EAGLE, Medusa), whose state stays on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmaccel.core.model import append_ragged
from mmaccel.core.proposers import Draft, DraftContext, Proposer
from mmaccel.errors import check
from mmaccel.speech.decoder import EncodedAudio, WhisperDecoderModel


@dataclass
class Assistant:
    """A Whisper decoder with its own tokenizer, and the target's tokenizer to translate between them."""

    model: WhisperDecoderModel
    tokenizer: object               # the assistant's Hugging Face tokenizer
    prompt: list[int]               # the assistant's decoder prompt
    end_of_text: int
    target_tokenizer: object
    target_end_of_text: int
    name: str = ""                  # the assistant's Whisper (e.g. "tiny.en")


def new_assistant(bundle, target_bundle) -> Assistant:
    """An assistant from a loaded `WhisperBundle` (English transcription prompt) for `target_bundle`."""
    mels, target_mels = bundle.model.config.num_mel_bins, target_bundle.model.config.num_mel_bins
    check(mels == target_mels, f"the assistant takes {mels} mel bins but the target {target_mels}; "
          "they must read the same features")
    return Assistant(WhisperDecoderModel(bundle.model), bundle.tokenizer, bundle.prompt("en"), bundle.tokens.end_of_text,
                     target_bundle.tokenizer, target_bundle.tokens.end_of_text, bundle.name)


class CrossTokenizerProposer(Proposer):
    """Chain drafts from an `Assistant` whose vocabulary differs from the target's."""

    def __init__(self, assistant: Assistant):
        self.assistant, self.target_tokenizer = assistant, assistant.target_tokenizer
        self.target_eot = assistant.target_end_of_text
        self._passes = 0

    def passes(self) -> int:
        n, self._passes = self._passes, 0
        return n

    def start(self, inputs: EncodedAudio, room: int, ctx: DraftContext) -> None:
        check(inputs.features is not None, "cross-tokenizer drafting needs the log-mel features (EncodedAudio.features)")
        a = self.assistant
        self.prompt_len = inputs.prompt.shape[1]
        self.inputs = a.model.encode(inputs.features, a.prompt)
        capacity_room = min(room + 32, a.model.max_positions - len(a.prompt))
        self.state = a.model.prefill(self.inputs, capacity_room)
        self._passes += 1
        self.fed = [list(a.prompt) for _ in range(inputs.batch_size)]   # assistant tokens in its cache

    def _text(self, tokens: list[int]) -> str:
        return self.target_tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        check(k >= 1, f"draft length k must be >= 1, got {k}")
        a = self.assistant
        texts = [self._text(h[self.prompt_len:]) for h in ctx.history]
        rollback, new = [], []
        for b, text in enumerate(texts):
            ids = a.prompt + a.tokenizer.encode(text, add_special_tokens=False)
            ids = ids[: self.state.cache.capacity - k]                     # stay inside the assistant's cache
            common = 0
            for x, y in zip(self.fed[b], ids):
                if x != y:
                    break
                common += 1
            common = min(common, len(ids) - 1)                           # refeed one token to get its logits
            rollback.append(len(self.fed[b]) - common)
            new.append(torch.tensor(ids[common:]))
            self.fed[b] = ids
        self.state.rollback(torch.tensor(rollback))
        logits = append_ragged(a.model, self.state, new)
        self._passes += 1
        generated = []
        for j in range(k):
            x = logits.argmax(-1)
            generated.append(x)
            if j < k - 1:
                logits = a.model.step(self.state, x[:, None])[:, 0]
                self._passes += 1
        generated = torch.stack(generated, 1).tolist()
        drafts = []
        for b, text in enumerate(texts):
            self.fed[b] = self.fed[b] + generated[b][: k - 1]
            cont = generated[b]
            ended = a.end_of_text in cont
            cont = cont[: cont.index(a.end_of_text)] if ended else cont
            more = a.tokenizer.decode(cont, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            committed = ctx.history[b][self.prompt_len:]
            full = self.target_tokenizer.encode(text + more, add_special_tokens=False)
            row = full[len(committed):] if full[: len(committed)] == committed else []
            row = (row + [self.target_eot] * ended)[:k]
            drafts.append(row + [self.target_eot] * (k - len(row)))     # padding is only ever checked, never trusted
        return Draft(torch.tensor(drafts, dtype=torch.long, device=ctx.pending.device))
