"""Compiled steps on the CPU: a module exported once to OpenVINO's graph runtime, cached on disk, run in fp32, bf16
or int8.

Why OpenVINO (measured, `benchmarks/engine/precision_choices.json`, Whisper base's 30-s encoder window on a Zen 4
EPYC, 2 threads): bf16 0.25 s against torch's eager bf16 0.36 s, inductor-compiled bf16 (freezing) 0.35 s and
CTranslate2's int8 0.48 s, at the same state error as torch's bf16; fp32 0.44 s against torch's 0.57 s. Half of
torch's bf16 window is its CPU attention kernel (1500 queries x 1500 keys, no faster in bf16 than in fp32), which
OpenVINO fuses; the products themselves run at about the same rate in both. int8: the linear layers' weights go
into the graph as int8 with one scale per output row (`quantize_rows`, the scheme of `Int8Linear`), the other
operations in bf16 where it is native (else fp32): about the state error of faster-whisper's encoder (11.8 %) in
0.22 s a window here, against 0.25 s for bf16 and CTranslate2's own 0.48 s. Under the bf16 hint OpenVINO expands
those weights to bf16 and multiplies in bf16; its per-token dynamic quantisation of the activations (int8 products,
CTranslate2's scheme) engages only over f32 activations (`compile_config(int8_activations=True)`): what the decoder
graph runs, while for the encoder's 1 500-token window the bf16 products are the faster (a base-sized stack of
linear layers 96 ms against 103 ms, AMX Xeon).

- The exported graph (OpenVINO IR, fp32 weights) is kept under `$MMACCEL_CACHE/compiled/<key>/`, the key being a
  hash of the module's class, parameters and buffers, the inputs' shapes and dtypes and both libraries' versions,
  so a second process reads it instead of exporting again; OpenVINO's own compiled blob sits beside it
  (`blob/`). `Compiled.first_call_s` says what the first call cost (export or read, compile, check).
- Never trusted unchecked: a fresh export is compared with the eager module on the example inputs and refused
  beyond `TOLERANCE` of the precision (a relative L2 error; bf16's states move ~1-3 % on Whisper).
- Failure is not fatal: when OpenVINO is missing, the export or the compile fails or the check refuses, `compile_module`
  warns in one line and returns None, and the caller runs the module eagerly. A cache that cannot be read is
  rebuilt (one warning line). The module passed in is never modified.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import threading
import time
import warnings
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.engine.int8 import quantize_rows
from mmaccel.engine.machine import cpu_bf16_units
from mmaccel.engine.precision import check_precision
from mmaccel.errors import check
from mmaccel.paths import CACHE_MARKER, default_cache_dir, write_cache_dir

PRECISIONS = ("fp32", "bf16", "int8")         # what a compiled step runs in
TOLERANCE = {"fp32": 1e-4, "bf16": 0.08, "int8": 0.25}  # relative L2 error against eager a fresh export may have
HINT = {"fp32": "f32", "bf16": "bf16"}        # OpenVINO's inference precision hint (int8: bf16 where native, else f32)
INT8_GROUP = 512        # input channels per activation scale at int8: a token's row (Whisper base's width)


class Compiled:
    """A module compiled by OpenVINO: `compiled(*tensors)` -> its first output, an fp32 torch tensor. The batch
    (first) dimension of every input is free; the others are the example's. Calls are serialised (one request)."""

    def __init__(self, request, precision: str, first_call_s: float, source: str, error: float | None):
        self._request = request
        self._lock = threading.Lock()
        self.precision = precision
        self.first_call_s = first_call_s     # export (or cache read) + compile + check, seconds
        self.source = source                 # "export" (built now) | "cache" (read from disk)
        self.error = error                   # relative L2 error against eager when built now (None: from cache)

    def __call__(self, *inputs: Tensor) -> Tensor:
        arrays = {i: np.ascontiguousarray(x.detach().float().cpu().numpy()) for i, x in enumerate(inputs)}
        with self._lock:
            out = self._request.infer(arrays)[0]
        return torch.from_numpy(np.array(out, dtype=np.float32, copy=True))


def available() -> bool:
    """Whether OpenVINO is installed (so that `compile_module` can compile rather than fall back)."""
    return importlib.util.find_spec("openvino") is not None


def runtime_version() -> str | None:
    """The installed OpenVINO's version (None: not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("openvino")
    except importlib.metadata.PackageNotFoundError:
        return None


def compile_module(module: nn.Module, example: tuple[Tensor, ...], precision: str = "fp32",
                   cache_dir: str | Path | None = None) -> Compiled | None:
    """`module` (tensors -> one tensor) compiled for this CPU at `precision` (fp32, bf16 or int8), or None with one
    warning line when it cannot be (the caller then runs `module` itself). `example`: inputs of the shapes it
    will see (any batch). `cache_dir`: where exported graphs are kept (default `$MMACCEL_CACHE/compiled`)."""
    check_precision(precision, PRECISIONS)
    check(isinstance(module, nn.Module), f"compile_module takes an nn.Module, got {type(module).__name__}")
    check(len(example) > 0 and all(isinstance(x, Tensor) for x in example), "compile_module needs example input tensors")
    start = time.perf_counter()
    try:
        import openvino as ov
    except ImportError as e:
        return _fallback(module, f"openvino is not installed ({e})")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "compiled"
    graphed = int8_weights(module) if precision == "int8" else module       # what goes into the graph
    try:
        graph, source, dest = cached_graph(ov, graphed, example, root)
    except Exception as e:  # noqa: BLE001 - an export failure falls back to eager
        return _fallback(module, f"export failed ({first_line(e)})")
    try:
        request = ov.Core().compile_model(graph, "CPU", compile_config(precision, root)).create_infer_request()
    except Exception as e:  # noqa: BLE001 - a compile failure falls back to eager
        return _fallback(module, f"compile failed ({first_line(e)})")
    compiled, error = Compiled(request, precision, 0.0, source, None), None
    if source == "export":
        try:
            error = _relative_error(compiled, module, example)
        except Exception as e:  # noqa: BLE001 - a graph that does not run falls back to eager
            return _fallback(module, f"the compiled graph does not run ({first_line(e)})")
        if not error <= TOLERANCE[precision]:
            return _fallback(module, f"its output differs from eager by {error:.2g} (relative L2), more than "
                                     f"{precision}'s {TOLERANCE[precision]}")
        save_graph(ov, graph, dest, {"module": type(module).__name__, "error": error})
    compiled.error = error
    compiled.first_call_s = time.perf_counter() - start
    return compiled


def graph_key(module: nn.Module, example: tuple[Tensor, ...], openvino_version: str) -> str:
    """The cache key of `module`'s graph: its class, every parameter and buffer, the inputs' shapes past the batch
    and dtypes, and the torch and OpenVINO versions (a hash; any change is a new graph)."""
    h = hashlib.sha256()
    h.update(json.dumps([type(module).__module__, type(module).__qualname__, torch.__version__, openvino_version,
                         [(list(x.shape[1:]), str(x.dtype)) for x in example]]).encode())
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:24]


def cached_graph(ov, graphed: nn.Module, example: tuple[Tensor, ...], root: Path, keep_dtypes: bool = False):
    """(`graphed`'s OpenVINO graph, "cache" or "export", the folder it is kept in): read from `root` when an earlier
    process exported it (an unreadable cache is removed with one warning line), else exported now, every input's
    first dimension left free (`save_graph` keeps it once checked)."""
    dest = root / graph_key(graphed, example, ov.__version__)
    if (dest / CACHE_MARKER).is_file():
        try:
            marker = json.loads((dest / CACHE_MARKER).read_text())
            check(marker.get("files") == _digests(dest), "its files are not the ones written")
            return ov.Core().read_model(str(dest / "model.xml"), str(dest / "model.bin")), "cache", dest
        except Exception as e:  # noqa: BLE001 - any unreadable cache is rebuilt
            warnings.warn(f"mmaccel: the compiled graph at {dest} could not be read ({first_line(e)}); rebuilding it",
                          stacklevel=3)
            shutil.rmtree(dest, ignore_errors=True)
    return export_graph(ov, graphed, example, keep_dtypes), "export", dest


def save_graph(ov, graph, dest: Path, marker: dict) -> None:
    """Keep an exported (and checked) graph at `dest` for later processes; a disk that cannot take it costs one
    warning line (the next process exports again)."""
    marker = {**marker, "openvino": ov.__version__}

    def write(tmp: Path) -> None:
        ov.save_model(graph, str(tmp / "model.xml"), compress_to_fp16=False)
        marker["files"] = _digests(tmp)

    try:
        write_cache_dir(dest, write, marker, lambda d: (d / CACHE_MARKER).is_file())
    except OSError as e:        # a read-only or full disk: run what was compiled, export again next time
        warnings.warn(f"mmaccel: the compiled graph could not be cached at {dest} ({first_line(e)})", stacklevel=3)


def compile_config(precision: str, root: Path, int8_activations: bool = False) -> dict:
    """OpenVINO's CPU settings for a graph run at `precision`: its precision hint, this process's threads, one
    stream, and its compiled-blob cache beside the graphs (when `root` is writable).

    `int8_activations` (int8 only): the linear layers multiply in int8, their activations quantised per token as
    they run. OpenVINO's CPU plugin does that only over f32 activations, so the hint is f32 and the graph's bf16
    inputs and states stay bf16 (the decoder's caches); under the bf16 hint it multiplies bf16 activations by
    weights it expands from int8 at every call, which costs in proportion to the tokens: Whisper base's
    vocabulary projection of 8 tokens 4.5 ms against 2.2 ms, the decoder pass at batch 1 17.5 against 12.7 ms
    (AMX Xeon, 2 threads; the same at batch 8)."""
    hint = "f32" if int8_activations else HINT.get(precision) or ("bf16" if cpu_bf16_units() else "f32")
    config = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": torch.get_num_threads(),
              "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if precision == "int8":
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = INT8_GROUP
    try:
        (root / "blob").mkdir(parents=True, exist_ok=True)
        config["CACHE_DIR"] = str(root / "blob")          # OpenVINO's compiled blob, beside the graphs
    except OSError:
        pass                                              # not writable: compiled every time (the write warns)
    return config


class _Int8Weights(nn.Module):
    """A linear layer as the exported graph holds it at int8: the weight int8 with one scale per output row (an int8
    constant, its conversion and the scale: the form OpenVINO keeps compressed and multiplies in int8)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight, scale = quantize_rows(linear.weight)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale[:, None].contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scale, self.bias)


def int8_weights(module: nn.Module) -> nn.Module:
    """A copy of `module` whose linear layers are `_Int8Weights` (convolutions, norms and attention stay fp32)."""
    copy = deepcopy(module)
    for child in list(copy.modules()):
        for attr, leaf in list(child.named_children()):
            if isinstance(leaf, nn.Linear):
                setattr(child, attr, _Int8Weights(leaf))
    return copy


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of the graph's files (the marker keeps them: a cache whose files changed is rebuilt)."""
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ("model.xml", "model.bin")
            if (folder / name).is_file()}


def export_graph(ov, module: nn.Module, example: tuple[Tensor, ...], keep_dtypes: bool = False):
    """The module as an OpenVINO graph, every input's first dimension left free and its inputs fp32; with
    `keep_dtypes`, the example's dtypes and every dimension free (see `mmaccel.engine.stateful` for why). The
    tracer's notes on the module's Python-level checks are silenced: the check against eager is what decides."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if keep_dtypes:
            return ov.convert_model(module, example_input=example)
        shapes = [ov.PartialShape([-1, *x.shape[1:]]) for x in example]
        return ov.convert_model(module, example_input=tuple(x.float() for x in example), input=shapes)


@torch.no_grad()
def _relative_error(compiled: Compiled, module: nn.Module, example: tuple[Tensor, ...]) -> float:
    """The worst relative L2 error against eager on the example and on a second batch of perturbed copies of it
    (a tracer that baked an input in as a constant passes the first and fails the second)."""
    generator = torch.Generator().manual_seed(0)
    probe = tuple(torch.cat([x, x + 0.1 * x.float().std().clamp_min(1e-3) *
                             torch.randn(x.shape, generator=generator).to(x.dtype)]) for x in example)
    worst = 0.0
    for inputs in (example, probe):
        want = module(*inputs).float()
        got = compiled(*inputs)
        check(got.shape == want.shape, f"compiled output shape {tuple(got.shape)} != eager {tuple(want.shape)}")
        worst = max(worst, float((got - want).norm() / want.norm().clamp_min(1e-30)))
    return worst


def _fallback(module: nn.Module, why: str) -> None:
    warnings.warn(f"mmaccel: {type(module).__name__} runs eagerly: {why}", stacklevel=3)
    return None


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
