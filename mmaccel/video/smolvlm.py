"""SmolVLM / SmolVLM2 and Idefics3 (Hugging Face classes, the Idefics3 architecture) as streaming decoders.

Each frame is one vision segment laid out as the SmolVLM processor lays out an image it does not split
(`_prompt_single_image` of transformers 5.x, also what its video processor does per frame):
`<fake_token_around_image> <global-img> [(side / scale)² <image> tokens] <fake_token_around_image>`.
The language model is a Llama with plain 1-D RoPE, so the marks and tokens of a segment take
consecutive positions and the text after it resumes right after them; appending frames one by one
then equals one forward over the whole sequence.

Pixels follow the processor for the global image: the frame is resized to the vision tower's square
`image_size` (8-bit bicubic with antialiasing on the host: the kernel of its torchvision backend, which
stands in for PIL's Lanczos), scaled to [0, 1] and normalised with mean = std = 0.5. Any frame size is
accepted (`frame_multiple` = 1). The processor resizes in two steps (longest edge to its `size`, then
to the square); one step gives its pixels exactly when its `size` is the square's side.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mmaccel.errors import check
from mmaccel.video.stream_decoder import StreamDecoder

SUPPORTED = ("smolvlm", "idefics3")
MEAN = STD = 0.5            # the SmolVLM / Idefics3 processors' normalisation (IMAGENET_STANDARD_MEAN/STD)
FAKE_IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN = "<fake_token_around_image>", "<global-img>"


class SmolVLMStream(StreamDecoder):
    """A `SmolVLMForConditionalGeneration` / `Idefics3ForConditionalGeneration` as a DecoderModel over text
    tokens (`step`) that also takes frames (`append_frames`), one frame per segment.

    The mark tokens are in the tokenizer, not the config: pass their ids (`image_marks(tokenizer)`
    looks them up).
    """

    temporal_patch = 1      # frames per segment: a frame is an image
    frame_multiple = 1      # `encode` resizes any frame to the vision tower's size

    def __init__(self, model: nn.Module, fake_image_token: int, global_image_token: int):
        cfg = model.config
        check(getattr(cfg, "model_type", None) in SUPPORTED,
              f"{type(model).__name__} ({getattr(cfg, 'model_type', '?')}) is not a SmolVLM / Idefics3 model: "
              f"expected one of {', '.join(SUPPORTED)}")
        super().__init__(model, model.model.text_model)
        self.vision, self.connector = model.model.vision_model, model.model.connector
        vc = cfg.vision_config
        check(isinstance(vc.image_size, int) and isinstance(vc.patch_size, int),
              f"expected a square vision tower (int image_size, patch_size), got {vc.image_size}, {vc.patch_size}")
        self.image_size, self.scale = vc.image_size, cfg.scale_factor
        patches = vc.image_size // vc.patch_size
        check(patches % self.scale == 0, f"{patches} patches per side do not pixel-shuffle by {self.scale}")
        self.side = patches // self.scale                       # tokens per side after the pixel shuffle
        for name, token in (("fake_image_token", fake_image_token), ("global_image_token", global_image_token)):
            check(isinstance(token, int) and 0 <= token < self.vocab_size,
                  f"{name} must be a token id in [0, {self.vocab_size}), got {token!r}")
        self.video_token = cfg.image_token_id                   # frames are images
        self.vision_start = self.vision_end = fake_image_token
        self.global_image_token = global_image_token
        self.segment_open = (fake_image_token, global_image_token)
        self.segment_close = (fake_image_token,)

    # ---- vision --------------------------------------------------------------------------------

    def pixels(self, frames: Tensor) -> Tensor:
        """uint8 frames [T, H, W, 3] -> the processor's pixel values [T, 3, S, S] (S = vision image size)."""
        check(frames.dim() == 4 and frames.shape[-1] == 3 and frames.dtype == torch.uint8,
              f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
        x = frames.permute(0, 3, 1, 2)
        S = self.image_size
        if tuple(x.shape[-2:]) != (S, S):       # on the host, in 8 bits: the processor's exact kernel
            x = F.interpolate(x.cpu(), size=(S, S), mode="bicubic", antialias=True, align_corners=False)
        return (x.to(self.device).float() / 255.0 - MEAN) / STD

    @torch.inference_mode()
    def encode(self, frames: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Vision embeddings [side², d] of one frame [1, H, W, 3], row by row, and their grid (side, side)."""
        check(frames.dim() == 4 and frames.shape[0] == 1,
              f"a SmolVLM segment is one frame [1, H, W, 3], got {tuple(frames.shape)}")
        pixels = self.pixels(frames)
        hidden = self.vision(pixel_values=pixels.to(self.vision.dtype)).last_hidden_state     # [1, patches², dv]
        return self.connector(hidden)[0], (self.side, self.side)

    def token_grid(self, grid: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of a segment's tokens, in `encode`'s order (the connector's pixel shuffle is row-major)."""
        return grid

    def segment_positions(self, start: int, grid: tuple[int, int]) -> tuple[Tensor, int]:
        """Positions [3 + N] of `<fake> <global-img> tokens <fake>` from `start`, and the next text position."""
        count = self.segment_marks + grid[0] * grid[1]
        return torch.arange(start, start + count), start + count


def image_marks(tokenizer) -> dict[str, int]:
    """The ids of SmolVLM's image marks in a Hugging Face tokenizer (named as its processor names them),
    as `SmolVLMStream` keyword arguments."""
    check(tokenizer is not None and hasattr(tokenizer, "get_vocab"),
          "a SmolVLM / Idefics3 stream needs its Hugging Face tokenizer for the ids of its image marks "
          f"({FAKE_IMAGE_TOKEN}, {GLOBAL_IMAGE_TOKEN}): they are not in the model's config")
    vocab = tokenizer.get_vocab()
    names = {"fake_image_token": getattr(tokenizer, "fake_image_token", None) or FAKE_IMAGE_TOKEN,
             "global_image_token": getattr(tokenizer, "global_image_token", None) or GLOBAL_IMAGE_TOKEN}
    missing = [name for name in names.values() if name not in vocab]
    check(not missing, f"the tokenizer has no {', '.join(missing)} token: it is not a SmolVLM / Idefics3 tokenizer")
    return {key: vocab[name] for key, name in names.items()}
