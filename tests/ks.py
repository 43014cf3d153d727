"""One-sample Kolmogorov-Smirnov test (no SciPy in the stack): does a sample follow a given CDF?"""

import math

import torch


def ks_pvalue(samples: torch.Tensor, cdf) -> float:
    """Asymptotic p-value of the KS statistic of 1-D `samples` against `cdf` (a torch function)."""
    x = samples.double().sort().values
    n = len(x)
    f = cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    d = torch.maximum(i / n - f, f - (i - 1) / n).max().item()
    t = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d          # Stephens' small-sample correction
    return max(0.0, min(1.0, 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * t * t) for k in range(1, 101))))


def normal_cdf(mean: float = 0.0, std: float = 1.0):
    return lambda x: torch.special.ndtr((x - mean) / std)
