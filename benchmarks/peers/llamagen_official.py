"""Peer benchmark: the official LlamaGen `generate()` against mmaccel on the same weights, device and batch.

The built-in image GPT is stored in the official checkpoint layout, so the official `Transformer` loads it
unchanged. Both decode the same labels with CFG 2 and plain sampling (temperature 1, no top-k/p); the
timed part is token generation only (no VQ decoding), after one warm-up call each, with the device
synchronised around every call. The official code is not part of mmaccel: point `--repo` at a LlamaGen
checkout (it needs `autoregressive/models/{gpt,generate}.py` and `utils/drop_path.py`).

    python benchmarks/peers/llamagen_official.py --repo /path/to/LlamaGen --device cuda \
        --out benchmarks/gpu/peer_llamagen.json

Optionally `--compile` also times the official compiled decode (`torch.compile` of `decode_one_token` in
"reduce-overhead" mode, as the official sampler script does), recording its error if it fails.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from mmaccel.core.sampling import Sampling
from mmaccel.devices import resolve_device
from mmaccel.image.methods import build_image_method
from mmaccel.image.pipeline import ImagePipeline


def official_model(repo: Path, pipe: ImagePipeline, device: torch.device):
    """The official Transformer built from our config and loaded with our (official-layout) weights."""
    sys.path.insert(0, str(repo))
    from autoregressive.models import generate as official_generate
    from autoregressive.models.gpt import ModelArgs, Transformer

    ours = asdict(pipe.model.config)
    args = ModelArgs(**{k: v for k, v in ours.items() if k in ModelArgs.__dataclass_fields__})
    model = Transformer(args)
    missing, unexpected = model.load_state_dict(pipe.model.state_dict(), strict=False)
    stray = [k for k in missing if "freqs_cis" not in k and "causal_mask" not in k]
    if stray or unexpected:
        raise SystemExit(f"the official model does not take our weights: missing {stray[:5]}, unexpected {unexpected[:5]}")
    return model.to(device).eval(), official_generate


def timed(fn, device: torch.device, reps: int) -> tuple[float, object]:
    """Best of `reps` wall-clock seconds of fn() after one warm-up, the device synchronised around each."""
    out = fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a LlamaGen checkout")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--methods", nargs="+", default=["ar", "sjd-coupled", "gsd"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time the official compiled decode")
    parser.add_argument("--cuda-graphs", action="store_true", help="also time our methods with CUDA graphs (a GPU only)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    pipe = ImagePipeline.from_pretrained(device=device)
    model, official = official_model(args.repo, pipe, device)
    tokens = pipe.grid * pipe.grid
    rows = []
    for batch in args.batch:
        labels = torch.arange(batch, device=device) % pipe.model.num_classes
        peer_s, _ = timed(lambda labels=labels: official.generate(model, labels, tokens, cfg_scale=2.0, temperature=1.0, top_k=0,
                                                    top_p=1.0, sample_logits=True), device, args.reps)
        row = {"batch": batch, "official_generate_s": round(peer_s, 4), "official_ms_per_token": round(1e3 * peer_s / tokens, 3)}
        if args.compile:
            try:
                official.decode_one_token = torch.compile(official.decode_one_token, mode="reduce-overhead", fullgraph=True)
                compiled_s, _ = timed(lambda labels=labels: official.generate(model, labels, tokens, cfg_scale=2.0,
                                                                              temperature=1.0, top_k=0, top_p=1.0,
                                                                              sample_logits=True), device, args.reps)
                row["official_compiled_s"] = round(compiled_s, 4)
            except Exception as err:        # the peer's own compiled path: record how it fails
                row["official_compiled_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        resources, guided = pipe.resources(2.0)
        inputs = (labels.tolist(), [pipe.model.num_classes] * batch) if guided else labels.tolist()
        for graphs in [False] + ([True] if args.cuda_graphs else []):
            for m in (pipe.model, pipe.draft):
                if m is not None:
                    m.cuda_graphs = graphs
            for name in args.methods:
                method = build_image_method(name)
                def run_ours(method=method, resources=resources, inputs=inputs):
                    return method.run(resources, inputs, max_new_tokens=tokens, sampling=Sampling(temperature=1.0), seed=0)
                ours_s, gen = timed(run_ours, device, args.reps)
                row[name + (" +graphs" if graphs else "")] = {
                    "s": round(ours_s, 4), "ms_per_token": round(1e3 * ours_s / tokens, 3), "nfe": gen.stats.nfe,
                    "speedup_vs_official": round(peer_s / ours_s, 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {"command": "python benchmarks/peers/llamagen_official.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "tokens_per_image": tokens, "cfg_scale": 2.0, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
