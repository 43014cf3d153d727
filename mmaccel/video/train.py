"""Train the built-in streaming video model: a small Qwen2.5-VL (the Hugging Face class, so the same
code path serves users' checkpoints) on streams of Fashion-MNIST items crossing a canvas
(`mmaccel.video.data`, train split; evaluation streams use the held-out test split).

Each training sample is one stream laid out exactly as `VideoStreamPipeline` lays it out at inference:
frames in temporal patches of two, a question flushing a partly filled patch (its last frame repeated),
then `<q> question <a> answer <eos>`; the loss is on the answer tokens only. The whole sequence runs as
one forward with the model's own M-RoPE ids, which equal the streamed positions (tests/video/test_qwen_vl.py).

    python -m mmaccel.video.train --out runs/video --steps 4000          # resumes from runs/video/last.pt
    python -m mmaccel.video.train --out runs/video --export mmaccel/assets/video_qwen   # ship the weights

CPU only is fine (2 cores: about 1 s per stream of 96 frames); a GPU is used with --device cuda.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from mmaccel.video.data import VOCAB, make_stream, questions
from mmaccel.video.reduce import Segment, TemporalDrop
from mmaccel.video.words import WordTokenizer

TRAIN_KINDS = ("now", "before", "count", "direction", "describe")   # "when" is the trigger head's task
DROP_SHARE, DROP_RATIOS = 0.5, (1.0, 0.5, 0.25)         # streams trained through TemporalDrop, at these keep ratios
CANVAS = 112
FRAMES = (48, 320)               # stream lengths (frames) of the training samples
FRAMES_PER_QUESTION = 12         # a stream of n frames asks max(8, n // 12) questions
EXIT_LAYERS, EXIT_WEIGHT = (1, 2), 0.2   # early exits trained beside the last layer: the self-speculative draft


def build_model(tok: WordTokenizer, seed: int = 0):
    """The built-in architecture: 4 text layers of width 128, a 3-block vision tower of width 96,
    one merged token per 28x28 pixels (16 per frame pair on the 112x112 canvas)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=len(tok), hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=384, max_position_embeddings=8192, tie_word_embeddings=True,
                bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad,
                rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0})
    vision = dict(depth=3, hidden_size=96, out_hidden_size=128, intermediate_size=192, num_heads=4, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[2])
    torch.manual_seed(seed)
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=tok.image,
                           video_token_id=tok.video, vision_start_token_id=tok.vision_start,
                           vision_end_token_id=tok.vision_end, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad, tie_word_embeddings=True)
    return Qwen2_5_VLForConditionalGeneration(cfg)


def layout(stream, qs, tok: WordTokenizer, patchify, temporal_patch: int = 2, drop: TemporalDrop | None = None):
    """One stream as the pipeline feeds it: (input_ids [L], labels [L], flat patches [P, d], grids [S, 3],
    keep [L]). `keep` marks what enters the model: every text token, and the vision tokens that the
    pixel `drop` (a `TemporalDrop`, as the pipeline's `reduction`) lets through; all True without one."""
    ids, labels, pixels, grids, keep, pending = [], [], [], [], [], []
    side = CANVAS // 28
    merged = side * side

    def flush():
        if pending:
            frames = torch.stack(pending)
            p, grid = patchify(frames)
            pixels.append(p)
            grids.append(grid)
            ids.extend([tok.vision_start] + [tok.video] * merged + [tok.vision_end])
            labels.extend([-100] * (merged + 2))
            kept = [True] * merged
            if drop is not None:
                kept = drop(Segment(frames, torch.zeros(merged, 1), (side, side))).keep.tolist()
            keep.extend([True, *kept, True])
            pending.clear()

    q_at = {}
    for q in qs:
        q_at.setdefault(q.frame, []).append(q)
    last = max(q.frame for q in qs)
    for t in range(last + 1):
        pending.append(stream.frame(t))
        if len(pending) == temporal_patch:
            flush()
        for q in q_at.get(t, []):
            flush()
            question, answer = tok.question_ids(q.text), tok.answer_ids(q.answer)
            ids.extend(question + answer)
            labels.extend([-100] * len(question) + answer)
            keep.extend([True] * (len(question) + len(answer)))
    return torch.tensor(ids), torch.tensor(labels), torch.cat(pixels), torch.tensor(grids), torch.tensor(keep)


def sample(seed: int, split: str, tok, patchify, frames: tuple[int, int] = FRAMES):
    """One training stream. Half of them go through temporal token dropping at a random keep ratio (all
    tokens, 1/2, 1/4), so the built-in model answers from full and from reduced streams alike."""
    rng = np.random.default_rng(seed)
    stream = make_stream(seed, int(rng.integers(*frames)), split)
    qs = questions(stream, rng, max(8, stream.num_frames // FRAMES_PER_QUESTION), kinds=TRAIN_KINDS)
    drop = TemporalDrop("pixel", keep_ratio=float(rng.choice(DROP_RATIOS))) if rng.random() < DROP_SHARE else None
    return layout(stream, qs, tok, patchify, drop=drop) if qs else None


def loss_of(model, batch, device, exits: tuple[int, ...] = EXIT_LAYERS,
            exit_weight: float = EXIT_WEIGHT) -> torch.Tensor:
    """Cross-entropy on the answer tokens of one laid-out stream; the vision tokens `keep` drops are
    removed from the sequence after embedding, the survivors keep their M-RoPE positions. Each layer
    of `exits` also predicts the answers through the final norm and the head (LayerSkip-style early
    exits, weighted `exit_weight`), so the model's first layers serve as its own draft."""
    ids, labels, pixels, grids, keep = (x.to(device) for x in batch)
    inner = model.model
    kinds = (ids[None] == model.config.video_token_id).int() * 2
    positions, _ = inner.get_rope_index(ids[None], kinds, video_grid_thw=grids)         # [3, 1, L]
    embeds = inner.get_input_embeddings()(ids[None])
    video = torch.cat(inner.get_video_features(pixels, grids, return_dict=True).pooler_output)
    embeds = embeds.masked_scatter((ids == model.config.video_token_id)[None, :, None].expand_as(embeds),
                                   video.to(embeds.dtype))
    out = model(inputs_embeds=embeds[:, keep], position_ids=positions[:, :, keep], output_hidden_states=bool(exits))
    targets = labels[keep][1:]
    loss = torch.nn.functional.cross_entropy(out.logits[0, :-1].float(), targets, ignore_index=-100)
    for layer in exits:     # hidden_states[k]: the output of the first k layers
        logits = model.lm_head(inner.language_model.norm(out.hidden_states[layer][0, :-1]))
        loss = loss + exit_weight * torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
    return loss


def main(argv: list[str] | None = None) -> None:
    from mmaccel.video.qwen_vl import QwenVLStream

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/video"))
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=4, help="streams per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--export", type=Path, default=None, help="write the trained model here (fp16 safetensors)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = WordTokenizer(VOCAB)
    model = build_model(tok, args.seed).to(args.device)
    patchify = QwenVLStream(model).patchify
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt, step = args.out / "last.pt", 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=args.device)
        grow_vocabulary(state, model)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    if args.export is not None:
        export(model, tok, args.export)
        return
    log = open(args.out / "train.log", "a")
    model.train()
    t0, running = time.time(), []
    while step < args.steps:
        lr = args.lr * min(1.0, (step + 1) / 200) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        total = 0.0
        for i in range(args.batch):
            batch = sample(args.seed * 10_000_000 + step * args.batch + i, "train", tok, patchify)
            if batch is None:
                continue
            loss = loss_of(model, batch, args.device) / args.batch
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        running.append(total)
        if step % 20 == 0:
            print(f"step {step} loss {np.mean(running):.4f} lr {lr:.2e} {time.time() - t0:.0f}s", file=log, flush=True)
            running = []
        if step % 200 == 0 or step == args.steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt.with_suffix(".tmp"))
            ckpt.with_suffix(".tmp").replace(ckpt)


def grow_vocabulary(state: dict, model) -> None:
    """Resume a checkpoint of a smaller vocabulary (words were appended to VOCAB since): new embedding rows
    start as the model initialises them, with empty optimizer moments. Ids of existing words are unchanged
    (specials first, VOCAB in order)."""
    name = "model.language_model.embed_tokens.weight"
    old, new = state["model"][name], model.state_dict()[name]
    if old.shape == new.shape:
        return
    grown = new.clone()
    grown[:old.shape[0]] = old
    for key in (name, "lm_head.weight"):      # tied: the same rows in both entries
        if key in state["model"]:
            state["model"][key] = grown
    for moments in state["opt"]["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments and moments[key].shape == old.shape:
                extra = moments[key].new_zeros(new.shape[0] - old.shape[0], old.shape[1])
                moments[key] = torch.cat([moments[key], extra])


def export(model, tok: WordTokenizer, out: Path) -> None:
    """The shipped form: a Hugging Face directory (config.json, fp16 model.safetensors) + words.json."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    (out / "words.json").write_text(json.dumps(list(VOCAB)))


if __name__ == "__main__":
    main()
