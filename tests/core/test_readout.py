import pytest
import torch
import torch.nn.functional as F

from mmaccel.core.readout import project


@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 3, 16), (4, 5, 16), (2, 16), (16,)])
def test_project_is_the_linear_product(shape):
    g = torch.Generator().manual_seed(0)
    weight, x = torch.randn(300, 16, generator=g), torch.randn(*shape, generator=g)
    y = project(x, weight)
    assert y.shape == (*shape[:-1], 300)
    torch.testing.assert_close(y, F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert torch.equal(y.argmax(-1), F.linear(x, weight).argmax(-1))


def test_project_keeps_other_dtypes_on_linear():
    weight, x = torch.randn(50, 8).to(torch.bfloat16), torch.randn(3, 8).to(torch.bfloat16)
    assert torch.equal(project(x, weight), F.linear(x, weight))


def test_project_leaves_its_inputs_alone_and_tracks_gradients():
    weight, x = torch.randn(40, 8, requires_grad=True), torch.randn(1, 8)
    before = x.clone()
    project(x, weight).sum().backward()
    assert torch.equal(x, before)
    torch.testing.assert_close(weight.grad, x.expand(40, 8))
