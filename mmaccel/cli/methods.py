"""`mmaccel methods [--pipeline NAME] [--markdown]`: every method of every pipeline family with its exactness,
needs and parameters (type, default, range, help), read from the registries."""

from __future__ import annotations

import argparse

from mmaccel.registries import FAMILIES


def _print_family(family: str, markdown: bool) -> None:
    from mmaccel.registries import exactness, family_markdown, method_registry

    if markdown:
        print(f"\n{family_markdown(family)}")
        return
    width = max(map(len, FAMILIES))
    for name, plugin in method_registry(family).items():
        needs = ", ".join(plugin.needs) or "target only"
        print(f"{family:{width}} {name:18} {exactness(plugin):34} needs {needs}: {plugin.summary}")
        for r in plugin.parameters():
            print(f"{'':{width + 20}}{r['name']}={r['default']!r} ({r['type']}{', ' + r['range'] if r['range'] else ''}): "
                  f"{r['help']}")


def cmd_methods(args: argparse.Namespace) -> int:
    for family in [args.pipeline] if args.pipeline else FAMILIES:
        _print_family(family, args.markdown)
    return 0


def add_parser(subparsers) -> None:
    m = subparsers.add_parser("methods", help="list the decoding methods, their exactness, needs and parameters")
    m.add_argument("--pipeline", choices=tuple(FAMILIES), default=None, help="one pipeline family (default: all)")
    m.add_argument("--markdown", action="store_true", help="Markdown sections with a parameter table per method")
    m.set_defaults(func=cmd_methods)
