"""`mmaccel bench ctc`: CTC decoders on the same log-probs of a CTC model, against greedy and the peers.

Audio: the 18 real clips (LibriVox, cards, ALSA) and the first `tts_utterances` held-out TTS
utterances (held-out sentences and voices) are the test set (`split="ood"`: the out-of-domain
utterances instead); the next `tts_utterances` of the same held-out split are the dev set, where
every setting is picked. The model runs once per batch
(not timed with the decoders; its RTFx is reported beside them); then every decoder reads the same
log-probs in the same batches (1 and 16), interleaved in one process:

- `greedy` (the baseline), our batched beam at 4 / 16 / 64, beam 16 with the n-gram LM, and with the LM
  and a boost list;
- pyctcdecode's beam 16 (no LM: its LM needs the `kenlm` module), torchaudio's flashlight lexicon-free
  beam 16 without and with the same ARPA LM (KenLM reading our file).

LM: a character n-gram (`order`, 6) estimated by our Kneser-Ney estimator from the train split's
sentences (never the held-out ones), cached as ARPA. Its weight and the insertion bonus are picked on
the dev set (beam 16), and the same values go to flashlight. Boost list: the test references' words
that never occur in the LM's text (an LM cannot know them; a user's list of names would be such words),
boosted with the weight picked on the dev set's own such words. Every row reports corpus WER, the
recall of those words, and the WER on the utterances that hold none of them (boosting must not cost
the rest). Throughput: utterances per decoder second. Early exit (models with exit heads): the
threshold for each encoder budget picked on the dev set, WER and encoder layers run on the test set.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import torch

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.core.methods import Resources
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.metrics.wer import corpus_wer, normalizer_version
from mmaccel.paths import default_cache_dir
from mmaccel.speech.ctc.arpa import write_arpa
from mmaccel.speech.ctc.beam import ctc_beam_search, ctc_greedy
from mmaccel.speech.ctc.boosting import phrase_table
from mmaccel.speech.ctc.kneser_ney import char_tokens, estimate_kneser_ney
from mmaccel.speech.ctc.lm import ngram_table
from mmaccel.speech.ctc.methods import CTC_REGISTRY, Posteriors, build_ctc_method
from mmaccel.speech.ctc.whisper_ctc import normalize_text

DEFAULT_METHODS = [
    MethodSpec("greedy"),
    MethodSpec("beam", {"beam": 4}, label="beam-4"),
    MethodSpec("beam", {"beam": 16}, label="beam-16"),
    MethodSpec("beam", {"beam": 16, "recombine": "sum"}, label="beam-16-sum"),
    MethodSpec("beam", {"beam": 64}, label="beam-64"),
    MethodSpec("beam", {"beam": 16, "lm": True}, label="beam-16+lm"),
    MethodSpec("beam", {"beam": 16, "lm": True, "boost": True}, label="beam-16+lm+boost"),
    MethodSpec("pyctcdecode", {"beam": 16}, label="pyctcdecode-16"),
    MethodSpec("flashlight", {"beam": 16}, label="flashlight-16"),
    MethodSpec("flashlight", {"beam": 16, "lm": True}, label="flashlight-16+lm"),
]
SUITE_PARAMS = ("lm", "boost")      # what the suite fuses (its dev-picked LM and boost list), not a method's parameters
PEERS = ("pyctcdecode", "flashlight")
FULL_TTS, QUICK_TTS = 100, 6
LM_WEIGHTS, BONUSES, BOOST_WEIGHTS = (0.2, 0.4, 0.7, 1.0), (0.0, 0.5, 1.5), (0.5, 1.0, 2.0)
EXIT_BUDGETS = (0.5, 0.75)


def char_lm_arpa(order: int, max_sentences: int | None = None) -> Path:
    """A character n-gram ARPA over the train split's sentences (normalised as the CTC targets), cached."""
    from mmaccel.speech.data import sentences

    path = default_cache_dir() / "speech" / "ctc_lm" / f"chars{order}_{max_sentences or 'all'}.arpa"
    if not path.is_file():
        lines = [normalize_text(s) for s in sentences("train")[:max_sentences]]
        write_arpa(estimate_kneser_ney([char_tokens(line) for line in lines if line], order, discounts="fallback"),
                   path)
    return path


def lm_words(max_sentences: int | None = None) -> set[str]:
    from mmaccel.speech.data import sentences

    return {w for s in sentences("train")[:max_sentences] for w in normalize_text(s).split()}


def _words(text: str) -> list[str]:
    return normalize_text(text).split()


def boost_list(references: list[str], known: set[str], vocab, limit: int = 40) -> list[str]:
    """The references' words the LM's text never holds and the labels can spell (longest first, at most `limit`)."""
    unknown = {w for r in references for w in _words(r)
               if w not in known and len(w) > 2 and all(ch in vocab.index for ch in w)}
    return sorted(unknown, key=lambda w: (-len(w), w))[:limit]


def boosted_recall(references: list[str], hypotheses: list[str], boosted: list[str]) -> float | None:
    """Share of the boosted words' occurrences in the references that the hypotheses hold (a word said
    twice in a reference needs two in the hypothesis)."""
    wanted = set(boosted)
    hits = total = 0
    for ref, hyp in zip(references, hypotheses):
        said = Counter(_words(hyp))
        for w, n in Counter(w for w in _words(ref) if w in wanted).items():
            total += n
            hits += min(n, said[w])
    return round(hits / total, 4) if total else None


def build_ctc_suite(quick: bool = False, methods: list[MethodSpec] | None = None, model: str = "builtin:ctc-base",
                    tts_utterances: int | None = None, order: int | None = None, split: str = "in-domain") -> Suite:
    from mmaccel.speech.ctc.peers import flashlight_beam, pyctcdecode_beam
    from mmaccel.speech.ctc.pipeline import CTCPipeline

    methods = checked_methods(methods)
    pipe = CTCPipeline.from_pretrained(model)
    ctc, vocab, step = pipe.model, pipe.vocab, pipe.model.frame_seconds
    test, dev, real, tts = held_out_sets(quick, tts_utterances, split)
    order = order or (4 if quick else 6)
    sentences_cap = 300 if quick else None
    arpa = char_lm_arpa(order, sentences_cap)
    t0 = time.perf_counter()
    lm = ngram_table(arpa, vocab)
    lm_build_s = time.perf_counter() - t0
    known = lm_words(sentences_cap)
    posteriors = SharedPosteriors(ctc)
    lm_weight, bonus, boost_weight, tried, boost_tried = pick_settings(posteriors, dev, lm, known, vocab, step)

    refs = [t for _, _, t in test]
    boosted = boost_list(refs, known, vocab)
    boost = phrase_table(boosted, vocab) if boosted else None
    plain = [i for i, r in enumerate(refs) if not set(_words(r)) & set(boosted)]
    sizes = (1, 16, 64)
    batches = {b: [test[i:i + b] for i in range(0, len(test), b)] for b in sizes}

    def run_batch(spec: MethodSpec, items: list, seed: int) -> tuple[list, DecodeStats]:
        lp, lengths = posteriors(items)
        beam = spec.params.get("beam", 16)
        use_lm, use_boost = spec.params.get("lm", False), spec.params.get("boost", False)
        t = time.perf_counter()
        if spec.name in CTC_REGISTRY:
            fusion = ([(lm, lm_weight)] if use_lm else []) + ([(boost, boost_weight)] if use_boost and boost else [])
            resources = Resources(ctc, extras={"fusion": fusion, "insertion_bonus": bonus if use_lm else 0.0})
            out = build_ctc_method(spec.name, **method_params(spec)).runner(resources, Posteriors(lp, lengths, step))
        elif spec.name == "pyctcdecode":
            out = pyctcdecode_beam(lp, vocab, lengths, beam=beam, frame_seconds=step)
        else:
            out = flashlight_beam(lp, vocab, lengths, beam=beam, lm=arpa if use_lm else None, lm_weight=lm_weight,
                                  insertion_bonus=bonus if use_lm else 0.0, frame_seconds=step)
        seconds = time.perf_counter() - t
        stats = DecodeStats(nfe=len(items), new_tokens=sum(len(h.text) for h in out), time_s={"total": seconds})
        return [h.text for h in out], stats

    def quality(spec: MethodSpec, outputs: list, baseline: list) -> dict:
        n = len(outputs)
        return {"wer": round(100 * corpus_wer(refs[:n], outputs).wer, 2),
                "wer_unboosted": round(100 * corpus_wer([refs[i] for i in plain if i < n],
                                                        [outputs[i] for i in plain if i < n]).wer, 2),
                "boosted_recall": boosted_recall(refs[:n], outputs, boosted)}

    def finish(doc: dict) -> None:
        peer = {r["batch"]: r for r in doc["results"] if r["method"] == "pyctcdecode-16"}
        for r in doc["results"]:
            r["quality"]["utt_per_s"] = round(len(test) / r["latency_s"], 1) if r["latency_s"] else None
            if r["batch"] in peer and r["latency_s"]:
                r["quality"]["vs_pyctcdecode_16"] = round(peer[r["batch"]]["latency_s"] / r["latency_s"], 2)
        doc["model_rtfx"] = round(posteriors.audio / max(1e-9, posteriors.seconds), 2)
        doc["settings"] = {"lm_weight": lm_weight, "insertion_bonus": bonus, "boost_weight": boost_weight,
                           "dev_lm_wer": {k: v[0] for k, v in tried.items()},
                           "dev_boost_wer": {k: v[0] for k, v in boost_tried.items()},
                           "boosted_words": boosted, "lm_table_build_s": round(lm_build_s, 2)}
        if hasattr(ctc, "transcribe_early_exit"):
            doc["early_exit"] = early_exit_study(ctc, dev, test, refs, vocab)

    audio = f"{real} real clips + {tts} held-out TTS utterances" if split == "in-domain" else \
        f"{len(test)} out-of-domain utterances (licence sentences, unseen voices, half under noise)"
    config = {"model": model, "split": split, "audio": f"{audio} (dev: {len(dev)} in-domain held-out TTS utterances)",
              "batching": "utterances in order of duration (a sorted manifest)",
              "audio_s": round(sum(a.duration for _, a, _ in test), 1), "utterances": len(test),
              "batch_sizes": list(sizes), "wer": f"corpus WER, {normalizer_version()}",
              "lm": f"character {order}-gram, Kneser-Ney (ours) on the train split's sentences ({arpa.name})",
              "threads": torch.get_num_threads(), "quick": quick}
    return Suite("ctc", config, methods, batches, run_batch, quality, lambda spec: spec.name == "greedy",
                 verify_identical=False, primary_quality="wer", warmup=lambda spec: run_batch(spec, test[:1], 0),
                 finish=finish, artifacts=append_markdown)


def checked_methods(methods: list[MethodSpec] | None) -> list[MethodSpec]:
    """`methods` (default `DEFAULT_METHODS`) with greedy, the baseline, first; our methods' parameters
    are checked here, before anything runs."""
    methods = methods or DEFAULT_METHODS
    if methods[0].name != "greedy":
        methods = [MethodSpec("greedy")] + [m for m in methods if m.name not in ("greedy", "ar")]
    for spec in methods:
        check(spec.name in CTC_REGISTRY or spec.name in PEERS, f"unknown CTC decoder {spec.name!r}; choose from "
              f"{', '.join([*CTC_REGISTRY, *PEERS])}")
        if spec.name in CTC_REGISTRY:
            build_ctc_method(spec.name, **method_params(spec))
    return methods


def held_out_sets(quick: bool, tts_utterances: int | None, split: str) -> tuple[list, list, int, int]:
    """(test, dev, real clips, TTS utterances per set): the real clips and the first held-out TTS utterances
    are the test set (the out-of-domain utterances when `split` says so), sorted by duration as batched CTC
    decoders run (a batch's frame loop is as long as its longest row); the next ones are the dev set."""
    from mmaccel.bench.asr_suite import OOD_UTTERANCES, load_corpus

    tts = tts_utterances if tts_utterances is not None else (QUICK_TTS if quick else FULL_TTS)
    everything = load_corpus(2 * tts)
    real = len(everything) - 2 * tts
    test, dev = everything[: real + tts], everything[real + tts:]
    if split != "in-domain":         # settings are still picked on the in-domain dev set
        test = load_corpus(OOD_UTTERANCES if tts_utterances is None and not quick else tts, split)
    return sorted(test, key=lambda item: item[1].duration), dev, real, tts


class SharedPosteriors:
    """The CTC model's log-probs of a batch, computed once and read by every decoder; `seconds` and
    `audio` sum the model's time and the audio's length (for its RTFx)."""

    def __init__(self, ctc):
        self.ctc, self.cache, self.seconds, self.audio = ctc, {}, 0.0, 0.0

    def __call__(self, items) -> tuple:
        key = tuple(i for i, _, _ in items)
        if key not in self.cache:
            t = time.perf_counter()
            self.cache[key] = self.ctc.log_probs([a for _, a, _ in items])
            self.seconds += time.perf_counter() - t
            self.audio += sum(a.duration for _, a, _ in items)
        return self.cache[key]


def pick_settings(posteriors: SharedPosteriors, dev: list, lm, known: set[str], vocab, step: float) -> tuple:
    """The LM weight and insertion bonus, then the boost weight (for the dev set's own unknown words), with
    the lowest dev WER at beam 16 -> (lm_weight, bonus, boost_weight, {setting: (WER, ...)} of each search)."""

    def decode(items, beam: int, fusion, bonus: float) -> list[str]:
        lp, lengths = posteriors(items)
        return [h.text for h in ctc_beam_search(lp, vocab, lengths, beam=beam, fusion=fusion, insertion_bonus=bonus,
                                                frame_seconds=step)]

    dev_batches = [dev[i:i + 16] for i in range(0, len(dev), 16)]
    dev_refs = [t for _, _, t in dev]
    tried = {}
    for weight in LM_WEIGHTS:
        for bonus in BONUSES:
            hyps = [h for b in dev_batches for h in decode(b, 16, [(lm, weight)], bonus)]
            tried[f"lm_weight={weight}, bonus={bonus}"] = (round(100 * corpus_wer(dev_refs, hyps).wer, 2), weight, bonus)
    _, lm_weight, bonus = min(tried.values())
    dev_boost = boost_list(dev_refs, known, vocab)
    boost_tried = {}
    for weight in BOOST_WEIGHTS:
        table = phrase_table(dev_boost, vocab) if dev_boost else None
        fusion = [(lm, lm_weight)] + ([(table, weight)] if table is not None else [])
        hyps = [h for b in dev_batches for h in decode(b, 16, fusion, bonus)]
        boost_tried[str(weight)] = (round(100 * corpus_wer(dev_refs, hyps).wer, 2), weight)
    _, boost_weight = min(boost_tried.values())
    return lm_weight, bonus, boost_weight, tried, boost_tried


def method_params(spec: MethodSpec) -> dict:
    """The parameters of `spec` that are its CTC method's (without the suite's)."""
    return {k: v for k, v in spec.params.items() if k not in SUITE_PARAMS}


def early_exit_study(ctc, dev: list, test: list, refs: list[str], vocab) -> dict:
    """Per encoder budget: the entropy threshold picked on dev (`pick_threshold`), then on test the
    greedy WER, the encoder layers run (fraction) and the model seconds, against the full model."""
    from mmaccel.speech.ctc.early_exit import encoder_cost, pick_threshold

    def batches(items):
        return [items[i:i + 16] for i in range(0, len(items), 16)]

    out = {}
    t = time.perf_counter()
    full = []
    for b in batches(test):
        log_probs, lengths = ctc.log_probs([a for _, a, _ in b])
        full += [h.text for h in ctc_greedy(log_probs, vocab, lengths)]
    out["full"] = {"wer": round(100 * corpus_wer(refs, full).wer, 2), "encoder_cost": 1.0,
                   "model_s": round(time.perf_counter() - t, 3)}
    by_layer: dict[int, list] = {}
    for b in batches(dev):
        for k, pair in ctc.log_probs_all([a for _, a, _ in b]).items():
            by_layer.setdefault(k, []).append(pair)
    stacked = {k: _stack(v) for k, v in by_layer.items()}
    lengths = next(iter(stacked.values()))[1]
    for budget in EXIT_BUDGETS:
        threshold = pick_threshold({k: v[0] for k, v in stacked.items()}, lengths, ctc.num_layers, budget)
        t = time.perf_counter()
        texts, layers = [], []
        for b in batches(test):
            r = ctc.transcribe_early_exit([a for _, a, _ in b], "entropy", threshold)
            texts += [h.text for h in ctc_greedy(r.log_probs, vocab, r.lengths)]
            layers += r.layers.tolist()
        out[f"budget {budget}"] = {"threshold": round(float(threshold), 4),
                                   "wer": round(100 * corpus_wer(refs, texts).wer, 2),
                                   "encoder_cost": round(encoder_cost(layers, ctc.num_layers), 3),
                                   "model_s": round(time.perf_counter() - t, 3)}
    return out


def _stack(rows: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Batches of (log_probs [b, T_i, V], lengths [b]) as one padded batch."""
    T = max(lp.shape[1] for lp, _ in rows)
    lps = [torch.nn.functional.pad(lp, (0, 0, 0, T - lp.shape[1])) for lp, _ in rows]
    return torch.cat(lps), torch.cat([n for _, n in rows])


def extra_markdown(doc: dict) -> str:
    """The dev-picked settings and the early-exit table of a CTC result document."""
    settings = doc["settings"]
    lines = ["#### Settings picked on the dev set (beam 16)", "",
             f"LM weight {settings['lm_weight']}, insertion bonus {settings['insertion_bonus']} (dev WER per setting: "
             f"{json.dumps(settings['dev_lm_wer'])}); boost weight {settings['boost_weight']} (dev WER: "
             f"{json.dumps(settings['dev_boost_wer'])}). Boosted words (test references' words the LM's text never "
             f"holds): {len(settings['boosted_words'])}. Dense LM table built in {settings['lm_table_build_s']} s. "
             f"Model RTFx (encoder + heads, batches of the table): {doc['model_rtfx']}.", ""]
    if "early_exit" in doc:
        lines += ["#### Encoder early exit (entropy threshold picked on dev per budget; greedy WER on test)", "",
                  "| setting | threshold | WER | encoder cost (share of layers) | encoder saved | model s |",
                  "|---|---|---|---|---|---|"]
        for name, row in doc["early_exit"].items():
            lines.append(f"| {name} | {row.get('threshold', '–')} | {row['wer']} | {row['encoder_cost']} | "
                         f"{round(100 * (1 - row['encoder_cost']), 1)} % | {row['model_s']} |")
    return "\n".join(lines) + "\n"


def append_markdown(out: Path) -> list[Path]:
    """`extra_markdown`, appended to the suite's Markdown beside `out`."""
    md = Path(out).with_suffix(".md")
    md.write_text(md.read_text() + "\n" + extra_markdown(json.loads(Path(out).read_text())))
    return [md]
