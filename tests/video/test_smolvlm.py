"""SmolVLM (Idefics3 architecture) as a streaming decoder: appends equal one forward over the processor's
layout, greedy equals HF generate(), the pipeline answers and bounds memory over it, and bad input is clear."""

import re

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.video.memory import KVBudget
from mmaccel.video.models import load_stream_model, stream_model
from mmaccel.video.smolvlm import SmolVLMStream
from mmaccel.video.stream import VideoStreamPipeline
from tests.video.test_stream import Digits

VOCAB, FAKE, GLOBAL, IMAGE = 96, 90, 91, 93
NAMES = {"<fake_token_around_image>": FAKE, "<global-img>": GLOBAL, "<image>": IMAGE}
SIZE, TOKENS = 56, 4            # vision image size; tokens per frame: (56 / 14)² / 2²


def tiny_smolvlm(seed: int = 0):
    """A 2-layer SmolVLM (Llama text, 2-block SigLIP-style tower): 56-pixel frames, 4 tokens each."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    text = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, max_position_embeddings=4096)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=SIZE,
                  patch_size=14)
    torch.manual_seed(seed)
    return SmolVLMForConditionalGeneration(SmolVLMConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                                                         scale_factor=2)).eval()


def clip(n, seed, side=SIZE):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, side, side, 3), dtype=torch.uint8, generator=g)


@pytest.fixture(scope="module")
def hf():
    return tiny_smolvlm()


@pytest.fixture(scope="module")
def model(hf):
    return SmolVLMStream(hf, FAKE, GLOBAL)


def processor_inputs(pieces, single_image=None):
    """input_ids and pixel_values as the SmolVLM processors build them: each frame is an unsplit image laid out
    by transformers' own prompt string, its pixels from the image processor (resized to 56 in one step)."""
    from transformers import SmolVLMImageProcessor
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    layout = single_image or (lambda: get_image_prompt_string(0, 0, TOKENS, "<fake_token_around_image>", "<image>",
                                                              "<global-img>"))
    ids, images, ends = [], [], []
    for piece in pieces:
        if isinstance(piece, torch.Tensor):
            ids += [NAMES[name] for name in re.findall(r"<[^>]+>", layout())]
            images.append(piece[0].numpy())
        else:
            ids += piece
        ends.append(len(ids) - 1)
    proc = SmolVLMImageProcessor(do_image_splitting=False, size={"longest_edge": SIZE},
                                 max_image_size={"longest_edge": SIZE})
    pixels = proc(images=[images], return_tensors="pt")["pixel_values"]                  # [1, frames, 3, 56, 56]
    return torch.tensor([ids]), pixels, ends


def streamed(model, pieces, shift: int = 0):
    """Logits [pieces, V] after each piece, appended one by one (frames: one segment each)."""
    state = model.new_state(1, 128)
    out = []
    for piece in pieces:
        if isinstance(piece, torch.Tensor):
            embeds, grid = model.encode(piece)
            positions, nxt = model.segment_positions(state.extras["next_position"] + shift, grid)
            out.append(model.append_segment(state, embeds, positions, nxt + shift))
        else:
            out.append(model.append_text(state, piece))
    return torch.cat(out), state


def test_streamed_frames_equal_one_forward_over_the_processors_layout(hf, model):
    """Prompt, three frames (two of other sizes, resized), a question: the logits after every piece equal
    one HF forward over the whole sequence; a misplaced segment or a layout without <global-img> does not."""
    pieces = [[5, 6, 7], clip(1, 1), clip(1, 2, side=40), clip(1, 3, side=70), [11, 12, 13]]
    ids, pixels, ends = processor_inputs(pieces)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=pixels).logits[0, ends]
    ours, state = streamed(model, pieces)
    assert (ours - ref).abs().max() < 1e-4
    assert state.extras["next_position"] == ids.shape[1] == int(state.cache.lengths[0])

    shifted, _ = streamed(model, pieces, shift=1)
    assert (shifted - ref).abs().max() > 1e-3
    ids, pixels, ends = processor_inputs(pieces, lambda: "<fake_token_around_image>" + "<image>" * TOKENS +
                                         "<fake_token_around_image>")
    with torch.no_grad():
        other = hf(input_ids=ids, pixel_values=pixels).logits[0, ends]
    assert (ours - other).abs().max() > 1e-3


def test_text_steps_equal_hf_generate(hf, model):
    pieces = [[5, 6], clip(1, 4), clip(1, 5), [11, 12]]
    logits, state = streamed(model, pieces)
    logits, ours = logits[-1:], []
    for _ in range(6):
        ours.append(int(logits[0].argmax()))
        logits = model.step(state, torch.tensor([[ours[-1]]]))[:, -1]
    ids, pixels, _ = processor_inputs(pieces)
    ref = hf.generate(input_ids=ids, pixel_values=pixels, max_new_tokens=6, do_sample=False)
    assert ours == ref[0, ids.shape[1]:].tolist()


def test_the_pipeline_answers_like_generation_and_lossless_methods_agree(hf, model):
    frames = clip(3, 6)
    answers = {}
    for method, params in (("ar", {}), ("ngram", {"k": 3})):
        pipe = VideoStreamPipeline(model, Digits(), system_prompt=[5, 6, 7])
        for f in frames:
            pipe.feed(f)
        answers[method] = [pipe.ask("11 12", method, max_new_tokens=8, **params).tokens,
                           pipe.ask("9", method, max_new_tokens=6, **params).tokens]
    assert answers["ngram"] == answers["ar"]
    ids, pixels, _ = processor_inputs([[5, 6, 7], *frames[:, None], Digits().question_ids("11 12")])
    ref = hf.generate(input_ids=ids, pixel_values=pixels, max_new_tokens=8, do_sample=False)
    assert answers["ar"][0] == ref[0, ids.shape[1]:].tolist()


def test_memory_is_bounded_over_a_long_stream(model):
    budget = KVBudget(sink=4, vision=3 * (TOKENS + 3), text=16)         # three frames of 4 tokens + 3 marks
    pipe = VideoStreamPipeline(model, Digits(), budget=budget, max_answer_tokens=4, system_prompt=[5, 6, 7])
    peak = 0
    for i, f in enumerate(clip(30, 7)):
        peak = max(peak, pipe.feed(f).kv_entries)
        if i % 10 == 9:
            pipe.ask("11", max_new_tokens=3)
            peak = max(peak, pipe.kv_entries)
    assert peak <= budget.total + 4 + 64 and pipe.kv_entries <= budget.total
    assert pipe.state.extras["next_position"] == pipe.kv_entries      # 1-D RoPE: contiguous, one position per entry


def test_evicted_keys_are_rotated_to_their_new_positions(model):
    """After eviction the moved layer-0 keys equal those of a fresh stream holding the survivors."""
    frames = clip(4, 8)
    pipe = VideoStreamPipeline(model, Digits(), budget=KVBudget(sink=3, vision=2 * (TOKENS + 3), text=8),
                               system_prompt=[5, 6, 7])
    for f in frames:
        pipe.feed(f)                                                    # the first two frames are evicted
    fresh = VideoStreamPipeline(model, Digits(), system_prompt=[5, 6, 7])
    for f in frames[2:]:
        fresh.feed(f)
    n = pipe.kv_entries
    assert n == fresh.kv_entries == 3 + 2 * (TOKENS + 3)
    assert torch.allclose(pipe.state.cache.k[0][:, :, :n], fresh.state.cache.k[0][:, :, :n], atol=1e-5)
    assert torch.equal(pipe.state.cache.v[0][:, :, :n], fresh.state.cache.v[0][:, :, :n])
    assert pipe.state.extras["next_position"] == fresh.state.extras["next_position"]


def test_bad_input_is_a_clear_error(hf, model, tmp_path):
    from tests.conftest import tiny_llama

    with pytest.raises(InputError, match="not a supported streaming VLM.*qwen2_vl.*smolvlm"):
        stream_model(tiny_llama(0))
    with pytest.raises(InputError, match="needs its Hugging Face tokenizer"):
        stream_model(hf)
    with pytest.raises(InputError, match="not a SmolVLM"):
        SmolVLMStream(tiny_llama(0), FAKE, GLOBAL)
    with pytest.raises(InputError, match="token id"):
        SmolVLMStream(hf, FAKE, VOCAB)
    with pytest.raises(InputError, match="one frame"):
        model.encode(clip(2, 0))
    with pytest.raises(InputError, match="uint8"):
        model.encode(torch.zeros(1, SIZE, SIZE, 3))
    tiny_llama(0).config.save_pretrained(tmp_path)
    with pytest.raises(InputError, match="not a supported streaming VLM"):
        load_stream_model(tmp_path)


def test_a_smolvlm_directory_loads_with_its_chat_turns(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tiny_smolvlm(seed=1).save_pretrained(tmp_path)
    vocab = {"<unk>": 0, "<end_of_utterance>": 1, "what": 5, "?": 6, "Assistant:": 8, "User:": 9, **NAMES}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<end_of_utterance>",
                            additional_special_tokens=list(NAMES)).save_pretrained(tmp_path)
    pipe = VideoStreamPipeline.from_pretrained(str(tmp_path), max_answer_tokens=4)
    assert isinstance(pipe.model, SmolVLMStream) and pipe.model.segment_open == (FAKE, GLOBAL)
    assert pipe.tokenizer.eos_token_id == 1 and pipe.tokenizer.question_ids("what ?") == [5, 6, 1, 8]
    pipe.feed(clip(1, 9, side=48)[0])
    assert pipe.ask("what ?", max_new_tokens=3).frames_seen == 1 and pipe.kv_entries > TOKENS + 3
