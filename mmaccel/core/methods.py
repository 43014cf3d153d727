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

from mmaccel.core.adaptive import AdaptiveDrafting
from mmaccel.core.jacobi import INITS, JacobiProposer
from mmaccel.core.model import DecoderModel
from mmaccel.core.plugin import NEEDS, MethodPlugin, param, registry
from mmaccel.core.proposers import DraftModelProposer, EarlyExitProposer, HeadsProposer, NGramProposer, Proposer
from mmaccel.core.sampling import Sampling
from mmaccel.core.speculative import Generation, LoopConfig, RowFeed, decode, joins
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


def _no_proposer(resources: Resources) -> None:
    return None


@dataclass
class Method:
    """A configured method. Built by its plug-in (`MethodPlugin.make`), which sets `needs` (the resources it
    declares, checked before it runs) and `lossless` (its declared exactness, or for a relaxed method whether
    these parameters spend no budget)."""

    name: str
    description: str
    make_proposer: Callable[[Resources], Proposer | None] = field(default=_no_proposer, repr=False)
    rule: str | Callable[..., Any] = "speculative"   # when sampling (a name in RULES, or a rule function);
    #                                                  greedy decoding always verifies greedily
    k: int = 0
    tree: tuple[int, int] | None = None
    coupled: bool = False
    rule_params: dict[str, Any] = field(default_factory=dict)
    # rule parameters computed from the resources (e.g. LANTERN's neighbour table from the latents)
    make_rule_params: Callable[[Resources], dict[str, Any]] | None = field(default=None, repr=False)
    # a decoder with its own schedule: runner(resources, inputs, ...); token decoders take max_new_tokens=, sampling=,
    # seed=, eos_token_id= and return a Generation, other families (next-scale, continuous, CTC) their own result
    runner: Callable[..., Any] | None = field(default=None, repr=False)
    # reads the target's logit values (beam scores, typical acceptance), not only each row's arg-max
    exact_logits: bool = False
    needs: tuple[str, ...] = ()
    lossless: bool = False

    def check_needs(self, resources: Resources) -> None:
        """A one-line error when `resources` lack something this method needs."""
        for need in self.needs:
            _need(resources, need, self.name)

    def loop_config(self, resources: Resources, adaptive: AdaptiveDrafting | None = None) -> LoopConfig:
        params = dict(self.rule_params)
        if self.make_rule_params is not None:
            params.update(self.make_rule_params(resources))
        return LoopConfig(proposer=self.make_proposer(resources), rule=self.rule, k=self.k, tree=self.tree,
                          coupled=self.coupled, rule_params=params or None, adaptive=adaptive)

    def run(self, resources: Resources, inputs: Any, *, max_new_tokens: int, sampling: Sampling = Sampling(),
            seed: int = 0, eos_token_id: int | None = None, prompt_tokens: list[list[int]] | None = None,
            adaptive: AdaptiveDrafting | None = None, feed: RowFeed | None = None) -> Generation:
        """Decode `inputs` (whatever the target's `prefill` takes) with this method; with `adaptive` (the pass
        costs measured so far), greedy passes draft only what pays (`mmaccel.core.adaptive`); with `feed`,
        requests join the call as its rows end (`joins`; `mmaccel.core.speculative.RowFeed`)."""
        self.check_needs(resources)
        if self.runner is not None:
            check(feed is None, f"method {self.name!r} has a schedule of its own: it cannot take joining requests")
            return self.runner(resources, inputs, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                               eos_token_id=eos_token_id)
        return decode(resources.model, inputs, self.loop_config(resources, adaptive), max_new_tokens=max_new_tokens,
                      sampling=sampling, seed=seed, eos_token_id=eos_token_id, prompt_tokens=prompt_tokens, feed=feed)

    def joins(self, resources: Resources) -> bool:
        """Whether its calls on `resources` can take requests as their rows end (continuous batching)."""
        return self.runner is None and joins(resources.model, self.loop_config(resources))


def _need(resources: Resources, attr: str, method: str):
    value = getattr(resources, attr) if hasattr(resources, attr) else resources.extras.get(attr)
    if value is None:
        raise InputError(f"method {method!r} needs {NEEDS.get(attr, attr)}, and this pipeline has none loaded")
    return value


@dataclass(frozen=True)
class ARParams:
    coupled: bool = param(False, "fix the sampling noise per position, as the coupled methods read it "
                                 "(their token-for-token twin)")


def _ar(p: ARParams) -> Method:
    return Method("ar", f"plain autoregressive decoding (the baseline){', coupled noise' if p.coupled else ''}",
                  coupled=p.coupled)


def chain_label(k: int, stop_below: float, siblings: int) -> str:
    """How a drafter's chain options read in a method's description."""
    label = f"k={k}" if stop_below == 0 else f"k <= {k}, greedy chains stop below draft probability {stop_below}"
    return label + (f", {siblings} runner-up siblings of the unsure draft" if siblings else "")


def check_siblings(stop_below: float, siblings: int) -> None:
    check(siblings == 0 or stop_below > 0,
          "siblings are the runner-ups of an unsure draft: they need stop_below > 0")


@dataclass(frozen=True)
class SpeculativeParams:
    k: int = param(4, "draft tokens per verification (the most, with stop_below)", low=1, high=64)
    stop_below: float = param(0.0, "a greedy draft chain stops below this draft probability (0: never)",
                              low=0.0, high=0.999)
    siblings: int = param(0, "runner-up siblings of the unsure draft verified beside it", low=0, high=15)
    coupled: bool = param(False, "coupled verification (SCD): the sampling noise fixed per position")

    def __post_init__(self):
        check_siblings(self.stop_below, self.siblings)


def _speculative(p: SpeculativeParams) -> Method:
    return Method("speculative", f"chain speculative decoding, draft model, {chain_label(p.k, p.stop_below, p.siblings)}",
                  lambda r: DraftModelProposer(_need(r, "draft", "speculative"), p.stop_below, p.siblings),
                  "coupled" if p.coupled else "speculative", k=p.k, coupled=p.coupled)


@dataclass(frozen=True)
class TreeParams:
    depth: int = param(4, "draft tree depth", low=1, high=64)
    width: int = param(2, "children kept per node (best-first)", low=1, high=16)


def _tree(p: TreeParams) -> Method:
    return Method("tree", f"tree speculative decoding (best-first draft tree, depth {p.depth} x width {p.width})",
                  lambda r: DraftModelProposer(_need(r, "draft", "tree")), tree=(p.depth, p.width))


@dataclass(frozen=True)
class NGramParams:
    k: int = param(4, "draft tokens per verification", low=1, high=64)
    max_ngram: int = param(3, "longest n-gram matched in the prompt and output", low=1, high=16)


def _ngram(p: NGramParams) -> Method:
    return Method("ngram", f"prompt-lookup n-gram drafts (n <= {p.max_ngram}), k={p.k}",
                  lambda r: NGramProposer(max_ngram=p.max_ngram), k=p.k)


@dataclass(frozen=True)
class JacobiParams:
    window: int = param(8, "Jacobi window: tokens guessed and verified per pass", low=1, high=64)
    init: str = param("repeat", "how fresh window positions are guessed", choices=INITS, what="Jacobi init")
    stride: int = param(0, "'above' init: the row width (0: the pipeline's grid width)", low=0, high=1 << 20)


def _sjd(p: JacobiParams, coupled: bool = False) -> Method:
    name = "sjd-coupled" if coupled else "sjd"

    def proposer(r: Resources) -> JacobiProposer:
        row = p.stride or r.extras.get("row_stride")
        check(p.init != "above" or bool(row), "Jacobi init 'above' takes the token one row up: give stride=<row "
                                              "width> (image pipelines pass their grid width)")
        return JacobiProposer(p.window, "coupled" if coupled else "sample", p.init, row if p.init == "above" else None)

    guesses = "" if p.init == "repeat" else f", fresh guesses {'one row up' if p.init == 'above' else 'at random'}"
    return Method(name, f"{'coupled ' if coupled else ''}speculative Jacobi decoding, window {p.window}{guesses} "
                  f"(greedy: Jacobi decoding)", proposer,
                  "coupled" if coupled else "speculative", k=p.window, coupled=coupled)


@dataclass(frozen=True)
class EarlyExitParams:
    k: int = param(4, "draft tokens per verification", low=1, high=64)
    exit_layer: int = param(2, "layers that draft (the first ones, with a trained exit head where there is one)",
                            low=1, high=1024)


def _early_exit(p: EarlyExitParams) -> Method:
    return Method("early-exit", f"self-speculative: first {p.exit_layer} layers draft, k={p.k}",
                  lambda r: EarlyExitProposer(r.model, p.exit_layer, (r.exit_heads or {}).get(p.exit_layer)), k=p.k)


@dataclass(frozen=True)
class MedusaParams:
    depth: int = param(3, "draft tree depth (heads used)", low=1, high=64)
    width: int = param(2, "candidates kept per head", low=1, high=16)


@dataclass(frozen=True)
class TypicalParams:
    depth: int = param(3, "heads used (chain length)", low=1, high=64)
    width: int = param(2, "candidates kept per head", low=1, high=16)
    epsilon: float = param(0.3, "typical acceptance: the posterior threshold (hard floor)", low=0.0, high=1.0)
    delta: float = param(0.09, "typical acceptance: entropy-scaled floor", low=0.0, high=10.0)


def _medusa(p: MedusaParams) -> Method:
    return Method("medusa", f"Medusa heads, tree depth {p.depth} x width {p.width}",
                  lambda r: HeadsProposer(_need(r, "heads", "medusa")), tree=(p.depth, p.width))


def _medusa_typical(p: TypicalParams) -> Method:
    return Method("medusa-typical", f"Medusa heads, tree depth {p.depth} x width {p.width} (typical acceptance)",
                  lambda r: HeadsProposer(_need(r, "heads", "medusa-typical")), "typical", k=p.depth,
                  rule_params={"epsilon": p.epsilon, "delta": p.delta}, exact_logits=True)


AR = MethodPlugin("ar", ARParams, _ar, "law-exact", summary="plain autoregressive decoding (the baseline)")
SPECULATIVE = MethodPlugin("speculative", SpeculativeParams, _speculative, "law-exact", ("draft",),
                           summary="chain speculative decoding with a draft model",
                           paper="Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318")
TREE = MethodPlugin("tree", TreeParams, _tree, "law-exact", ("draft",),
                    summary="tree speculative decoding with a draft model",
                    paper="EAGLE-2 (Li et al. 2024), arXiv 2406.16858")
NGRAM = MethodPlugin("ngram", NGramParams, _ngram, "law-exact", summary="prompt-lookup n-gram drafts",
                     host_reads=None, host_reads_why="prompt lookup is a string search on the host: every proposal "
                                                     "reads the history back (NGramProposer)",
                     paper="prompt lookup decoding (Saxena 2023)")
SJD = MethodPlugin("sjd", JacobiParams, _sjd, "law-exact", summary="speculative Jacobi decoding (SJD)",
                   paper="SJD (Teng et al., ICLR 2025), arXiv 2410.01699")
SJD_COUPLED = MethodPlugin("sjd-coupled", JacobiParams, lambda p: _sjd(p, coupled=True), "law-exact",
                           summary="speculative Jacobi decoding with coupled noise (SCD)",
                           paper="SCD / MC-SJD (ICML 2026), arXiv 2510.24211")
EARLY_EXIT = MethodPlugin("early-exit", EarlyExitParams, _early_exit, "law-exact",
                          summary="self-speculative: the first layers draft",
                          paper="LayerSkip (Elhoushi et al. 2024), arXiv 2404.16710")
MEDUSA = MethodPlugin("medusa", MedusaParams, _medusa, "law-exact", ("heads",), summary="Medusa heads, tree verify",
                      paper="Medusa (Cai et al. 2024), arXiv 2401.10774")
MEDUSA_TYPICAL = MethodPlugin("medusa-typical", TypicalParams, _medusa_typical, "relaxed", ("heads",),
                              budget="epsilon", summary="Medusa heads with typical acceptance",
                              paper="Medusa (Cai et al. 2024), arXiv 2401.10774")

REGISTRY: dict[str, MethodPlugin] = registry(AR, SPECULATIVE, TREE, NGRAM, SJD, SJD_COUPLED, EARLY_EXIT, MEDUSA,
                                             MEDUSA_TYPICAL)


def build_method(name: str | Method, registry: dict[str, MethodPlugin] | None = None, **params: Any) -> Method:
    """The method called `name` in `registry` (default: the core REGISTRY), configured by `params`
    (k, depth, width, window, ...); a Method object is returned as it is."""
    if isinstance(name, Method):
        check(not params, "pass parameters when building a method by name, not with a Method object")
        return name
    registry = REGISTRY if registry is None else registry
    check(isinstance(name, str), f"method must be a name or a Method, got {type(name).__name__}")
    if name not in registry:
        raise InputError(f"unknown method {name!r}; choose from {', '.join(registry)}")
    return registry[name].make(params)
