"""`mmaccel bench serve`'s parts: the load clients against a stand-in app on loopback (with no time left each
client sends one request), a point's aggregates and the table's ratios over one request at a time."""

import asyncio

from fastapi import FastAPI, Request

from mmaccel.bench.serve_suite import Served, _point, load, markdown, memory_trend, text_markdown


def test_each_client_sends_at_least_one_request_and_records_it():
    app = FastAPI()
    seen = []

    @app.post("/v1/audio/transcriptions")
    async def echo(request: Request):
        form = await request.form()
        seen.append((form["model"], form.get("encoder"), len(await form["file"].read())))
        return {"text": "hello world"}

    clips = [(b"a" * 10, 1.5, "hello world"), (b"b" * 20, 2.5, "hello there")]
    with Served(app) as served:
        records = asyncio.run(load(served.url, clips, 3, 0.0, fields={"encoder": "bf16"}))
    assert sorted(n for _, _, n in seen) == [10, 10, 20] and {(m, e) for m, e, _ in seen} == {("whisper-base", "bf16")}
    point = _point("echo", 3, records, 2.0)
    assert (point["requests"], point["failed"], point["requests_per_s"], point["audio_s_per_s"]) == (3, 0, 1.5, 2.75)
    assert point["wer"] == round(100 * 1 / 6, 2)               # "there" for "world" in one of three two-word clips


def test_a_run_by_request_count_sends_that_many():
    app = FastAPI()
    languages = []

    @app.post("/v1/audio/transcriptions")
    async def echo(request: Request):
        languages.append((await request.form())["language"])
        return {"text": "hello world"}

    with Served(app) as served:
        records = asyncio.run(load(served.url, [(b"a", 1.0, "hello world")], 3, 600.0, requests=7))
    assert len(records) == 7 and languages == ["en"] * 7 and all(r["rss_mb"] > 0 for r in records)
    assert memory_trend(records, every=2)["requests"] == [2, 4, 6]


def test_the_table_compares_each_point_with_one_request_at_a_time():
    rows = [{"server": s, "clients": c, "requests": 10, "requests_per_s": rps, "audio_s_per_s": rps * 3,
             "p50_s": 1.0, "p95_s": 2.0, "wer": 5.0} for s, c, rps in (("a", 1, 2.0), ("a", 4, 5.0), ("b", 1, 1.0))]
    table = markdown({"results": rows})
    assert "| a | 4 | 10 | 5.00 | 15.00 | 2.50 |" in table and "| b | 1 | 10 | 1.00 | 3.00 | 1.00 |" in table
    assert table.splitlines()[0].endswith("memory after (MB) |")


def test_the_text_table_compares_each_batching_with_its_own_lone_requests():
    rows = [{"batching": b, "clients": c, "requests": 9, "requests_per_s": rps, "tokens_per_s": rps * 40,
             "p50_s": 1.0, "p95_s": 2.0, "same_as_alone": same}
            for b, c, rps, same in (("continuous", 1, 1.0, 1.0), ("continuous", 16, 3.0, 1.0), ("per-call", 1, 1.0, 0.5))]
    table = text_markdown({"results": rows})
    assert "| continuous | 16 | 9 | 3.00 | 120.0 | 3.00 |" in table and table.endswith("| 50 % |")
