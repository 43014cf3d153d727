"""`mmaccel serve --ray`: the app of `mmaccel.serve.app` as a Ray Serve deployment, for scale-out over replicas.

Each replica builds the same FastAPI app (`create_app`) in its own process, so its models, their `ModelWorker`
batching and its metrics live in the replica; Ray's HTTP proxy routes every request to one replica (the less
loaded of two it samples) and the controller replaces a replica that dies. Responses carry
`X-MMAccel-Replica: <Ray's replica id>`, so a client (or a test) can tell which replica answered.

>>> run_ray(ServeConfig(models=("whisper-base",)), replicas=4, host="127.0.0.1", port=8000)   # blocks until SIGTERM

For `serve run` / `serve deploy` a config file names `mmaccel.serve.ray_app:app_builder` with `args`
(`docs/ray_serve.yaml`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from typing import Any

from mmaccel.errors import InputError, check
from mmaccel.serve.app import ServeConfig, create_app
from mmaccel.serve.catalogue import served_models

APP_NAME = "mmaccel"                  # the Serve application's name
DEPLOYMENT = "mmaccel"                # its one deployment (config files override its options by this name)
REPLICA_HEADER = "x-mmaccel-replica"
INSTALL = "Ray Serve is not installed: pip install mmaccel[serve]"
EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _serve():
    """`ray.serve`, or a one-line error naming the extra that carries it."""
    try:
        from ray import serve
    except ImportError as err:
        raise InputError(INSTALL) from err
    return serve


class ReplicaHeader:
    """ASGI middleware: every HTTP response names the replica that answered it."""

    def __init__(self, app, replica: str):
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), self.replica)]}
            await send(message)

        await self.app(scope, receive, send_named)


def build_deployment(config: ServeConfig, replicas: int = 1, cpus: float = 1.0):
    """The Serve application (`Deployment.bind()`) of `replicas` replicas, each running `create_app(config)`.

    A replica reserves `cpus` cores (Ray sizes its torch threads to them) and one GPU when `config.device` is CUDA
    (without one, Ray hides the GPUs from it). It admits up to `max_queue + max_rows` requests, so the app's own
    queue limit (429) is the back-pressure, as alone; stopping it waits up to `timeout_s` for the requests in
    flight, as `mmaccel serve` does on SIGTERM.
    """
    serve = _serve()
    check(isinstance(replicas, int) and replicas >= 1, f"replicas must be an integer >= 1, got {replicas!r}")
    check(cpus > 0, f"a replica needs cpus > 0, got {cpus}")
    check(not config.pipelines, "under Ray each replica loads its own models: leave ServeConfig.pipelines empty")
    served_models(list(config.models))               # a bad model id fails here, not in every replica
    gpu = bool(config.device) and config.device.startswith("cuda")

    def build_app():                                 # runs in each replica (Ray calls it at replica start)
        app = create_app(config)
        app.add_middleware(ReplicaHeader, replica=serve.get_replica_context().replica_id.unique_id)
        return app

    ingress = serve.ingress(build_app)()
    deployment = serve.deployment(ingress, name=DEPLOYMENT, num_replicas=replicas,
                                  ray_actor_options={"num_cpus": cpus, "num_gpus": 1 if gpu else 0},
                                  max_ongoing_requests=config.max_queue + config.max_rows,
                                  graceful_shutdown_timeout_s=config.timeout_s)
    return deployment.bind()


def _coerce(name: str, default: Any, value: Any) -> Any:
    """An `args` value of a config file (typed by YAML, or a string of `serve run ... name=value`) as the type of
    the field's `default`."""
    try:
        if isinstance(default, tuple):
            return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else tuple(value)
        if isinstance(default, bool):
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        if isinstance(default, int | float):
            return type(default)(value)
    except (TypeError, ValueError) as err:
        raise InputError(f"args.{name}: cannot read {value!r} as {type(default).__name__}") from err
    return value if value is None or not isinstance(default, str | None) else str(value)


def config_from_args(args: dict[str, Any]) -> tuple[ServeConfig, int]:
    """The `ServeConfig` and replica count of a config file's `args` (the fields of ServeConfig, plus `replicas`)."""
    args = dict(args or {})
    replicas = _coerce("replicas", 1, args.pop("replicas", 1))
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(ServeConfig) if f.name != "pipelines"}
    unknown = sorted(set(args) - set(defaults))
    check(not unknown, f"unknown args {', '.join(unknown)}; the app takes replicas, {', '.join(defaults)}")
    return ServeConfig(**{name: _coerce(name, defaults[name], value) for name, value in args.items()}), replicas


def app_builder(args: dict[str, Any]):
    """The application of a Ray Serve config file: `import_path: mmaccel.serve.ray_app:app_builder`, `args: {models:
    [whisper-base], max_rows: 8, ...}` (`docs/ray_serve.yaml`). `api_key` defaults to $MMACCEL_API_KEY where the
    app is built (the application's `runtime_env.env_vars` can carry it), as for `mmaccel serve`."""
    args = dict(args or {})
    args.setdefault("api_key", os.environ.get("MMACCEL_API_KEY") or None)
    config, replicas = config_from_args(args)
    return build_deployment(config, replicas)


def _wait_for_exit_signal() -> None:
    """Block until SIGINT or SIGTERM. A second one ends the process at once (the default action: Python's handlers
    would wait for Ray's blocking calls to return), and a Ray started here goes with it."""
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
        for sig in EXIT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    for sig in EXIT_SIGNALS:
        signal.signal(sig, on_signal)
    while not stop.wait(1.0):
        pass


def run_ray(config: ServeConfig, replicas: int, host: str, port: int, address: str | None = None, cpus: float = 1.0,
            on_ready=None) -> None:
    """Serve `config` on `replicas` replicas of `cpus` cores behind Ray's proxy at http://host:port until SIGINT or
    SIGTERM.

    `address` None starts a Ray of its own on this machine (stopped on exit); "auto" or "HOST:6379" joins a running
    cluster (`ray start --head`), where on exit only this application is deleted. `on_ready()` is called once the
    replicas answer.
    """
    serve = _serve()
    import ray

    check(1 <= port <= 65535, f"Ray Serve needs a fixed port in [1, 65535], got {port}")
    application = build_deployment(config, replicas, cpus)
    ray.init(address=address or "local")
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application, name=APP_NAME, route_prefix="/")
        if on_ready is not None:
            on_ready()
        _wait_for_exit_signal()
        serve.delete(APP_NAME)                      # replicas finish their requests in flight (graceful shutdown)
        if address is None:
            serve.shutdown()
    finally:
        ray.shutdown()
