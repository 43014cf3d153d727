"""`mmaccel methods`: the decoding methods of each pipeline family, read from their registries."""

from __future__ import annotations

import argparse


def cmd_methods(args: argparse.Namespace) -> int:
    from mmaccel.core.methods import REGISTRY, build_method
    from mmaccel.image.methods import IMAGE_REGISTRY
    from mmaccel.speech.methods import ASR_REGISTRY

    for title, registry in (("text (mmaccel generate)", REGISTRY), ("image (mmaccel image generate)", IMAGE_REGISTRY),
                            ("speech (mmaccel asr transcribe)", ASR_REGISTRY)):
        print(f"\n{title}\n\n| method | lossless | needs | what |\n|---|---|---|---|")
        for name in registry:
            m = build_method(name, registry)
            print(f"| {name} | {'yes' if m.lossless else 'no (budgeted)'} | {m.needs or 'target only'} | {m.description} |")
    return 0


def add_parser(subparsers) -> None:
    m = subparsers.add_parser("methods", help="list the decoding methods")
    m.set_defaults(func=cmd_methods)
