"""Speech fixtures: a tiny random Hugging Face Whisper (built offline, seeded). The builtin tiny.en
behind an ASRPipeline (`tiny_en_asr`) is in tests/conftest.py: the benchmark tests use it too."""

import pytest
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

from mmaccel.speech.decoder import WhisperDecoderModel

VOCAB, EOT, SOT, NO_TS = 64, 60, 61, 62
TIMED_VOCAB = NO_TS + 1 + 40        # Whisper's layout: timestamp tokens after <|notimestamps|> (40 here)
PROMPT = [SOT, NO_TS]
SUPPRESS = [3, 7]


def tiny_whisper(seed: int = 0, vocab: int = VOCAB, positions: int = 48) -> WhisperForConditionalGeneration:
    torch.manual_seed(seed)
    cfg = WhisperConfig(vocab_size=vocab, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=4,
                        encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_source_positions=20, max_target_positions=positions, pad_token_id=EOT, bos_token_id=EOT,
                        eos_token_id=EOT, decoder_start_token_id=SOT)
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():   # varied, audio-dependent greedy transcripts instead of one repeated token
        model.model.decoder.layer_norm.weight.copy_(torch.randn(32) * 3)
        model.model.encoder.embed_positions.weight.mul_(0.05)
        for layer in model.model.decoder.layers:
            layer.encoder_attn.out_proj.weight.mul_(4)
    model.generation_config = GenerationConfig(decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT,
                                               suppress_tokens=SUPPRESS, begin_suppress_tokens=[EOT])
    return model


@pytest.fixture(scope="session")
def tiny_hf():
    return tiny_whisper()


@pytest.fixture(scope="session")
def tiny_decoder(tiny_hf):
    return WhisperDecoderModel(tiny_hf)


def features(batch: int, seed: int = 1) -> torch.Tensor:
    """Random log-mel-like features [batch, 8 mels, 40 frames] for the tiny model (20 encoder positions)."""
    return torch.randn(batch, 8, 40, generator=torch.Generator().manual_seed(seed))


def encode_each_clip_once(asr) -> None:
    """Memoise `asr`'s fp32 Whisper encoder by its input, for tests that transcribe the same clips with many
    methods: the states do not depend on the method, and the encoder is most of a transcription's time
    (everything around it, the features' upload and `WhisperDecoderModel.encode` included, still runs)."""
    from tests.emulated_cuda import on_host

    encoder = asr.encoder("fp32")
    forward, seen = encoder.forward, {}

    def memoised(features, *args, **kwargs):
        data = on_host(features)                              # an emulated device tensor's host data
        key = (type(features), features.dtype, tuple(data.shape), data.numpy().tobytes(), args, tuple(kwargs.items()))
        if key not in seen:
            seen[key] = forward(features, *args, **kwargs)
        return seen[key]

    encoder.forward = memoised
