"""`mmaccel` command line: generate, image, asr, bench, demo, compare, eval, methods, serve.

One module per command (its arguments and its `cmd_*` function); the option groups several commands
share are in `options.py`. Each command imports the models, data and benchmarks it runs when it runs;
building the parser reads only the method lists of the next-scale and continuous image pipelines.
"""

from __future__ import annotations

import argparse
import sys

from mmaccel.errors import MMAccelError
from mmaccel.progress import say


def build_parser() -> argparse.ArgumentParser:
    from mmaccel.cli import asr, bench, demo, generate, image, methods, serve
    from mmaccel.cli.eval import add_eval_parser

    parser = argparse.ArgumentParser(prog="mmaccel", description="Fast autoregressive generation on one decoding core.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (generate, image, asr, bench, demo):      # demo registers `demo` and `compare`
        command.add_parser(sub)
    add_eval_parser(sub)
    methods.add_parser(sub)
    serve.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv[:1] == ["demo"]:                 # the app parses its own options (--host, --port, --share, ...)
        args = parser.parse_args(["demo"])
        args.app_args = argv[1:]
    else:
        args = parser.parse_args(argv)
    try:
        return args.func(args)
    except MMAccelError as err:
        say(f"mmaccel: error: {err}")
        return 2


__all__ = ["build_parser", "main"]
