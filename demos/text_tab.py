"""Text tab: the built-in SmolLM2-135M-Instruct, AR next to a method: the output with each token coloured
by the target pass that committed it (tokens from accepted drafts share their pass's colour), NFE, speed-up."""

from __future__ import annotations

import time

import gradio as gr

from demos.render import passes_html, token_pieces
from demos.shared import SharedModel, choice, number, parse_params, ratio, reported_rows, shown_on_page
from mmaccel.errors import InputError
from mmaccel.lm.pipeline import TextPipeline

# the settings of benchmarks/core.json (on this model only n-gram drafts pay in wall clock on a CPU)
DEFAULT_PARAMS = {"speculative": "k=2", "tree": "depth=3 width=2", "ngram": "k=2 max_ngram=3", "sjd": "window=2",
                  "sjd-coupled": "window=2"}
METHODS = tuple(DEFAULT_PARAMS)
MAX_NEW_TOKENS = 256
MAX_PROMPT_CHARS = 4000
LEGEND = ("Tokens sharing a colour were committed by one target pass (accepted drafts + the target's own "
          "token); grey tokens had a pass to themselves, as in plain AR. Hover a token for its pass.")


def text_model(source: str, device: str | None = None) -> SharedModel:
    def load() -> TextPipeline:
        pipe = TextPipeline.from_pretrained(source, device=device)
        pipe.generate(["Hi."], "ar", max_new_tokens=4)          # warm-up
        return pipe

    return SharedModel("text", load)


def _stats_table(method: str, base, fast, base_s: float, fast_s: float, sampled: bool) -> str:
    same = fast.tokens == base.tokens
    identical = "yes" if same else "no (sampling: the same law, other draws)" if sampled else "no"
    rows = [("target passes (NFE)", base.stats.nfe, fast.stats.nfe),
            ("NFE ratio (AR / method)", "1.00×", ratio(base.stats.nfe, fast.stats.nfe)),
            ("mean tokens per pass", f"{base.stats.mean_accepted:.2f}", f"{fast.stats.mean_accepted:.2f}"),
            ("draft passes", base.stats.draft_passes, fast.stats.draft_passes),
            ("time (s)", f"{base_s:.2f}", f"{fast_s:.2f}"),
            ("speed-up (wall clock)", "1.00×", ratio(base_s, fast_s)),
            *reported_rows(base.stats, fast.stats),
            ("identical to AR", "–", identical)]
    lines = [f"| | AR | {method} |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def build(model: SharedModel) -> None:
    """The tab's controls and events (call inside a gr.Blocks / gr.Tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            prompt = gr.Textbox("Name three rivers in Africa and one fact about each.", lines=3, label="prompt",
                                elem_id="text-prompt")
            method = gr.Dropdown(list(METHODS), value="speculative", label="method", elem_id="text-method")
            params = gr.Textbox(DEFAULT_PARAMS["speculative"], label="method parameters (KEY=VALUE)")
            max_new = gr.Slider(8, MAX_NEW_TOKENS, value=64, step=8, label="max new tokens", elem_id="text-max-new")
            temperature = gr.Slider(0, 1.5, value=0.0, step=0.05, label="temperature (0 = greedy)")
            top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p")
            seed = gr.Number(0, precision=0, label="seed", minimum=0)
            run = gr.Button("Generate", variant="primary", elem_id="text-run")
        with gr.Column(scale=2):
            output = gr.HTML(label="output, coloured by commit pass", elem_id="text-output")
            gr.Markdown(LEGEND)
            stats = gr.Markdown(elem_id="text-stats")

    method.change(lambda m: DEFAULT_PARAMS.get(m, ""), method, params, queue=False)

    @shown_on_page
    def generate(prompt, method, params_text, max_new, temperature, top_k, top_p, seed, progress=gr.Progress()):
        method = choice(method, "method", METHODS)
        params = parse_params(params_text)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("the prompt is empty: type something for the model to continue")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise InputError(f"the prompt has {len(prompt)} characters; this page takes up to {MAX_PROMPT_CHARS}")
        sampling = {"max_new_tokens": number(max_new, "max new tokens", 1, MAX_NEW_TOKENS, integer=True),
                    "temperature": number(temperature, "temperature", 0, 2),
                    "top_k": number(top_k, "top-k", 0, 1000, integer=True), "top_p": number(top_p, "top-p", 0.01, 1),
                    "seed": number(seed, "seed", 0, 2**31 - 1, integer=True)}
        progress(0.0, desc="loading SmolLM2")
        with model.use() as pipe:
            progress(0.1, desc="AR")
            t0 = time.perf_counter()
            base = pipe.generate([prompt], "ar", **sampling)
            base_s = time.perf_counter() - t0
            progress(0.5, desc=method)
            t0 = time.perf_counter()
            fast = pipe.generate([prompt], method, **sampling, **params)
            fast_s = time.perf_counter() - t0
            pieces = token_pieces(pipe.tokenizer, fast.tokens[0])
        return (passes_html(pieces, fast.commit_pass[0]),
                _stats_table(method, base, fast, base_s, fast_s, sampling["temperature"] > 0))

    run.click(generate, [prompt, method, params, max_new, temperature, top_k, top_p, seed], [output, stats],
              api_name="text")
