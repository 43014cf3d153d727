"""Shared fixtures: tiny random Llama-layout LMs (target and a smaller draft), seeded, and a tiny
local Hugging Face LM directory (random weights, word-level tokenizer) built offline; a scripted
schedule for adaptive drafting."""

import itertools

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from mmaccel.engine.machine import cpu_bf16_units
from mmaccel.lm.hf import HFCausalLM

# One thread for the whole suite: the same float reductions on every machine, and no contention
# with a benchmark or training job running beside the tests.
torch.set_num_threads(1)

# the cheaper precision this CPU runs natively (bf16 is refused where it would be emulated)
NATIVE_CHEAP = "bf16" if cpu_bf16_units() else "int8"


def tiny_llama(seed: int, layers: int = 2, hidden: int = 64, vocab: int = 97) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than the default init, so greedy has clear winners
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def target():
    return HFCausalLM(tiny_llama(0, layers=3))


@pytest.fixture(scope="session")
def draft(target):
    # a draft that agrees with the target often: the target's first layer (shared weights)
    return target.early_exit(1)


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 97, (n,), generator=g).tolist() for n in (5, 9, 3, 7)]

WORDS = ["<pad>", "<eos>", "<unk>"] + "the a cat dog sat on mat ran far away and then stop go red blue".split()


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_lm")
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(path)
    model = tiny_llama(0, layers=2, vocab=len(WORDS))
    model.config.eos_token_id = 1
    model.save_pretrained(path)
    return path


def installed(load, what: str):
    """`load()`, or the test skipped when the package that carries the weights of `what` is missing."""
    from mmaccel.errors import ModelNotFoundError

    try:
        return load()
    except ModelNotFoundError as err:
        pytest.skip(f"{what} not installed: {err}")


@pytest.fixture(scope="session")
def tiny_en_asr():
    """The builtin Whisper tiny.en in an ASRPipeline."""
    from mmaccel.speech.pipeline import ASRPipeline

    return installed(lambda: ASRPipeline.from_pretrained("builtin:tiny.en"), "Whisper tiny.en")


@pytest.fixture(scope="session")
def smollm2():
    """The builtin SmolLM2-135M-Instruct (and its distilled draft) in a TextPipeline."""
    from mmaccel.lm.pipeline import TextPipeline

    return installed(lambda: TextPipeline.from_pretrained("builtin:smollm2"), "SmolLM2")


def scripted(monkeypatch, lengths):
    """Adaptive drafting's passes draft `lengths` in turn (a tree: all of it or nothing), not what the clock says."""
    from mmaccel.core.adaptive import DraftLengths

    turns = itertools.cycle(lengths)

    def choose(self, active):
        k = next(turns)
        return (self.most if k else 0) if self.tree else min(k, self.most)

    monkeypatch.setattr(DraftLengths, "choose", choose)
