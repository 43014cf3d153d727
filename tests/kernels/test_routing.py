"""Which implementation each fused rule takes (no kernel runs here): the PyTorch reference for CPU
tensors, the Triton wrapper when MMACCEL_KERNELS=triton forces it; rules call only the dispatcher."""

import importlib

import pytest
import torch

from mmaccel.core import acceptance, tree
from mmaccel.kernels.dispatch import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton is not installed")

B, K, V, N = 2, 3, 11, 5


def _inputs():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(B, K + 1, V, generator=g).softmax(-1)
    q = torch.rand(B, K, V, generator=g).softmax(-1)
    drafts = torch.randint(0, V, (B, K), generator=g)
    return drafts, q, p, torch.rand(B, K, generator=g), torch.empty(B, K + 1, V).exponential_(generator=g)


def _tree(with_mask=True):
    """A small tree; its mask (which the verifiers read) already built by the reference, unless not asked."""
    t = tree.TokenTree(torch.tensor([[1, 2, 3, 4, 5]] * B), torch.tensor([[-1, 0, 0, 1, 3]] * B))
    if with_mask:
        with pytest.MonkeyPatch.context() as m:
            m.setenv("MMACCEL_KERNELS", "torch")
            t.mask()
    return t


def _chain(rule, **params):
    return lambda: rule(*_inputs(), **params)


def _tree_probs():
    return torch.rand(B, N, V, generator=torch.Generator().manual_seed(1)).softmax(-1)


CALLS = {   # fused entry point -> (kernel module, wrapper the dispatcher calls)
    "speculative": (_chain(acceptance.accept_speculative), "speculative", "verify_chain"),
    "pooled": (_chain(acceptance.accept_pooled, neighbours=torch.arange(V)[:, None].roll(1, 0), delta=0.2),
               "pooled", "verify_pooled"),
    "grouped": (_chain(acceptance.accept_grouped, distances=torch.zeros(V, V)), "grouped", "verify_grouped"),
    "grouped-coupled": (_chain(acceptance.accept_grouped_coupled, distances=torch.zeros(V, V)), "grouped",
                        "verify_grouped_coupled"),
    "tree-sampled": (lambda: tree.verify_tree_sampled(_tree(), _tree_probs(), torch.rand(B, N),
                                                      torch.ones(B, N, V)), "tree_verify", "verify_tree"),
    "tree-greedy": (lambda: tree.verify_tree_greedy(_tree(), _tree_probs()), "tree_verify", "verify_tree_argmax"),
    "tree-mask": (lambda: _tree(with_mask=False).mask(), "tree_mask", "ancestor_mask"),
}


@pytest.mark.parametrize("name", CALLS)
def test_cpu_tensors_take_the_reference(name, monkeypatch):
    call, module, wrapper = CALLS[name]

    def refuse(*args, **kwargs):
        raise AssertionError(f"{name}: the kernel was called for CPU tensors")

    monkeypatch.setattr(importlib.import_module(f"mmaccel.kernels.{module}"), wrapper, refuse)
    monkeypatch.setenv("MMACCEL_KERNELS", "auto")
    call()


@pytest.mark.parametrize("name", CALLS)
def test_forced_triton_calls_the_kernel(name, monkeypatch):
    call, module, wrapper = CALLS[name]
    called = []

    def record(*args, **kwargs):
        called.append(wrapper)
        raise LookupError("recorded")

    monkeypatch.setattr(importlib.import_module(f"mmaccel.kernels.{module}"), wrapper, record)
    monkeypatch.setenv("MMACCEL_KERNELS", "triton")
    with pytest.raises(LookupError, match="recorded"):
        call()
    assert called == [wrapper]
