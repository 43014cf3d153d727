"""`mmaccel demo` (the web app in demos/) and `mmaccel compare` (the same comparison in the terminal)."""

from __future__ import annotations

import argparse

from mmaccel.cli.options import add_out_option
from mmaccel.errors import InputError
from mmaccel.progress import say


def cmd_demo(args: argparse.Namespace) -> int:
    """The web app (demos/): Gradio tabs for image, speech and text on the embedded defaults."""
    try:
        from demos.app import main as app_main
    except ImportError as err:
        raise InputError(f"the web app needs gradio and the demos package of an mmaccel checkout ({err}); "
                         "run `make demo` in the repository") from None
    return app_main(args.app_args)


def cmd_compare(args: argparse.Namespace) -> int:
    from mmaccel.bench.compare import run_compare

    run_compare(args.out, log=say)
    return 0


def add_parser(subparsers) -> None:
    d = subparsers.add_parser("demo", add_help=False,
                              help="the web app: image, speech, text and video tabs on the embedded models (demo --help "
                                   "for options)")
    d.set_defaults(func=cmd_demo, app_args=[])
    c = subparsers.add_parser("compare", help="in the terminal: AR vs the accelerated methods on the embedded default models")
    add_out_option(c, "directory for the sample grid", default="runs/demo")
    c.set_defaults(func=cmd_compare)
