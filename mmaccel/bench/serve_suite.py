"""`mmaccel bench serve`: requests per second and latency of `mmaccel serve` under concurrent clients, against one
request at a time and against faster-whisper behind the same endpoints.

The server runs in this process on a loopback port (uvicorn in a thread); each client is an asyncio task (httpx)
that sends the real clips round-robin, one request after another, for `duration_s`. Points: 1 client (one request
at a time: the baseline, and a lone request's latency), then more, for four servers (`servers`): ours (continuous
batching: a request's windows join the call in progress as its rows end), ours with per-call batching
(`--per-call`: a request waits for the next call), ours with EAGLE (the requests ask for it) and a peer adapter
that answers the same endpoints with faster-whisper's `BatchedInferencePipeline` (int8, one request per call: it
batches the chunks of one file, and a clip under 30 s is one chunk). Per point: requests, requests/s, audio seconds
per second, p50/p95 latency, the corpus WER of what the server returned against the clips' references, and the
process's resident memory after it (with the memory after the warm-up: over a run's requests it should stay flat).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mmaccel.bench.harness import device_name
from mmaccel.metrics.wer import corpus_wer

MODEL = "whisper-base"
CONCURRENCY, QUICK_CONCURRENCY = (1, 4, 16), (1, 4)
DURATION_S, QUICK_DURATION_S = 120.0, 15.0


class FasterWhisperPeer:
    """The same `transcribe` the server's worker calls, answered by faster-whisper (int8) one input at a time; the
    option checks read our pipeline's vocabulary and resources (`bundle`, `resources`)."""

    def __init__(self, asr):
        import torch
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        from mmaccel.speech.whisper import ct2_model_dir

        self.bundle, self.resources = asr.bundle, asr.resources
        model = WhisperModel(str(ct2_model_dir("base")), device="cpu", compute_type="int8",
                             cpu_threads=torch.get_num_threads())
        self.pipeline = BatchedInferencePipeline(model)

    def transcribe(self, audios, method, *, language=None, temperature=0.0, **_):
        from types import SimpleNamespace

        from mmaccel.speech.transcript import Transcript

        out = []
        for audio in audios:
            segments, info = self.pipeline.transcribe(audio.samples, language=language or "en", batch_size=8,
                                                      beam_size=1, temperature=temperature)
            text = " ".join(s.text.strip() for s in segments)
            out.append(Transcript(text, audio.source, audio.duration, language=info.language))
        return SimpleNamespace(transcripts=out)


def clips() -> list[tuple[bytes, float, str]]:
    """The real clips as WAV bytes, with their seconds and reference texts."""
    import soundfile as sf

    from mmaccel.speech.audio import load_audio
    from mmaccel.speech.data import real_utterances

    clips = []
    for u in real_utterances():
        audio = load_audio(u.audio_filepath)
        buf = io.BytesIO()
        sf.write(buf, audio.samples, 16000, format="WAV", subtype="PCM_16")
        clips.append((buf.getvalue(), audio.duration, u.text))
    return clips


class Served:
    """An app of `create_app` under uvicorn on a free loopback port, in a thread."""

    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(60)


async def load(url: str, clips, clients: int, duration_s: float, model: str = MODEL,
               requests: int | None = None, fields: dict[str, str] | None = None) -> list[dict]:
    """`clients` tasks sending clips round-robin for `duration_s` (at least one each), or until `requests` were
    sent: one record per request. Every request names its language (English), as the peer adapter assumes, and
    carries `fields` (a method, an encoder)."""
    import httpx

    records: list[dict] = []
    stop = time.perf_counter() + duration_s
    sent = 0

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal sent
        i = c
        while requests is None or sent < requests:         # by time, each client sends at least one request
            sent += 1
            data, seconds, reference = clips[i % len(clips)]
            t0 = time.perf_counter()
            r = await http.post(f"{url}/v1/audio/transcriptions", data={"model": model, "language": "en", **(fields or {})},
                                files={"file": ("clip.wav", data, "audio/wav")})
            records.append({"latency_s": time.perf_counter() - t0, "status": r.status_code, "audio_s": seconds,
                            "reference": reference, "text": r.json().get("text", "") if r.status_code == 200 else "",
                            "rss_mb": rss_mb()})
            i += clients
            if requests is None and time.perf_counter() >= stop:
                return

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(c, http) for c in range(clients)))
    return records


def rss_mb() -> float:
    """This process's resident memory now (the server runs in it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _point(server: str, clients: int, records: list[dict], wall_s: float) -> dict:
    ok = [r for r in records if r["status"] == 200]
    latency = sorted(r["latency_s"] for r in ok) or [0.0]
    return {"server": server, "clients": clients, "requests": len(records), "failed": len(records) - len(ok),
            "rss_mb_after": round(rss_mb()),
            "wall_s": round(wall_s, 2), "requests_per_s": round(len(ok) / wall_s, 3),
            "audio_s_per_s": round(sum(r["audio_s"] for r in ok) / wall_s, 3),
            "p50_s": round(statistics.median(latency), 3), "p95_s": round(float(np.percentile(latency, 95)), 3),
            "wer": round(100 * corpus_wer([r["reference"] for r in ok], [r["text"] for r in ok]).wer, 2) if ok else None}


def servers(asr) -> dict[str, tuple[Any, bool, dict[str, str]]]:
    """The servers measured: name -> (the pipeline behind the endpoints, continuous batching, the form fields every
    request carries). Ours in fp32 with greedy (continuous and per call); ours at precision "auto" (`mmaccel serve
    --precision auto`: the encoder compiled in bf16 where native, the decoder in int8) with greedy and with EAGLE
    (greedy's transcripts at that precision up to int8's rounding, in fewer decoder passes); and faster-whisper's
    batched pipeline (int8)."""
    from mmaccel.speech.pipeline import ASRPipeline

    auto = ASRPipeline(asr.bundle, heads=asr.heads, draft=asr.draft, precision="auto")
    return {"mmaccel": (asr, True, {}), "mmaccel-per-call": (asr, False, {}),
            "mmaccel-auto": (auto, True, {}), "mmaccel-eagle-auto": (auto, True, {"method": "eagle"}),
            "faster-whisper-batched-int8": (FasterWhisperPeer(asr), False, {})}


def run_serve_bench(quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """The result document: one row per (server, clients)."""
    import torch

    from mmaccel.serve.app import ServeConfig, create_app
    from mmaccel.speech.pipeline import ASRPipeline

    asr = ASRPipeline.from_pretrained("builtin:base")
    audio = clips()
    concurrency, duration = (QUICK_CONCURRENCY, QUICK_DURATION_S) if quick else (CONCURRENCY, DURATION_S)
    load_before = os.getloadavg()[0]
    rows, warm_rss = [], {}
    measured = servers(asr)
    for name, (pipeline, continuous, fields) in measured.items():
        app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: pipeline}, max_queue=256,
                                     continuous=continuous))
        with Served(app) as served:
            asyncio.run(load(served.url, audio, 1, 0.0, fields=fields))          # warm-up: one request
            warm_rss[name] = round(rss_mb())
            for clients in concurrency:
                t0 = time.perf_counter()
                records = asyncio.run(load(served.url, audio, clients, duration, fields=fields))
                rows.append(_point(name, clients, records, time.perf_counter() - t0))
                log(f"[serve] {rows[-1]}")
    return {"suite": "serve", "date": dt.date.today().isoformat(), "device": device_name(asr.model.device),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "load_before": round(load_before, 2),
            "config": {"model": MODEL, "duration_s": duration, "concurrency": list(concurrency), "quick": quick,
                       "audio": f"the {len(audio)} real clips, round-robin",
                       "fields": {name: fields for name, (_, _, fields) in measured.items()},
                       "options": "response_format json, language en, temperature fallback on (both servers' "
                                  "defaults; faster-whisper's batched pipeline decodes at the first temperature)"},
            "rss_mb_after_warm_up": warm_rss, "results": rows}


def load_table(rows: list[dict], group: str, columns: list[tuple[str, Callable[[dict], str]]]) -> str:
    """A Markdown table of load points: `group`, clients, requests, requests/s, `columns` (header, cell of a
    row) with "× one at a time" (requests/s over the group's one-client point) first, then p50 and p95."""
    heads = [group, "clients", "requests", "requests/s", *(h for h, _ in columns[:1]), "× one at a time", "p50 (s)",
             "p95 (s)", *(h for h, _ in columns[1:])]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        base = next(b for b in rows if b[group] == r[group] and b["clients"] == 1)
        ratio = r["requests_per_s"] / base["requests_per_s"] if base["requests_per_s"] else 0.0
        cells = [r[group], r["clients"], r["requests"], f"{r['requests_per_s']:.2f}", *(c(r) for _, c in columns[:1]),
                 f"{ratio:.2f}", f"{r['p50_s']:.2f}", f"{r['p95_s']:.2f}", *(c(r) for _, c in columns[1:])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    return load_table(doc["results"], "server", [("audio s/s", lambda r: f"{r['audio_s_per_s']:.2f}"),
                                                 ("WER", lambda r: r["wer"]),
                                                 ("memory after (MB)", lambda r: r.get("rss_mb_after", "–"))])


def plot(doc: dict, path) -> None:
    """Throughput and p95 latency against the number of clients, per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for server in dict.fromkeys(r["server"] for r in doc["results"]):
        rows = [r for r in doc["results"] if r["server"] == server]
        left.plot([r["clients"] for r in rows], [r["audio_s_per_s"] for r in rows], marker="o", label=server)
        right.plot([r["clients"] for r in rows], [r["p95_s"] for r in rows], marker="o", label=server)
    left.set(xlabel="concurrent clients", ylabel="audio seconds per second", xscale="log")
    right.set(xlabel="concurrent clients", ylabel="p95 latency (s)", xscale="log")
    left.legend()
    fig.suptitle(f"mmaccel serve, {doc['config']['model']}, {doc['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MEMORY_MODEL, MEMORY_REQUESTS, QUICK_MEMORY_REQUESTS, MEMORY_CLIENTS = "whisper-tiny.en", 1000, 64, 8


def memory_trend(records: list[dict], every: int = 100) -> dict:
    """The server's resident memory after every `every` requests (in the order they finished)."""
    marks = list(range(every, len(records) + 1, every))
    return {"requests": marks, "rss_mb": [round(records[m - 1]["rss_mb"]) for m in marks]}


def run_memory_check(quick: bool = False, requests: int | None = None, log: Callable[[str], None] = print) -> dict:
    """`mmaccel bench serve-memory`: `requests` (1 000; 64 with `quick`) from 8 clients to our server (Whisper
    tiny.en, so that the run takes minutes), the process's resident memory after every tenth of them."""
    import torch

    from mmaccel.serve.app import ServeConfig, create_app

    audio = clips()
    total = requests if requests is not None else QUICK_MEMORY_REQUESTS if quick else MEMORY_REQUESTS
    app = create_app(ServeConfig(models=(MEMORY_MODEL,), max_queue=256))
    with Served(app) as served:
        asyncio.run(load(served.url, audio, MEMORY_CLIENTS, 0.0, MEMORY_MODEL, requests=MEMORY_CLIENTS))   # warm-up
        warm = round(rss_mb())
        t0 = time.perf_counter()
        records = asyncio.run(load(served.url, audio, MEMORY_CLIENTS, 0.0, MEMORY_MODEL, requests=total))
        wall = time.perf_counter() - t0
    trend = memory_trend(records, every=max(1, total // 10))
    log(f"[serve-memory] {trend}")
    return {"suite": "serve-memory", "date": dt.date.today().isoformat(), "device": device_name(torch.device("cpu")),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "config": {"model": MEMORY_MODEL, "requests": total, "clients": MEMORY_CLIENTS, "quick": quick},
            "rss_mb_after_warm_up": warm, "failed": sum(r["status"] != 200 for r in records),
            "wall_s": round(wall, 1), "trend": trend,
            "growth_mb": trend["rss_mb"][-1] - trend["rss_mb"][0] if trend["rss_mb"] else None}


def memory_markdown(doc: dict) -> str:
    rows = zip(doc["trend"]["requests"], doc["trend"]["rss_mb"])
    return "\n".join(["| requests answered | resident memory (MB) |", "|---|---|", f"| 0 (after warm-up) | "
                      f"{doc['rss_mb_after_warm_up']} |", *(f"| {n} | {mb} |" for n, mb in rows)])


TEXT_MODEL, TEXT_MAX_TOKENS, TEXT_DURATION_S, QUICK_TEXT_DURATION_S = "smollm2-135m-instruct", 48, 60.0, 10.0
QUESTIONS = ("Name a colour.", "What is two plus two?", "Say hello to a friend.", "Name a river in Europe.",
             "What is the capital of France?", "Give one word for happy.", "Count to five.", "Name a fruit.",
             "Describe the sea in one sentence.", "Why is the sky blue?", "Name three animals.",
             "What day comes after Monday?", "Write a short greeting.", "What is a cat?", "Name a planet.",
             "Tell me a fun fact.")


async def chat_load(url: str, clients: int, duration_s: float) -> list[dict]:
    """`clients` tasks sending the questions round-robin (greedy, `TEXT_MAX_TOKENS` each) for `duration_s`."""
    import httpx

    records: list[dict] = []
    stop = time.perf_counter() + duration_s

    async def client(c: int, http: httpx.AsyncClient) -> None:
        i = c
        while True:
            question = QUESTIONS[i % len(QUESTIONS)]
            t0 = time.perf_counter()
            r = await http.post(f"{url}/v1/chat/completions", json={
                "model": TEXT_MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0,
                "max_tokens": TEXT_MAX_TOKENS})
            body = r.json() if r.status_code == 200 else {}
            records.append({"latency_s": time.perf_counter() - t0, "status": r.status_code, "question": question,
                            "text": body["choices"][0]["message"]["content"] if body else "",
                            "tokens": body["usage"]["completion_tokens"] if body else 0})
            i += clients
            if time.perf_counter() >= stop:
                return

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(c, http) for c in range(clients)))
    return records


def run_text_serve_bench(quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """`mmaccel bench serve-text`: chat completions under concurrent clients, with continuous batching (requests
    join calls in progress) against call-level batching (a request waits for the next call); greedy, so every
    answer must be the text the question gets alone."""
    import torch

    from mmaccel.lm.pipeline import TextPipeline
    from mmaccel.serve.app import ServeConfig, create_app

    pipeline = TextPipeline.from_pretrained("builtin:smollm2")
    alone = {q: pipeline.generate([q], max_new_tokens=TEXT_MAX_TOKENS).texts[0] for q in QUESTIONS}
    concurrency, duration = (QUICK_CONCURRENCY, QUICK_TEXT_DURATION_S) if quick else (CONCURRENCY, TEXT_DURATION_S)
    rows = []
    for name, continuous in (("continuous", True), ("per-call", False)):
        app = create_app(ServeConfig(models=(TEXT_MODEL,), pipelines={TEXT_MODEL: pipeline}, max_queue=256,
                                     continuous=continuous))
        with Served(app) as served:
            asyncio.run(chat_load(served.url, 1, 0.0))                          # warm-up: one request
            for clients in concurrency:
                t0 = time.perf_counter()
                records = asyncio.run(chat_load(served.url, clients, duration))
                wall = time.perf_counter() - t0
                ok = [r for r in records if r["status"] == 200]
                latency = sorted(r["latency_s"] for r in ok) or [0.0]
                rows.append({"batching": name, "clients": clients, "requests": len(records),
                             "failed": len(records) - len(ok), "wall_s": round(wall, 2),
                             "requests_per_s": round(len(ok) / wall, 3),
                             "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 2),
                             "p50_s": round(statistics.median(latency), 3),
                             "p95_s": round(float(np.percentile(latency, 95)), 3),
                             "same_as_alone": sum(r["text"] == alone[r["question"]] for r in ok) / max(1, len(ok))})
                log(f"[serve-text] {rows[-1]}")
    return {"suite": "serve-text", "date": dt.date.today().isoformat(), "device": device_name(torch.device("cpu")),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "config": {"model": TEXT_MODEL, "duration_s": duration, "concurrency": list(concurrency), "quick": quick,
                       "max_tokens": TEXT_MAX_TOKENS, "method": "ar", "temperature": 0, "max_rows": 8,
                       "questions": len(QUESTIONS)},
            "results": rows}


def text_markdown(doc: dict) -> str:
    return load_table(doc["results"], "batching", [("tokens/s", lambda r: f"{r['tokens_per_s']:.1f}"),
                                                   ("same text as alone", lambda r: f"{100 * r['same_as_alone']:.0f} %")])
