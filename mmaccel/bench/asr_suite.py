"""`mmaccel bench asr`: speech decoding methods against greedy on a real Whisper, plus peers.

Audio: the 18 real clips (LibriVox, cards, ALSA) and the first `tts_utterances` of the held-out
TTS evaluation split (held-out sentences and voices; built on first use). Every method transcribes
the same utterances in the same batches (1 and 8), interleaved in one process; audio is decoded to
memory before timing. Per method:

- decoder passes per generated token (nfe / new tokens; greedy = 1.0 at batch 1) and mean accepted length;
- RTFx (Σ audio s / Σ transcription s; feature extraction + encoder + decoding, warm-up excluded) and
  the end-to-end speed-up over greedy (`speedup`), the decoder-only speed-up (`decoder_speedup`:
  the encoder costs the same for every method) and the token-generation speed-up
  (`generation_speedup`: decoder time minus the target's prefill, i.e. the prompt pass and the
  cross-attention keys/values of the audio, which also cost the same for every method);
- corpus WER after the Whisper English normaliser, and the share of transcripts identical to greedy;
- for early exit (`calm`), the average number of decoder layers run per token.

Peers on the same weights and audio: Hugging Face `generate` (greedy, the model's own suppression
rules, encoder timed separately), HF assisted generation with our draft decoder as the assistant
(batch 1 only in HF: a batch runs row by row) and faster-whisper / CTranslate2 on the original `model.bin`
(int8 and float32, greedy, no VAD, no timestamps; batch 8 through its BatchedInferencePipeline),
run and timed in a child process: a CTranslate2 model loaded here would slow every torch method of
this process by ~1.6x (`FasterWhisperProcess`).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.core.stats import DecodeStats, track_peak_memory
from mmaccel.engine.machine import fast_bf16_matmul
from mmaccel.errors import InputError, check
from mmaccel.metrics.wer import corpus_wer, normalizer_version
from mmaccel.paths import default_cache_dir
from mmaccel.speech.audio import Audio, load_audio, log_mel
from mmaccel.speech.methods import build_asr_method
from mmaccel.speech.pipeline import MAX_NEW_TOKENS

PEERS = ("hf-generate", "hf-assisted", "faster-whisper")
DEFAULT_METHODS = [
    MethodSpec("greedy"),
    MethodSpec("medusa", {"depth": 1, "width": 1}, label="medusa-1"),
    MethodSpec("medusa-block", {"depth": 2, "width": 1}, label="medusa-block-2"),
    MethodSpec("early-exit", {"k": 2, "exit_layer": 5}, label="early-exit-k2"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0}, label="eagle-k4"),
    MethodSpec("eagle", {"k": 8, "stop_below": 0.5}, label="eagle-k8-s0.5"),
    MethodSpec("calm", {"threshold": 0.9}, label="calm-0.9"),
    MethodSpec("speculative", {"k": 3}, label="speculative-k3"),
    MethodSpec("speculative", {"k": 4}, label="speculative-k4"),
    MethodSpec("speculative", {"k": 4, "stop_below": 0.8}, label="speculative-k4-s0.8"),
    MethodSpec("speculative", {"k": 8, "stop_below": 0.8}, label="speculative-k8-s0.8"),
    MethodSpec("speculative", {"k": 8, "stop_below": 0.8, "siblings": 2}, label="speculative-k8-s0.8-sib2"),
    MethodSpec("tree", {"depth": 3, "width": 2}, label="tree-d3w2"),
    MethodSpec("beam", {"num_beams": 5}),
    # cheaper encoders (not lossless against the fp32 model: their WER is the price), the decoder
    # methods on top checked against greedy on the same encoder states
    MethodSpec("greedy", {"encoder": "bf16"}, label="greedy-enc-bf16"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0, "encoder": "bf16"}, label="eagle-k4-enc-bf16"),
    MethodSpec("greedy", {"encoder": "int8"}, label="greedy-enc-int8"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0, "encoder": "int8"}, label="eagle-k4-enc-int8"),
    # the whole model in int8 (the engine's precision: encoder and decoder, a scale per weight row and per token),
    # its methods compared with greedy at the same precision (identical_to_greedy_same_precision)
    MethodSpec("greedy", {"precision": "int8"}, label="greedy-int8"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0, "precision": "int8"}, label="eagle-k4-int8"),
    MethodSpec("hf-generate"),
    MethodSpec("hf-assisted"),
    MethodSpec("faster-whisper", {"compute_type": "int8"}, label="faster-whisper-int8"),
    MethodSpec("faster-whisper", {"compute_type": "float32"}, label="faster-whisper-fp32"),
]
FULL_TTS, QUICK_TTS = 60, 6
# with the product's features on (`--timestamps`, `--vad`): the lossless methods that gain most, against
# faster-whisper with the same features
FEATURE_METHODS = [
    MethodSpec("greedy"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0}, label="eagle-k4"),
    MethodSpec("speculative", {"k": 4}, label="speculative-k4"),
    MethodSpec("greedy", {"precision": "int8"}, label="greedy-int8"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0, "precision": "int8"}, label="eagle-k4-int8"),
    MethodSpec("speculative", {"k": 4, "precision": "int8"}, label="speculative-k4-int8"),
    MethodSpec("faster-whisper", {"compute_type": "int8"}, label="faster-whisper-int8"),
    MethodSpec("faster-whisper", {"compute_type": "float32"}, label="faster-whisper-fp32"),
]
# ... and at "auto", each part as fast as it measured here (the encoder compiled in int8 where the CPU has int8
# dot-product units, else in bf16 where bf16 is native, else fp32; the decoder in int8): faster-whisper int8 runs a
# cheaper encoder too, and each utterance is a padded 30-s window, so the encoder is over half of the time whatever
# the decoder does
AUTO_FEATURE_METHODS = [
    MethodSpec("greedy", {"precision": "auto"}, label="greedy-auto"),
    MethodSpec("eagle", {"k": 4, "stop_below": 0.0, "precision": "auto"}, label="eagle-k4-auto"),
    MethodSpec("speculative", {"k": 4, "precision": "auto"}, label="speculative-k4-auto"),
]
TIMESTAMPS = ("segments", "words")


SPLITS = ("in-domain", "ood")
OOD_UTTERANCES = 48


def load_corpus(tts_utterances: int, split: str = "in-domain") -> list[tuple[str, Audio, str]]:
    """(id, audio, reference): in-domain, the real clips and the first `tts_utterances` TTS eval
    utterances; "ood", the first `tts_utterances` of the out-of-domain split (`build_ood_corpus`:
    licence sentences, unseen voices, half under noise)."""
    from mmaccel.speech.data import build_ood_corpus, build_tts_corpus, read_manifest, real_utterances

    check(split in SPLITS, f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    if split == "ood":
        root = default_cache_dir() / "speech" / "tts"
        manifest = root / "ood.jsonl"
        if not manifest.is_file():
            build_ood_corpus(root, OOD_UTTERANCES)
        return [(u.id, load_audio(u.audio_filepath), u.text) for u in read_manifest(manifest)[:tts_utterances]]
    utts = real_utterances()
    if tts_utterances:
        root = default_cache_dir() / "speech" / "tts"
        manifest = root / "eval.jsonl"
        if not manifest.is_file():
            build_tts_corpus(root, "eval")
        utts += read_manifest(manifest)[:tts_utterances]
    return [(u.id, load_audio(u.audio_filepath), u.text) for u in utts]


def build_asr_suite(quick: bool = False, methods: list[MethodSpec] | None = None, model: str = "builtin:base",
                    tts_utterances: int | None = None, pipeline=None, heads: str = "auto", draft: str = "auto",
                    device: str | None = None, cuda_graphs: bool = False, split: str = "in-domain",
                    timestamps: str | None = None, vad: bool = False) -> Suite:
    """`heads` / `draft`: as `mmaccel asr transcribe` takes them ("auto", "none", or files; heads comma-separated).
    `split`: "in-domain" (the real clips and held-out TTS utterances) or "ood" (`load_corpus`).
    `timestamps` ("segments" or "words") and `vad`: every method (faster-whisper too) decodes with these
    features on; the default methods are then `FEATURE_METHODS` and `AUTO_FEATURE_METHODS`."""
    from mmaccel.speech.pipeline import ASRPipeline, draft_option, heads_option

    check(timestamps in (None, *TIMESTAMPS), f"timestamps must be one of {TIMESTAMPS}, got {timestamps!r}")
    features = {"timestamps": timestamps is not None, "word_timestamps": timestamps == "words", "vad_filter": vad}
    featured = timestamps is not None or vad
    if methods and featured:
        # a method given as one of the feature presets is named as its row (the Whisper page's tables read them)
        presets = {(m.name, tuple(sorted(m.params.items()))): m.label for m in FEATURE_METHODS + AUTO_FEATURE_METHODS}
        methods = [MethodSpec(m.name, m.params, presets.get((m.name, tuple(sorted(m.params.items()))), m.label))
                   for m in methods]
    if not methods and featured:
        # the int8 rows only where "auto" runs something else (where it is int8 throughout they would repeat it)
        int8 = [] if _auto_is_int8(device) else FEATURE_METHODS[3:6]
        methods = FEATURE_METHODS[:3] + int8 + AUTO_FEATURE_METHODS + FEATURE_METHODS[6:]
    # bf16 rows only where bf16 is native (elsewhere it is refused: emulated, several times slower than fp32)
    methods = methods or [m for m in DEFAULT_METHODS if _variant(m) != ("encoder", "bf16")
                          or fast_bf16_matmul(torch.device(device or "cpu"))]
    hf = [m.name for m in methods if m.name.startswith("hf-")]
    check(not (featured and hf), f"{hf[0] if hf else ''} decodes without timestamps or VAD; leave it out of a "
          "--timestamps / --vad run")
    # speculative-cross drafts with another Whisper: tiny.en for the builtin base
    assistant = "builtin:tiny.en" if model == "builtin:base" and any(m.name == "speculative-cross" for m in methods) else None
    asr = pipeline or ASRPipeline.from_pretrained(model, heads=heads_option(heads), draft=draft_option(draft),
                                                  assistant=assistant, device=device, cuda_graphs=cuda_graphs)
    if methods[0].name != "greedy":
        # the plain baseline first; greedy on a cheaper encoder (greedy:encoder=bf16) is a row of its own
        methods = [MethodSpec("greedy")] + [m for m in methods if m.name != "ar" and (m.name != "greedy" or m.params)]
    tts = tts_utterances if tts_utterances is not None else \
        (QUICK_TTS if quick else OOD_UTTERANCES if split == "ood" else FULL_TTS)
    corpus = load_corpus(tts, split)
    refs = [text for _, _, text in corpus]
    audio_s = sum(a.duration for _, a, _ in corpus)
    sizes = (1, 8)
    batches = {b: [corpus[i : i + b] for i in range(0, len(corpus), b)] for b in sizes}
    peers = {}
    precisions = {asr.precision: asr}     # precision asked for -> the pipeline at that precision (built once)

    def at_precision(name: str, decoder: str | None = None):
        """The pipeline at precision `name`; `decoder="eager"`: its int8 decoder's passes eager rather than one
        compiled graph (`decoder_graph`), for the engines' comparison in one run."""
        check(decoder in (None, "eager"), f"decoder= takes 'eager' (the int8 decoder's eager passes), got {decoder!r}")
        key = name if decoder is None else f"{name}:{decoder}"
        if key not in precisions:          # the same weights, heads and draft, converted
            precisions[key] = ASRPipeline(asr.bundle, heads=asr.heads, draft=asr.draft, precision=name)
            if decoder == "eager":
                precisions[key].model.graph = None
        return precisions[key]

    def run_batch(spec: MethodSpec, items: list, seed: int) -> tuple[list, DecodeStats]:
        audios = [a for _, a, _ in items]
        if spec.name in ("hf-generate", "hf-assisted"):
            return _hf_generate(asr, audios, assisted=spec.name == "hf-assisted")
        if spec.name == "faster-whisper":
            key = spec.params.get("compute_type", "int8")
            if key not in peers:
                peers[key] = FasterWhisperProcess(asr.bundle.name, key, torch.get_num_threads(), features)
            return peers[key].transcribe(audios)
        params = dict(spec.params)
        pipe = at_precision(params.pop("precision"), params.pop("decoder", None)) if "precision" in params else asr
        out = pipe.transcribe(audios, spec.name, batch_size=len(audios), **features, **AS_FASTER_WHISPER, **params)
        stats = out.stats
        stats.time_s["total"] = out.wall_s
        return out.texts, stats

    def quality(spec: MethodSpec, outputs: list, baseline: list) -> dict:
        n = len(outputs)
        wer = corpus_wer(refs[:n], outputs)
        row = {"wer": round(100 * wer.wer, 2), "identical_to_ar": _identical(outputs, baseline)}
        variant = _variant(spec)
        if variant is not None:     # lossless decoding on a cheaper encoder or model: against greedy on the same one
            if spec.name == "greedy":
                same_variant_greedy[variant] = outputs
            elif variant in same_variant_greedy:
                row[f"identical_to_greedy_same_{variant[0]}"] = _identical(outputs, same_variant_greedy[variant])
        return row

    same_variant_greedy: dict[tuple, list] = {}     # ("encoder" | "precision", name) -> its greedy outputs

    def warmup(spec: MethodSpec) -> None:
        run_batch(spec, corpus[:1], 0)

    def finish(doc: dict) -> None:
        add_speed_columns(doc, audio_s)

    audio = f"{len(corpus) - tts} real clips + {tts} held-out TTS utterances" if split == "in-domain" else \
        f"{len(corpus)} out-of-domain utterances (licence sentences, unseen voices, half under noise)"
    config = {"model": asr.bundle.name, "split": split, "audio": audio,
              "audio_s": round(audio_s, 1), "utterances": len(corpus), "batch_sizes": list(sizes),
              "wer": f"corpus WER, {normalizer_version()}",
              "heads": ", ".join(Path(f).name for f in asr.heads_source.split(", ")) if asr.heads_source else None,
              "draft": Path(asr.draft_source).name if asr.draft_source else None,
              "assistant": asr.assistant.name if asr.assistant else None,
              "threads": torch.get_num_threads(), "quick": quick, "timestamps": timestamps, "vad": vad,
              "mel_padding": asr.mel_padding,
              "fallback": "off: one temperature, as faster-whisper's rows (temperature 0, no_speech_threshold None)",
              "timing": "the whole transcribe call (VAD, features, encoder, decoding, scores, word alignment)",
              "drafting": "adaptive: each pass drafts up to k, or none, by measured acceptance and cost "
                          "(mmaccel.core.adaptive), unless a row says adaptive=false"}
    return Suite("asr", config, methods, batches, run_batch, quality, claims_lossless, verify_identical=True,
                 primary_quality="wer", warmup=warmup, finish=finish, floor=lambda: target_floor(asr))


def target_floor(asr) -> dict:
    """Greedy's one-token pass (the arg-max view where greedy uses it) against its floor."""
    from mmaccel.bench.floor_suite import pass_floor, whisper_subjects

    return pass_floor(whisper_subjects(asr, ["fp32" if asr.argmax_model is asr.model else "fp32-argmax"])[0])


def _auto_is_int8(device: str | None) -> bool:
    """Whether precision="auto" runs both the Whisper encoder and decoder in int8 on `device` (None: the CPU)."""
    from mmaccel.engine.compiled import available
    from mmaccel.engine.precision import resolve_precision

    where = torch.device(device or "cpu")
    return all(resolve_precision("auto", where, bound, compiled=available()).name == "int8"
               for bound in ("compute", "bandwidth"))


def _variant(spec: MethodSpec) -> tuple[str, str] | None:
    """What a row runs on other than the fp32 model: ("encoder", precision) or ("precision", precision, with the
    decoder engine when it is not the default: "auto:eager")."""
    for key in ("precision", "encoder"):
        if spec.params.get(key, "fp32") != "fp32":
            engine = spec.params.get("decoder") if key == "precision" else None
            return key, spec.params[key] if engine is None else f"{spec.params[key]}:{engine}"
    return None


def claims_lossless(spec: MethodSpec) -> bool:
    """Whether `spec` claims greedy's transcripts: of the peers only HF's decoders; no method on a cheaper
    encoder or model (the claim is against the fp32 model); every other method says so itself (`lossless`)."""
    if spec.name in PEERS:
        return spec.name.startswith("hf-")
    params = dict(spec.params)
    params.pop("adaptive", None)                                  # which passes draft: the tokens stay greedy's
    if _variant(spec) is not None:
        return False
    params.pop("encoder", None)
    params.pop("precision", None)
    params.pop("decoder", None)
    return build_asr_method(spec.name, **params).lossless


def add_speed_columns(doc: dict, audio_s: float) -> None:
    """Add to every result row's quality its RTFx over `audio_s` seconds of audio, decoder passes per token,
    mean exit layer, and the decoder and token-generation speed-ups over greedy at the same batch size."""
    by_batch = {r["batch"]: r for r in doc["results"] if r["method"] == "greedy"}
    for r in doc["results"]:
        base = by_batch[r["batch"]]
        r["quality"]["rtfx"] = round(audio_s / r["latency_s"], 2) if r["latency_s"] else None
        if r["mean_accepted"]:        # per sequence: each pass emits mean_accepted tokens per active row
            r["quality"]["passes_per_token"] = round(1 / r["mean_accepted"], 3)
        elif r["batch"] == 1 and r["nfe"] and r["new_tokens"]:
            r["quality"]["passes_per_token"] = round(r["nfe"] / r["new_tokens"], 3)
        if "mean_exit_layer" in r:
            r["quality"]["mean_exit_layer"] = r["mean_exit_layer"]
        dec, base_dec = r["time_s"].get("decode"), base["time_s"].get("decode")
        if dec and base_dec:
            r["quality"]["decoder_speedup"] = round(base_dec / dec, 3)
        pre, base_pre = r["time_s"].get("prefill"), base["time_s"].get("prefill")
        if dec and base_dec and pre is not None and base_pre is not None:
            r["quality"]["generation_speedup"] = round((base_dec - base_pre) / (dec - pre), 3)


def _identical(outputs: list, reference: list) -> float:
    return round(sum(a == b for a, b in zip(outputs, reference)) / len(outputs), 4)


# ---- peers ------------------------------------------------------------------------------------------

def _hf_generate(asr, audios: list[Audio], assisted: bool = False) -> tuple[list[str], DecodeStats]:
    """Transformers' own greedy `generate` on the same weights (suppression from the model's config).

    `assisted`: HF assisted generation with the pipeline's draft decoder as `assistant_model` (the
    same weights our `speculative` drafts with, read out over the full vocabulary; HF's default
    assistant schedule). HF runs assisted generation one utterance at a time (batch 1 only), so a
    batch is decoded row by row.
    """
    bundle = asr.bundle
    model = bundle.model
    prompt = bundle.prompt("en")
    if assisted and asr.draft is None:
        raise InputError("hf-assisted needs the pipeline's draft decoder, and none is loaded")
    calls, draft_calls = [0], [0]
    hooks = [model.model.decoder.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))]
    if assisted:
        hooks.append(asr.draft.hf.model.decoder.register_forward_pre_hook(
            lambda *a: draft_calls.__setitem__(0, draft_calls[0] + 1)))
    stats = DecodeStats()
    config = copy.deepcopy(model.generation_config)
    config.max_length, config.max_new_tokens, config.do_sample, config.num_beams = None, MAX_NEW_TOKENS, False, 1
    try:
        with torch.inference_mode(), track_peak_memory(stats):
            t0 = time.perf_counter()
            features = log_mel(bundle.feature_extractor, audios)
            t1 = time.perf_counter()
            encoded = model.model.encoder(features)
            t2 = time.perf_counter()
            if not assisted:
                rows = model.generate(encoder_outputs=encoded, decoder_input_ids=torch.tensor([prompt] * len(audios)),
                                      attention_mask=None, generation_config=config).tolist()
            else:
                rows = []
                for b in range(len(audios)):
                    one = BaseModelOutput(last_hidden_state=encoded.last_hidden_state[b : b + 1])
                    # HF refuses decoder_input_ids with an assistant; it builds the same prompt from these
                    rows += model.generate(encoder_outputs=one, attention_mask=None, generation_config=config,
                                           assistant_model=asr.draft.hf, **_prompt_kwargs(bundle)).tolist()
            t3 = time.perf_counter()
    finally:
        for hook in hooks:
            hook.remove()
    eot = bundle.tokens.end_of_text
    new = [[t for t in r if t not in prompt] for r in rows]
    new = [r[: r.index(eot) + 1] if eot in r else r for r in new]
    stats.nfe, stats.draft_passes, stats.new_tokens = calls[0], draft_calls[0], sum(len(r) for r in new)
    stats.time_s = {"features": t1 - t0, "encoder": t2 - t1, "decode": t3 - t2, "total": t3 - t0}
    texts = [bundle.tokenizer.decode(r, skip_special_tokens=True).strip() for r in new]
    return texts, stats


def _prompt_kwargs(bundle) -> dict:
    """`generate` arguments that build `bundle.prompt("en")` (transcribe, English, no timestamps)."""
    return {"language": "en", "task": "transcribe"} if bundle.tokens.multilingual else {}


def _faster_whisper(name: str, compute_type: str, threads: int) -> Any:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from mmaccel.speech.whisper import ct2_model_dir

    model = WhisperModel(str(ct2_model_dir(name)), device="cpu", compute_type=compute_type,
                         cpu_threads=threads, num_workers=1)
    return model, BatchedInferencePipeline(model)


class FasterWhisperProcess:
    """faster-whisper in a child process, timed there.

    A loaded CTranslate2 model slows the memory-bound torch products of its process while it exists
    (measured here: a fp32 matrix-vector pass over 40 weights 6.0 → 9.8 ms, Whisper base's decoder
    step 11.9 → 19.0 ms; back to 6.2 ms once the model is deleted), so it must not share the
    process with the methods it is compared to.
    """

    def __init__(self, name: str, compute_type: str, threads: int, features: dict | None = None):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_faster_whisper_worker, args=(child, name, compute_type, threads,
                                                                        fw_options(**(features or {}))), daemon=True)
        self.process.start()
        ready = self.conn.recv()
        if ready != "ready":
            raise InputError(f"faster-whisper ({compute_type}) could not start: {ready}")

    def transcribe(self, audios: list[Audio]) -> tuple[list[str], DecodeStats]:
        self.conn.send(audios)
        texts, seconds = self.conn.recv()
        stats = DecodeStats()
        stats.time_s = {"total": seconds}
        return texts, stats


def _faster_whisper_worker(conn, name: str, compute_type: str, threads: int, options: dict) -> None:
    try:
        peer = _faster_whisper(name, compute_type, threads)
    except Exception as err:                      # reported to the parent, which raises it
        conn.send(f"{type(err).__name__}: {err}")
        return
    conn.send("ready")
    while True:
        try:
            audios = conn.recv()
        except EOFError:                          # the parent is gone
            return
        texts, stats = _run_faster_whisper(peer, audios, options)
        conn.send((texts, stats.time_s["total"]))


# our decoding options as faster-whisper's in `fw_options`: one temperature (no fallback), no window left empty
AS_FASTER_WHISPER = dict(temperature=0.0, no_speech_threshold=None)


def fw_options(timestamps: bool = False, word_timestamps: bool = False, vad_filter: bool = False) -> dict:
    """faster-whisper's options for greedy decoding as ours (no fallback, no conditioning on earlier text), with the
    features of `ASRPipeline.transcribe` given."""
    return dict(language="en", task="transcribe", beam_size=1, temperature=0.0,
                without_timestamps=not (timestamps or word_timestamps), word_timestamps=word_timestamps,
                vad_filter=vad_filter, condition_on_previous_text=False)


def _speech_only(samples: np.ndarray) -> np.ndarray:
    """The speech of a 16 kHz clip, joined, as faster-whisper's BatchedInferencePipeline finds it with VAD on."""
    from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

    regions = get_speech_timestamps(samples, VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160))
    chunks, _ = collect_chunks(samples, regions, max_duration=30) if regions else ([], [])
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def _run_faster_whisper(peer: Any, audios: list[Audio], options: dict) -> tuple[list[str], DecodeStats]:
    model, batched = peer
    stats = DecodeStats()
    t0 = time.perf_counter()
    if len(audios) == 1:
        segments, _ = model.transcribe(audios[0].samples, no_speech_threshold=None, **options)
        texts = [" ".join(s.text.strip() for s in segments).strip()]
    else:
        # each clip is one of the pipeline's chunks (with VAD: the clip's speech only, found by the pipeline's own
        # VAD rules clip by clip, as ours runs per input; its VAD over the clips joined would pack several
        # utterances into one window, and their text could not be told apart)
        pieces = [_speech_only(a.samples) if options["vad_filter"] else a.samples for a in audios]
        joined = np.concatenate(pieces)
        bounds = np.cumsum([0] + [len(p) for p in pieces]) / 16000
        clips = [{"start": float(a), "end": float(b)} for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        texts = [""] * len(audios)
        if clips:
            segments, _ = batched.transcribe(joined, clip_timestamps=clips, batch_size=len(audios),
                                             **{**options, "vad_filter": False})
            segments = list(segments)
            # a segment belongs to the clip holding its midpoint (its edges are rounded to 20 ms frames)
            texts = [" ".join(s.text.strip() for s in segments if lo <= (s.start + s.end) / 2 < hi).strip()
                     for lo, hi in zip(bounds[:-1], bounds[1:])]
    stats.time_s = {"total": time.perf_counter() - t0}
    return texts, stats
