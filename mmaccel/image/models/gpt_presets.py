"""The LlamaGen GPT's configuration (`GPTConfig`, field names of the official `ModelArgs`) and its named
size presets (official c2i sizes and the small ones this project trains)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mmaccel.errors import InputError, check


def find_multiple(n: int, k: int) -> int:
    """The smallest multiple of k that is >= n (the official SwiGLU width rounding)."""
    return n if n % k == 0 else n + k - n % k


@dataclass(frozen=True)
class GPTConfig:
    """Field names follow the official `ModelArgs`; defaults are GPT-B, 256x256 images (16x16 tokens).

    Dropouts only act in training mode. `drop_path_rate` of the official trainer is not supported.
    """

    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    token_dropout_p: float = 0.1
    attn_dropout_p: float = 0.0
    resid_dropout_p: float = 0.1
    ffn_dropout_p: float = 0.1
    num_classes: int = 1000
    class_dropout_prob: float = 0.1
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256

    def __post_init__(self):
        check(self.n_layer >= 1 and self.dim >= 1 and self.n_head >= 1,
              f"n_layer, dim and n_head must be >= 1, got {self.n_layer}, {self.dim}, {self.n_head}")
        check(self.dim % self.n_head == 0, f"dim {self.dim} must be divisible by n_head {self.n_head}")
        check(self.head_dim % 4 == 0, f"the 2-D rotary embedding needs head_dim divisible by 4, got {self.head_dim}")
        check(self.n_head % self.kv_heads == 0, f"n_head {self.n_head} must be a multiple of n_kv_head {self.kv_heads}")
        check(self.vocab_size >= 1 and self.num_classes >= 1,
              f"vocab_size and num_classes must be >= 1, got {self.vocab_size}, {self.num_classes}")
        grid = int(round(self.block_size ** 0.5))
        check(self.block_size >= 1 and grid * grid == self.block_size,
              f"block_size must be a square number of image tokens (16*16=256, 24*24=576), got {self.block_size}")
        check(self.cls_token_num == 1, f"class-conditional LlamaGen uses one class token; cls_token_num must be 1, "
              f"got {self.cls_token_num}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def grid_size(self) -> int:
        return int(round(self.block_size ** 0.5))

    @property
    def ffn_hidden_dim(self) -> int:
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)

    @property
    def has_null_class(self) -> bool:
        """Whether the class table has the CFG row `num_classes` (trained with label dropout)."""
        return self.class_dropout_prob > 0


# (n_layer, n_head, dim). Official c2i sizes (GPT-B/L/XL/XXL/XXXL; 1B/3B are listed there as t2i sizes but
# c2i_3B_384.pt exists) and small sizes for the models this project trains itself.
GPT_PRESETS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (12, 12, 768),        # 111M
    "GPT-L": (24, 16, 1024),       # 343M
    "GPT-XL": (36, 20, 1280),      # 775M
    "GPT-XXL": (48, 24, 1536),     # 1.4B
    "GPT-XXXL": (48, 40, 2560),    # 3.9B
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-nano": (2, 4, 64),        # drafts and tests
    "GPT-micro": (4, 4, 128),
    "GPT-mini": (6, 8, 256),
}


def _check_fields(overrides: dict[str, Any]) -> None:
    unknown = sorted(set(overrides) - {f.name for f in fields(GPTConfig)})
    check(not unknown, f"unknown GPTConfig field(s) {', '.join(unknown)}; see GPTConfig for the official names")


def gpt_config(name: str, **overrides: Any) -> GPTConfig:
    """The preset `name` (e.g. "GPT-B") with `overrides` (block_size=576 for 384px, vocab_size, ...)."""
    if name not in GPT_PRESETS:
        raise InputError(f"unknown GPT preset {name!r}; choose from {', '.join(GPT_PRESETS)}")
    n_layer, n_head, dim = GPT_PRESETS[name]
    _check_fields(overrides)
    return GPTConfig(**{"n_layer": n_layer, "n_head": n_head, "dim": dim, **overrides})
