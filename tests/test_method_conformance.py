"""Conformance generated from the method registries: a method added to a family's registry gets these cases
with no test edit (the benches and toys they run on are in tests/conformance.py).

(a) Exactness. Every greedy-exact or law-exact method gives plain greedy decoding's tokens at temperature 0
    (the family's baseline: `ar`, or `greedy` for speech), on a batch of one and on a ragged batch, with the
    resources its family's pipeline supplies: text on the text pipeline's tiny Llama (its own copy as draft;
    prompts of 3, 5 and 8 tokens, an end token that ends the rows at different lengths), image on the shipped
    Fashion-MNIST GPT with its drafter under CFG (image rows have no end token: the ragged batch is three
    classes whose rows accept different numbers of drafts per pass), speech on the shipped Whisper tiny.en
    (LibriVox clips of 12 and 11 tokens, each row ending at its own <|endoftext|>) and, marked slow,
    Whisper base with its shipped heads and draft decoder and tiny.en as assistant. A method whose needs a
    bench does not supply is skipped, the need named in its id.
(b) Law. Every law-exact method samples the target's law: one seeded batched call of many identical rows on a
    toy target whose exact law is known, chi-square on the first tokens' joint law (level 0.001); a wrong
    acceptance rule (every draft kept) with the same drafters must fail the same check, so the check has the
    power to see a broken rule. Text uses a trigram toy (tests.conformance.TrigramLM), image a tiny LlamaGen
    GPT (SJD2 needs a model that reads input embeddings). The law is a property of a plug-in's `build`, so a
    build registered in several families (the core methods) is sampled once, on the first family's toy that
    supplies its needs; the speech pipeline decodes greedily only, so it has no toy.
(c) Host reads. On the emulated CUDA device (tests/emulated_cuda.py) every method of a benched family reads
    back to the host at most `MethodPlugin.host_reads` times per call, no more on a longer call (4 and 8
    tokens; images 4 x 4 and 5 x 5, as ZipAR decodes square grids) that runs more passes; a method declared to
    read per pass (host_reads=None) must read more on the longer call, so that the declaration changes when its
    reads are removed. The benches are tiny random models of the families' own adapter classes (text: the tiny
    Llama; image: a 2-layer GPT with drafter and VQ; speech: the speech tests' tiny Whisper with random heads,
    block, EAGLE head and draft), since the emulated device costs per op, not per FLOP; image at temperature 1
    (the image pipeline's default), text and speech greedily (theirs). A plug-in registered in several families
    is measured once, on the first family's bench that supplies its needs; every case also runs its family's
    model adapter, whose reads are part of the count.

Families whose methods are not token decoders checked against a plain greedy baseline are excluded by a
per-family table (EXCLUDED, with the reason in each skipped case's id), not by exactness: next-scale and
continuous-token images, CTC and Whisfusion have their own baselines and loops; video answers run the core's
methods on a stream's live cache, whose bench would need a streaming VLM fixture (the core plug-ins it
registers are checked through the text family). A family in neither table fails
`test_every_family_is_benched_or_excluded`.
"""

from __future__ import annotations

import pytest
import torch

from mmaccel.core.methods import build_method
from mmaccel.core.plugin import EXACT, NEEDS
from mmaccel.core.sampling import Sampling
from mmaccel.errors import ModelNotFoundError
from mmaccel.registries import FAMILIES, method_registry
from tests.conformance import (
    LIBRIVOX,
    Bench,
    gpt_law_bench,
    load_image,
    load_speech,
    load_text,
    load_tiny_speech,
    supplied,
    tiny_image_pipeline,
    tiny_speech_pipeline,
    trigram_law_bench,
)
from tests.emulated_cuda import emulated_cuda

IMAGE_SUPPLIES = frozenset({"draft", "latents", "embeddings", "embedding_scale"})
SPEECH_BASE_SUPPLIES = frozenset({"draft", "heads", "exit_heads", "medusa_block", "eagle", "assistant"})

EXACTNESS_BENCHES = {
    "text": [Bench("text", "tiny-llama", frozenset({"draft"}), "text_bench")],
    "image": [Bench("image", "fashion-mnist", IMAGE_SUPPLIES, "image_bench")],
    "speech": [Bench("speech", "tiny.en", frozenset({"eagle"}), "speech_tiny_en_bench", baseline="greedy"),
               Bench("speech", "base", SPEECH_BASE_SUPPLIES, "speech_base_bench", baseline="greedy", slow=True),
               # Whisper's timestamp mode: its rules apply to every pass (tree passes too)
               Bench("speech", "tiny-random-timestamps", SPEECH_BASE_SUPPLIES - {"assistant"},
                     "speech_timestamps_bench", baseline="greedy"),
               Bench("speech", "tiny.en-timestamps", frozenset({"eagle"}), "speech_tiny_en_timestamps_bench",
                     baseline="greedy"),
               Bench("speech", "base-timestamps", SPEECH_BASE_SUPPLIES, "speech_base_timestamps_bench",
                     baseline="greedy", slow=True),
               # int8 decoders: greedy-identical by construction (exact products, attention in one kernel shape)
               Bench("speech", "tiny-random-int8-timestamps", SPEECH_BASE_SUPPLIES - {"assistant"},
                     "speech_int8_timestamps_bench", baseline="greedy"),
               Bench("speech", "tiny.en-int8", frozenset({"eagle"}), "speech_tiny_en_int8_bench", baseline="greedy"),
               Bench("speech", "base-int8-timestamps", SPEECH_BASE_SUPPLIES, "speech_base_int8_timestamps_bench",
                     baseline="greedy", slow=True)],
}
LAW_BENCHES = {
    "text": Bench("text", "trigram-toy", frozenset({"draft", "heads"}), "text_law"),
    "image": Bench("image", "tiny-gpt", frozenset({"embeddings", "embedding_scale"}), "image_law"),
}
NO_LAW = {"speech": "the speech pipeline decodes greedily only (transcribe takes no temperature)"}
DEVICE_BENCHES = {
    "text": Bench("text", "tiny-llama", frozenset({"draft"}), "text_device"),
    "image": Bench("image", "tiny-gpt", IMAGE_SUPPLIES, "image_device"),
    "speech": Bench("speech", "tiny-whisper", frozenset({"draft", "heads", "exit_heads", "medusa_block", "eagle"}),
                    "speech_device", baseline="greedy"),
}
EXCLUDED = {   # family -> (what its skipped cases' ids say, why)
    "image-scale": ("next-scale", "next-scale decoding: a scale of tokens per pass, with its own baseline and loop"),
    "image-continuous": ("continuous-tokens", "continuous tokens drawn by a diffusion head: no discrete greedy baseline"),
    "ctc": ("ctc-frames", "CTC decoding: greedy is its own baseline (frame-wise arg-max), no autoregressive tokens"),
    "whisfusion": ("non-autoregressive", "a non-autoregressive diffusion decoder with its own loop"),
    "video": ("no-stream-bench", "answers decode over a stream's live cache and no streaming-VLM bench exists yet "
                                 "(its core plug-ins are checked through the text family)"),
}
# (b): rows per sampled call: every cell of the trigram toy's pair laws and of the GPT's law expects >= 1 draw (most >= 5)
ROWS = {"text": 2000, "image": 2000}


def _excluded(family: str, name: str, check: str) -> pytest.param:
    slug, why = EXCLUDED[family]
    return pytest.param(None, name, id=f"{family}-{name}-excluded-{slug}",
                        marks=pytest.mark.skip(reason=f"{family} is excluded from the {check} check: {why}"))


def _case(bench: Bench, name: str) -> pytest.param:
    plugin = method_registry(bench.family)[name]
    reason = bench.skip_reason(plugin)
    marks = [pytest.mark.slow] if bench.slow else []
    if reason is not None:
        return pytest.param(bench, name, id=f"{bench.family}-{name}-on-{bench.label}-skipped-needs-"
                            f"{'+'.join(bench.missing(plugin))}", marks=[*marks, pytest.mark.skip(reason=reason)])
    return pytest.param(bench, name, id=f"{bench.family}-{name}-on-{bench.label}", marks=marks)


def exactness_cases() -> list:
    cases = []
    for family in FAMILIES:
        for name, plugin in method_registry(family).items():
            if plugin.exactness not in EXACT:
                continue                 # relaxed and another-model methods promise no greedy equality
            if family in EXCLUDED:
                cases.append(_excluded(family, name, "exactness"))
            cases += [_case(bench, name) for bench in EXACTNESS_BENCHES.get(family, [])]
    return cases


def law_cases() -> list:
    """One case per law-exact build: on the first family's toy (FAMILIES order) that supplies its needs."""
    cases, seen = [], {}
    for family in FAMILIES:
        for name, plugin in method_registry(family).items():
            if plugin.exactness == "law-exact":
                seen.setdefault(plugin.build, []).append((family, name, plugin))
    for places in seen.values():
        runnable = [(f, n) for f, n, p in places if f in LAW_BENCHES and not LAW_BENCHES[f].missing(p)]
        if runnable:
            cases.append(_case(LAW_BENCHES[runnable[0][0]], runnable[0][1]))
            continue
        family, name, plugin = places[0]
        if family in EXCLUDED:
            cases.append(_excluded(family, name, "law"))
        elif family in LAW_BENCHES:
            cases.append(_case(LAW_BENCHES[family], name))
        else:
            reason = NO_LAW.get(family, f"family {family} has no law toy")
            cases.append(pytest.param(None, name, id=f"{family}-{name}-no-law-toy", marks=pytest.mark.skip(reason=reason)))
    return cases


def device_cases() -> list:
    """One case per plug-in: on the first family's device bench (FAMILIES order) that supplies its needs (the
    text bench is the cheapest); the reads of every family's model adapter are in each of its cases."""
    cases, places = [], {}
    for family in FAMILIES:
        for name, plugin in method_registry(family).items():
            places.setdefault(id(plugin), []).append((family, name, plugin))
    for where in places.values():
        runnable = [(f, n) for f, n, p in where if f in DEVICE_BENCHES and not DEVICE_BENCHES[f].missing(p)]
        if runnable:
            cases.append(_case(DEVICE_BENCHES[runnable[0][0]], runnable[0][1]))
            continue
        family, name, _ = where[0]
        benched = [(f, n) for f, n, _ in where if f in DEVICE_BENCHES]
        cases.append(_case(DEVICE_BENCHES[benched[0][0]], benched[0][1]) if benched else _excluded(family, name, "host-read"))
    return cases


def test_every_family_is_benched_or_excluded():
    benched = set(EXACTNESS_BENCHES) | set(LAW_BENCHES) | set(DEVICE_BENCHES)
    missing = [f for f in FAMILIES if f not in benched and f not in EXCLUDED]
    assert not missing, (f"families {missing} have no conformance bench: add one to tests/test_method_conformance.py "
                         "(EXACTNESS_BENCHES, LAW_BENCHES, DEVICE_BENCHES) or list them in EXCLUDED with the reason")
    assert not set(EXCLUDED) & benched
    assert all(set(b.supplies) <= set(NEEDS) for table in (EXACTNESS_BENCHES, LAW_BENCHES, DEVICE_BENCHES)
               for bs in table.values() for b in (bs if isinstance(bs, list) else [bs]))


# --- fixtures: one loaded bench each ----------------------------------------------------------------------------

def _declared(bench: Bench, resources) -> None:
    """A bench's declared supplies (which name the skipped cases) are what its loaded resources hold."""
    have = supplied(resources)
    assert have == bench.supplies, (f"the {bench.family} bench {bench.label} supplies {sorted(have)} but declares "
                                    f"{sorted(bench.supplies)}: update its declaration in {__name__}")


@pytest.fixture(scope="module")
def text_bench(tiny_lm_dir):
    return load_text(tiny_lm_dir)


@pytest.fixture(scope="module")
def image_bench():
    from mmaccel.image.pipeline import ImagePipeline

    return load_image(ImagePipeline.from_pretrained())


def _librivox():
    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")


@pytest.fixture(scope="module")
def speech_tiny_en_bench(tiny_en_asr):
    _librivox()
    return load_speech(tiny_en_asr)


@pytest.fixture(scope="module")
def speech_tiny_en_timestamps_bench(tiny_en_asr):
    _librivox()
    return load_speech(tiny_en_asr, timestamps=True)


@pytest.fixture(scope="module")
def speech_timestamps_bench():
    from tests.speech.conftest import TIMED_VOCAB

    # drafts that read timestamp tokens (the shipped ones of base); tiny.en's read them as <|notimestamps|>
    return load_tiny_speech(tiny_speech_pipeline(vocab=TIMED_VOCAB, drafts_read_timestamps=True), timestamps=True)


@pytest.fixture(scope="module")
def speech_int8_timestamps_bench():
    from tests.speech.conftest import TIMED_VOCAB

    return load_tiny_speech(tiny_speech_pipeline(vocab=TIMED_VOCAB, drafts_read_timestamps=True, precision="int8"),
                            timestamps=True)


def _int8(asr):
    """`asr`'s model, heads, draft and assistant in an int8 pipeline."""
    from mmaccel.speech.pipeline import ASRPipeline

    int8 = ASRPipeline(asr.bundle, asr.heads, asr.draft, precision="int8")
    int8.assistant = asr.assistant
    return int8


@pytest.fixture(scope="module")
def speech_tiny_en_int8_bench(tiny_en_asr):
    _librivox()
    return load_speech(_int8(tiny_en_asr))


@pytest.fixture(scope="module")
def base_with_tiny_en():
    from mmaccel.speech.pipeline import ASRPipeline

    _librivox()
    try:
        return ASRPipeline.from_pretrained("builtin:base", assistant="builtin:tiny.en")
    except ModelNotFoundError as err:
        pytest.skip(f"Whisper base or tiny.en not installed: {err}")


@pytest.fixture(scope="module")
def speech_base_bench(base_with_tiny_en):
    return load_speech(base_with_tiny_en)


@pytest.fixture(scope="module")
def speech_base_timestamps_bench(base_with_tiny_en):
    return load_speech(base_with_tiny_en, timestamps=True)


@pytest.fixture(scope="module")
def speech_base_int8_timestamps_bench(base_with_tiny_en):
    return load_speech(_int8(base_with_tiny_en), timestamps=True)


# --- (a) exactness ----------------------------------------------------------------------------------------------

def _baseline(loaded, bench: Bench, batch: str):
    if batch not in loaded.references:
        loaded.references[batch] = loaded.run(build_method(bench.baseline, method_registry(bench.family)), batch)
    return loaded.references[batch]


@pytest.mark.parametrize("batch", ["one", "ragged"])
@pytest.mark.parametrize("bench, name", exactness_cases())
def test_exact_methods_give_plain_greedy_tokens(request, bench, name, batch):
    loaded = request.getfixturevalue(bench.fixture)
    method = build_method(name, method_registry(bench.family))
    _declared(bench, loaded.resources(method))
    base = _baseline(loaded, bench, batch)
    if batch == "ragged" and bench.family != "image":
        assert len({len(row) for row in base.tokens}) == len(base.tokens), "the ragged batch's rows end together"
    out = loaded.run(method, batch)
    assert out.tokens == base.tokens, f"{bench.family} {name} on {bench.label} differs from {bench.baseline}"


# --- (b) law ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def text_law():
    return trigram_law_bench(ROWS["text"])


@pytest.fixture(scope="module")
def image_law():
    return gpt_law_bench(ROWS["image"])


def test_the_trigram_toy_reads_each_tokens_predecessor_through_its_cache():
    """The toy's logits are its table at (previous token, token), where "previous" follows the cache: ragged
    prompts, rollback and a tree mask (siblings see their parent, not each other)."""
    model = trigram_law_bench(1).resources.model
    table, V = model.table, model.vocab_size
    state = model.prefill([[1, 2, 3], [4]], room=8)
    assert torch.equal(state.logits, torch.stack([table[2, 3], table[V, 4]]))
    assert torch.equal(model.step(state, torch.tensor([[5, 0], [1, 2]])),
                       torch.stack([torch.stack([table[3, 5], table[5, 0]]), torch.stack([table[4, 1], table[1, 2]])]))
    state.rollback(torch.tensor([1, 2]))                                # row 0 ends at 5, row 1 at 4
    siblings = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    out = model.step(state, torch.tensor([[2, 3, 4], [0, 1, 5]]), tree_mask=siblings)
    assert torch.equal(out[0], torch.stack([table[5, 2], table[2, 3], table[2, 4]]))
    assert torch.equal(out[1], torch.stack([table[4, 0], table[0, 1], table[0, 5]]))


@pytest.mark.parametrize("bench, name", law_cases())
def test_law_exact_methods_sample_the_target_law(request, bench, name):
    toy = request.getfixturevalue(bench.fixture)
    _declared(bench, toy.resources)
    tokens = toy.sample(build_method(name, method_registry(bench.family)))
    assert tokens.shape == (toy.rows, toy.law.dim())
    assert not any(toy.rejects(tokens)), f"{name} does not sample the target's law on the {bench.label}: {toy.rejects(tokens)}"


@pytest.mark.parametrize("bench", list(LAW_BENCHES.values()), ids=[b.label for b in LAW_BENCHES.values()])
def test_a_wrong_acceptance_rule_fails_the_law_check(request, bench):
    """The negative control: drafts kept whatever the target says. The check must reject it (all verdicts)."""
    toy = request.getfixturevalue(bench.fixture)
    for what, method in toy.wrong.items():
        assert all(toy.rejects(toy.sample(method))), f"the law check on the {bench.label} misses a broken rule ({what})"


# --- (c) host reads on the emulated CUDA device -----------------------------------------------------------------

def _warm(loaded, bench: Bench):
    """An unmeasured call first: first-use caches (rotary tables) are made once per process."""
    with emulated_cuda():
        loaded.run(build_method(bench.baseline, method_registry(bench.family)), "ragged", max_new_tokens=loaded.lengths[0])
    return loaded


@pytest.fixture(scope="module")
def text_device(tiny_lm_dir):
    with emulated_cuda():
        loaded = load_text(tiny_lm_dir, device="cuda")
    loaded.eos = {}                     # every row runs to the length measured
    return _warm(loaded, DEVICE_BENCHES["text"])


@pytest.fixture(scope="module")
def image_device():
    cpu = tiny_image_pipeline()
    with emulated_cuda():
        pipe = type(cpu)(cpu.model.to("cuda"), cpu.vq.to("cuda"), cpu.draft.to("cuda"))
        loaded = load_image(pipe, sampling=Sampling(temperature=1.0))
    return _warm(loaded, DEVICE_BENCHES["image"])


@pytest.fixture(scope="module")
def speech_device():
    with emulated_cuda():
        loaded = load_tiny_speech(tiny_speech_pipeline("cuda"))
    return _warm(loaded, DEVICE_BENCHES["speech"])


@pytest.mark.parametrize("bench, name", device_cases())
def test_host_reads_per_call_stay_within_the_declaration(request, bench, name):
    loaded = request.getfixturevalue(bench.fixture)
    plugin = method_registry(bench.family)[name]
    with emulated_cuda():
        _declared(bench, loaded.resources(build_method(name, method_registry(bench.family))))
    seen = []
    for n in loaded.lengths:
        with emulated_cuda() as report:
            out = loaded.run(build_method(name, method_registry(bench.family)), "ragged", max_new_tokens=n)
        seen.append((report.count(), out.stats.nfe, dict(report.kinds())))
    request.node.user_properties.append(("host_reads", [(n, *s) for n, s in zip(loaded.lengths, seen)]))
    (short, short_passes, _), (long, long_passes, _) = seen
    what = f"{name}: {short} reads in {short_passes} passes ({loaded.lengths[0]} tokens), {long} in {long_passes} " \
           f"({loaded.lengths[1]} tokens) {seen}"
    assert long_passes > short_passes, f"the longer call ran no more passes: {what}"
    if plugin.host_reads is None:
        assert long > short, (f"{name} declares host reads per pass ({plugin.host_reads_why}) but reads as often at "
                              f"both lengths: declare host_reads={max(short, long)}. {what}")
    else:
        assert long <= short, f"reads back per pass: {what}"
        assert max(short, long) <= plugin.host_reads, f"reads more than it declares ({plugin.host_reads}): {what}"
