"""Medusa-Block heads for Whisper (the `medusa_block` design of Whisper-Medusa), verified losslessly.

One extra Whisper decoder layer, shared by all heads: self-attention over the target's final
hidden states (its own KV cache), cross-attention to the audio, MLP; initialised as a copy of the
target's last layer, with that layer's final norm. Then one residual SiLU block per head and the
tied vocabulary projection (through the shortlist). Head i guesses the token i + 2 places after the
block's newest input position, like the Linear heads (`mmaccel.speech.heads`). Unlike
Whisper-Medusa (two decoder passes per step, no tree mask), the drafts are verified in the target's
one pass per step, with a tree mask, by greedy match: transcripts are greedy's.

The block's sequence starts at the last prompt position (the one that predicts the first
transcript token) and grows by the positions each verification commits
(`DraftContext.committed_hidden`). Its cross-attention keys/values are frozen copies of the last
layer's, so it reads the target's cross-attention cache entry instead of computing its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mmaccel.core.model import DecodeState
from mmaccel.core.proposers import DraftContext, HeadsProposer
from mmaccel.errors import check
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.draft import WhisperDraft, new_draft


@dataclass
class MedusaBlock:
    layer: WhisperDraft          # a one-layer draft decoder: the block layer and its final norm
    heads: nn.ModuleList         # MedusaHead i guesses the token i + 2 ahead of the block's input position


def new_medusa_block(target: WhisperDecoderModel, heads: nn.ModuleList) -> MedusaBlock:
    """A block initialised from the target's last layer, in front of `heads` (new or trained)."""
    return MedusaBlock(new_draft(target.hf, (-1,)), heads)


def block_forward(block: WhisperDecoderModel, state: DecodeState, hidden: Tensor) -> Tensor:
    """Append the target's final hidden states [B, T, d] to the block's cache (causal within T);
    returns the block's normalised outputs [B, T, d]."""
    step, _ = block.begin(state, hidden.shape[1])
    return block.decoder.layer_norm(block.layer(0, hidden.to(block.dtype), step))


class BlockHeadsProposer(HeadsProposer):
    """Medusa-Block drafting: the block reads every committed target hidden state, the heads read
    the block's output at the newest one."""

    needs_committed_hidden = True

    def __init__(self, block: MedusaBlock, target: WhisperDecoderModel):
        super().__init__(block.heads)
        self.block = block.layer.decoder_model(target)

    def start(self, inputs, room, ctx):
        check(ctx.committed_hidden is not None, "Medusa-Block needs the target's hidden states; the model returned none")
        self.state = self.block.new_state(ctx.pending.shape[0], room + 1)
        self.state.extras["inputs"] = inputs

    def _logits(self, ctx: DraftContext, n: int) -> Tensor:
        check(n <= len(self.heads), f"asked for {n} drafts but only {len(self.heads)} Medusa heads are loaded")
        hidden, counts = ctx.committed_hidden, ctx.committed_counts          # counts on the device: no read-back
        out = block_forward(self.block, self.state, hidden)
        self.state.rollback(hidden.shape[1] - counts)               # rows that committed fewer
        last = (counts - 1).clamp(min=0).to(out.device)
        h = out[torch.arange(out.shape[0], device=out.device), last]
        dtype = next(self.heads.parameters()).dtype
        return torch.stack([self.heads[i](h.to(dtype)) for i in range(n)], 1).float()
