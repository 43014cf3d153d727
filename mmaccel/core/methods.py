"""Named decoding methods: each is a proposer + an acceptance rule + a loop shape.

Methods are to decoding what schedulers are to diffusion: chosen by name (`method="sjd"`) or
passed as an object, swappable without touching the model. A `Method` is a recipe; the proposer it
needs is built fresh for every call (proposers hold per-call state) from the `Resources` the
pipeline has (target model, draft model, Medusa heads, token latents). Methods whose schedule is
not draft-then-verify (ZipAR's wavefront) bring their own `runner`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from mmaccel.core.jacobi import INITS, JacobiProposer
from mmaccel.core.model import DecoderModel
from mmaccel.core.proposers import DraftModelProposer, EarlyExitProposer, HeadsProposer, NGramProposer, Proposer
from mmaccel.core.sampling import Sampling
from mmaccel.core.speculative import Generation, LoopConfig, decode
from mmaccel.errors import InputError, check


@dataclass
class Resources:
    """What a pipeline can offer methods: the target, and optionally a draft model, Medusa heads,
    trained early-exit heads (by exit layer) and the latent vector of every token (an image
    tokenizer's codebook, [V, D]) for latent neighbourhoods."""

    model: DecoderModel
    draft: DecoderModel | None = None
    heads: nn.ModuleList | None = None
    latents: Tensor | None = None
    exit_heads: dict[int, nn.Module] | None = None
    extras: dict[str, Any] = field(default_factory=dict)   # a domain's own resources by name (a Medusa block)


@dataclass
class Method:
    name: str
    description: str
    needs: str                      # what the method needs besides the target ("", "draft", "heads", ...)
    lossless: bool
    make_proposer: Callable[[Resources], Proposer | None] = field(repr=False)
    rule: str = "speculative"       # used when sampling; greedy decoding always verifies greedily
    k: int = 0
    tree: tuple[int, int] | None = None
    coupled: bool = False
    rule_params: dict[str, Any] = field(default_factory=dict)
    # rule parameters computed from the resources (e.g. LANTERN's neighbour table from the latents)
    make_rule_params: Callable[[Resources], dict[str, Any]] | None = field(default=None, repr=False)
    # a decoder with its own schedule: runner(resources, inputs, max_new_tokens=, sampling=, seed=, eos_token_id=)
    runner: Callable[..., Generation] | None = field(default=None, repr=False)
    # reads the target's logit values (beam scores, typical acceptance), not only each row's arg-max
    exact_logits: bool = False

    def loop_config(self, resources: Resources) -> LoopConfig:
        params = dict(self.rule_params)
        if self.make_rule_params is not None:
            params.update(self.make_rule_params(resources))
        return LoopConfig(proposer=self.make_proposer(resources), rule=self.rule, k=self.k, tree=self.tree,
                          coupled=self.coupled, rule_params=params or None)

    def run(self, resources: Resources, inputs: Any, *, max_new_tokens: int, sampling: Sampling = Sampling(),
            seed: int = 0, eos_token_id: int | None = None, prompt_tokens: list[list[int]] | None = None) -> Generation:
        """Decode `inputs` (whatever the target's `prefill` takes) with this method."""
        if self.runner is not None:
            return self.runner(resources, inputs, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                               eos_token_id=eos_token_id)
        return decode(resources.model, inputs, self.loop_config(resources), max_new_tokens=max_new_tokens,
                      sampling=sampling, seed=seed, eos_token_id=eos_token_id, prompt_tokens=prompt_tokens)


_NEEDS = {"draft": "a draft model", "heads": "trained Medusa heads", "latents": "token latents (a codebook)",
          "exit_heads": "trained early-exit heads", "medusa_block": "a trained Medusa block",
          "eagle": "a trained EAGLE head",
          "assistant": "an assistant model (another tokenizer)",
          "embeddings": "a model that reads input embeddings (the LlamaGen GPT)"}


def _need(resources: Resources, attr: str, method: str):
    value = getattr(resources, attr) if hasattr(resources, attr) else resources.extras.get(attr)
    if value is None:
        raise InputError(f"method {method!r} needs {_NEEDS.get(attr, attr)}, and this pipeline has none loaded")
    return value


def _int(params: dict, key: str, default: int, low: int = 1, high: int = 64) -> int:
    value = params.pop(key, default)
    check(isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
          f"{key} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _float(params: dict, key: str, default: float, low: float, high: float) -> float:
    value = params.pop(key, default)
    check(isinstance(value, (int, float)) and low <= value <= high, f"{key} must be in [{low}, {high}], got {value!r}")
    return float(value)


def _ar(p):
    # coupled: the sampling noise fixed per position, as the coupled methods read it (their token-for-token twin)
    coupled = bool(p.pop("coupled", False))
    return Method("ar", f"plain autoregressive decoding (the baseline){', coupled noise' if coupled else ''}", "", True,
                  lambda r: None, coupled=coupled)


def chain_options(p: dict, k: int = 4, stop_below: float = 0.0) -> tuple[int, float, int, str]:
    """A drafter's chain options from `p` (defaults `k`, `stop_below`; no siblings): k, stop_below,
    siblings and a description."""
    k = _int(p, "k", k)
    stop = _float(p, "stop_below", stop_below, 0.0, 0.999)
    siblings = _int(p, "siblings", 0, low=0, high=15)
    check(siblings == 0 or stop > 0, "siblings are the runner-ups of an unsure draft: they need stop_below > 0")
    label = f"k={k}" if stop == 0 else f"k <= {k}, greedy chains stop below draft probability {stop}"
    if siblings:
        label += f", {siblings} runner-up siblings of the unsure draft"
    return k, stop, siblings, label


def _speculative(p):
    coupled = bool(p.pop("coupled", False))
    k, stop, siblings, label = chain_options(p)
    return Method("speculative", f"chain speculative decoding, draft model, {label}", "draft", True,
                  lambda r: DraftModelProposer(_need(r, "draft", "speculative"), stop, siblings),
                  "coupled" if coupled else "speculative", k=k, coupled=coupled)


def _tree(p):
    depth, width = _int(p, "depth", 4), _int(p, "width", 2, high=16)
    return Method("tree", f"tree speculative decoding (best-first draft tree, depth {depth} x width {width})", "draft",
                  True, lambda r: DraftModelProposer(_need(r, "draft", "tree")), tree=(depth, width))


def _ngram(p):
    k, n = _int(p, "k", 4), _int(p, "max_ngram", 3, high=16)
    return Method("ngram", f"prompt-lookup n-gram drafts (n <= {n}), k={k}", "", True,
                  lambda r: NGramProposer(max_ngram=n), k=k)


def _sjd(p, coupled=False):
    window = _int(p, "window", 8)
    init = p.pop("init", "repeat")
    check(init in INITS, f"unknown Jacobi init {init!r}; choose from {', '.join(INITS)}")
    stride = _int(p, "stride", 0, low=0, high=1 << 20)      # "above": the row width (0: the pipeline's)
    name = "sjd-coupled" if coupled else "sjd"

    def proposer(r: Resources) -> JacobiProposer:
        row = stride or r.extras.get("row_stride")
        check(init != "above" or bool(row), "Jacobi init 'above' takes the token one row up: give stride=<row width> "
                                            "(image pipelines pass their grid width)")
        return JacobiProposer(window, "coupled" if coupled else "sample", init, row if init == "above" else None)

    guesses = "" if init == "repeat" else f", fresh guesses {'one row up' if init == 'above' else 'at random'}"
    return Method(name, f"{'coupled ' if coupled else ''}speculative Jacobi decoding, window {window}{guesses} "
                  f"(greedy: Jacobi decoding)", "", True, proposer,
                  "coupled" if coupled else "speculative", k=window, coupled=coupled)


def _early_exit(p):
    k, layer = _int(p, "k", 4), _int(p, "exit_layer", 2, high=1024)
    return Method("early-exit", f"self-speculative: first {layer} layers draft, k={k}", "", True,
                  lambda r: EarlyExitProposer(r.model, layer, (r.exit_heads or {}).get(layer)), k=k)


def _medusa(p, typical=False):
    depth, width = _int(p, "depth", 3), _int(p, "width", 2, high=16)
    rule_params = {"epsilon": _float(p, "epsilon", 0.3, 0, 1), "delta": _float(p, "delta", 0.09, 0, 10)} if typical else {}
    name = "medusa-typical" if typical else "medusa"
    return Method(name, f"Medusa heads, tree depth {depth} x width {width}" + (" (typical acceptance)" if typical else ""),
                  "heads", not typical, lambda r: HeadsProposer(_need(r, "heads", name)),
                  "typical" if typical else "speculative", k=depth if typical else 0,
                  tree=None if typical else (depth, width),
                  rule_params=rule_params, exact_logits=typical)


REGISTRY: dict[str, Callable[[dict], Method]] = {
    "ar": _ar,
    "speculative": _speculative,
    "tree": _tree,
    "ngram": _ngram,
    "sjd": _sjd,
    "sjd-coupled": lambda p: _sjd(p, coupled=True),
    "early-exit": _early_exit,
    "medusa": _medusa,
    "medusa-typical": lambda p: _medusa(p, typical=True),
}


def build_method(name: str | Method, registry: dict[str, Callable[[dict], Method]] | None = None,
                 **params: Any) -> Method:
    """The method called `name` in `registry` (default: the core REGISTRY), configured by `params`
    (k, depth, width, window, ...); a Method object is returned as it is."""
    if isinstance(name, Method):
        check(not params, "pass parameters when building a method by name, not with a Method object")
        return name
    registry = REGISTRY if registry is None else registry
    check(isinstance(name, str), f"method must be a name or a Method, got {type(name).__name__}")
    if name not in registry:
        raise InputError(f"unknown method {name!r}; choose from {', '.join(registry)}")
    rest = dict(params)
    method = registry[name](rest)
    check(not rest, f"method {name!r} does not take parameter(s) {', '.join(sorted(rest))}")
    return method
