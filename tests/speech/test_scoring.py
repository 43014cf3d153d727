"""score_tokens: each generated token's log-probability and the no-speech probability, read in one pass."""

import torch

from mmaccel.speech import scoring
from mmaccel.speech.scoring import compression_ratio, score_tokens
from tests.speech.conftest import features


def test_scores_are_the_models_own_log_probabilities_whatever_rows_share_a_product(tiny_decoder, monkeypatch):
    model = tiny_decoder
    prompt = [1, 2]
    inputs = model.encode(features(3), prompt)
    tokens = [[5, 9, 3, 0], [7], [4, 4, 8]]          # ragged rows; the last one without an end of text
    scores = score_tokens(model, inputs, tokens, no_speech=6)
    monkeypatch.setattr(scoring, "ROWS_PER_PRODUCT", 1)  # one row per product
    for alone, shared in zip(score_tokens(model, inputs, tokens, no_speech=6), scores):
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(shared.logprobs), atol=1e-5)
        assert abs(alone.no_speech_prob - shared.no_speech_prob) < 1e-6      # read at the prompt's position
    hf = model.hf
    with torch.no_grad():
        for b, row in enumerate(tokens):
            ids = torch.tensor([prompt + row])
            logits = hf(input_features=features(3)[b : b + 1], decoder_input_ids=ids).logits[0]      # [P + T, V]
            logits = logits[len(prompt) - 1 : -1] + torch.cat([model._begin_bias[None],
                                                               model.suppression.expand(len(row) - 1, -1)])
            want = logits.log_softmax(-1).gather(1, torch.tensor(row)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(scores[b].logprobs), want, atol=1e-4), b
            nsp = hf(input_features=features(3)[b : b + 1], decoder_input_ids=ids).logits[0, 0].softmax(-1)[6]
            assert abs(scores[b].no_speech_prob - float(nsp)) < 1e-5


def test_the_no_speech_probability_is_read_at_start_of_transcript_after_a_text_prompt(tiny_decoder, monkeypatch):
    model = tiny_decoder
    prompt = [3, 8, 1, 2]                             # <|startofprev|> and text, then <|startoftranscript|> at 2
    inputs = model.encode(features(2), prompt)
    tokens = [[5, 9, 0], [7, 0]]
    monkeypatch.setattr(scoring, "ROWS_PER_PRODUCT", 1)   # one row per product: row b's product starts at b
    scores = score_tokens(model, inputs, tokens, no_speech=6, start=2)
    with torch.no_grad():
        for b, row in enumerate(tokens):
            logits = model.hf(input_features=features(2)[b : b + 1], decoder_input_ids=torch.tensor([prompt + row])).logits
            assert abs(scores[b].no_speech_prob - float(logits[0, 2].softmax(-1)[6])) < 1e-5, b


def test_compression_ratio_grows_with_repetition():
    assert compression_ratio("") == 0.0
    assert compression_ratio("I need an" + " I-I" * 80) > 2.4 > compression_ratio("He was not an ill-disposed young man.")
