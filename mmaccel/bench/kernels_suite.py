"""`mmaccel bench kernels`: microseconds per call of each fused verification kernel and its reference.

For every kernel family (mmaccel/kernels) and shape, three implementations on the same inputs: the
PyTorch reference as the methods call it (eager), the same reference under `torch.compile`
(inductor; a compile failure is recorded, not raised), and the Triton kernel, which runs on CUDA
tensors only ("n/a" elsewhere). Shapes cover the shipped image GPT's codebook (1024), LlamaGen's
(16384) and a 50k text vocabulary (GPT-2's 50257); GSD's [V, V] latent distances bound its
vocabulary. Times are medians of `torch.utils.benchmark` blocks after warm-up calls; ratios are
reference / implementation, so > 1 is faster. Compiled and Triton outputs are compared with the
eager reference's (`*_matches`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.bench.harness import device_name
from mmaccel.core import acceptance
from mmaccel.core.tree import TokenTree, verify_tree_greedy, verify_tree_sampled
from mmaccel.devices import resolve_device
from mmaccel.kernels.dispatch import ENV, triton_available
from mmaccel.progress import progress

IMAGE_VOCAB = 1024          # the shipped Fashion-MNIST GPT's codebook (mmaccel/assets/fashion_vq.safetensors)
LLAMAGEN_VOCAB = 16384      # LlamaGen's VQ codebook (GPTConfig's default)
TEXT_VOCAB = 50257          # GPT-2's vocabulary
NEIGHBOURS, DELTA = 50, 0.1                                   # LANTERN's defaults (mmaccel.image.methods)
GROUP = {"p_threshold": 0.15, "d_threshold": 0.5, "half_window": 7}    # GSD's defaults
MAX_DISTANCE_VOCAB = LLAMAGEN_VOCAB                          # [V, V] float32 distances: 1 GiB at 16384
ROUNDS = 3                                                   # full runs: rounds over all cases

CHAIN = [(1, 4, IMAGE_VOCAB), (8, 8, IMAGE_VOCAB), (4, 8, LLAMAGEN_VOCAB), (1, 8, TEXT_VOCAB), (8, 4, TEXT_VOCAB)]
TREES = [(1, 9, IMAGE_VOCAB), (8, 17, IMAGE_VOCAB), (4, 25, LLAMAGEN_VOCAB), (1, 17, TEXT_VOCAB), (8, 17, TEXT_VOCAB)]
MASKS = [(1, 17), (8, 25), (8, 65)]
QUICK_CHAIN, QUICK_TREES, QUICK_MASKS = [(2, 3, 64)], [(2, 7, 64)], [(2, 7)]


@dataclass
class Case:
    """One kernel at one shape: the reference (as the methods call it) and the Triton wrapper, each a
    function of `args`, returning a tuple of tensors."""

    kernel: str
    shape: dict[str, int]
    reference: Callable[..., tuple]
    triton: Callable[[], Callable[..., tuple]] | None      # imports the wrapper (Triton) on demand
    args: tuple
    note: str | None = None                                # why the case is not run


def _laws(g: torch.Generator, shape: tuple[int, ...], device) -> Tensor:
    """Peaked target-like distributions (softmax of scaled Gaussian logits)."""
    return (torch.randn(shape, generator=g) * 3).softmax(-1).to(device)


def _chain_args(g, B, K, V, device):
    p, q = _laws(g, (B, K + 1, V), device), _laws(g, (B, K, V), device)
    drafts = torch.multinomial(q.reshape(-1, V).cpu(), 1, generator=g).reshape(B, K).to(device)
    return (drafts, q, p, torch.rand(B, K, generator=g).to(device),
            torch.empty(B, K + 1, V).exponential_(generator=g).to(device))


def _tree(g, B, N, V, device, p):
    """A best-first-like tree: levels of equal width under random parents of the level above; each
    node's token is one of its parent's two most likely tokens, so paths get accepted."""
    width = max(1, round((N - 1) ** 0.5))
    parents = [-1]
    level = [0]
    while len(parents) < N:
        new = [level[int(torch.randint(0, len(level), (1,), generator=g))] for _ in range(min(width, N - len(parents)))]
        level = list(range(len(parents), len(parents) + len(new)))
        parents += sorted(new)
    parents = torch.tensor(parents).expand(B, N).contiguous()
    top2 = p.cpu().topk(2, dim=-1).indices                                # [B, N, 2]
    pick = torch.randint(0, 2, (B, N, 1), generator=g)
    tokens = top2.gather(1, parents.clamp_min(0)[..., None].expand(-1, -1, 2)).gather(2, pick)[..., 0]
    return tokens.to(device), parents.to(device)


def _outputs(verdict) -> tuple:
    return tuple(t for t in (verdict.num_accepted, verdict.next_token, verdict.deviation) if t is not None)


def _speculative(d, q, p, u, e):
    return _outputs(acceptance.accept_speculative(d, q, p, u, e))


def _pooled(d, q, p, u, e, neighbours):
    return _outputs(acceptance.accept_pooled(d, q, p, u, e, neighbours=neighbours, delta=DELTA))


def _grouped(d, q, p, u, e, distances):
    return _outputs(acceptance.accept_grouped(d, q, p, u, e, distances=distances, **GROUP))


def _grouped_coupled(d, p, e, distances):
    return _outputs(acceptance.accept_grouped_coupled(d, None, p, None, e, distances=distances, **GROUP))


def _tree_sampled(tokens, parents, p, u, e):
    return verify_tree_sampled(TokenTree(tokens, parents), p, u, e)


def _tree_greedy(tokens, parents, logits):
    return verify_tree_greedy(TokenTree(tokens, parents), logits)


def _tree_mask(tree):
    tree._mask = None              # the mask is cached on the tree: time building it, not reading the cache
    return (tree.mask(),)


def _cases(device: torch.device, quick: bool) -> list[Case]:
    from mmaccel.image.methods import latent_sq_distances

    g = torch.Generator().manual_seed(0)
    cases = []
    for B, K, V in QUICK_CHAIN if quick else CHAIN:
        shape = {"B": B, "K": K, "V": V}
        d, q, p, u, e = _chain_args(g, B, K, V, device)
        cases.append(Case("speculative", shape, _speculative, lambda: _wrapper("speculative", "verify_chain"),
                          (d, q, p, u, e)))
        neighbours = torch.randint(0, V, (V, min(NEIGHBOURS, V - 1)), generator=g).to(device)
        cases.append(Case("pooled", dict(shape, M=neighbours.shape[1]), _pooled,
                          lambda: _wrapper("pooled", "verify_pooled", delta=DELTA), (d, q, p, u, e, neighbours)))
        # coupled drafts: mostly the target's own sample (as coupled Jacobi drafts often are), else another
        exact = (p / e).argmax(-1)[:, :K]
        near = torch.where(torch.rand(B, K, generator=g).to(device) < 0.7, exact, d)
        if V > MAX_DISTANCE_VOCAB:
            note = f"n/a: GSD's [V, V] distances would take {V * V * 4 / 2**30:.1f} GiB"
            cases += [Case("grouped", shape, _grouped, None, (), note),
                      Case("grouped-coupled", shape, _grouped_coupled, None, (), note)]
            continue
        latents = torch.nn.functional.normalize(torch.randn(V, 8, generator=g), dim=-1)
        distances = latent_sq_distances(latents).to(device)
        cases.append(Case("grouped", shape, _grouped, lambda: _wrapper("grouped", "verify_grouped", **GROUP),
                          (d, q, p, u, e, distances)))
        cases.append(Case("grouped-coupled", shape, _grouped_coupled,
                          lambda: _wrapper("grouped", "verify_grouped_coupled", **GROUP), (near, p, e, distances)))
    for B, N, V in QUICK_TREES if quick else TREES:
        shape = {"B": B, "N": N, "V": V}
        p = _laws(g, (B, N, V), device)
        tokens, parents = _tree(g, B, N, V, device, p)
        # the width of the paths the reference returns on this device (on a GPU the bound N - 1, not the depth)
        depth = TokenTree(tokens, parents).max_depth()
        u, e = torch.rand(B, N, generator=g).to(device), torch.empty(B, N, V).exponential_(generator=g).to(device)
        cases.append(Case("tree-sampled", shape, _tree_sampled,
                          lambda depth=depth: _wrapper("tree_verify", "verify_tree", max_depth=depth),
                          (tokens, parents, p, u, e)))
        cases.append(Case("tree-greedy", shape, _tree_greedy,
                          lambda depth=depth: _wrapper("tree_verify", "verify_tree_argmax", max_depth=depth),
                          (tokens, parents, p.log())))
    for B, N in QUICK_MASKS if quick else MASKS:
        p = _laws(g, (B, N, 8), "cpu")
        tokens, parents = _tree(g, B, N, 8, device, p)
        cases.append(Case("tree-mask", {"B": B, "N": N}, _tree_mask, lambda: _mask_wrapper(),
                          (TokenTree(tokens, parents),)))
    return cases


def _wrapper(module: str, name: str, **params) -> Callable[..., tuple]:
    import importlib

    fn = getattr(importlib.import_module(f"mmaccel.kernels.{module}"), name)
    return lambda *args: tuple(fn(*args, **params))


def _mask_wrapper() -> Callable[..., tuple]:
    from mmaccel.kernels.tree_mask import ancestor_mask

    return lambda tree: (ancestor_mask(tree.parents),)


def _time_us(fn: Callable[[], object], min_run_time: float, warmup: int = 3) -> float:
    """Median per-call time (µs) over torch.utils.benchmark's blocks, after warm-up calls."""
    from torch.utils.benchmark import Timer

    for _ in range(warmup):
        fn()
    measurement = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()).blocked_autorange(
        min_run_time=min_run_time)
    return measurement.median * 1e6


def _matches(out: tuple, ref: tuple) -> bool:
    """Equal tokens and paths; float outputs (deviation) equal up to float32 rounding of sums."""
    if len(out) != len(ref):
        return False
    return all(torch.equal(a.cpu(), b.cpu()) if not b.is_floating_point() or a.dtype == torch.bool
               else torch.allclose(a.cpu().float(), b.cpu().float(), rtol=1e-5, atol=1e-7) for a, b in zip(out, ref))


def _compiled(case: Case, ref: tuple, row: dict, compiled: dict[str, Callable]) -> dict[str, Callable[[], object]]:
    """Compile the case's reference (one compiled function per kernel in `compiled`: new shapes
    recompile it) and check its outputs; a failure is recorded in the row."""
    if case.kernel not in compiled:
        compiled[case.kernel] = torch.compile(case.reference)
    fn = compiled[case.kernel]
    try:
        start = time.perf_counter()
        out = fn(*case.args)
        row["compile_s"] = round(time.perf_counter() - start, 2)
    except Exception as err:                                 # inductor's failures are results here
        row["compiled_note"] = _error(err)
        return {}
    row["compiled_matches"] = _matches(out, ref)
    return {"compiled": lambda: fn(*case.args)}


def _triton(case: Case, ref: tuple, row: dict) -> dict[str, Callable[[], object]]:
    kernel = case.triton()
    try:
        row["triton_matches"] = _matches(kernel(*case.args), ref)
    except Exception as err:
        row["triton_note"] = _error(err)
        return {}
    return {"triton": lambda: kernel(*case.args)}


@contextlib.contextmanager
def _reference_dispatch():
    """The dispatcher takes the PyTorch reference (for the eager and the compiled timings, also on CUDA)."""
    saved = os.environ.get(ENV)
    os.environ[ENV] = "torch"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


def _error(err: Exception) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:160]}"


def run_kernels(device: str | None = "cpu", quick: bool = False, compile: bool = True,
                log: Callable[[str], None] = print) -> dict:
    """The result document: one row per kernel and shape (times in µs, ratios over the eager reference).

    First every compiled function is built (inductor compiling in this process: its worker pool would
    otherwise run beside the timings) and checked; then rounds over all cases time the reference, the
    compiled function and the Triton kernel one after another per case, so slow spells of a shared
    machine hit them alike; a time is the median over the rounds (each round's figure is kept)."""
    from torch._inductor import config as inductor

    dev = resolve_device(device)
    rounds, min_run_time = (1, 0.05) if quick else (ROUNDS, 0.2)
    cuda = dev.type == "cuda"
    triton_note = None if cuda and triton_available() else ("n/a: Triton is not installed" if cuda else
                                                             "n/a: no GPU" if not torch.cuda.is_available()
                                                             else "n/a: CPU tensors")
    load_before = os.getloadavg()[0]
    cases = _cases(dev, quick)
    rows, timed, compiled = [], [], {}
    with _reference_dispatch(), inductor.patch(compile_threads=1):
        for case in cases:
            row = {"kernel": case.kernel, "shape": case.shape, "reference_us": None, "compiled_us": None,
                   "triton_us": None, "compiled_ratio": None, "triton_ratio": None, "compile_s": None,
                   "compiled_matches": None, "triton_matches": None,
                   "compiled_note": case.note or (None if compile else "not run (compile=False)"),
                   "triton_note": case.note or triton_note, "rounds_us": {}}
            rows.append(row)
            if case.note is not None:
                log(f"[kernels] {case.kernel} {case.shape}: {case.note}")
                continue
            ref = case.reference(*case.args)
            fns = {"reference": lambda case=case: case.reference(*case.args)}
            if compile:
                fns.update(_compiled(case, ref, row, compiled))
            if triton_note is None:
                fns.update(_triton(case, ref, row))
            timed.append((case, row, fns))
        for r in range(rounds):
            for _case, row, fns in progress(timed, desc=f"kernels round {r + 1}/{rounds}", unit="case"):
                for name, fn in fns.items():
                    row["rounds_us"].setdefault(name, []).append(round(_time_us(fn, min_run_time), 2))
    for case, row, _fns in timed:
        for name, values in row["rounds_us"].items():
            row[f"{name}_us"] = round(statistics.median(values), 2)
        for name in ("compiled", "triton"):
            if row[f"{name}_us"]:
                row[f"{name}_ratio"] = round(row["reference_us"] / row[f"{name}_us"], 3)
        log(f"[kernels] {case.kernel} {case.shape}: reference {row['reference_us']} µs, compiled "
            f"{row['compiled_us'] or row['compiled_note']}, Triton {row['triton_us'] or row['triton_note']}")
    import triton

    return {"suite": "kernels", "device": device_name(dev),
            "torch": torch.__version__, "triton": triton.__version__,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "config": {"quick": quick, "compile": compile, "device": str(dev), "threads": torch.get_num_threads(),
                       "rounds": rounds, "min_run_time_s": min_run_time,
                       "timer": "torch.utils.benchmark blocked_autorange median per round, median over rounds",
                       "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                       "vocabularies": {"image": IMAGE_VOCAB, "llamagen": LLAMAGEN_VOCAB, "text": TEXT_VOCAB},
                       "pooled": {"neighbours": NEIGHBOURS, "delta": DELTA}, "grouped": GROUP,
                       "compile_mode": "torch.compile default (inductor, compile_threads=1), one compiled function "
                                       "per kernel, all built before any timing; compile_s is the first call with "
                                       "inductor's on-disk caches as found"},
            "results": rows}


def markdown(doc: dict) -> str:
    """The result document as a Markdown table."""
    lines = ["| kernel | shape | reference (µs) | torch.compile (µs) | × | Triton (µs) | × |",
             "|---|---|---|---|---|---|---|"]

    def cell(row, name):
        us, note, ratio = row[f"{name}_us"], row[f"{name}_note"], row[f"{name}_ratio"]
        if us is None:
            return f"{note or '–'} | –"
        flag = "" if row[f"{name}_matches"] in (None, True) else " (outputs differ)"
        return f"{us:,.1f}{flag} | {ratio:.2f}"

    for r in doc["results"]:
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        if r["reference_us"] is None:                         # a case not run: its reason once
            lines.append(f"| {r['kernel']} | {shape} | {r['compiled_note']} | – | – | – | – |")
            continue
        lines.append(f"| {r['kernel']} | {shape} | {r['reference_us']:,.1f} | {cell(r, 'compiled')} | "
                     f"{cell(r, 'triton')} |")
    return "\n".join(lines) + "\n"
