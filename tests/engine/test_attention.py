"""Attention in one kernel shape: a query's output is bitwise the same alone, among other queries (any count, past
one block), beside other rows and under masks that hide other keys; and it is attention (close to torch's)."""

import pytest
import torch
import torch.nn.functional as F

from mmaccel.engine.attention import QUERY_BLOCK, fixed_shape_attention

H, D = 4, 16


def _qkv(rows: int, queries: int, keys: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, H, queries, D, generator=g), torch.randn(rows, H, keys, D, generator=g),
            torch.randn(rows, H, keys, D, generator=g))


def _causal(lengths: torch.Tensor, queries: int, keys: int) -> torch.Tensor:
    """[B, 1, T, S]: query t of row b sees the keys before lengths[b] + t + 1."""
    return (torch.arange(keys)[None, None, :] < (lengths[:, None, None] + torch.arange(queries)[None, :, None] + 1))[:, None]


@pytest.mark.parametrize("keys", [48, 300])
def test_a_query_gives_the_same_bits_in_any_pass(keys):
    q, k, v = _qkv(5, 2 * QUERY_BLOCK + 3, keys, seed=keys)
    lengths = torch.tensor([3, 17, 9, 25, 1])
    alone = {(b, t): fixed_shape_attention(q[b:b + 1, :, t:t + 1], k[b:b + 1], v[b:b + 1],
                                           _causal(lengths[b:b + 1] + t, 1, keys))
             for b in range(5) for t in range(q.shape[2])}
    for rows in ([0], [3, 1], [4, 0, 2, 1, 3]):
        idx = torch.tensor(rows)
        for width in (1, 2, QUERY_BLOCK - 1, QUERY_BLOCK, QUERY_BLOCK + 1, q.shape[2]):
            out = fixed_shape_attention(q[idx, :, :width], k[idx], v[idx], _causal(lengths[idx], width, keys))
            for i, b in enumerate(rows):
                for t in range(width):
                    assert torch.equal(out[i, :, t], alone[b, t][0, :, 0]), (rows, width, b, t)


def test_hidden_keys_do_not_matter_and_unmasked_queries_see_every_key():
    q, k, v = _qkv(2, 3, 64, seed=1)
    mask = _causal(torch.tensor([10, 30]), 3, 64)
    out = fixed_shape_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 40:], v2[:, :, 40:] = 1e3, -7.0          # keys no query sees (row 1's last query sees 33)
    assert torch.equal(fixed_shape_attention(q, k2, v2, mask), out)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fixed_shape_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)


def test_one_mask_row_for_every_query_and_inputs_untouched():
    q, k, v = _qkv(2, QUERY_BLOCK + 2, 40, seed=2)
    window = (torch.arange(40) < torch.tensor([[25], [40]]))[:, None, None]       # [B, 1, 1, S]
    keep = [t.clone() for t in (q, k, v, window)]
    out = fixed_shape_attention(q, k, v, window)
    assert out.shape == q.shape
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=window), rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, window), keep))
