"""HFCausalLM over our cache: the same logits under every HF attention implementation."""

import torch

from mmaccel.lm.hf import HFCausalLM
from tests.conftest import tiny_llama


def test_eager_attention_gets_an_additive_mask_and_matches_sdpa():
    """HF's eager attention adds the mask to the scores; a boolean mask there would let every token see the
    future (True adds 1). Prefill + a 2-token step with a tree mask must equal the SDPA model and HF's own forward."""
    sdpa = tiny_llama(0)
    eager = tiny_llama(0)
    eager.config._attn_implementation = "eager"
    prompt = [[5, 9, 13, 2, 7]]
    want = sdpa(torch.tensor(prompt)).logits[0, -1]
    outs = []
    for hf in (sdpa, eager):
        model = HFCausalLM(hf)
        state = model.prefill(prompt, room=4)
        assert (state.logits[0] - want).abs().max() < 1e-4
        tree = torch.tensor([[[True, False], [True, True]]])
        outs.append(model.step(state, torch.tensor([[3, 4]]), tree_mask=tree))
    assert (outs[0] - outs[1]).abs().max() < 1e-4
