"""Typed method plug-ins: what a decoding method declares, so that pipelines, the CLI (`mmaccel methods`), the app
and the tests read it without running it.

A plug-in has a name; a frozen dataclass of parameters whose fields are made with `param` (type from the
default, range or choices, one line of help); its exactness ("greedy-exact": bit-identical to plain greedy;
"law-exact": also the target's law when sampling; "relaxed": a budget parameter bounds what it changes, and it
reports the deviation in `DecodeStats.deviation`; "another-model": it runs another model than the target, a
baseline or quality floor such as the small model alone, and nothing bounds what that changes); the paper it
follows (`paper`, shown by the docs' methods reference); the resources it
needs (keys of `NEEDS`); how often a call reads back to the host on a GPU (`host_reads`: at most that many
values per call, or None with the reason it reads per pass); and `build`, which turns validated parameters into
the `Method` that runs. Cross-parameter rules go in the dataclass's `__post_init__`. A pipeline family's registry
is a dict name -> plug-in (`registry(...)`).

>>> @dataclass(frozen=True)
... class ChainParams:
...     k: int = param(4, "draft tokens per verification", low=1, high=64)
>>> plugin = MethodPlugin("chain", ChainParams, build=lambda p: ..., exactness="law-exact", needs=("draft",))
>>> plugin.configure({"k": 0})        # InputError: k must be an integer in [1, 64], got 0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from mmaccel.errors import InputError, check

EXACT = ("greedy-exact", "law-exact")
EXACTNESS = (*EXACT, "relaxed", "another-model")
# what a method can need besides the target, as a pipeline's `Resources` holds it (attribute or extras key)
NEEDS = {"draft": "a draft model", "heads": "trained Medusa heads", "latents": "token latents (a codebook)",
         "exit_heads": "trained early-exit heads", "medusa_block": "a trained Medusa block",
         "eagle": "a trained EAGLE head", "assistant": "an assistant model (another tokenizer)",
         "embeddings": "a model that reads input embeddings (the LlamaGen GPT)",
         "embedding_scale": "the scale of the model's token embeddings",
         "refiner": "a refiner (the small VAR that draws CoDe's later scales)"}
# what a call on the shared driver reads back to the host on a GPU, however long it decodes: the tokens, counts,
# commit passes, accepted-length histogram and deviation at the end (5), and a model adapter's host prompts
HOST_READS = 8


@dataclass(frozen=True)
class ParamInfo:
    """How one parameter is checked and documented."""

    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    what: str | None = None          # how an unknown choice is named in the error ("Jacobi init")


def param(default: Any, help: str, *, low: float | None = None, high: float | None = None,
          choices: Iterable[str] | None = None, what: str | None = None) -> Any:
    """A parameter field: `default` (its type is the parameter's: bool, int, float or str), `help` one line,
    an inclusive [low, high] range for numbers or `choices` for strings."""
    info = ParamInfo(help, low, high, None if choices is None else tuple(choices), what)
    return field(default=default, metadata={"param": info})


def _checked(name: str, info: ParamInfo, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        check(value in (True, False), f"{name} must be true or false, got {value!r}")
        return bool(value)
    if isinstance(default, int):
        check(isinstance(value, int) and not isinstance(value, bool) and info.low <= value <= info.high,
              f"{name} must be an integer in [{info.low}, {info.high}], got {value!r}")
        return value
    if isinstance(default, float):
        check(isinstance(value, (int, float)) and info.low <= value <= info.high,
              f"{name} must be in [{info.low}, {info.high}], got {value!r}")
        return float(value)
    if info.choices is not None:
        check(value in info.choices, f"unknown {info.what or name} {value!r}; choose from {', '.join(info.choices)}")
    return value


@dataclass(frozen=True)
class MethodPlugin:
    """A named method: its parameters, exactness, needs and the `build` that makes its `Method`."""

    name: str
    params: type
    build: Callable[[Any], Any] = field(repr=False)
    exactness: str = "greedy-exact"
    needs: tuple[str, ...] = ()
    budget: str | None = None        # relaxed methods: the parameter that bounds the deviation
    summary: str = ""
    paper: str = ""                  # the paper (or work) it follows, with its arXiv id where it has one; "" for a baseline
    # relaxed methods: whether parameters spend no budget, so that the output is exact (LANTERN at delta 0)
    exact_when: Callable[[Any], bool] | None = field(default=None, repr=False)
    # the most host reads of one call on a GPU, whatever its length (tests/test_method_conformance.py measures
    # them on the emulated device); None: it reads per pass, and `host_reads_why` says why in one line
    host_reads: int | None = HOST_READS
    host_reads_why: str = ""

    def __post_init__(self):
        check(self.exactness in EXACTNESS, f"{self.name}: exactness must be one of {EXACTNESS}")
        check(all(n in NEEDS for n in self.needs), f"{self.name}: needs must be keys of NEEDS, got {self.needs}")
        names = {f.name for f in fields(self.params)}
        check((self.exactness == "relaxed") == (self.budget is not None) and (self.budget is None or self.budget in names),
              f"{self.name}: a relaxed method names its budget parameter (and only a relaxed one)")
        check(self.exact_when is None or self.exactness == "relaxed", f"{self.name}: only a relaxed method has exact_when")
        check(all("param" in f.metadata and f.default is not MISSING for f in fields(self.params)),
              f"{self.name}: every parameter is a `param(...)` field with a default")
        check(self.host_reads is None or (isinstance(self.host_reads, int) and self.host_reads >= 0),
              f"{self.name}: host_reads is a count >= 0, or None for a method that reads per pass")
        check(self.host_reads is not None or (self.host_reads_why.strip() != "" and "\n" not in self.host_reads_why),
              f"{self.name}: a method that reads back per pass (host_reads=None) says why in one line (host_reads_why)")

    def configure(self, raw: dict[str, Any]) -> Any:
        """Validated parameters from `raw` (names -> values; missing ones take their defaults)."""
        known = [f.name for f in fields(self.params)]
        unknown = sorted(set(raw) - set(known))
        check(not unknown, f"method {self.name!r} does not take parameter(s) {', '.join(unknown)}; "
                           f"it takes {', '.join(known) if known else 'none'}")
        values = {f.name: _checked(f.name, f.metadata["param"], f.default, raw[f.name])
                  for f in fields(self.params) if f.name in raw}
        return self.params(**values)

    def make(self, raw: dict[str, Any]):
        """The `Method` for parameters `raw`, with this plug-in's needs and exactness."""
        params = self.configure(raw)
        method = self.build(params)
        method.needs = self.needs
        method.lossless = self.exactness in EXACT or (self.exact_when is not None and self.exact_when(params))
        return method

    def parameters(self) -> list[dict[str, Any]]:
        """One row per parameter: name, type, default, range or choices, help."""
        rows = []
        for f in fields(self.params):
            info: ParamInfo = f.metadata["param"]
            bounds = (f"one of {', '.join(info.choices)}" if info.choices else
                      f"[{info.low}, {info.high}]" if info.low is not None else "")
            rows.append({"name": f.name, "type": type(f.default).__name__, "default": f.default, "range": bounds,
                         "help": info.help})
        return rows


@dataclass(frozen=True)
class NoParams:
    """A method without parameters."""


def registry(*plugins: MethodPlugin) -> dict[str, MethodPlugin]:
    """A pipeline family's registry: name -> plug-in, in the order given (names are unique)."""
    out: dict[str, MethodPlugin] = {}
    for p in plugins:
        if p.name in out:
            raise InputError(f"two methods are called {p.name!r}")
        out[p.name] = p
    return out
