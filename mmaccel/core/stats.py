"""DecodeStats: what a decoding call cost — target/draft passes, accepted lengths, time, memory.

Each counter is declared once, with its merge rule (how `+` combines two calls), its JSON form (rounding;
left out while empty) and one line of help. `+`, `to_dict`, `from_dict`, the benchmark rows and the app's
tables are generic over the declarations (`counters()`). A method that needs a counter of its own declares
it in its own module with `declare_counter` (as CSpD does for `fallbacks`): `stats.<name>` then reads and
writes it, and it is merged and serialised like the built-in ones.
"""

from __future__ import annotations

import copy
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


def _sum_per_key(a: dict, b: dict) -> dict:
    out = copy.copy(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


MERGES: dict[str, Callable[[Any, Any], Any]] = {
    "sum": operator.add,            # counts, summed budgets
    "max": max,                     # peaks
    "last": lambda a, b: copy.copy(b),  # what the latest call ran on
    "concat": operator.add,         # per-output lists, in call order
    "sum_per_key": _sum_per_key,    # histograms (Counter) and phase times (dict), key by key
}
_KINDS = (int, float, str, list, dict, Counter)


@dataclass(frozen=True)
class CounterSpec:
    """One declared counter. Its kind is its default's type: int, float or str; a list of floats (one per
    output); a dict of floats by name (phase times); a Counter of int -> int (a histogram, JSON keys are the
    sorted ints as strings)."""

    name: str
    default: Any                    # copied for each new DecodeStats
    merge: str                      # a key of MERGES: how `a + b` combines the two values
    help: str                       # one line: what is counted, and its unit
    ndigits: int | None = None      # JSON rounding of a float (of each float in a list or dict)
    omit_empty: bool = False        # left out of the JSON while zero / empty (counters only some methods report)
    per_output: bool = False        # one entry per generated output: left out of summaries
    label: str = ""                 # short name for tables (the app); the name if empty
    extra: bool = False             # declared by a method (`declare_counter`), kept in `DecodeStats.extra`

    def __post_init__(self) -> None:
        if self.merge not in MERGES:
            raise ValueError(f"counter {self.name!r}: merge must be one of {sorted(MERGES)}, got {self.merge!r}")
        if type(self.default) not in _KINDS or isinstance(self.default, list | dict) and self.default:
            raise ValueError(f"counter {self.name!r}: the default must be an int, float or str, or an empty list, "
                             f"dict or Counter; got {self.default!r}")
        if not self.help:
            raise ValueError(f"counter {self.name!r}: say in `help` what it counts")

    @property
    def scalar(self) -> bool:
        return not isinstance(self.default, list | dict)

    def empty(self) -> Any:
        return copy.copy(self.default)

    def merged(self, a: Any, b: Any) -> Any:
        return MERGES[self.merge](a, b)

    def encode(self, value: Any) -> Any:
        """The JSON form of `value`."""
        nd = self.ndigits
        if isinstance(self.default, Counter):
            return {str(k): v for k, v in sorted(value.items())}
        if isinstance(self.default, dict):
            return {k: v if nd is None else round(v, nd) for k, v in value.items()}
        if isinstance(self.default, list):
            return [x if nd is None else round(x, nd) for x in value]
        return value if nd is None else round(value, nd)

    def decode(self, value: Any) -> Any:
        """The inverse of `encode` (up to its rounding)."""
        if isinstance(self.default, Counter):
            return Counter({int(k): int(v) for k, v in value.items()})
        if isinstance(self.default, dict):
            return {k: float(v) for k, v in value.items()}
        if isinstance(self.default, list):
            return [float(x) for x in value]
        return type(self.default)(value)


def counter(default: Any = 0, *, merge: str, help: str, ndigits: int | None = None, omit_empty: bool = False,
            per_output: bool = False, label: str = "") -> Any:
    """A `DecodeStats` field declared with its rule (see `CounterSpec`); a container default is copied per instance."""
    spec = CounterSpec("", default, merge, help, ndigits, omit_empty, per_output, label)
    if spec.scalar:
        return field(default=default, metadata={"counter": spec})
    return field(default_factory=spec.empty, metadata={"counter": spec})


class _Derived(property):
    after: str
    ndigits: int


def derived(after: str, ndigits: int) -> Callable[[Callable[[Any], float]], property]:
    """A property computed from the counters, written by `to_dict` right after the counter `after` (and left out
    with it), rounded to `ndigits`."""
    def wrap(fget: Callable[[Any], float]) -> property:
        prop = _Derived(fget, doc=fget.__doc__)
        prop.after, prop.ndigits = after, ndigits
        return prop
    return wrap


@dataclass
class DecodeStats:
    """Counters of one or more decoding calls; `+` aggregates, `to_dict()` is JSON-ready.

    nfe counts target forward passes including the prefill (plain AR: one per generated token).
    The accepted-length histogram counts, per verifying target pass and per active row, the tokens
    that pass emitted (1 for plain AR, up to K+1 for K drafts).
    """

    nfe: int = counter(0, merge="sum", help="target forward passes, the prefill included (plain AR: one per token)")
    draft_passes: int = counter(0, merge="sum", help="forward passes of a draft model")
    new_tokens: int = counter(0, merge="sum", help="tokens generated, all rows together")
    accepted_hist: Counter = counter(Counter(), merge="sum_per_key",
                                     help="tokens emitted by a verifying target pass for one row -> how often")
    time_s: dict[str, float] = counter({}, merge="sum_per_key", ndigits=6, help="wall time per phase (and 'total'), s")
    peak_mem_mb: float = counter(0.0, merge="max", ndigits=1,
                                 help="peak memory: CUDA allocated bytes, or the process's resident set on a CPU, MB")
    device: str = counter("cpu", merge="last", help="the device the latest call ran on")
    deviation: float = counter(0.0, merge="sum", ndigits=6,
                               help="TV budget spent by relaxed acceptance rules (0 for lossless ones)")
    deviation_per_row: list[float] = counter([], merge="concat", ndigits=6, per_output=True,
                                             help="the TV budget spent, per generated sequence")
    exit_hist: Counter = counter(Counter(), merge="sum_per_key", omit_empty=True, label="early exits",
                                 help="early exit: layers run -> tokens emitted after that many")
    cache_mb: float = counter(0.0, merge="max", ndigits=3, omit_empty=True, label="KV cache (MB)",
                              help="largest KV cache a call allocated (where the method reports it), MB")
    extra: dict[str, Any] = field(default_factory=dict)     # the counters methods declare (`declare_counter`)

    @derived(after="exit_hist", ndigits=4)
    def mean_exit_layer(self) -> float:
        """Average number of layers run per token emitted by an early-exit decoder (0 if none)."""
        n = sum(self.exit_hist.values())
        return sum(k * v for k, v in self.exit_hist.items()) / n if n else 0.0

    @derived(after="new_tokens", ndigits=4)
    def mean_accepted(self) -> float:
        steps = sum(self.accepted_hist.values())
        return sum(k * v for k, v in self.accepted_hist.items()) / steps if steps else 0.0

    @property
    def wall_s(self) -> float:
        return self.time_s.get("total", sum(self.time_s.values()))

    def record_accepted(self, lengths: list[int]) -> None:
        self.accepted_hist.update(lengths)

    @contextmanager
    def timed(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.time_s[phase] = self.time_s.get(phase, 0.0) + time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        """A counter a method declared (`declare_counter`): its default until written."""
        spec = _EXTRA.get(name)
        if spec is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.extra.setdefault(name, spec.empty())     # stored, so an in-place update (a histogram's) sticks

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXTRA:
            self.extra[name] = value
        else:
            object.__setattr__(self, name, value)

    def _read(self, spec: CounterSpec) -> Any:
        if spec.extra:
            return self.extra[spec.name] if spec.name in self.extra else spec.empty()
        return getattr(self, spec.name)

    def __add__(self, other: DecodeStats) -> DecodeStats:
        out = type(self)()
        for spec in counters():
            if not spec.extra or spec.name in self.extra or spec.name in other.extra:
                setattr(out, spec.name, spec.merged(self._read(spec), other._read(spec)))
        return out

    def to_dict(self, summary: bool = False) -> dict:
        """JSON-ready: the counters in declaration order, each in its JSON form and followed by its derived values;
        those declared `omit_empty` are left out while empty, and with `summary=True` the per-output lists too."""
        return dict(self._json(lambda spec: not (summary and spec.per_output)))

    def reported(self) -> dict:
        """The counters only some methods report (declared `omit_empty`: KV cache size, early exits, a method's own)
        that these calls did, as in `to_dict`; {} for plain decoding."""
        return dict(self._json(lambda spec: spec.omit_empty))

    def _json(self, keep: Callable[[CounterSpec], bool]) -> Iterator[tuple[str, Any]]:
        for spec in counters():
            value = self._read(spec)
            if keep(spec) and not (spec.omit_empty and not value):
                yield spec.name, spec.encode(value)
                for name, ndigits in _DERIVED.get(spec.name, ()):
                    yield name, round(getattr(self, name), ndigits)

    @classmethod
    def from_dict(cls, d: dict) -> DecodeStats:
        """Inverse of `to_dict()` for every declared counter (derived values are recomputed), so stats stored as
        JSON (a resumed evaluation's batches) aggregate like fresh ones. A method's counter is read once its
        module (which declares it) has been imported."""
        out = cls()
        for spec in counters():
            if spec.name in d:
                setattr(out, spec.name, spec.decode(d[spec.name]))
        return out


_FIELDS = tuple(replace(f.metadata["counter"], name=f.name) for f in fields(DecodeStats) if "counter" in f.metadata)
_DERIVED: dict[str, list[tuple[str, int]]] = {}
for _name, _prop in vars(DecodeStats).items():
    if isinstance(_prop, _Derived):
        _DERIVED.setdefault(_prop.after, []).append((_name, _prop.ndigits))
_EXTRA: dict[str, CounterSpec] = {}


def counters() -> list[CounterSpec]:
    """Every declared counter, in JSON order: the fields of `DecodeStats`, then the methods' counters by name."""
    return [*_FIELDS, *(spec for _, spec in sorted(_EXTRA.items()))]


def declare_counter(name: str, default: Any = 0, *, merge: str = "sum", help: str, ndigits: int | None = None,
                    per_output: bool = False, label: str = "") -> CounterSpec:
    """Declare a method's own counter, at its module's import. `stats.<name>` then reads it (the default until
    written) and writes it; `+` merges it by `merge`; `to_dict`/`from_dict` carry it under `name`, left out while
    empty so the JSON of the methods that never touch it is unchanged. Declaring it again alike is a no-op."""
    spec = CounterSpec(name, default, merge, help, ndigits, True, per_output, label, extra=True)
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"counter name {name!r} must be a public Python identifier")
    if name in {f.name for f in fields(DecodeStats)} or hasattr(DecodeStats, name):
        raise ValueError(f"{name!r} is already a DecodeStats attribute; give the counter another name")
    if _EXTRA.get(name, spec) != spec:
        raise ValueError(f"counter {name!r} is already declared as {_EXTRA[name]}; one declaration per counter")
    _EXTRA[name] = spec
    return spec


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (4096 / 2**20)


def _hwm_mb() -> float:
    """The kernel's resident-set high-water mark of this process (VmHWM), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_open_peaks: list[list[float]] = []     # running peaks of the enclosing CPU trackers (resets are nested)


@contextmanager
def track_peak_memory(stats: DecodeStats, device: torch.device | str = "cpu", interval_s: float = 0.002):
    """Record the peak memory of the enclosed block into `stats.peak_mem_mb`.

    CUDA: peak allocated bytes. CPU: peak resident set size of the process (weights already
    resident included), from the kernel's high-water mark reset at entry, so a short spike is never
    missed however busy the machine; where that is unavailable, RSS sampled by a thread.
    """
    device = torch.device(device)
    stats.device = str(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield
        stats.peak_mem_mb = max(stats.peak_mem_mb, torch.cuda.max_memory_allocated(device) / 2**20)
        return
    try:
        peak = [_rss_mb()]
        _fold(_hwm_mb())
    except OSError:  # no /proc: report nothing rather than a wrong number
        yield
        return
    if _reset_hwm():
        _open_peaks.append(peak)
        try:
            yield
        finally:
            _open_peaks.pop()
            peak[0] = max(peak[0], _hwm_mb())
            _fold(peak[0])
            stats.peak_mem_mb = max(stats.peak_mem_mb, peak[0])
        return
    done = threading.Event()

    def sample():
        while not done.wait(interval_s):
            peak[0] = max(peak[0], _rss_mb())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        stats.peak_mem_mb = max(stats.peak_mem_mb, peak[0], _rss_mb())


def _fold(mb: float) -> None:
    """Credit `mb` to every enclosing tracker before a nested reset (or after a nested exit)."""
    for peak in _open_peaks:
        peak[0] = max(peak[0], mb)
