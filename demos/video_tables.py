"""The video tab's Markdown tables: the stream's running numbers, an answer with its stats and truth, the
questions asked so far, and the proactive requests that fired."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmaccel.video.stream import VideoAnswer

if TYPE_CHECKING:
    from demos.video_tab import Session

MAX_HISTORY = 10                # questions listed under the answer


def stream_table(session: Session) -> str:
    pipe, budget = session.pipe, session.pipe.budget
    s = session.settings
    where = f"task stream, seed {s.seed}" if s.upload is None else f"{Path(s.upload).name} at ≤ {s.fps:g} fps"
    seen = session.frames_seen
    kept = f"{session.kept} of {session.encoded}" + (f" ({session.kept / session.encoded:.0%} kept)"
                                                     if session.encoded else "")
    last = session.last
    segment = f"{last.vision_tokens} of {last.tokens_in}" if last is not None and last.appended else "–"
    ingest = (f"last {last.ingest_s * 1e3:.1f} ms, mean {session.ingest_s / seen * 1e3:.1f} ms "
              f"(the frame that completes a temporal patch of {pipe.model.temporal_patch} pays its encoding)"
              if last is not None else "–")
    rows = [("frames seen", f"{seen} ({where}){' — the source has ended' if session.ended else ''}"),
            ("vision tokens kept / encoded", f"{kept}; last segment {segment}"),
            ("KV entries", f"{pipe.kv_entries} of {pipe.capacity} (budget: {budget.sink} sinks + {budget.vision} "
                           f"vision + {budget.text} text, + room for an answer)"),
            ("ingest latency per frame", ingest)]
    return "\n".join(["| stream | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def answer_table(answer: VideoAnswer, method: str, truth: str) -> str:
    stats = answer.stats
    text = answer.text or "(nothing: the model ended its answer at once)"
    mark = "" if truth.startswith("–") else " ✓" if answer.text == truth else " ✗"
    rows = [("answer", f"**{text}**{mark}"), ("ground truth", truth),
            ("latency", f"{answer.latency_s * 1e3:.1f} ms (question appended + answer decoded)"),
            ("target passes (NFE)", f"{stats.nfe} for {stats.new_tokens} tokens "
                                    f"({stats.mean_accepted:.2f} tokens per pass, {method})"),
            ("draft passes", stats.draft_passes),
            ("vision tokens in the cache", f"{answer.vision_entries_before} → {answer.vision_entries_after} "
                                           "(KV reduction at this question)"),
            ("frames seen", answer.frames_seen)]
    return "\n".join(["| answer | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def history_table(session: Session) -> str:
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731 - a typed "|" must not split the table row
    rows = [f"| {a.frames_seen} | {cell(a.question)} | {a.text} | {truth} | {a.stats.nfe} | {a.latency_s * 1e3:.1f} |"
            for a, truth in reversed(session.history[-MAX_HISTORY:])]
    return "\n".join(["| frames | question | answer | truth | NFE | ms |", "|---|---|---|---|---|---|", *rows])


def notices(session: Session | None) -> str:
    if session is None or not session.notices:
        return ""
    return "**Requests that fired**\n\n" + "\n".join(f"- {n}" for n in session.notices)
