"""The Markdown tables and the long-stream plot of an `mmaccel bench video` result document."""

from __future__ import annotations

from pathlib import Path


def decode_seconds(time_s: dict) -> float:
    """Answer time after the question's prefill (phase times of `DecodeStats` or a result row): the decode
    loop's draft and verify passes."""
    return time_s.get("total", 0.0) - time_s.get("prefill", 0.0)


def answer_decoding_table(doc: dict) -> list[str]:
    """Per method: the answer decoding time against AR's (the decode loop, without the question prefill
    every method pays alike), and the ingest of the whole streams (a draft that reads frames adds to it)."""
    rows = doc["results"]
    base = next(r for r in rows if r["method"] == doc["baseline"])
    picked = doc["config"].get("self_draft_dev")
    lines = ["#### Answer decoding (held-out test streams, greedy)", ""]
    if picked:
        lines += ["Self-draft chains picked on the dev streams (decode seconds per setting): " + "; ".join(
            f"exit {e}: {p['params']} of {p['decode_s']}" for e, p in picked.items()), ""]
    lines += ["| method | answer tokens | NFE ratio | mean accepted | decode s | decode speed-up | answer latency s "
              "| stream ingest s | identical to AR |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        decode, ingest = decode_seconds(r["time_s"]), r["time_s"].get("stream_ingest")
        lines.append(f"| {r['method']} | {r['new_tokens']} | {r['nfe_ratio']} | {r['mean_accepted']:.2f} | "
                     f"{decode:.3f} | {decode_seconds(base['time_s']) / decode:.2f}x | {r['latency_s']:.3f} | "
                     f"{'–' if ingest is None else f'{ingest:.2f}'} | {r['quality'].get('identical_to_ar')} |")
    answers = base["quality"].get("questions")
    if answers:
        decode_passes = base["nfe"] - answers                # the first token of an answer comes with its prefill
        lines += ["", f"Answers are short: AR takes {base['nfe'] / answers:.2f} passes an answer, the first with the "
                  f"question's prefill. A draft that cost nothing and was always right would verify the rest in one "
                  f"pass: at most {decode_passes / answers:.2f}x fewer decode passes than AR's {decode_passes}."]
    return lines


def extra_markdown(doc: dict) -> str:
    """The ingest and long-stream tables of a video result document."""
    import json

    ingest = doc["ingest"]
    lines = [*answer_decoding_table(doc), "", "#### Vision token reduction (held-out test streams)", "",
             f"TemporalDrop's feature threshold picked on the dev streams: {ingest['dev']['chosen_feature_threshold']} "
             f"(tried: {json.dumps(ingest['dev']['feature_thresholds'])}; dev accuracy of the full stream "
             f"{ingest['dev']['full_accuracy']}). Chance reference: the most common dev answer of each kind, "
             f"given to every test question, scores {ingest['constant_answers']['accuracy']} "
             f"(by kind {json.dumps(ingest['constant_answers']['by_kind'])}).", "",
             "| setting | vision tokens / frame | keep ratio | token reduction | KV entries (mean) | KV reduction "
             "| ingest ms (mean / p95) | accuracy (± 95% CI) | change (± paired 95% CI) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in ingest["settings"].items():
        lines.append(f"| {name} | {r['vision_tokens_per_frame']} | {r['keep_ratio']} | {r['token_reduction']}x | "
                     f"{r['kv_entries_mean']} | {r['kv_reduction']}x | {r['ingest_ms_mean']} / {r['ingest_ms_p95']} | "
                     f"{r['accuracy']} ± {r['accuracy_ci95']} | {r['accuracy_change']:+} ± "
                     f"{r.get('accuracy_change_ci95', '?')} |")
    lines += ["", "#### Long streams through the bounded cache", "",
              "| stream | frames | max KV entries | cache capacity | cache MB | RSS MB start -> end "
              "| ingest ms of appending frames, median of first tenth -> last tenth (p99 of last tenth) "
              "| accuracy in the last tenth (now, direction, describe) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, r in doc["long_stream"].items():
        lines.append(f"| {name} | {r['frames']} | {r['kv_entries_max']} | {r['cache_capacity']} | {r['cache_mb']} | "
                     f"{r['rss_mb_start']} -> {r['rss_mb_end']} | {r['ingest_ms_first_tenth']} -> "
                     f"{r['ingest_ms_last_tenth']} ({r.get('ingest_ms_p99_last_tenth', '–')}) | "
                     f"{r.get('late_accuracy', '–')} "
                     f"({r.get('late_questions', 0)} q) |")
    if "triggers" in doc:
        lines += ["", "#### Proactive trigger (held-out test streams)", "",
                  "| setting | " + " | ".join(doc["triggers"][next(iter(doc["triggers"]))]) + " |",
                  "|---|" + "---|" * len(doc["triggers"][next(iter(doc["triggers"]))])]
        for name, r in doc["triggers"].items():
            lines.append(f"| {name} | " + " | ".join(str(v) for v in r.values()) + " |")
    return "\n".join(lines) + "\n"


def append_markdown(out: Path) -> Path:
    """`extra_markdown`, appended to the suite's Markdown beside `out`."""
    import json

    md = Path(out).with_suffix(".md")
    md.write_text(md.read_text() + "\n" + extra_markdown(json.loads(Path(out).read_text())))
    return md


def plot_long_stream(out: Path) -> list[Path]:
    """KV entries and ingest latency over the long streams (`<out>_long.png`)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(Path(out).read_text())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for key, row in doc["long_stream"].items():
        xs = [i * row["sample_every"] for i in range(len(row["kv_entries"]))]
        axes[0].plot(xs, row["kv_entries"], label=key, lw=0.9)
        every = row.get("ingest_every", row["sample_every"])
        points = [(i * every, ms) for i, ms in enumerate(row["ingest_ms"]) if ms is not None]
        axes[1].plot([p[0] for p in points], [p[1] for p in points], label=key, lw=0.9)
    axes[0].set_ylabel("KV cache entries")
    axes[1].set_ylabel("ingest ms of an appending frame (window median)")
    for ax in axes:
        ax.set_xlabel("frame")
        ax.legend(fontsize=8)
    fig.suptitle(f"mmaccel bench video — bounded memory over long streams ({doc['device']})")
    fig.tight_layout()
    path = Path(out).with_name(Path(out).stem + "_long.png")
    fig.savefig(path)
    plt.close(fig)
    return [path]
