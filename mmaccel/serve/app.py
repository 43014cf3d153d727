"""The OpenAI-compatible HTTP app of `mmaccel serve` (FastAPI).

Routes: `POST /v1/audio/transcriptions` and `/v1/audio/translations` (`mmaccel.serve.speech`),
`POST /v1/images/generations` (`mmaccel.serve.images`), `POST /v1/completions` and `/v1/chat/completions`
(`mmaccel.serve.text`, streamed as server-sent events on request), `GET /v1/models`, `GET /v1/methods` (from the
method registries), `GET /healthz`, `GET /metrics` (Prometheus). Errors come in
OpenAI's envelope, `{"error": {"message": one line, "type": ..., "code": ...}}`: 400 for bad input, 401 without the
bearer token (with `api_key`, every route but /healthz needs it), 413 for an upload over the limit, 429 with
Retry-After when a model's queue is full, 503 while shutting down (`lifecycle`), 504 past the request timeout,
500 for a fault of ours (logged; the server goes on).

>>> app = create_app(ServeConfig(models=("whisper-tiny.en", "llamagen-fashion-mnist", "smollm2-135m-instruct")))
>>> uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from mmaccel.errors import InputError, MMAccelError, check
from mmaccel.serve import images, speech, text
from mmaccel.serve.batching import ClientGone, ModelWorker, QueueFull, ShuttingDown
from mmaccel.serve.catalogue import ALIASES, DEFAULT_MODELS, REGISTRY_OF, ServedModel, served_models
from mmaccel.serve.metrics import ServeMetrics

log = logging.getLogger("mmaccel.serve")
OPEN_ROUTES = ("/healthz",)          # served without the bearer token
POLL_S = 0.25                        # how often a waiting request checks whether its client is still there


@dataclass
class ServeConfig:
    """How `create_app` serves: the catalogue ids of the models to load, the bearer token every route but /healthz
    needs (None: no token), the device their pipelines load on, the upload limit, each model's queue bound and rows
    per call (30-s windows, images or completions), a request's whole timeout, the method of a request that names
    none (by family), whether requests join calls in progress, the speech models' precision and pipelines already
    loaded (by model id, for tests)."""

    models: tuple[str, ...] = DEFAULT_MODELS
    api_key: str | None = None
    device: str | None = None
    max_upload_mb: float = 25.0      # OpenAI's own limit
    max_queue: int = 64              # requests waiting per model
    max_rows: int = 8                # rows (30-s windows) of one call
    timeout_s: float = 600.0         # a request's whole wait: queue and call
    speech_method: str = "greedy"    # the method of a request that names none, by family
    image_method: str = "ar"
    text_method: str = "ar"
    continuous: bool = True          # requests join calls in progress (where the method can)
    speech_precision: str = "fp32"   # the speech models' precision (`mmaccel.engine.precision`; "auto": this CPU's)
    pipelines: dict[str, Any] = field(default_factory=dict, repr=False)   # model id -> a loaded pipeline (tests)


def _error(status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    first = (message.strip().splitlines() or ["error"])[0]
    return JSONResponse({"error": {"message": first, "type": kind, "param": None, "code": status}}, status,
                        headers=headers)


class Server:
    """The app's state: the served models, their workers and the metrics."""

    def __init__(self, config: ServeConfig):
        check(config.max_upload_mb > 0 and config.max_queue >= 1 and config.max_rows >= 1 and config.timeout_s > 0,
              "max_upload_mb, max_queue, max_rows and timeout_s must be positive")
        self.config = config
        self.models: dict[str, ServedModel] = {m.id: m for m in served_models(list(config.models))}
        self.metrics = ServeMetrics()
        self.pipelines: dict[str, Any] = {}
        self.workers: dict[str, ModelWorker] = {}
        self.draining = False            # set on the first exit signal (`lifecycle`): new requests get 503
        self.in_flight = 0               # requests being answered (the open routes aside)
        self.image_sizes: dict[str, str] = {}
        for m in self.models.values():
            pipeline = self.pipelines[m.id] = config.pipelines.get(m.id) or m.load(config.device, config.speech_precision)
            self.workers[m.id] = self._worker(m, pipeline)
            self.metrics.watch_queue(m.id, lambda w=self.workers[m.id]: w.depth)

    def _worker(self, m: ServedModel, pipeline) -> ModelWorker:
        rows, queue = self.config.max_rows, self.config.max_queue
        if m.family == "speech":
            return speech.speech_worker(m.id, pipeline, max_rows=rows, max_queue=queue, continuous=self.config.continuous,
                                        on_call=lambda call: (
                self.metrics.observe_call(call, speech.passes_per_token(call))))
        if m.family == "image":
            self.image_sizes[m.id] = "{}x{}".format(*pipeline.generate([0], "ar", seed=0).images[0].size)  # warm-up
            return images.image_worker(m.id, pipeline, m.pipeline, max_rows=rows, max_queue=queue,
                                       continuous=self.config.continuous,
                                       on_call=lambda call: self.metrics.observe_call(call, None))
        return text.text_worker(m.id, pipeline, max_rows=rows, max_queue=queue, continuous=self.config.continuous,
                                on_call=lambda call: (
            self.metrics.observe_call(call, text.passes_per_token(call.result))))

    def model(self, requested: str, family: str) -> str:
        """The served model id a request names (or an alias such as whisper-1)."""
        if ALIASES.get(requested) == family:
            requested = next((m.id for m in self.models.values() if m.family == family), requested)
        check(requested in self.models, f"model {requested!r} is not served here; "
                                        f"GET /v1/models lists {', '.join(self.models)}")
        check(self.models[requested].family == family, f"model {requested!r} is a {self.models[requested].family} "
                                                         f"model; this endpoint needs a {family} model")
        return requested

    def close(self) -> None:
        """Answer new requests 503 and close every model's worker; returns once each has answered its waiting
        requests."""
        self.draining = True
        for worker in self.workers.values():
            worker.close()


async def _await(request: Request, future: concurrent.futures.Future, worker: ModelWorker, timeout_s: float):
    """The job's result, waiting at most `timeout_s`; a client that went away takes its job out of the queue (or
    frees its rows in a joining call: `ModelWorker.abandon`)."""
    waiting = asyncio.wrap_future(future)
    deadline = time.monotonic() + timeout_s
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=POLL_S)
        if done:
            return waiting.result()
        if await request.is_disconnected():
            worker.abandon(future)
            waiting.cancel()                    # what the job still ends with is heard by no one
            raise ClientGone
        if time.monotonic() > deadline:
            worker.abandon(future)
            waiting.cancel()
            raise HTTPException(504, f"the request took over {timeout_s:g} s")


async def _json(request: Request) -> Any:
    """The request's JSON body; one line when it is not JSON."""
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"the request body is not valid JSON ({err})") from None


def create_app(config: ServeConfig | None = None) -> FastAPI:
    """The app serving `config.models` (loaded now, so a bad model fails here rather than at the first request)."""
    config = config or ServeConfig()
    server = Server(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await run_in_threadpool(server.close)

    app = FastAPI(title="mmaccel", summary="OpenAI-compatible serving of mmaccel's fast decoding", lifespan=lifespan)
    app.state.server = server

    @app.middleware("http")
    async def guard(request: Request, call_next):
        start = time.perf_counter()
        path = request.url.path
        length = request.headers.get("content-length")
        given = request.headers.get("authorization", "")
        if config.api_key and path not in OPEN_ROUTES and not hmac.compare_digest(
                given.encode(), f"Bearer {config.api_key}".encode()):
            response = _error(401, "a valid API key is needed: Authorization: Bearer <key>", "authentication_error")
        elif server.draining and path not in OPEN_ROUTES:
            response = _error(503, "the server is shutting down", "server_error", {"Connection": "close"})
        elif length is not None and length.isdigit() and int(length) > config.max_upload_mb * 2**20 + 2**16:
            response = _error(413, f"the request is {int(length)} bytes; uploads are limited to "
                                   f"{config.max_upload_mb:g} MiB")
        elif path in OPEN_ROUTES:
            response = await call_next(request)
        else:
            server.in_flight += 1
            try:
                response = await call_next(request)
            finally:
                server.in_flight -= 1
        server.metrics.observe_request(path if path in routes else "other", response.status_code,
                                       time.perf_counter() - start)
        return response

    @app.exception_handler(MMAccelError)
    async def bad_input(request: Request, err: MMAccelError):
        if isinstance(err, QueueFull):
            return _error(429, str(err), "rate_limit_error", {"Retry-After": "1"})
        if isinstance(err, ShuttingDown):
            return _error(503, str(err), "server_error")
        if isinstance(err, speech.TooLarge):
            return _error(413, str(err))
        return _error(400, str(err))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        return _error(err.status_code, str(err.detail), "invalid_request_error" if err.status_code < 500 else "server_error")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request")

    @app.exception_handler(ClientGone)
    async def gone(request: Request, err: ClientGone):
        return _error(499, "the client closed the request")

    @app.exception_handler(Exception)
    async def fault(request: Request, err: Exception):
        log.exception("request %s failed", request.url.path)
        return _error(500, f"internal error ({type(err).__name__}): {err}", "server_error")

    async def audio(request: Request, task: str) -> Response:
        form = await request.form(max_files=1, max_fields=32)
        try:
            parsed, upload = speech.parse_request(form, task, config.speech_method, int(config.max_upload_mb * 2**20))
            model = server.model(parsed.model, "speech")
            speech.check_options(server.pipelines[model], parsed.options)     # before it can fail a shared call
            data = await run_in_threadpool(speech.read_upload, upload)
        finally:
            await form.close()
        worker = server.workers[model]
        future = worker.submit(parsed.options, data, speech.windows(data))
        transcript = await _await(request, future, worker, config.timeout_s)
        if transcript.error is not None:
            raise InputError(transcript.error)
        body, media = speech.render(parsed, transcript)
        if isinstance(body, dict):
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=media)

    async def completion(request: Request, kind: str) -> Response:
        parsed = text.parse_request(await _json(request), kind, config.text_method, config.max_rows)
        model = server.model(parsed.model, "text")
        pipeline = server.pipelines[model]
        text.check_options(pipeline, parsed.options)
        ids = text.prompt_ids(pipeline, parsed)
        stream = text.TokenStream(asyncio.get_running_loop()) if parsed.stream else None
        worker = server.workers[model]
        future = worker.submit(parsed.options, text.TextJob(ids, parsed.n, parsed.max_tokens, stream), parsed.n)
        if stream is None:
            return JSONResponse(text.render(parsed, await _await(request, future, worker, config.timeout_s), model))
        return StreamingResponse(text.stream_events(parsed, model, future, worker, stream, pipeline.tokenizer),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        """OpenAI's transcription request (multipart), plus `method`, `method_params` (JSON) and `vad_filter`."""
        return await audio(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        """Speech in any language to English text (a multilingual model)."""
        return await audio(request, "translate")

    @app.post("/v1/images/generations")
    async def image_generations(request: Request) -> Response:
        """OpenAI's image request: `prompt` names a class; plus `method`, `method_params`, `seed`, `cfg_scale`."""
        parsed = images.parse_request(await _json(request), config.image_method, config.max_rows)
        model = server.model(parsed.model, "image")
        pipeline = server.pipelines[model]
        check(parsed.size in (None, "auto", server.image_sizes[model]),
              f"size {parsed.size!r} is not drawn by {model}: it draws {server.image_sizes[model]}")
        images.check_options(pipeline, parsed.options)
        label = images.label_of(pipeline, parsed.prompt)
        worker = server.workers[model]
        future = worker.submit(parsed.options, (label, parsed.n), parsed.n)
        return JSONResponse(images.render(parsed, await _await(request, future, worker, config.timeout_s)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """OpenAI's (legacy) completion request on a text model; `stream: true` answers with server-sent events."""
        return await completion(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """OpenAI's chat completion request on a text model; `stream: true` answers with server-sent events."""
        return await completion(request, "chat")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": m.id, "object": "model", "created": 0, "owned_by": "mmaccel",
                                            "family": m.family, "source": m.source} for m in server.models.values()]}

    @app.get("/v1/methods")
    async def methods() -> dict:
        from mmaccel.registries import method_registry

        registries = {REGISTRY_OF[m.pipeline]: m.family for m in server.models.values()}
        return {"object": "list", "data": [
            {"id": name, "object": "method", "family": family, "registry": registry, "exactness": plugin.exactness,
             "summary": plugin.summary, "needs": list(plugin.needs), "parameters": plugin.parameters()}
            for registry, family in sorted(registries.items()) for name, plugin in method_registry(registry).items()]}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "draining" if server.draining else "ok", "models": list(server.models),
                "queue": {name: w.depth for name, w in server.workers.items()}}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=server.metrics.content_type)

    routes = {r.path for r in app.routes}
    return app
