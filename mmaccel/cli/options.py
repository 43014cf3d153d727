"""The option groups several commands share, written once: sampling, seed, method parameters, output, draft.

Each command states only its defaults and its own help; the device options come from
`mmaccel.devices.add_device_option`. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json


def key_value(text: str) -> tuple[str, object]:
    """'k=4' -> ('k', 4): the value is read as JSON when it parses, else kept as a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"method parameters are KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_param_option(parser: argparse.ArgumentParser, example: str) -> None:
    """--param KEY=VALUE (repeatable): the method's parameters, `dict(args.param)`."""
    parser.add_argument("--param", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help=f"method parameter, e.g. --param {example} (repeatable)")


def add_sampling_options(parser: argparse.ArgumentParser, *, temperature: float, top_k: int | None = 0,
                         top_p: float | None = 1.0, cfg_scale: float | None = None,
                         temperature_help: str = "sampling temperature", cfg_help: str = "classifier-free guidance scale",
                         ) -> None:
    """--temperature, --top-k, --top-p (and --cfg-scale) with the command's defaults; None leaves an option out."""
    parser.add_argument("--temperature", type=float, default=temperature, help=temperature_help)
    if top_k is not None:
        parser.add_argument("--top-k", type=int, default=top_k, help="keep the k most likely tokens (0: all)")
    if top_p is not None:
        parser.add_argument("--top-p", type=float, default=top_p,
                            help="keep the most likely tokens up to this probability mass (1: all)")
    if cfg_scale is not None:
        parser.add_argument("--cfg-scale", type=float, default=cfg_scale, help=cfg_help)


def add_seed_option(parser: argparse.ArgumentParser, help: str = "random seed (the same seed gives the same output)") -> None:
    parser.add_argument("--seed", type=int, default=0, help=help)


def add_out_option(parser: argparse.ArgumentParser, help: str, *, required: bool = False,
                   default: str | None = None) -> None:
    """--out: where a command writes (a directory or a JSON path, as `help` says)."""
    parser.add_argument("--out", required=required, default=default, help=help)


def none_or_text(text: str) -> str | None:
    """'none' -> None (no such model), anything else unchanged."""
    return None if text == "none" else text


def add_draft_option(parser: argparse.ArgumentParser, default: str, help: str) -> None:
    """--draft: a draft model, `default` ('builtin' / 'auto') or 'none' (read as None)."""
    parser.add_argument("--draft", type=none_or_text, default=default, help=help)
