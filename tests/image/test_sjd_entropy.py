"""sjd-entropy: the rule's output law and reported bound (Monte Carlo against the closed form, with a negative
control), budget 0 reproducing SJD draw for draw on the built-in pipeline, and a relaxed run's reported bound."""

import math

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.image.methods import build_image_method
from mmaccel.image.pipeline import ImagePipeline
from mmaccel.image.sjd_entropy import accept_entropy
from tests.core.test_speculative import chi2_rejects

P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
Q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])


def closed_form(p: torch.Tensor, q: torch.Tensor, boost: float) -> tuple[torch.Tensor, float]:
    """The law of the emitted token (q a' + (1 - sum q a') r) and the TV bound eps = sum q (a' - a)."""
    scale = 1 + boost * float(-(p * p.log()).sum()) / math.log(p.numel())
    relaxed = torch.where(q > 0, (scale * p / q).clamp(max=1), torch.zeros_like(p))
    exact = torch.where(q > 0, (p / q).clamp(max=1), torch.zeros_like(p))
    residual = (p - q).clamp_min(0)
    law = q * relaxed + (1 - (q * relaxed).sum()) * residual / residual.sum()
    return law, float((q * (relaxed - exact)).sum())


@pytest.mark.parametrize("boost", [0.0, 0.5, 3.0])
@pytest.mark.parametrize("point_mass", [False, True])
def test_rule_law_and_reported_bound_match_the_closed_form(boost, point_mass):
    torch.manual_seed(0)
    N, V = 100_000, P.numel()
    q = torch.nn.functional.one_hot(torch.tensor(3), V).float() if point_mass else Q
    drafts = torch.multinomial(q, N, replacement=True)[:, None]                       # [N, 1]
    target = P.expand(N, 2, V)
    uniforms = torch.rand(N, 1)
    verdict = accept_entropy(drafts, None if point_mass else q.expand(N, 1, V), target, uniforms,
                             torch.empty(N, 2, V).exponential_(), boost=boost)
    emitted = torch.where(verdict.num_accepted >= 1, drafts[:, 0], verdict.next_token)
    law, eps = closed_form(P, q, boost)
    assert not chi2_rejects(emitted, law)
    assert chi2_rejects(emitted, P) == (boost > 0)        # the relaxation is visible; at budget 0 it is the target
    assert torch.allclose(verdict.deviation, torch.full((N,), eps), atol=1e-5)
    assert 0.5 * float((law - P).abs().sum()) <= eps + 1e-6
    p_x, q_x = P[drafts[:, 0]], q[drafts[:, 0]]
    rescued = ((verdict.num_accepted >= 1) & ~(uniforms[:, 0] * q_x < p_x)).float()  # kept, the exact rule rejects
    assert abs(float(rescued.mean()) - eps) < 5 * math.sqrt(max(eps, 1e-4) / N)


def test_deviation_counts_the_kept_drafts_and_the_correction_only():
    p = torch.tensor([[[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [1.0, 0, 0, 0]]])
    q = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.05, 0.05, 0.1, 0.8], [0.1, 0.1, 0.1, 0.7]]])
    drafts = torch.tensor([[0, 3, 0]])
    verdict = accept_entropy(drafts, q, p, torch.tensor([[0.0, 0.99, 0.0]]), torch.ones(1, 4, 4), boost=0.5)
    assert verdict.num_accepted.tolist() == [1]                       # s * 0.25 / 0.8 < 0.99 at the second draft
    bound = [closed_form(p[0, j], q[0, j], 0.5)[1] for j in range(3)]
    assert abs(float(verdict.deviation) - (bound[0] + bound[1])) < 1e-6 and bound[2] > 0


@pytest.fixture(scope="module")
def pipe():
    torch.set_num_threads(1)
    return ImagePipeline.from_pretrained(draft=None)


KW = dict(cfg_scale=2.0, temperature=1.0, top_k=0, seed=11)


@pytest.fixture(scope="module")
def sjd(pipe):
    return pipe.generate([3, 7], "sjd", window=16, **KW)


def test_budget_zero_is_sjd_draw_for_draw(pipe, sjd):
    out = pipe.generate([3, 7], "sjd-entropy", window=16, boost=0.0, **KW)
    assert torch.equal(out.tokens, sjd.tokens) and out.stats.nfe == sjd.stats.nfe and out.stats.deviation == 0.0
    assert build_image_method("sjd-entropy", boost=0.0).lossless and not build_image_method("sjd-entropy").lossless


def test_relaxed_run_spends_a_bounded_reported_budget(pipe, sjd):
    out = pipe.generate([3, 7], "sjd-entropy", window=16, boost=4.0, **KW)
    assert out.tokens.shape == (2, 16, 16) and out.stats.new_tokens == 2 * 256
    assert out.stats.nfe < sjd.stats.nfe
    rows = out.stats.deviation_per_row
    assert len(rows) == 2 and abs(sum(rows) - out.stats.deviation) < 1e-6
    assert all(0 < r <= 256 for r in rows)            # at most 1 per decided position, at least one spent


def test_bad_parameters_are_refused_in_one_line():
    with pytest.raises(InputError, match=r"boost must be in \[0.0, 64.0\], got -1") as err:
        build_image_method("sjd-entropy", boost=-1)
    assert "\n" not in str(err.value)
