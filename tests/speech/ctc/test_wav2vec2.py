import json

import numpy as np
import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.ctc.beam import ctc_beam_search, ctc_greedy
from mmaccel.speech.ctc.wav2vec2 import Wav2Vec2CTC

TOKENS = ["<pad>", "|", "a", "b", "c", "t", "<unk>"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    torch.manual_seed(0)
    config = Wav2Vec2Config(vocab_size=len(TOKENS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 4, 4), conv_kernel=(10, 8, 4),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, pad_token_id=0)
    root = tmp_path_factory.mktemp("w2v")
    Wav2Vec2ForCTC(config).save_pretrained(root)
    (root / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(TOKENS)}))
    (root / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<pad>", "word_delimiter_token": "|"}))
    return root


def test_a_wav2vec2_directory_decodes_through_the_ctc_interface(checkpoint):
    from transformers import Wav2Vec2ForCTC

    model = Wav2Vec2CTC.from_pretrained(checkpoint)
    assert model.vocab.blank == 0 and model.vocab.space == 1 and model.frame_seconds == pytest.approx(0.005)
    rng = np.random.default_rng(0)
    audios = [(rng.standard_normal(16000).astype(np.float32) * 0.1, 16000), (rng.standard_normal(8000) * 0.1, 16000)]
    log_probs, lengths = model.log_probs(audios)
    assert log_probs.shape[0] == 2 and lengths.tolist() == [199, 99] and log_probs.shape[2] == len(TOKENS)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]))
    one = (audios[1][0] - audios[1][0].mean()) / np.sqrt(audios[1][0].var() + 1e-7)
    hf = Wav2Vec2ForCTC.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        want = hf(torch.from_numpy(one.astype(np.float32))[None]).logits.log_softmax(-1)
    torch.testing.assert_close(log_probs[1, :99], want[0], atol=1e-4, rtol=1e-4)
    greedy = ctc_greedy(log_probs, model.vocab, lengths, frame_seconds=model.frame_seconds)
    beam = ctc_beam_search(log_probs, model.vocab, lengths, beam=1, blank_skip=None, frame_seconds=model.frame_seconds)
    assert [h.tokens for h in beam] == [h.tokens for h in greedy]


def test_missing_or_broken_checkpoints_are_clear_errors(checkpoint, tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json missing"):
        Wav2Vec2CTC.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    with pytest.raises(ModelNotFoundError, match="no vocab.json"):
        Wav2Vec2CTC.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text("{not json")
    with pytest.raises(InputError, match="vocab.json"):
        Wav2Vec2CTC.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(TOKENS)}))
    with pytest.raises(ModelNotFoundError, match="cannot load the Wav2Vec2ForCTC weights"):
        Wav2Vec2CTC.from_pretrained(tmp_path)
    model = Wav2Vec2CTC.from_pretrained(checkpoint)
    with pytest.raises(InputError, match="non-empty list"):
        model.log_probs([])
    with pytest.raises(InputError, match="25 ms"):
        model.log_probs([(np.zeros(100, dtype=np.float32), 16000)])
