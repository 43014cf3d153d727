"""The mmaccel web app: one Gradio Blocks with a tab per modality, over the pipelines.

    python -m demos [--host 127.0.0.1] [--port 7860]      (or `mmaccel demo`, or `make demo`)

Models load once per process, on a tab's first request, and every session shares them (demos.shared).
Requests go through Gradio's queue, one at a time per event."""

from __future__ import annotations

import argparse
import atexit
import errno
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

# no usage statistics or update checks from an app that may run air-gapped
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from demos import image2_tab, image_tab, speech_tab, text_tab, video_tab  # noqa: E402
from mmaccel.devices import add_device_option, resolve_device  # noqa: E402
from mmaccel.errors import InputError  # noqa: E402

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860
# system fonts only: the default theme would fetch web fonts, which an offline browser cannot
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                       font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
CSS = ".passes {line-height: 1.9; font-size: 15px} .passes .tok {border-radius: 3px; padding: 1px 0}"
INTRO = ("**mmaccel**: the plain autoregressive baseline next to an accelerated method, same seed, same "
         "model. Lossless methods give the baseline's output; relaxed ones report what they spent.")


def build_app(image: str = "builtin:fashion-mnist", speech: str = "builtin:base", text: str = "builtin:smollm2",
              video: str = "builtin:moving-fashion", workdir: str | os.PathLike | None = None,
              device: str | None = None) -> gr.Blocks:
    """The app over the given models (builtin names or local paths, as each pipeline's from_pretrained takes),
    on `device` (cpu by default)."""
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix="mmaccel-demo-")
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    with gr.Blocks(title="mmaccel", analytics_enabled=False, delete_cache=(3600, 3600)) as app:
        gr.Markdown(INTRO)
        with gr.Tab("Image", id="image"):
            image_tab.build(image_tab.image_model(image, device), Path(workdir) / "image")
        with gr.Tab("Image II", id="image2"):
            image2_tab.build(image2_tab.image2_models(device), Path(workdir) / "image2")
        with gr.Tab("Speech", id="speech"):
            speech_tab.build(speech_tab.speech_model(speech, device))
        with gr.Tab("Text", id="text"):
            text_tab.build(text_tab.text_model(text, device))
        with gr.Tab("Video", id="video"):
            video_tab.build(video_tab.video_model(video, device))
    app.queue(default_concurrency_limit=1)
    return app


def check_port(host: str, port: int) -> None:
    """A clear error now, instead of Gradio's search for another port, when `port` is taken."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the server binds: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise InputError(f"port {port} on {host} is in use: pass another with --port N "
                                 "(--port 0 picks a free one)") from None
            raise InputError(f"cannot serve on {host}:{port}: {err.strerror}") from None


def check_share() -> None:
    """`--share` needs Gradio's tunnel client, which Gradio downloads on first use; offline it would hang."""
    from gradio import tunneling

    if not Path(tunneling.BINARY_PATH).is_file():
        raise InputError(f"--share needs Gradio's share-tunnel client at {tunneling.BINARY_PATH}, which Gradio "
                         "downloads from the internet, and this machine cannot fetch it. Serve on the local network "
                         "instead (--host 0.0.0.0), or forward the port yourself (ssh -L 7860:127.0.0.1:7860 HOST)")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmaccel demo", description="the mmaccel web app (Gradio)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}; 0.0.0.0 for the network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--share", action="store_true", help="a public Gradio link (needs internet)")
    p.add_argument("--image-model", default="builtin:fashion-mnist", help="image model (builtin name or directory)")
    p.add_argument("--speech-model", default="builtin:base", help="Whisper model (builtin:base, builtin:tiny.en or a directory)")
    p.add_argument("--text-model", default="builtin:smollm2", help="text model (builtin:smollm2 or a HF directory)")
    p.add_argument("--video-model", default="builtin:moving-fashion",
                   help="streaming video model (builtin:moving-fashion or a Qwen-VL directory with words.json)")
    add_device_option(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if not 0 <= args.port <= 65535:
            raise InputError(f"--port must be in [0, 65535], got {args.port}")
        if args.share:
            check_share()
        check_port(args.host, args.port)
        resolve_device(args.device)                 # no GPU for --device cuda: say so now, not at a tab's first request
    except InputError as err:
        print(f"mmaccel demo: error: {err}", file=sys.stderr)
        return 2
    port = args.port or free_port(args.host)
    app = build_app(args.image_model, args.speech_model, args.text_model, args.video_model, device=args.device)
    clip_dirs = sorted({str(Path(p).parent) for p in speech_tab.bundled_clips().values()})
    print(f"mmaccel demo: serving on http://{args.host}:{port} (Ctrl+C to stop)", flush=True)
    app.launch(server_name=args.host, server_port=port, share=args.share, quiet=True, ssr_mode=False,
               theme=THEME, css=CSS, allowed_paths=clip_dirs, footer_links=["api"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
