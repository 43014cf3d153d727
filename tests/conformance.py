"""What the registry-generated conformance cases (tests/test_method_conformance.py) run on: a toy decoder whose
law is known, and one *bench* per pipeline family and check. A bench says which resources its pipeline supplies
(declared, so that a case's id can say why it is skipped before anything is loaded; a test checks the
declaration against the loaded resources), and its loader gives a `Loaded`: the resources a method runs with,
the batches it decodes and how.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mmaccel.core.methods import Method, Resources
from mmaccel.core.model import DecodeState, KVCache, append_ragged, check_step_args
from mmaccel.core.plugin import NEEDS, MethodPlugin
from mmaccel.core.proposers import MedusaHead
from mmaccel.core.sampling import Sampling
from mmaccel.errors import check

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")


# --- a toy decoder whose law is known ---------------------------------------------------------------------------

class TrigramLM:
    """A toy `DecoderModel`: the next token's logits are `table[previous token, token]` (a trigram table
    [V + 1, V, V]; row V stands for "no previous token"), so a step costs two gathers and its law is exact by
    construction. The token ids live in a one-layer `KVCache` (one head of width 1), so rollback, ragged rows,
    tree masks and compaction are the cache's own: a token's previous token is the latest slot its attention
    mask lets it see. Its hidden state (both tokens one-hot) feeds Medusa heads; `early_exit` is the same model
    reading only the last token (a bigram), as the first layers of a deeper model see less."""

    layers = 4

    def __init__(self, table: Tensor):
        check(table.dim() == 3 and table.shape[0] == table.shape[1] + 1 == table.shape[2] + 1,
              f"a trigram table is [V + 1, V, V], got {tuple(table.shape)}")
        self.table = table
        self.vocab_size = table.shape[-1]
        self.device = torch.device("cpu")

    @property
    def hidden_size(self) -> int:
        return 2 * self.vocab_size + 1

    def prefill(self, inputs: list[list[int]], room: int) -> DecodeState:
        check(all(len(row) > 0 for row in inputs), "every prompt needs a token")
        cache = KVCache(1, len(inputs), 1, 1, max(map(len, inputs)) + room)
        state = DecodeState(cache)
        state.logits = append_ragged(self, state, [torch.tensor(row) for row in inputs])
        return state

    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None) -> Tensor:
        check_step_args(state, tokens, tree_mask, self.vocab_size)
        V, T = self.vocab_size, tokens.shape[1]
        write, start = state.cache.reserve(T)
        ids = tokens.to(torch.float32)[:, None, :, None]                            # [B, 1, T, 1]
        keys, _ = write.update(ids, ids, 0)                                         # [B, 1, S, 1]
        visible = state.cache.attention_mask(start, T, tree_mask)[:, 0]             # [B, T, S]
        slots = torch.arange(keys.shape[2])
        own = start[:, None] + torch.arange(T)[None, :]                             # [B, T]
        seen = visible & (slots[None, None, :] < own[:, :, None])
        prev_slot = torch.where(seen, slots, -1).amax(-1)                           # [B, T]
        prev = keys[:, 0, :, 0].gather(1, prev_slot.clamp(min=0)).long()
        prev = torch.where(prev_slot >= 0, prev, V)
        state.hidden = torch.cat([nn.functional.one_hot(prev, V + 1), nn.functional.one_hot(tokens, V)], -1).float()
        return self.table[prev, tokens]                                             # [B, T, V]

    def early_exit(self, exit_layer: int, head: nn.Module | None = None) -> TrigramLM:
        check(1 <= exit_layer < self.layers, f"exit_layer must lie in [1, {self.layers - 1}], got {exit_layer}")
        return TrigramLM(self.table.mean(0, keepdim=True).expand_as(self.table).contiguous())


def toy_resources(vocab: int, seed: int = 0, sharpness: float = 1.0) -> Resources:
    """A trigram target, a trigram draft that agrees with it often, and three random Medusa heads."""
    g = torch.Generator().manual_seed(seed)
    table = sharpness * torch.randn(vocab + 1, vocab, vocab, generator=g)
    draft = table + 0.7 * sharpness * torch.randn(table.shape, generator=g)
    target = TrigramLM(table)
    heads = nn.ModuleList(MedusaHead(target.hidden_size, vocab) for _ in range(3))
    with torch.no_grad():
        for head in heads:
            head.proj.weight.copy_(torch.randn(head.proj.weight.shape, generator=g))
    return Resources(model=target, draft=TrigramLM(draft), heads=heads)


# --- benches ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bench:
    """Where one family's methods are checked: `label` names what it loads (it appears in case ids),
    `supplies` the resources (keys of NEEDS) it offers methods, `baseline` the family's plain decoding."""

    family: str
    label: str
    supplies: frozenset[str]
    fixture: str                     # the test module's fixture that loads it (a `Loaded`)
    baseline: str = "ar"
    slow: bool = False

    def missing(self, plugin: MethodPlugin) -> list[str]:
        return [n for n in plugin.needs if n not in self.supplies]

    def skip_reason(self, plugin: MethodPlugin) -> str | None:
        missing = self.missing(plugin)
        if not missing:
            return None
        return (f"{self.family} method {plugin.name!r} needs {', '.join(NEEDS[n] for n in missing)}, which the "
                f"{self.label} bench does not supply")


@dataclass
class Loaded:
    """A loaded bench. `resources(method)` is what the method runs with (a pipeline may pick its target per
    method); `batches` maps a batch name to (inputs as the target's `prefill` takes them, prompt tokens or None)."""

    resources: Callable[[Method], Resources]
    batches: dict[str, tuple[Any, list[list[int]] | None]]
    max_new_tokens: int
    eos: dict[str, int | None] = field(default_factory=dict)     # per batch; absent: None
    sampling: Sampling = field(default_factory=Sampling)
    lengths: tuple[int, int] = (4, 8)                            # host-read checks: a short and a long call
    references: dict[str, Any] = field(default_factory=dict)     # per batch: the baseline's Generation, cached

    def run(self, method: Method, batch: str, *, max_new_tokens: int | None = None, seed: int = 0):
        inputs, prompts = self.batches[batch]
        return method.run(self.resources(method), inputs, max_new_tokens=max_new_tokens or self.max_new_tokens,
                          sampling=self.sampling, seed=seed, eos_token_id=self.eos.get(batch), prompt_tokens=prompts)


def supplied(resources: Resources) -> set[str]:
    """The keys of NEEDS that `resources` hold."""
    have = set()
    for need in NEEDS:
        value = getattr(resources, need) if hasattr(resources, need) else resources.extras.get(need)
        if value is not None:
            have.add(need)
    return have


def ragged_eos(rows: list[list[int]]) -> int:
    """A token that ends the rows of a greedy batch at different lengths: one whose first occurrence (or
    absence) differs from row to row."""
    def end(row: list[int], token: int) -> int:
        return row.index(token) if token in row else len(row)

    for token in dict.fromkeys(t for row in rows for t in row):
        if len({end(row, token) for row in rows}) == len(rows):
            return token
    raise AssertionError(f"no token ends these greedy rows at different lengths: {rows}")


# text: the text pipeline's tiny Llama (random, word-level tokenizer: tests/conftest.py), its own copy as the draft
TEXT_PROMPTS = {"one": [[3, 4, 5, 6, 7]], "ragged": [[3, 4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]]}


def load_text(model_dir: Path, device: str = "cpu") -> Loaded:
    from mmaccel.core.methods import build_method
    from mmaccel.lm.pipeline import TextPipeline

    pipe = TextPipeline.from_pretrained(str(model_dir), draft=str(model_dir), device=device)
    batches = {name: (rows, rows) for name, rows in TEXT_PROMPTS.items()}
    loaded = Loaded(lambda method: pipe.resources, batches, 24, {"one": pipe.tokenizer.eos_token_id})
    # the random model never emits its tokenizer's end token: the ragged batch ends at one its rows reach apart
    loaded.eos["ragged"] = ragged_eos(loaded.run(build_method("ar"), "ragged").tokens)
    return loaded


# image: class labels under CFG (the pipeline's default guidance); image rows have no end token, so the ragged
# batch is rows of different classes, which accept different numbers of drafts per pass
IMAGE_LABELS = {"one": [3], "ragged": [1, 5, 8]}


def load_image(pipe, cfg_scale: float = 2.0, sampling: Sampling = Sampling(), max_new_tokens: int = 32) -> Loaded:
    """Image rows are square grids: the host-read lengths are the 4 x 4 and 5 x 5 images (ZipAR's default row
    window s = 4 needs a grid at least 4 wide)."""
    resources, guided = pipe.resources(cfg_scale)
    null = pipe.model.num_classes
    batches = {name: ((labels, [null] * len(labels)) if guided else labels, None) for name, labels in IMAGE_LABELS.items()}
    return Loaded(lambda method: resources, batches, max_new_tokens, sampling=sampling, lengths=(16, 25))


def tiny_image_pipeline(grid: int = 8):
    """An ImagePipeline over a tiny random 2-layer GPT, a drafter close to it and a tiny VQ tokenizer, as
    tests/image/test_pipeline.py builds them."""
    from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT
    from mmaccel.image.pipeline import ImagePipeline
    from mmaccel.image.tokenizers.vq import VQConfig, VQModel

    torch.manual_seed(0)
    vocab = 64
    vq = VQModel(VQConfig(codebook_size=vocab, codebook_embed_dim=8, ch=16, ch_mult=(1, 2, 2), num_res_blocks=1,
                          z_channels=16, norm_groups=8))
    target = LlamaGenGPT(GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=vocab, num_classes=10,
                                   block_size=grid * grid, multiple_of=32)).eval()
    with torch.no_grad():
        target.output.weight.normal_(0, 0.3)
        target.cls_embedding.embedding_table.weight.normal_(0, 1.0)
        target.tok_embeddings.weight.normal_(0, 1.0)
    draft = LlamaGenGPT(target.config).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * p.std().clamp(min=1e-3) * torch.randn(p.shape))
    return ImagePipeline(target, vq, draft)


# speech: LibriVox clips (pocketsphinx-testdata) of 12 and 11 greedy tokens (tiny.en; 13 and 11 with base), each
# row of the ragged batch ending at its own <|endoftext|>
SPEECH_CLIPS = {"one": ["0930"], "ragged": ["0880", "0930"]}


def load_speech(asr, timestamps: bool = False) -> Loaded:
    """The LibriVox batches as `transcribe` decodes them, in Whisper's timestamp mode with `timestamps`."""
    from mmaccel.speech.audio import load_audio, log_mel
    from mmaccel.speech.timestamps import TimestampRules

    prompt = asr.bundle.prompt("en", timestamps=timestamps)
    tokens = asr.bundle.tokens
    rules = TimestampRules(tokens.no_timestamps, tokens.end_of_text, len(prompt)) if timestamps else None
    batches = {}
    for name, clips in SPEECH_CLIPS.items():
        audio = [load_audio(LIBRIVOX / f"sense_and_sensibility_01_austen_64kb-{c}.wav") for c in clips]
        inputs = asr.model.encode(log_mel(asr.bundle.feature_extractor, audio), prompt, [a.duration for a in audio],
                                  asr.encoder(), rules)
        batches[name] = (inputs, [prompt] * len(clips))
    eot = tokens.end_of_text
    return Loaded(lambda method: asr.resources(method, timestamps), batches, 40 if timestamps else 32,
                  {"one": eot, "ragged": eot})


def tiny_speech_pipeline(device: str = "cpu", vocab: int | None = None, drafts_read_timestamps: bool = False,
                         precision: str = "fp32"):
    """An ASRPipeline over the speech tests' tiny random Whisper (tests/speech/conftest.py) with random Medusa
    heads, exit heads, a Medusa block, an EAGLE head and a draft decoder: every resource but an assistant (that
    needs a tokenizer). For device="cuda" without a GPU, call it inside `emulated_cuda()`. `vocab`: the model's
    vocabulary size (default the tests' 64; `TIMED_VOCAB` adds timestamp tokens). `drafts_read_timestamps`: the
    draft decoder and EAGLE head are marked as trained on timestamp-mode transcripts (`WhisperDraft.timestamps`).
    `precision`: the pipeline's (`ASRPipeline(precision=)`)."""
    from mmaccel.speech.draft import new_draft
    from mmaccel.speech.eagle import new_eagle_head
    from mmaccel.speech.heads import WhisperHeads, new_exit_heads, new_medusa_heads
    from mmaccel.speech.medusa_block import new_medusa_block
    from mmaccel.speech.pipeline import ASRPipeline
    from mmaccel.speech.whisper import WhisperBundle
    from tests.speech.conftest import VOCAB, tiny_whisper

    hf = tiny_whisper(vocab=vocab or VOCAB).to(device)
    bundle = WhisperBundle("tiny-random", hf, None, None, None, Path("."))
    draft = new_draft(hf)
    draft.timestamps = drafts_read_timestamps
    asr = ASRPipeline(bundle, draft=draft, precision=precision)
    torch.manual_seed(5)
    medusa = new_medusa_heads(asr.model, 4).to(asr.model.device)
    for p in medusa.parameters():
        nn.init.normal_(p, std=0.3)
    exits = {k: head.to(asr.model.device) for k, head in new_exit_heads(asr.model, [1, 2, 3]).items()}
    asr.heads = WhisperHeads(medusa=medusa, exits=exits,
                             block=new_medusa_block(asr.model, new_medusa_heads(asr.model, 4).to(asr.model.device)),
                             eagle=new_eagle_head(asr.model))
    asr.heads.eagle.layer.timestamps = drafts_read_timestamps
    return asr


def load_tiny_speech(asr, timestamps: bool = False) -> Loaded:
    """Two rows of random features; with `timestamps`, in timestamp mode (the model needs `TIMED_VOCAB`)."""
    from mmaccel.speech.timestamps import TimestampRules
    from tests.speech.conftest import EOT, NO_TS, PROMPT, SOT, features

    if not timestamps:
        inputs = asr.model.encode(features(2).to(asr.model.device), PROMPT)
        return Loaded(asr.resources, {"ragged": (inputs, [PROMPT] * 2)}, 16, {"ragged": EOT})
    from mmaccel.speech.methods import build_asr_method

    prompt, audio = [SOT], features(2).to(asr.model.device)
    rules = TimestampRules(NO_TS, EOT, len(prompt), max_initial=10)
    batches = {name: (asr.model.encode(audio[:rows], prompt, rules=rules), [prompt] * rows)
               for name, rows in (("one", 1), ("ragged", 2))}
    loaded = Loaded(lambda method: asr.resources(method, True), batches, 16)
    eos = ragged_eos(loaded.run(build_asr_method("greedy"), "ragged").tokens)    # the random model ends no row itself
    loaded.eos = {"one": eos, "ragged": eos}
    return loaded


# --- laws ---------------------------------------------------------------------------------------------------------

def codes(tokens: Tensor, vocab: int) -> Tensor:
    """Sequences [N, L] of ids < vocab -> their index in a [vocab] * L table."""
    L = tokens.shape[1]
    return (tokens * vocab ** torch.arange(L - 1, -1, -1)).sum(1)


def accept_every_draft(drafts, draft_probs, target_probs, uniforms, exponentials, **params):
    """A wrong acceptance rule (the negative control): exact speculative sampling with every uniform at 0,
    so every draft with target probability > 0 is kept."""
    from mmaccel.core.acceptance import accept_speculative

    return accept_speculative(drafts, draft_probs, target_probs, torch.zeros_like(uniforms), exponentials)


@dataclass
class LawBench:
    """A toy target sampled in one batched call of `rows` identical rows: `law` [V] * L is the exact law of
    its first L tokens; `rejects(tokens [rows, L])` the chi-square verdicts (level 0.001) against it; `wrong`
    methods that break the law with a wrong acceptance rule (each must be rejected)."""

    resources: Resources
    inputs: Any
    prompts: list[list[int]] | None
    law: Tensor
    rejects: Callable[[Tensor], list[bool]]
    wrong: dict[str, Method]
    rows: int

    def sample(self, method: Method, seed: int = 1234) -> Tensor:
        out = method.run(self.resources, self.inputs, max_new_tokens=self.law.dim(), sampling=Sampling(temperature=1.0),
                         seed=seed, prompt_tokens=self.prompts)
        return torch.tensor(out.tokens)


def trigram_law_bench(rows: int) -> LawBench:
    """The text family's toy: a trigram target over tests/core/test_speculative.py's 6-token vocabulary,
    its law of 3 tokens from that module's `exact_triple_law`, judged on the whole triple and on the pairs
    (x0, x1), (x1, x2) (`pair_tests`, whose cells all expect >= 8 draws from 2000 rows)."""
    from mmaccel.core.jacobi import JacobiProposer
    from mmaccel.core.proposers import DraftModelProposer
    from tests.core.test_speculative import VOCAB, chi2_rejects, exact_triple_law, pair_tests

    resources = toy_resources(VOCAB, sharpness=0.5)
    prompt = [1, 2, 3]
    law = exact_triple_law(resources.model, prompt)

    def rejects(tokens: Tensor) -> list[bool]:
        return [chi2_rejects(codes(tokens, VOCAB), law), *pair_tests(tokens, law)]

    wrong = {"draft-model": Method("accept-every-draft", "draft model, k=2, every draft kept",
                                   lambda r: DraftModelProposer(r.draft), accept_every_draft, k=2),
             "jacobi": Method("accept-every-draft", "Jacobi window 3, every draft kept",
                              lambda r: JacobiProposer(3, "sample", "repeat"), accept_every_draft, k=3)}
    return LawBench(resources, [prompt] * rows, [prompt] * rows, law, rejects, wrong, rows)


def gpt_law_bench(rows: int) -> LawBench:
    """The image family's toy: tests/image/test_sjd2.py's tiny LlamaGen GPT (3 token ids, a 2 x 2 grid) and its
    teacher-forced law of the 4 tokens of class 3 (`exact_law`), judged on the whole sequence."""
    from mmaccel.core.jacobi import JacobiProposer
    from mmaccel.image.sjd2 import embedding_scale
    from tests.core.test_speculative import chi2_rejects
    from tests.image.test_sjd2 import exact_law, tiny_gpt

    model = tiny_gpt(3, 2, torch.float32, spread=0.15)
    law = exact_law(model, 3, 4).reshape([3] * 4)
    resources = Resources(model=model, extras={"embeddings": model.tok_embeddings.weight,
                                               "embedding_scale": embedding_scale(model), "row_stride": 2})
    wrong = {"jacobi": Method("accept-every-draft", "Jacobi window 3, every draft kept",
                              lambda r: JacobiProposer(3, "sample", "repeat"), accept_every_draft, k=3)}
    return LawBench(resources, [3] * rows, None, law, lambda tokens: [chi2_rejects(codes(tokens, 3), law)], wrong, rows)
