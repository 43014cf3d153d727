"""Whisper's timestamp mode: the rules against Hugging Face's `WhisperTimeStampLogitsProcessor` (the same rules
as openai-whisper's), on chains and on tree passes; segments read from timestamp tokens; the pipeline's greedy
timestamp tokens against Hugging Face `generate(return_timestamps=True)` on the real tiny.en."""

from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from mmaccel.speech.timestamps import TimestampRules, split_segments
from tests.speech.test_pipeline import FILES, LIBRIVOX

EOT, NO_TS, V, P = 60, 62, 63 + 80, 2        # text 0..59, <|endoftext|> 60, <|notimestamps|> 62, 80 timestamps
RULES = TimestampRules(NO_TS, EOT, P, max_initial=50)


def _hf_processor() -> WhisperTimeStampLogitsProcessor:
    config = SimpleNamespace(no_timestamps_token_id=NO_TS, eos_token_id=EOT, bos_token_id=EOT,
                             max_initial_timestamp_index=50, _detect_timestamp_from_logprob=True)
    return WhisperTimeStampLogitsProcessor(config, begin_index=P)


def _random_logits(rows: int, g: torch.Generator) -> torch.Tensor:
    logits = 3 * torch.randn(rows, V, generator=g)
    logits[:, RULES.timestamp_begin :] -= 4 * torch.rand(rows, 1, generator=g)      # timestamps likely, not certain
    return logits


def _ours_on_chain(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Our rules for the next token after each row of `history` [B, L] (prompt included), as one pass sees it."""
    B, L = history.shape
    visible = torch.ones(B, 1, L, dtype=torch.bool)
    return RULES.apply(logits[:, None].clone(), history, visible)[:, 0]


def test_the_rules_are_hugging_faces_on_every_history_greedy_meets():
    hf, g = _hf_processor(), torch.Generator().manual_seed(0)
    rows = torch.full((64, P), 61)
    checked = 0
    for _ in range(40):                      # greedy under HF's rules from random logits: histories of every kind
        logits = _random_logits(rows.shape[0], g)
        want = hf(rows, logits)
        got = _ours_on_chain(rows, logits)
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got[~got.isinf()], want[~want.isinf()])
        rows = torch.cat([rows, want.argmax(-1, keepdim=True)], 1)
        checked += rows.shape[0]
    seen = rows[:, P:]
    assert (seen >= RULES.timestamp_begin).any() and (seen < EOT).any(), "the histories hold both kinds of token"
    assert checked == 64 * 40


def test_a_tree_pass_judges_each_node_by_its_own_path():
    """Nodes of one pass that extend different paths get the rules of their own path (tree attention)."""
    hf, g = _hf_processor(), torch.Generator().manual_seed(1)
    ts = RULES.timestamp_begin
    committed = torch.tensor([[61, 61, ts, 5, 6]])                       # prompt, <|0.00|>, two words
    # the tree: 0 = <|0.40|> (closes a segment), 1 = word after it?  no: 1 = a child of 0 (<|0.40|> again: a
    # new segment's start), 2 = a sibling of 0 (a word); each node sees the committed slots and its ancestors
    nodes = torch.tensor([[ts + 20, ts + 20, 7]])
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [0, 0, 1]]], dtype=torch.bool)
    ids = torch.cat([committed, nodes], 1)
    visible = torch.cat([torch.ones(1, 3, committed.shape[1], dtype=torch.bool), tree], 2)
    logits = _random_logits(3, g)[None]
    got = RULES.apply(logits.clone(), ids, visible)[0]
    paths = [[ts + 20], [ts + 20, ts + 20], [7]]
    for node, path in enumerate(paths):
        history = torch.cat([committed, torch.tensor([path])], 1)
        want = hf(history, logits[0, node : node + 1].clone())[0]
        assert torch.equal(torch.isinf(got[node]), torch.isinf(want)), node
    # the path [<|0.40|>] after text must close (timestamp or end); after a pair it must be text
    assert torch.isinf(got[0, :EOT]).all() and torch.isinf(got[1, ts:]).all()


def test_segments_are_read_as_openai_whisper_reads_them():
    ts = RULES.timestamp_begin

    def t(seconds: float) -> int:
        return ts + round(seconds / 0.02)

    closed = [t(0), 1, 2, t(1.0), t(1.0), 3, t(2.0), EOT]                 # two segments, ends on a single timestamp
    segments, done = split_segments(closed, RULES, 30.0)
    assert [(a, b) for a, b, _ in segments] == [(0.0, 1.0), (1.0, 2.0)] and done == 30.0
    assert segments[0][2] == [t(0), 1, 2, t(1.0)]
    unclosed = [t(0), 1, t(1.0), t(1.2), 4, 5]                            # the last segment never closes
    segments, done = split_segments(unclosed, RULES, 30.0, keep_tail=False)
    assert [(a, b) for a, b, _ in segments] == [(0.0, 1.0)] and done == 1.0     # the next window starts at 1.0 s
    segments, done = split_segments(unclosed, RULES, 30.0)
    assert [(a, b) for a, b, _ in segments] == [(0.0, 1.0), (1.2, 30.0)] and done == 30.0
    assert split_segments([t(0), 1, 2, t(3.0), EOT], RULES, 30.0)[0] == [(0.0, 3.0, [t(0), 1, 2, t(3.0)])]
    assert split_segments([1, 2, EOT], RULES, 12.5)[0] == [(0.0, 12.5, [1, 2])]        # no timestamps at all
    assert split_segments([EOT], RULES, 12.5) == ([], 12.5)
    # a timestamp in the padding after a short clip: no time passes the clip's end
    assert split_segments([t(0), 1, t(1.0), t(1.0), 2, t(1.6), EOT], RULES, 1.5) == \
        ([(0.0, 1.0, [t(0), 1, t(1.0)]), (1.0, 1.5, [t(1.0), 2, t(1.6)])], 1.5)


def test_greedy_timestamps_are_hugging_faces_on_tiny_en(tiny_en_asr):
    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    from mmaccel.speech.audio import as_audio, log_mel

    clips = FILES[:2]
    out = tiny_en_asr.transcribe(clips, "greedy", timestamps=True)
    gen = tiny_en_asr.bundle.model.generation_config
    config = type(gen).from_dict({**gen.to_dict(), "max_initial_timestamp_index": 50, "max_new_tokens": 224,
                                  "max_length": None})
    sot = tiny_en_asr.bundle.tokens.start_of_transcript
    for clip, transcript in zip(clips, out.transcripts):
        features = log_mel(tiny_en_asr.bundle.feature_extractor, [as_audio(clip)])
        hf = tiny_en_asr.bundle.model.generate(features, return_timestamps=True, generation_config=config)
        hf = [t for t in (hf.sequences if hasattr(hf, "sequences") else hf)[0].tolist() if t != sot]   # no prompt
        assert transcript.tokens[:-1] == hf and transcript.tokens[-1] == tiny_en_asr.bundle.tokens.end_of_text
        segments = transcript.segments
        assert segments and all(0 <= s.start <= s.end <= transcript.duration + 0.02 for s in segments)
        assert all(a.end <= b.start for a, b in zip(segments, segments[1:]))
        assert "".join(s.text for s in segments).strip() == transcript.text and "<|" not in transcript.text
        assert all(s.avg_logprob < 0 and 0 <= s.no_speech_prob <= 1 and s.compression_ratio > 0 for s in segments)


def test_the_decoder_applies_the_rules_to_each_tree_node_by_its_path():
    """A tree pass of the Whisper decoder in timestamp mode gives each node the logits (rules included) that a
    chain pass along its own path gives: the rules read the cache's token record through the tree mask."""
    from mmaccel.speech.decoder import WhisperDecoderModel
    from tests.speech.conftest import EOT, NO_TS, SOT, TIMED_VOCAB, features, tiny_whisper

    model = WhisperDecoderModel(tiny_whisper(vocab=TIMED_VOCAB))
    rules = TimestampRules(NO_TS, EOT, 1, max_initial=10)
    inputs = model.encode(features(1), [SOT], rules=rules)
    ts = rules.timestamp_begin
    committed = torch.tensor([[ts, 5, 6]])                                # <|0.00|> and two words

    def after(tokens: torch.Tensor, tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        state = model.prefill(inputs, 16)
        model.step(state, committed)
        return model.step(state, tokens, tree_mask=tree_mask)[0]

    nodes = torch.tensor([[ts + 20, ts + 20, 7]])
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [0, 0, 1]]], dtype=torch.bool)
    got = after(nodes, tree)
    for node, path in enumerate([[ts + 20], [ts + 20, ts + 20], [7]]):
        want = after(torch.tensor([path]))[-1]
        assert torch.equal(got[node].isinf(), want.isinf()), node
        assert torch.allclose(got[node][~want.isinf()], want[~want.isinf()], atol=1e-4), node
    assert got[0, :EOT].isinf().all() and got[1, ts:].isinf().all()      # close the segment; then text
