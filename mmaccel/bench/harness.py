"""Benchmark harness: every method and the AR baseline in one process, same inputs, seeds and batches.

A suite says how to run one method on one batch (`run_batch`) and how to score outputs against the
baseline's (`quality`); the harness does the rest: warm-up (excluded), interleaving (all methods on
batch i before batch i+1, so machine noise hits them alike; their order rotates from batch to batch, so
no method always runs first or right after another), aggregation, ratios, and the JSON / Markdown / PNG
outputs. Ratios are baseline / method, so > 1 is better.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmaccel.core.stats import DecodeStats
from mmaccel.engine.machine import cpu_bf16_units, cpu_model, measure_machine
from mmaccel.errors import check
from mmaccel.progress import bars_cleared, progress

BASELINES = ("ar", "greedy")        # the plain AR decoder ("greedy" is its name for speech)


@dataclass
class MethodSpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    label: str | None = None

    @property
    def key(self) -> str:
        return self.label or self.name


@dataclass
class Suite:
    """What a benchmark compares. `run_batch(spec, batch_inputs, seed) -> (outputs, DecodeStats)`;
    `quality(spec, outputs, baseline_outputs) -> dict` (a suite may score a method on a larger sample
    set of its own instead of the timed outputs); `lossless(spec) -> bool` (the method's claim)."""

    name: str
    config: dict[str, Any]
    methods: list[MethodSpec]
    batches: dict[int, list[Any]]                 # batch size -> list of batch inputs
    run_batch: Callable[[MethodSpec, Any, int], tuple[list, DecodeStats]]
    quality: Callable[[MethodSpec, list, list], dict]
    claims_lossless: Callable[[MethodSpec], bool]
    verify_identical: bool = True                 # greedy suites: lossless claims are checked token for token
    primary_quality: str = "identical_to_ar"
    warmup: Callable[[MethodSpec], Any] | None = None  # one short untimed call per method
    artifacts: Callable[[Path], list[Path]] | None = None  # extra outputs written beside the JSON (sample grids)
    finish: Callable[[dict], None] | None = None  # adds suite-specific derived numbers to the result document
    floor: Callable[[], dict] | None = None       # the target's one-token pass against its floor (`floor_suite.pass_floor`)


def run_suite(suite: Suite, seed: int = 0, log: Callable[[str], None] = print) -> dict:
    """Run every method on every batch; returns the result document (see `write_results`)."""
    check(bool(suite.methods) and suite.methods[0].name in BASELINES,
          f"the first method of a suite must be the AR baseline ({' or '.join(BASELINES)})")
    baseline = suite.methods[0].key
    results = []
    for batch_size, batches in suite.batches.items():
        if suite.warmup is not None:
            for spec in suite.methods:
                suite.warmup(spec)
        outputs = {spec.key: [] for spec in suite.methods}
        stats = {spec.key: DecodeStats() for spec in suite.methods}
        for i, inputs in enumerate(progress(batches, desc=f"{suite.name} batch size {batch_size}", unit="batch")):
            for spec in rotated(suite.methods, i):
                out, st = suite.run_batch(spec, inputs, seed + i)
                outputs[spec.key].extend(out)
                stats[spec.key] = stats[spec.key] + st
            with bars_cleared():
                log(f"[{suite.name}] batch size {batch_size}: {i + 1}/{len(batches)} batches done")
        base = stats[baseline]
        for spec in suite.methods:
            st = stats[spec.key]
            counted = st.to_dict()                          # the counters in their declared JSON form
            quality = suite.quality(spec, outputs[spec.key], outputs[baseline])
            lossless = suite.claims_lossless(spec)
            if suite.verify_identical and lossless:
                lossless = quality.get("identical_to_ar", 0.0) == 1.0
            nfe_ratio = base.nfe / st.nfe if st.nfe else None
            speedup = base.wall_s / st.wall_s if st.wall_s else None
            results.append({
                "method": spec.key, "params": spec.params, "batch": batch_size,
                "nfe": st.nfe, "nfe_ratio": None if nfe_ratio is None else round(nfe_ratio, 4),
                "mean_accepted": counted["mean_accepted"],
                "latency_s": round(st.wall_s, 4),
                "speedup": None if speedup is None else round(speedup, 4),
                # how much of the pass reduction reaches the wall clock (1.0: every saved pass)
                "conversion": round(speedup / nfe_ratio, 4) if speedup and nfe_ratio else None,
                "ms_per_target_pass": round(st.time_s["verify"] * 1e3 / st.nfe, 3) if st.nfe and "verify" in st.time_s
                else None,
                "peak_mem_mb": counted["peak_mem_mb"],
                "quality": quality, "lossless": lossless,
                "draft_passes": st.draft_passes, "new_tokens": st.new_tokens,
                "tv_per_output": round(st.deviation / max(1, len(outputs[spec.key])), 6),
                "time_s": {k: round(v, 4) for k, v in st.time_s.items()},
                **st.reported(),        # the counters only some methods report (KV cache, early exits, a method's own)
            })
    doc = {
        "suite": suite.name, "device": device_name(), "torch": torch.__version__,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": suite.config, "baseline": baseline, "machine": measure_machine().to_dict(), "results": results,
    }
    if suite.floor is not None:
        doc["floor"] = suite.floor()
    if suite.finish is not None:
        suite.finish(doc)
    return doc


def rotated(methods: list[MethodSpec], i: int) -> list[MethodSpec]:
    """The order the methods run on batch `i`: the list turned left by i (the first batch keeps it)."""
    i %= len(methods)
    return methods[i:] + methods[:i]


def device_name(device: torch.device | None = None) -> str:
    """The device results were measured on (GPU name, or CPU model and threads); without `device`, the
    GPU when there is one."""
    if device is None and torch.cuda.is_available() or device is not None and device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({_cpu_model()}, {torch.get_num_threads()} threads)"


def _cpu_model() -> str:
    """The CPU's model name and architecture, with its native bf16 units (AMX, AVX512-BF16), which
    decide how fast the bf16 paths run: CPU results are only comparable on the same model."""
    return ", ".join([cpu_model(), platform.machine(), *cpu_bf16_units()])


COLUMNS = ["method", "batch", "nfe", "nfe_ratio", "mean_accepted", "latency_s", "speedup", "peak_mem_mb", "quality", "lossless"]


def conversion(row: dict) -> float | None:
    """Wall-clock speed-up / target-pass reduction of a result row (1.0: every saved pass reaches the user); computed
    from the row, so documents written before it was recorded have it too."""
    return row["speedup"] / row["nfe_ratio"] if row.get("speedup") and row.get("nfe_ratio") else None


def markdown_table(doc: dict) -> str:
    """The result document as a Markdown table (one row per method and batch size)."""
    relaxed = any(r.get("tv_per_output", 0) > 0 for r in doc["results"])
    tv_head, tv_rule = (" TV spent / output |", "---|") if relaxed else ("", "")
    lines = ["| method | params | batch | NFE | NFE ratio | mean accepted | latency (s) | speed-up | conversion | "
             f"peak mem (MB) | quality |{tv_head} lossless |", f"|---|---|---|---|---|---|---|---|---|---|---|{tv_rule}---|"]
    for r in doc["results"]:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "–"
        quality = ", ".join(f"{k}={v}" for k, v in r["quality"].items())
        tv = f" {r.get('tv_per_output', 0):.3g} |" if relaxed else ""
        nfe_ratio = "–" if r["nfe_ratio"] is None else f"{r['nfe_ratio']:.2f}"
        converted = "–" if conversion(r) is None else f"{conversion(r):.2f}"
        lines.append(f"| {r['method']} | {params} | {r['batch']} | {r['nfe'] or '–'} | {nfe_ratio} | "
                     f"{r['mean_accepted']:.2f} | {r['latency_s']:.2f} | {r['speedup']:.2f} | {converted} | "
                     f"{r['peak_mem_mb']:.0f} | "
                     f"{quality} |{tv} {'yes' if r['lossless'] else 'no'} |")
    return "\n".join(lines)


def floor_lines(doc: dict) -> str:
    """The machine and the target pass against its floor (documents that recorded them), as Markdown lines."""
    lines = []
    if "machine" in doc:
        from mmaccel.bench.floor_suite import machine_line

        lines.append(machine_line(doc["machine"]))
    f = doc.get("floor")
    if f and "floor_ms" in f:
        lines.append(f"Target pass ({f['model']}, {f['precision']}, batch 1, one token after {f['kv_len']}): "
                     f"{f['ms']:g} ms against a floor of {f['floor_ms']:g} ms ({f['x_floor']:.2f}x, {f['bound']}-bound, "
                     f"{f['bytes']['bytes'] / 1e6:.1f} MB read)")
    return "".join(f"{line}\n\n" for line in lines)


def write_results(doc: dict, out: Path, primary_quality: str) -> list[Path]:
    """Write `out` (JSON), and beside it the Markdown table (.md) and the quality/speed-up plot (.png)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    md = out.with_suffix(".md")
    md.write_text(f"# Benchmark `{doc['suite']}`\n\n{doc['device']}, torch {doc['torch']}, {doc['date']}\n\n"
                  f"Config: `{json.dumps(doc['config'])}`\n\n{floor_lines(doc)}{markdown_table(doc)}\n")
    png = out.with_suffix(".png")
    _plot(doc, png, primary_quality)
    return [out, md, png]


def _plot(doc: dict, path: Path, primary_quality: str) -> None:
    """Two panels: quality vs wall-clock speed-up, and NFE ratio vs wall-clock speed-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    panels = [(lambda r: r["quality"].get(primary_quality, float("nan")), primary_quality),
              (lambda r: r["nfe_ratio"], "NFE ratio (target passes saved)")]
    for ax, (value, label) in zip(axes, panels):
        for batch, marker in zip(sorted({r["batch"] for r in doc["results"]}), "os^vD"):
            rows = [r for r in doc["results"] if r["batch"] == batch and value(r) is not None and r["speedup"]]
            xs, ys = [r["speedup"] for r in rows], [value(r) for r in rows]
            ax.scatter(xs, ys, marker=marker, label=f"batch {batch}")
            for k, (r, x, y) in enumerate(zip(rows, xs, ys)):
                ax.annotate(r["method"], (x, y), fontsize=7, xytext=(4, 4 + 7 * (k % 3)), textcoords="offset points")
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("wall-clock speed-up over AR (same process)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"mmaccel bench {doc['suite']} — {doc['device']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def validate_document(doc: dict) -> None:
    """Raise if `doc` does not have the published result shape (used by tests and `bench report`)."""
    for key in ("suite", "device", "torch", "date", "config", "baseline", "results"):
        check(key in doc, f"benchmark JSON lacks {key!r}")
    for r in doc["results"]:
        for key in ("method", "params", "batch", "nfe", "nfe_ratio", "mean_accepted", "latency_s", "speedup",
                    "peak_mem_mb", "quality", "lossless"):
            check(key in r, f"benchmark result lacks {key!r}: {r}")
        check(isinstance(r["lossless"], bool) and isinstance(r["quality"], dict), f"malformed result row {r}")
