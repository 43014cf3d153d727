"""`mmaccel serve`: the OpenAI-compatible server (mmaccel.serve) on uvicorn, or on Ray Serve replicas (`--ray`)."""

from __future__ import annotations

import argparse
import os

from mmaccel.errors import check
from mmaccel.progress import say


def cmd_serve(args: argparse.Namespace) -> int:
    from mmaccel.serve.app import ServeConfig

    check(args.port == 0 or 1 <= args.port <= 65535, f"--port must be in [1, 65535], got {args.port}")
    check(args.ray or (args.replicas is None and args.ray_address is None and args.replica_cpus is None),
          "--replicas, --replica-cpus and --ray-address need --ray (scale-out on Ray Serve)")
    check(args.replicas is None or args.replicas >= 1, f"--replicas must be >= 1, got {args.replicas}")
    api_key = args.api_key or os.environ.get("MMACCEL_API_KEY") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        say(f"mmaccel serve: warning: listening on {args.host} without --api-key: anyone who reaches it can use it")
    config = ServeConfig(models=tuple(m.strip() for m in args.models.split(",") if m.strip()), api_key=api_key,
                         device=args.device, max_upload_mb=args.max_upload_mb, max_queue=args.max_queue,
                         max_rows=args.batch_rows, timeout_s=args.timeout, speech_method=args.speech_method,
                         image_method=args.image_method, text_method=args.text_method,
                         continuous=not args.per_call, speech_precision=args.precision)
    if args.ray:
        return _serve_on_ray(config, args)
    return _serve_on_uvicorn(config, args)


def _serve_on_uvicorn(config, args: argparse.Namespace) -> int:
    import uvicorn

    from mmaccel.serve.app import create_app
    from mmaccel.serve.lifecycle import GracefulServer

    app = create_app(config)
    say(f"mmaccel serve: {', '.join(config.models)} on http://{args.host}:{args.port} (OpenAI API under /v1)")
    server = GracefulServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level),
                            drain_timeout_s=args.timeout)
    server.run()
    return 0


def _serve_on_ray(config, args: argparse.Namespace) -> int:
    from mmaccel.serve.ray_app import run_ray

    replicas = args.replicas or 1
    run_ray(config, replicas, args.host, args.port, address=args.ray_address,
            cpus=1.0 if args.replica_cpus is None else args.replica_cpus,
            on_ready=lambda: say(f"mmaccel serve: {', '.join(config.models)} on http://{args.host}:{args.port} "
                                 f"(OpenAI API under /v1), {replicas} Ray Serve replica(s)"))
    return 0


def add_parser(subparsers) -> None:
    from mmaccel.engine.precision import CHOICES
    from mmaccel.serve.catalogue import CATALOGUE, DEFAULT_MODELS

    s = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/audio/transcriptions, ...)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /healthz "
                                                   "(default: $MMACCEL_API_KEY, else none)")
    s.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, of: {', '.join(CATALOGUE)}")
    s.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda where available)")
    s.add_argument("--speech-method", default="greedy", help="the method of a speech request that names none")
    s.add_argument("--image-method", default="ar", help="the method of an image request that names none")
    s.add_argument("--text-method", default="ar", help="the method of a text request that names none")
    s.add_argument("--precision", default="fp32", choices=CHOICES,
                   help="the speech models' precision: fp32 (as loaded), bf16, int8 or auto (each part as fast as it "
                        "measured on this CPU: the encoder bf16 where native, else fp32; the decoder int8); the "
                        "cheaper ones may change transcripts")
    s.add_argument("--per-call", action="store_true", help="requests wait for the next call instead of joining "
                                                          "calls in progress (continuous batching, the default)")
    s.add_argument("--batch-rows", type=int, default=8, help="rows (30-s windows) decoded together per call")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting per model before 429")
    s.add_argument("--max-upload-mb", type=float, default=25.0, help="the largest upload (413 above)")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds a request may wait and run (504 after)")
    s.add_argument("--ray", action="store_true", help="serve on Ray Serve replicas behind Ray's proxy "
                                                      "(pip install mmaccel[serve]; docs/serving.md)")
    s.add_argument("--replicas", type=int, default=None, help="with --ray: copies of the app, each with its own models "
                                                              "and batching (default 1)")
    s.add_argument("--replica-cpus", type=float, default=None, help="with --ray: cores each replica reserves (and "
                                                                     "its torch threads; default 1)")
    s.add_argument("--ray-address", default=None, help="with --ray: join a running cluster ('auto' or HOST:6379; "
                                                      "default: a Ray of its own on this machine)")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.set_defaults(func=cmd_serve)
