"""Data-parallel evaluation: the same command in one process, or one process per device.

`torchrun --nproc-per-node N ...` and `accelerate launch --num_processes N ...` start N copies of a
command with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
`distributed()` reads them, joins the process group (gloo on CPU, NCCL when every process on the
node has a CUDA device; `MMACCEL_DIST_BACKEND` overrides) and leaves it at the end; without RANK / WORLD_SIZE the command is
one process and no group is created.

Sharding. Work is cut into fixed global units (a batch of samples, a chunk of images) numbered
0..n-1 independently of the number of processes; rank r takes units r, r + W, r + 2W, ... (round
robin keeps ranks balanced when units are sorted by cost, e.g. utterances longest first). A unit's
result depends only on its number (its inputs and seed), so the gathered results are those of a
one-process run, bit for bit at equal per-process thread counts: torch's CPU kernels may split a
reduction differently over another number of threads. Rank 0 gathers the units' results
(`gather_object`), writes the final files, and every rank meets at a barrier before the group is
destroyed.

Threads. Each process uses `threads` torch threads, by default the usable cores divided by the
processes on this node (LOCAL_WORLD_SIZE), at least 1. This replaces torchrun's default of
OMP_NUM_THREADS=1 per process. For results bit-identical to a run with another number of processes,
pass the same `--threads` to both.

Errors. A bad input raises the same `MMAccelError` on every rank (inputs are validated on all
ranks before any collective); work that may fail on one rank only is run through `Dist.agree` or
`Dist.on_main`, which raise the first rank's error on every rank, so no rank waits forever in a
collective and each exits with the CLI's one-line error.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mmaccel.errors import InputError, MMAccelError, check

T = TypeVar("T")

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BACKEND_ENV = "MMACCEL_DIST_BACKEND"
# A rank whose units are all done (resumed) waits in the gather for the others; evaluation runs of
# many hours must not time out there.
TIMEOUT = datetime.timedelta(hours=12)


@dataclass(frozen=True)
class Dist:
    """This process's place in the run; a one-process run is rank 0 of 1 with no backend."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None      # "gloo" / "nccl" when a process group is up, else None
    threads: int = 1                # torch threads of this process

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.backend is not None

    def shard(self, n: int) -> list[int]:
        """This rank's units of 0..n-1 (round robin)."""
        return list(range(self.rank, n, self.world_size))

    def device(self, requested: str | None) -> str | None:
        """The device this rank computes on: a plain "cuda" (or "auto" with GPUs) becomes this process's
        own GPU, cuda:LOCAL_RANK, so N processes on a node use N GPUs."""
        if requested in ("cuda", "auto") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def all_gather(self, obj: Any) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def gather(self, obj: Any) -> list | None:
        """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
        if not self.active:
            return [obj]
        out: list | None = [None] * self.world_size if self.is_main else None
        torch.distributed.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gather_units(self, results: dict[int, Any], n: int) -> list | None:
        """Merge each rank's {unit: result} of units 0..n-1 into one list in unit order, on rank 0."""
        parts = self.gather(results)
        if parts is None:
            return None
        merged: dict[int, Any] = {}
        for part in parts:
            merged.update(part)
        missing = sorted(set(range(n)) - set(merged))
        check(not missing, f"units {missing[:5]} were not computed by any rank")   # a sharding bug, not input
        return [merged[j] for j in range(n)]

    def agree(self, fn: Callable[[], T]) -> T:
        """Run `fn` on every rank; if it raised an `MMAccelError` on any rank, raise it on all of them.
        `fn` must not use collectives (a rank that failed would not reach them)."""
        if not self.active:
            return fn()
        result, error = None, None
        try:
            result = fn()
        except MMAccelError as err:
            error = str(err)
        errors = [e for e in self.all_gather(error) if e is not None]
        if errors:
            raise InputError(errors[0])
        return result

    def on_main(self, fn: Callable[[], T]) -> T | None:
        """Run `fn` on rank 0 only; its `MMAccelError` is raised on every rank. Returns `fn`'s result
        on rank 0 and None on the others. `fn` must not use collectives."""
        if not self.active:
            return fn()
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except MMAccelError as err:
                error = str(err)
        error = self.broadcast(error)
        if error is not None:
            raise InputError(error)
        return result


def launch_env(environ: dict[str, str] | None = None) -> dict[str, int] | None:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from a torchrun / accelerate environment, or
    None when RANK / WORLD_SIZE are absent (a plain one-process run)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    values = {}
    for name, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "RANK"),
                          ("LOCAL_WORLD_SIZE", "WORLD_SIZE")):
        text = env.get(name, env[default] if default else None)
        try:
            values[name] = int(text)
        except (TypeError, ValueError):
            raise InputError(f"environment variable {name}={text!r} is not an integer (set by torchrun / "
                             "accelerate launch; unset RANK and WORLD_SIZE for a one-process run)") from None
    check(values["WORLD_SIZE"] >= 1 and 0 <= values["RANK"] < values["WORLD_SIZE"],
          f"RANK={values['RANK']} is not in [0, WORLD_SIZE={values['WORLD_SIZE']})")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    check(not missing, f"RANK and WORLD_SIZE are set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                       "not: start the command with torchrun / accelerate launch, or unset RANK and WORLD_SIZE")
    return values


def default_threads(local_world_size: int = 1) -> int:
    """Usable CPU cores divided by the processes on this node, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


def pick_backend(local_world_size: int = 1) -> str:
    """`MMACCEL_DIST_BACKEND` if set, else NCCL when there is a CUDA device for every process on this
    node, else gloo."""
    chosen = os.environ.get(BACKEND_ENV)
    if chosen:
        check(chosen in ("gloo", "nccl"), f"{BACKEND_ENV} must be gloo or nccl, got {chosen!r}")
        return chosen
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size
    return "nccl" if cuda and torch.distributed.is_nccl_available() else "gloo"


@contextmanager
def distributed(threads: int | None = None) -> Iterator[Dist]:
    """The process group of a torchrun / accelerate launch (or a one-process `Dist`), with this
    process's torch threads set; on exit: barrier, group destroyed, previous thread count restored."""
    check(threads is None or (isinstance(threads, int) and threads >= 1), f"threads must be >= 1, got {threads!r}")
    env = launch_env()
    previous_threads = torch.get_num_threads()
    local_world = env["LOCAL_WORLD_SIZE"] if env else 1
    n_threads = threads or default_threads(local_world)
    torch.set_num_threads(n_threads)
    started = False
    try:
        if env is None:
            yield Dist(threads=n_threads)
            return
        backend = pick_backend(local_world)
        if backend == "nccl":
            torch.cuda.set_device(env["LOCAL_RANK"])
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend, rank=env["RANK"], world_size=env["WORLD_SIZE"],
                                                 timeout=TIMEOUT)
            started = True
        dist = Dist(env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], local_world, backend, n_threads)
        yield dist
        dist.barrier()
    finally:
        if started:
            torch.distributed.destroy_process_group()
        torch.set_num_threads(previous_threads)


def progress(iterable: Iterable[T], dist: Dist, desc: str, total: int | None = None) -> Iterable[T]:
    """`iterable` with a tqdm bar on rank 0's stderr when it is a terminal (silent otherwise and on
    the other ranks)."""
    from mmaccel.progress import progress as bar

    return bar(iterable, desc=desc, total=total, enabled=dist.is_main)
