"""The OpenAI-compatible app on Whisper tiny.en: every response format, requests decoded together that return what
each returns alone, every bad request answered with one line (the server goes on), the bearer token, the
listing and metrics routes, and the official `openai` client against the app served by uvicorn on loopback."""

import io
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from mmaccel.serve.app import ServeConfig, create_app
from tests.conftest import NATIVE_CHEAP
from tests.serve.conftest import WAIT_S, Gated, served, until
from tests.speech.test_pipeline import FILES, files  # noqa: F401  (fixture)

MODEL = "whisper-tiny.en"


@pytest.fixture(scope="module")
def gated(tiny_en_asr):
    return Gated(tiny_en_asr, "transcribe")


@pytest.fixture(scope="module")
def client(gated):
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, max_upload_mb=1.0))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _post(client, path, name, data=None, content=None, route="/v1/audio/transcriptions"):
    content = open(path, "rb").read() if content is None else content
    return client.post(route, files={"file": (name, content, "audio/wav")}, data={"model": MODEL, **(data or {})})


def test_every_response_format(client, tiny_en_asr, files):  # noqa: F811
    alone = tiny_en_asr.transcribe(files[0]).texts[0].strip()
    r = _post(client, files[0], "a.wav")
    assert r.status_code == 200 and r.json() == {"text": alone}
    r = _post(client, files[0], "a.wav", {"response_format": "text"})
    assert r.status_code == 200 and r.text == alone + "\n" and r.headers["content-type"].startswith("text/plain")
    srt = _post(client, files[0], "a.wav", {"response_format": "srt"}).text
    assert srt.startswith("1\n00:00:00,000 --> 00:00:0") and "-->" in srt
    assert _post(client, files[0], "a.wav", {"response_format": "vtt"}).text.startswith("WEBVTT\n\n00:00.000 --> ")
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", open(files[0], "rb"), "audio/wav")},
                    data={"model": "whisper-1", "response_format": "verbose_json",
                          "timestamp_granularities[]": ["word", "segment"]})
    body = r.json()
    assert r.status_code == 200, body
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert abs(body["duration"] - sf.info(files[0]).duration) < 0.01 and body["mmaccel"]["method"] == "greedy"
    assert body["mmaccel"]["encoder"] is None           # not asked for: the server's own precision ran
    assert body["segments"] and all(s["start"] <= s["end"] for s in body["segments"])
    words = body["words"]
    assert len(words) >= 5 and all(w["start"] <= w["end"] for w in words)
    assert " ".join(w["word"] for w in words).split() == " ".join(s["text"] for s in body["segments"]).split()


def test_a_cheaper_encoder_gives_what_the_pipeline_gives_with_it(client, tiny_en_asr, files):  # noqa: F811
    want = tiny_en_asr.transcribe(files[0], "eagle", encoder=NATIVE_CHEAP).texts[0].strip()
    r = _post(client, files[0], "a.wav", {"encoder": NATIVE_CHEAP, "method": "eagle", "response_format": "verbose_json"})
    assert r.status_code == 200 and r.json()["text"] == want and r.json()["mmaccel"]["encoder"] == NATIVE_CHEAP


def test_a_prompt_conditions_the_transcript(client, tiny_en_asr, files):  # noqa: F811
    hint = "Dashwood, Norland, ill-disposed."
    alone = tiny_en_asr.transcribe(files[1], initial_prompt=hint).texts[0].strip()
    r = _post(client, files[1], "a.wav", {"prompt": hint})
    assert r.status_code == 200 and r.json() == {"text": alone} and "ill-disposed" in alone


def test_requests_decoded_together_return_what_each_returns_alone(client, gated, files):  # noqa: F811
    """Per-call batching (--per-call): requests that queue while a call decodes share the next call."""
    paths = (files * 2)[:6]
    alone = [_post(client, p, "a.wav", {"response_format": "verbose_json"}).json() for p in paths]
    gated.batches.clear()
    gated.hold.clear()                            # the first request's call waits: the other five queue behind it
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, continuous=False))
    with TestClient(app, raise_server_exceptions=False) as client, ThreadPoolExecutor(len(paths)) as pool:
        worker = client.app.state.server.workers[MODEL]
        first = pool.submit(_post, client, paths[0], "a.wav", {"response_format": "verbose_json", "method": "eagle"})
        until(lambda: gated.batches)
        rest = [pool.submit(_post, client, p, "a.wav", {"response_format": "verbose_json", "method": "eagle"})
                for p in paths[1:]]
        until(lambda: worker.depth == len(rest))
        gated.hold.set()
        together = [f.result(WAIT_S).json() for f in [first, *rest]]
        metrics = client.get("/metrics").text
    assert gated.batches == [1, 5]                # the five waiting requests shared one call
    for a, b in zip(alone, together):
        assert b["mmaccel"]["method"] == "eagle" and a["mmaccel"]["method"] == "greedy"
        assert [s["tokens"] for s in a["segments"]] == [s["tokens"] for s in b["segments"]]     # token for token
    assert 'mmaccel_batch_requests_bucket{le="4.0",model="whisper-tiny.en"}' in metrics


class Encoding:
    """A pipeline whose encoder, at its n-th use, first runs `before[n]` (a wait on the test's thread); `calls`
    counts the joined calls (one options check each)."""

    def __init__(self, pipeline, before):
        self.pipeline, self.before, self.encoded, self.calls = pipeline, before, 0, 0

    def _encode(self, *args, **kwargs):
        self.encoded += 1
        self.before.get(self.encoded, lambda: None)()
        return self.pipeline._encode(*args, **kwargs)

    def _job(self, *args, **kwargs):
        self.calls += 1
        return self.pipeline._job(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pipeline, name)


def test_a_request_joins_a_call_in_progress(tiny_en_asr, files):  # noqa: F811
    """The first call (one request on an idle server) holds until two requests queue; the second call (a
    59-s audio's two windows and a clip, one spare row) holds until a fourth request queues, which takes the
    spare row at the first step: two calls in all, and every answer is what each request gets alone."""
    clips = [sf.read(f, dtype="float32")[0] for f in files]
    pause = np.zeros(16000, np.float32)
    long = np.concatenate([x for c in clips + clips for x in (c, pause)])
    buf = io.BytesIO()
    sf.write(buf, long, 16000, format="WAV")
    uploads = {"first": open(files[0], "rb").read(), "long": buf.getvalue(), "short": open(files[1], "rb").read(),
               "joiner": open(files[2], "rb").read()}
    alone = {name: tiny_en_asr.transcribe(sf.read(io.BytesIO(data), dtype="float32")[0], sample_rate=16000).texts[0]
             for name, data in uploads.items()}
    pipeline = Encoding(tiny_en_asr, {1: lambda: until(lambda: worker.depth == 2),
                                      2: lambda: until(lambda: worker.depth == 1)})
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: pipeline}, max_rows=4))
    with TestClient(app, raise_server_exceptions=False) as client, ThreadPoolExecutor(4) as pool:
        worker = client.app.state.server.workers[MODEL]
        post = lambda name: client.post("/v1/audio/transcriptions", data={"model": MODEL},  # noqa: E731
                                        files={"file": (f"{name}.wav", uploads[name])}).json()
        first = pool.submit(post, "first")
        until(lambda: pipeline.calls == 1)
        long, short = pool.submit(post, "long"), pool.submit(post, "short")
        until(lambda: pipeline.calls == 2)
        joiner = pool.submit(post, "joiner")
        answers = {"first": first.result(WAIT_S), "long": long.result(WAIT_S), "short": short.result(WAIT_S),
                   "joiner": joiner.result(WAIT_S)}
    assert pipeline.calls == 2                    # the fourth request joined the second call
    assert answers == {name: {"text": text.strip()} for name, text in alone.items()}


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * 16000), np.float32), 16000, format="WAV")
    return buf.getvalue()


BAD = [  # (form fields, upload name, upload bytes (None: a real clip), route, status, start of the message)
    ({}, "notes.txt", b"these are not audio samples", None, 400, "cannot read notes.txt as audio"),
    ({}, "empty.wav", b"", None, 400, "audio file is empty (0 bytes): empty.wav"),
    ({}, "big.wav", _wav(40.0), None, 413, "the request is"),
    ({"model": "whisper-9"}, "a.wav", None, None, 400, "model 'whisper-9' is not served here"),
    ({"method": "fastest"}, "a.wav", None, None, 400, "unknown method 'fastest'"),
    ({"method": "speculative", "method_params": '{"k": 0}'}, "a.wav", None, None, 400, "k must be"),
    ({"method": "medusa"}, "a.wav", None, None, 400, "method 'medusa' needs trained Medusa heads"),
    ({"method_params": "{k: 4"}, "a.wav", None, None, 400, "method_params is not valid JSON"),
    ({"encoder": "fp16"}, "a.wav", None, None, 400, "encoder must be one of fp32, bf16, int8, got 'fp16'"),
    ({"stream": "true"}, "a.wav", None, None, 400, "unknown field(s) stream"),
    ({"response_format": "xml"}, "a.wav", None, None, 400, "response_format must be one of"),
    ({"timestamp_granularities[]": "word"}, "a.wav", None, None, 400, "timestamp_granularities[] needs"),
    ({"temperature": "hot"}, "a.wav", None, None, 400, "temperature must be a number"),
    ({"language": "xx"}, "a.wav", None, None, 400, "this is an English-only Whisper"),
    ({}, "a.wav", None, "/v1/audio/translations", 400, "this is an English-only Whisper; it can only transcribe"),
]


@pytest.mark.parametrize("fields,name,content,route,status,message", BAD)
def test_bad_requests_get_one_line_and_the_server_goes_on(client, files, fields, name, content, route, status,  # noqa: F811
                                                           message):
    r = client.post(route or "/v1/audio/transcriptions", files={"file": (name, open(files[0], "rb").read()
                                                                         if content is None else content)},
                    data={"model": MODEL, **fields})
    error = r.json()["error"]
    assert r.status_code == status and error["message"].startswith(message), error
    assert "\n" not in error["message"] and "/tmp" not in error["message"]
    assert client.get("/healthz").json()["status"] == "ok"


def test_an_upload_over_the_limit_without_a_content_length_is_413(client):
    boundary = "mmaccel-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{MODEL}\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename=\"big.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            ).encode() + _wav(40.0) + f"\r\n--{boundary}--\r\n".encode()
    r = client.post("/v1/audio/transcriptions", content=iter([body]),       # chunked: no Content-Length
                    headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413 and r.json()["error"]["message"].startswith("the upload is"), r.text


def test_requests_without_a_file_or_with_malformed_bodies(client):
    r = client.post("/v1/audio/transcriptions", data={"model": MODEL})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the request needs one audio upload")
    r = client.post("/v1/audio/transcriptions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "\n" not in r.json()["error"]["message"]
    assert client.get("/v1/nothing").status_code == 404


def test_listing_health_and_metrics_routes(client):
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL]
    methods = {m["id"]: m for m in client.get("/v1/methods").json()["data"]}
    assert {"greedy", "speculative", "eagle", "beam"} <= set(methods)
    assert methods["calm"]["exactness"] == "relaxed" and methods["speculative"]["parameters"][0]["name"] == "k"
    assert client.get("/healthz").json() == {"status": "ok", "models": [MODEL], "queue": {MODEL: 0}}
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "mmaccel_requests_total" in metrics.text
    assert 'mmaccel_queue_depth{model="whisper-tiny.en"} 0.0' in metrics.text


def test_an_api_key_guards_every_route_but_healthz(gated, files):  # noqa: F811
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, api_key="s3cret"))
    with TestClient(app) as c:
        assert c.get("/healthz").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.get("/v1/models", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


@pytest.fixture(scope="module")
def live(gated):
    """The app under uvicorn on a free loopback port, for the official client."""
    with served(create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, api_key="k"))) as url:
        yield f"{url}/v1"


def test_the_official_openai_client(live, tiny_en_asr, files):  # noqa: F811
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=live, api_key="k", max_retries=0)
    alone = tiny_en_asr.transcribe(files[1]).texts[0].strip()
    with open(files[1], "rb") as f:
        assert client.audio.transcriptions.create(model="whisper-1", file=f).text == alone
    with open(files[1], "rb") as f:
        verbose = client.audio.transcriptions.create(model=MODEL, file=f, response_format="verbose_json",
                                                     timestamp_granularities=["word", "segment"])
    assert verbose.text == alone and verbose.words and verbose.segments and verbose.language == "english"
    with open(files[1], "rb") as f:
        srt = client.audio.transcriptions.create(model=MODEL, file=f, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 -->")
    with open(files[1], "rb") as f, pytest.raises(openai.BadRequestError, match="it can only transcribe"):
        client.audio.translations.create(model=MODEL, file=f)
    with open(files[1], "rb") as f, pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live, api_key="wrong", max_retries=0).audio.transcriptions.create(model=MODEL, file=f)


def test_curl(live, tiny_en_asr, files):  # noqa: F811
    import json
    import shutil
    import subprocess

    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    out = subprocess.run(["curl", "-sS", "--max-time", str(WAIT_S), "-H", "Authorization: Bearer k", "-F",
                          "model=whisper-1", "-F", f"file=@{files[0]}", f"{live}/audio/transcriptions"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"text": tiny_en_asr.transcribe(files[0]).texts[0].strip()}


def test_an_exit_signal_lets_requests_in_flight_finish_and_refuses_new_ones(gated, files):  # noqa: F811
    import signal

    import httpx
    import uvicorn

    from mmaccel.serve.lifecycle import GracefulServer

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, continuous=False))
    server = GracefulServer(uvicorn.Config(app, log_level="warning"), drain_timeout_s=WAIT_S)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: server.started)
    gated.batches.clear()
    gated.hold.clear()
    with ThreadPoolExecutor(1) as pool:
        post = lambda: httpx.post(f"{url}/v1/audio/transcriptions", data={"model": MODEL},  # noqa: E731
                                  files={"file": ("a.wav", open(files[0], "rb").read())}, timeout=WAIT_S)
        in_flight = pool.submit(post)
        until(lambda: gated.batches)             # its call has started (and waits)
        server.handle_exit(signal.SIGTERM, None)
        refused = post()
        assert refused.status_code == 503 and refused.json()["error"]["message"] == "the server is shutting down"
        assert httpx.get(f"{url}/healthz").json()["status"] == "draining"
        assert thread.is_alive()                  # a request is still in flight
        gated.hold.set()
        done = in_flight.result(WAIT_S)
    assert done.status_code == 200 and done.json()["text"]
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_the_speech_models_load_at_the_servers_precision(monkeypatch):
    from mmaccel.serve.catalogue import CATALOGUE
    from mmaccel.speech import pipeline

    asked = {}
    monkeypatch.setattr(pipeline.ASRPipeline, "from_pretrained",
                        classmethod(lambda cls, source, **kw: asked.setdefault(source, kw)))
    CATALOGUE["whisper-tiny.en"].load(None, "auto")
    assert asked["builtin:tiny.en"] == {"device": None, "precision": "auto"}
    assert ServeConfig().speech_precision == "fp32"            # the model as loaded unless asked


def test_a_request_without_an_encoder_runs_the_servers_precision(tiny_en_asr, files):  # noqa: F811
    from mmaccel.speech.pipeline import ASRPipeline

    int8 = ASRPipeline(tiny_en_asr.bundle, precision="int8")
    encoders = []
    transcribe = int8.transcribe

    def spied(*args, **kwargs):
        encoders.append(int8.encoder(kwargs.get("encoder")))
        return transcribe(*args, **kwargs)

    int8.transcribe = spied
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: int8}, continuous=False))
    with TestClient(app) as c:
        r = _post(c, files[0], "a.wav")
    assert r.status_code == 200 and r.json()["text"] == transcribe(files[0]).texts[0].strip()
    assert encoders and all(e is int8.encoder("int8") for e in encoders)
