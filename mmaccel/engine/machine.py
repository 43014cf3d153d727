"""The machine a pass runs on: its CPU's native units and, measured in the same run, what it reads and multiplies.

A pass's floor (`mmaccel.engine.floor`) is its bytes over the read bandwidth or its FLOPs over the GEMM rate of its
precision, whichever is larger. Both rates differ several-fold between the CPUs this project runs on (AVX2-only
EPYCs emulate bf16 several times *slower* than fp32; Zen 4 multiplies bf16 ~4x faster than fp32; Xeons have AMX),
so they are measured, never assumed: `measure_machine()` takes about two seconds and is kept for the process.

- read bandwidth: one sum over a 256 MB fp32 tensor (far beyond any last-level cache), best of a few;
- GEMM rates: a 1500 x 2048 x 2048 product (an encoder window's shape) in fp32, in bf16 and in int8 through the
  product the engine's int8 layers call (`mmaccel.engine.int8`);
- the last-level cache size: a pass whose bytes fit in it may run faster than its DRAM floor in a loop.
"""

from __future__ import annotations

import functools
import platform
import time
from dataclasses import asdict, dataclass

import torch

# /proc/cpuinfo flags that decide which precision runs natively here
UNIT_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile")
BF16_UNITS = ("amx_bf16", "avx512_bf16")
INT8_UNITS = ("amx_int8", "avx512_vnni", "avx_vnni")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's /proc/cpuinfo flags (empty where unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_bf16_units() -> list[str]:
    """This CPU's native bf16 units among AMX and AVX512-BF16."""
    return [unit for unit in BF16_UNITS if unit in cpu_flags()]


def cpu_int8_units() -> list[str]:
    """This CPU's int8 dot-product units among AMX, AVX512-VNNI and AVX-VNNI (without one, int8 products
    run on AVX2's 16-bit sums: activations keep 7 bits so that they cannot saturate)."""
    return [unit for unit in INT8_UNITS if unit in cpu_flags()]


def fast_bf16_matmul(device: torch.device) -> bool:
    """Whether bf16 matrix products run natively here (CUDA, or a CPU with AVX512-BF16 / AMX)."""
    return device.type == "cuda" or bool(cpu_bf16_units())


def cpu_model() -> str:
    """The CPU's model name (or the platform's processor)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def last_level_cache_bytes() -> int | None:
    """The size of CPU 0's highest cache level (sysfs), None where unreadable."""
    try:
        from pathlib import Path

        levels = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
        size = (levels[-1] / "size").read_text().strip()
        return int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1] in "KM" else int(size)
    except (OSError, IndexError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class Machine:
    """What a pass can at best get from this machine, measured in this process."""

    cpu: str
    flags: list[str]                    # the UNIT_FLAGS this CPU has
    threads: int
    read_gb_s: float                    # DRAM read bandwidth, GB/s
    gemm_gflop_s: dict[str, float]      # precision -> GFLOP/s of a large product
    cache_bytes: int | None             # last-level cache

    def to_dict(self) -> dict:
        return asdict(self)

    def floor_s(self, nbytes: float, flops: float, precision: str) -> float:
        """The roofline floor of work reading `nbytes` and computing `flops` in `precision`."""
        return max(nbytes / (self.read_gb_s * 1e9), flops / (self.gemm_gflop_s[precision] * 1e9))


def _best_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _gemm_rates(repeats: int) -> dict[str, float]:
    from mmaccel.engine.int8 import Int8Linear

    m, k, n = 1500, 2048, 2048
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    flops = 2 * m * k * n
    rates = {"fp32": flops / _best_s(lambda: a @ b, repeats)}
    a16, b16 = a.bfloat16(), b.bfloat16()
    rates["bf16"] = flops / _best_s(lambda: a16 @ b16, repeats)
    layer = Int8Linear.of(b.T.contiguous())
    with torch.inference_mode():
        rates["int8"] = flops / _best_s(lambda: layer(a), repeats)
    return {p: round(r / 1e9, 1) for p, r in rates.items()}


@functools.cache
def _measured(threads: int, repeats: int) -> Machine:
    big = torch.ones(64 << 20)                         # 256 MB of fp32
    read = big.numel() * 4 / _best_s(big.sum, repeats)
    return Machine(cpu_model(), [f for f in UNIT_FLAGS if f in cpu_flags()], threads, round(read / 1e9, 2),
                   _gemm_rates(repeats), last_level_cache_bytes())


def measure_machine(repeats: int = 5) -> Machine:
    """This machine's `Machine`, measured once per process and thread count (about two seconds)."""
    return _measured(torch.get_num_threads(), repeats)
