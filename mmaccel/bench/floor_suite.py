"""`mmaccel bench floor`: how far each pass is from what this machine allows, measured in one run.

First the machine (`mmaccel.engine.machine`: read bandwidth, GEMM rate per precision, its CPU flags); then, for the
target decoders of the three pipeline families (Whisper base and tiny.en, SmolLM2-135M, the built-in next-token
image GPT), one step of the model through its public `step` at each verify width (1, 2, 4, 8, 16 tokens) and batch
(1, 8), at a fixed cache length, in each precision this machine can run; and one Whisper encoder window. Each row
has its bytes and FLOPs (`mmaccel.engine.floor.trace_pass`, traced once in fp32), its floor in that precision, the
measured time (median and best of `repeats`, warm-up excluded) and their ratio, and the cost of a width-T pass
relative to a one-token pass at the same batch (what a verify pass costs a method).

Precisions: fp32 (the model as loaded), bf16 (where native), int8 (`Int8Linear` layers and, for Whisper, its
vocabulary projection, as `ASRPipeline(precision="int8")` runs it) and, for Whisper, `fp32-argmax`: the arg-max view
greedy and the greedy-verified methods use on CPUs with native bf16 (`ArgmaxProjection`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mmaccel.engine.compiled import Compiled
from mmaccel.engine.floor import PassCost, model_tensors, trace_pass
from mmaccel.engine.machine import Machine, cpu_bf16_units, measure_machine
from mmaccel.engine.measured import time_ms
from mmaccel.engine.pass_costs import KV_LEN
from mmaccel.engine.precision import convert

WIDTHS = (1, 2, 4, 8, 16)
BATCHES = (1, 8)


@dataclass
class Subject:
    """One model in one precision: how to build a state at KV_LEN for a batch, and its weights (for the trace)."""

    model: str
    precision: str
    decoder: object                                   # a DecoderModel
    prefill: Callable[[int], object]                 # batch -> DecodeState with KV_LEN entries
    weights: list[torch.Tensor]
    token: int                                       # an ordinary token id to feed
    traced_as: str = "fp32"                          # "fp32": its bytes are the fp32 model's, converted; "own"


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _precisions() -> list[str]:
    return ["fp32", *(["bf16"] if cpu_bf16_units() else []), "int8"]


def whisper_subjects(pipe, precisions: list[str] | None = None) -> list[Subject]:
    """An `ASRPipeline`'s target decoder in each of `precisions` (default: fp32, fp32-argmax and the others here)."""
    from mmaccel.speech.decoder import WhisperDecoderModel
    from mmaccel.speech.pass_shape import filled_state, filler

    name = pipe.bundle.name
    hf = pipe.bundle.model
    prompt = pipe.bundle.prompt("en")

    def subject(label: str, model: WhisperDecoderModel) -> Subject:
        weights = model_tensors(hf.model.decoder)
        if model.argmax_readout is not None:                          # it reads a bf16 copy of the projection
            weights.append(model.argmax_readout.weight_bf16)
        return Subject(f"whisper-{name}", label, model, lambda batch: filled_state(model, prompt, batch), weights,
                       filler(model), "own" if model.argmax_readout is not None else "fp32")

    build = {"fp32": lambda: pipe.model, "fp32-argmax": pipe.model.argmax_view,
             "bf16": lambda: WhisperDecoderModel(convert(hf, "bf16")),
             "int8": lambda: WhisperDecoderModel(hf, quantized=True)}
    return [subject(p, build[p]()) for p in precisions or ["fp32", "fp32-argmax", *_precisions()[1:]]]


def lm_subjects(pipe, precisions: list[str] | None = None, name: str = "smollm2-135m") -> list[Subject]:
    """A `TextPipeline`'s target in each of `precisions` (default: every one this machine runs)."""
    from mmaccel.lm.hf import HFCausalLM

    hf = pipe.model.hf

    def subject(precision: str, model: HFCausalLM) -> Subject:
        def prefill(batch: int):
            return model.prefill([[1] * KV_LEN] * batch, 64)
        return Subject(name, precision, model, prefill, model_tensors(hf), min(1000, model.vocab_size - 1))
    return [subject(p, pipe.model if p == "fp32" else HFCausalLM(convert(hf, p))) for p in precisions or _precisions()]


def image_subjects(pipe, precisions: list[str] | None = None, name: str = "fashion-gpt") -> list[Subject]:
    """An `ImagePipeline`'s next-token GPT in each of `precisions` (default: every one this machine runs)."""
    gpt = pipe.model

    def subject(precision: str, model) -> Subject:
        def prefill(batch: int):
            state = model.prefill([0] * batch, 64)
            model.step(state, torch.full((batch, KV_LEN - 1), 1))
            return state
        return Subject(name, precision, model, prefill, model_tensors(gpt), 1)
    return [subject(p, gpt if p == "fp32" else convert(gpt, p)) for p in precisions or _precisions()]


def _decoder_rows(subjects: list[Subject], machine: Machine, repeats: int, widths, batches, log) -> list[dict]:
    rows = []
    traced: dict[tuple, PassCost] = {}
    for s in subjects:
        for batch in batches:
            state = s.prefill(batch)
            cache = [*state.cache.k, *state.cache.v]
            one = None
            for width in widths:
                tokens = torch.full((batch, width), s.token)

                def run(decoder=s.decoder, state=state, tokens=tokens, width=width):
                    decoder.step(state, tokens)
                    state.rollback(width)
                # bytes and FLOPs: traced once on the fp32 model (the first subject), converted to the precision
                key = (s.model, batch, width, s.precision if s.traced_as == "own" else "fp32")
                if key not in traced:
                    traced[key] = trace_pass(run, s.weights, cache)
                cost = traced[key]
                base = "fp32" if s.traced_as == "own" else s.precision
                floor_ms = cost.floor_s(machine, base) * 1e3
                median, best = time_ms(run, repeats)
                one = median if width == 1 else one
                rows.append({"model": s.model, "part": "decoder", "precision": s.precision, "batch": batch,
                             "width": width, "kv_len": KV_LEN, "ms": _sig(median), "ms_best": _sig(best),
                             "floor_ms": _sig(floor_ms), "x_floor": round(median / floor_ms, 2),
                             "x_width1": round(median / one, 3), **_bound(cost, machine, base)})
            log(f"[floor] {s.model} {s.precision} batch {batch}: " + ", ".join(
                f"T={r['width']} {r['ms']:.1f} ms ({r['x_floor']:.1f}x floor)" for r in rows[-len(widths):]))
    return rows


def pass_floor(subject: Subject, repeats: int = 10) -> dict:
    """One pass of `subject` at batch 1, one token, KV_LEN entries: its bytes, floor and measured time (the floor
    section of a harness suite's document)."""
    machine = measure_machine()
    if subject.decoder.device.type != "cpu":
        return {"model": subject.model, "note": "the floor is measured for CPUs only"}
    row = _decoder_rows([subject], machine, repeats, (1,), (1,), log=lambda m: None)[0]
    return {k: row[k] for k in ("model", "precision", "batch", "width", "kv_len", "ms", "floor_ms", "x_floor", "bound",
                                "bytes")}


def _bound(cost: PassCost, machine: Machine, precision: str) -> dict:
    at = cost.at(precision)
    memory = at.bytes / (machine.read_gb_s * 1e9)
    compute = at.flops / (machine.gemm_gflop_s[precision] * 1e9)
    fits = machine.cache_bytes is not None and at.bytes <= machine.cache_bytes
    return {"bytes": at.to_dict(), "bound": "memory" if memory >= compute else "compute", "fits_cache": fits}


def _encoder_rows(names: list[str], machine: Machine, repeats: int, log) -> list[dict]:
    from mmaccel.speech.pipeline import ASRPipeline

    rows = []
    for name in names:
        pipe = ASRPipeline.from_pretrained(f"builtin:{name}", heads=None, draft=None)
        fp32 = pipe.encoder("fp32")
        features = torch.zeros(1, pipe.bundle.model.config.num_mel_bins, 3000)
        cost = trace_pass(lambda fp32=fp32, features=features: fp32(features), model_tensors(fp32))
        for precision in _precisions():
            encoder = pipe.encoder(precision)            # what the pipeline runs: compiled where it can be
            compiled = isinstance(encoder, Compiled)
            x = features if compiled else features.to(encoder.conv1.weight.dtype)
            with torch.inference_mode():
                median, best = time_ms(lambda encoder=encoder, x=x: encoder(x), max(3, repeats // 3))
            floor_ms = cost.floor_s(machine, precision) * 1e3
            rows.append({"model": f"whisper-{name}", "part": "encoder", "precision": precision, "batch": 1,
                         "engine": "openvino" if compiled else "torch",
                         "width": 1500, "kv_len": 0, "ms": _sig(median), "ms_best": _sig(best),
                         "floor_ms": _sig(floor_ms), "x_floor": round(median / floor_ms, 2), "x_width1": 1.0,
                         **_bound(cost, machine, precision)})
            log(f"[floor] whisper-{name} encoder {precision}: {median:.0f} ms ({rows[-1]['x_floor']:.1f}x floor)")
    return rows


def run_floor_bench(quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """The floor document: the machine, then a row per (model, part, precision, batch, width)."""
    from mmaccel.bench.harness import device_name

    machine = measure_machine()
    repeats = 5 if quick else 15
    widths, batches = ((1, 8), (1,)) if quick else (WIDTHS, BATCHES)
    whispers = ["tiny.en"] if quick else ["base", "tiny.en"]
    log(f"[floor] machine: {machine.read_gb_s} GB/s, GFLOP/s {machine.gemm_gflop_s}, flags {' '.join(machine.flags)}")
    from mmaccel.image.pipeline import ImagePipeline
    from mmaccel.lm.pipeline import TextPipeline
    from mmaccel.speech.pipeline import ASRPipeline

    subjects = [s for name in whispers
                for s in whisper_subjects(ASRPipeline.from_pretrained(f"builtin:{name}", heads=None, draft=None))]
    if not quick:
        subjects += lm_subjects(TextPipeline.from_pretrained("builtin:smollm2", draft=None))
        subjects += image_subjects(ImagePipeline.from_pretrained("builtin:fashion-mnist", draft=None))
    rows = _decoder_rows(subjects, machine, repeats, widths, batches, log)
    rows += _encoder_rows(whispers, machine, repeats, log)
    config = {"widths": list(widths), "batches": list(batches), "kv_len": KV_LEN, "repeats": repeats, "quick": quick,
              "encoder_window": "one padded 30-s window [1, mels, 3000]", "threads": torch.get_num_threads()}
    return {"suite": "floor", "device": device_name(), "torch": torch.__version__,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "config": config,
            "machine": machine.to_dict(), "results": rows}


def machine_line(machine: dict) -> str:
    rates = ", ".join(f"{p} {r:g}" for p, r in machine["gemm_gflop_s"].items())
    cache = f", last-level cache {machine['cache_bytes'] >> 20} MiB" if machine.get("cache_bytes") else ""
    return (f"Machine: read {machine['read_gb_s']:g} GB/s; GEMM GFLOP/s {rates}{cache}; "
            f"flags {' '.join(machine['flags']) or 'none of note'}")


def markdown(doc: dict) -> str:
    """The machine line, then one table per part: time, floor and their ratio per width."""
    lines = [machine_line(doc["machine"]), "",
             "| model | part | precision | batch | width | ms | floor (ms) | × floor | × width 1 | bound | MB read |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        engine = f" ({r['engine']})" if r.get("engine", "torch") != "torch" else ""
        lines.append(f"| {r['model']} | {r['part']} | {r['precision']}{engine} | {r['batch']} | {r['width']} | {r['ms']:g} | "
                     f"{r['floor_ms']:g} | {r['x_floor']:.2f} | {r['x_width1']:.2f} | {r['bound']}"
                     f"{' (fits cache)' if r['fits_cache'] else ''} | {r['bytes']['bytes'] / 1e6:.1f} |")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    """Time per decoder pass against verify width, a panel per model, a line per (precision, batch), floors dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["results"] if r["part"] == "decoder"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), dpi=110, squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        for key in dict.fromkeys((r["precision"], r["batch"]) for r in mine):
            line = [r for r in mine if (r["precision"], r["batch"]) == key]
            drawn = ax.plot([r["width"] for r in line], [r["ms"] for r in line], marker="o",
                            label=f"{key[0]}, batch {key[1]}")
            ax.plot([r["width"] for r in line], [r["floor_ms"] for r in line], ls="--", color=drawn[0].get_color(),
                    lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per pass (verify width)")
        ax.set_ylabel("ms per pass (dashed: floor)")
        ax.set_title(model)
        ax.legend(fontsize=7)
    fig.suptitle(f"mmaccel bench floor — {doc['device']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
