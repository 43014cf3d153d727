"""Proactive triggers: the head max-pools per-token logits, round-trips through its files, fires through the
pipeline at the segment its weights say (and only on a new appearance), the metric counts exactly, and a
short training run on recorded streams lowers the loss."""

import json

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.data import FASHION_MNIST_ROOT
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.stream import VideoStreamPipeline
from mmaccel.video.trigger import CONFIG_FILE, WEIGHTS_FILE, TriggerHead, TriggerMonitor, load_trigger
from mmaccel.video.trigger_eval import early_requests, evaluate_triggers, replay_requests, trigger_metrics
from tests.video.conftest import tiny_qwen_vl
from tests.video.test_stream import Digits

needs_data = pytest.mark.skipif(not FASHION_MNIST_ROOT.is_dir(), reason="Debian dataset-fashion-mnist not installed")


@pytest.fixture(scope="module")
def model():
    return QwenVLStream(tiny_qwen_vl())


def flat(value, n=2, side=56):
    """n frames of one grey level."""
    return torch.full((n, side, side, 3), value, dtype=torch.uint8)


def test_head_max_pools_token_logits_and_masks_padding():
    head = TriggerHead(8, ["bag", "shirt", "boot"], width=16)
    x = torch.randn(2, 5, 8)
    per_token = head.token_logits(x)
    assert per_token.shape == (2, 5, 3)
    assert torch.equal(head(x), per_token.amax(1))
    mask = torch.tensor([[True, True, False, False, False], [True] * 5])
    assert torch.equal(head(x, mask)[0], per_token[0, :2].amax(0))
    assert torch.isneginf(head(torch.zeros(1, 0, 8))).all()             # a segment whose tokens were all dropped
    assert torch.equal(head.probabilities(torch.zeros(0, 8)), torch.zeros(3))
    p = head.probabilities(x[1])
    assert p.shape == (3,) and torch.allclose(p, torch.sigmoid(per_token[1].amax(0)))


def test_save_load_round_trip(tmp_path):
    head = TriggerHead(8, ["bag", "shirt"], width=4, threshold=0.3)
    head.save(tmp_path, trained={"steps": 3})
    back = load_trigger(tmp_path, hidden_size=8)
    assert back.classes == ["bag", "shirt"] and back.threshold == 0.3 and back.width == 4
    x = torch.randn(3, 6, 8)
    assert torch.equal(back(x), head(x))
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["info"] == {"trained": {"steps": 3}}


def hand_set_head(hidden: list[torch.Tensor], k: int, d: int) -> tuple[TriggerHead, list[float]]:
    """"bag" reads the direction that separates segment k's tokens from those before it, its bias halfway
    between segment k's score and the highest earlier one (threshold 0.5 = logit 0); "shirt" never fires."""
    head = TriggerHead(d, ["bag", "shirt"], width=d)
    with torch.no_grad():
        head.mlp[0].weight.copy_(torch.eye(d))
        head.mlp[0].bias.zero_()
        f = [F.gelu(h) for h in hidden]
        v = f[k].mean(0) - torch.cat(f[:k]).mean(0)
        scores = [float((g @ v).max()) for g in f]
        assert scores[k] > max(scores[:k])
        head.mlp[2].weight.zero_()
        head.mlp[2].bias.fill_(-10.0)
        head.mlp[2].weight[0] = v
        head.mlp[2].bias[0] = -(scores[k] + max(scores[:k])) / 2
    return head, scores


def test_requests_fire_at_the_segment_the_head_sees_and_only_on_a_new_appearance(model):
    # segments: dark, dark, dark, bright (k = 3), dark, bright
    frames = torch.cat([flat(10), flat(12), flat(10), flat(250), flat(10), flat(250)])
    plain = VideoStreamPipeline(model, Digits())
    hidden = []
    for f in frames:
        if plain.feed(f).appended:
            hidden.append(plain.state.hidden[0, 1:-1].clone())
    head, scores = hand_set_head(hidden, 3, model.text.config.hidden_size)
    cut = -float(head.mlp[2].bias[0].detach())
    assert scores[4] < cut < scores[5]                           # the subject goes (segment 4) and comes back (5)

    pipe = VideoStreamPipeline(model, Digits(), trigger=head)
    early = pipe.request("bag")                                  # before any frame: armed
    never = pipe.request("shirt")
    events = {}
    for t, f in enumerate(frames):
        report = pipe.feed(f)
        events[t] = report.events
        if t == 7:                                               # right after segment 3 fired: "bag" is visible now
            late = pipe.request("bag")
            assert not late.armed
    fired = {t: e for t, e in events.items() if e}
    assert list(fired) == [7, 11]
    (first,), (second,) = fired[7], fired[11]
    assert (first.subject, first.frame, first.requested_at, first.request_id) == ("bag", 7, -1, early.request_id)
    assert (second.frame, second.requested_at, second.request_id) == (11, 7, late.request_id)
    assert first.probability > 0.5 and second.probability > 0.5
    assert [r.request_id for r in pipe.requests] == [never.request_id]

    # replaying the probabilities through the same rule gives the same fires
    probs = torch.stack([head.probabilities(h) for h in hidden])
    assert replay_requests(probs, [1, 3, 5, 7, 9, 11], head.classes, 0.5,
                           [("bag", -1), ("shirt", -1), ("bag", 7)]) == [7, None, 11]
    pipe.reset()
    assert pipe.requests == [] and pipe.feed(frames[0]).events == []


def test_metric_counts_hand_made_fires():
    outcomes = [(10, 12), (10, 26), (10, 27), (10, 9), (10, None), (None, 5), (None, None), (40, 40)]
    m = trigger_metrics(outcomes, tolerance=16)
    assert (m["requests"], m["events"], m["fires"], m["hits"]) == (8, 6, 6, 3)
    assert m["precision"] == pytest.approx(3 / 6) and m["recall"] == pytest.approx(3 / 6)
    assert m["f1"] == pytest.approx(0.5)
    assert m["mean_delay"] == pytest.approx((2 + 16 + 0) / 3) and m["median_delay"] == 2
    assert (m["false_fires"], m["early_fires"], m["fires_without_event"], m["late_fires"], m["misses"],
            m["silent_without_event"]) == (2, 1, 1, 1, 1, 1)
    none = trigger_metrics([(3, None), (None, None)])
    assert none["precision"] == 0.0 and none["recall"] == 0.0 and none["mean_delay"] is None


def test_bad_input_is_a_clear_error(model, tmp_path):
    head = TriggerHead(model.text.config.hidden_size, ["bag"])
    with pytest.raises(InputError, match="no trigger head"):
        VideoStreamPipeline(model, Digits()).request("bag")
    with pytest.raises(InputError, match="knows no class 'boot'.*bag"):
        VideoStreamPipeline(model, Digits(), trigger=head).request("boot")
    with pytest.raises(InputError, match="hidden states of size 32, the model's are 64"):
        VideoStreamPipeline(model, Digits(), trigger=TriggerHead(32, ["bag"]))
    with pytest.raises(InputError, match="threshold"):
        TriggerHead(8, ["bag"], threshold=1.0)
    with pytest.raises(InputError, match="distinct"):
        TriggerHead(8, ["bag", "bag"])
    with pytest.raises(InputError, match="probabilities must be"):
        TriggerMonitor(["bag"], 0.5).observe(torch.zeros(2), 1)

    with pytest.raises(ModelNotFoundError, match="missing"):
        load_trigger(tmp_path)
    TriggerHead(32, ["bag"]).save(tmp_path)
    with pytest.raises(InputError, match="size 32, the model's are 64"):
        load_trigger(tmp_path, hidden_size=64)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="not a readable safetensors"):
        load_trigger(tmp_path)
    TriggerHead(32, ["bag"]).save(tmp_path)
    TriggerHead(32, ["bag"], width=8).save(tmp_path / "other")
    (tmp_path / "other" / CONFIG_FILE).replace(tmp_path / CONFIG_FILE)             # weights of width 128
    with pytest.raises(InputError, match="wrong shape"):
        load_trigger(tmp_path)
    (tmp_path / CONFIG_FILE).write_text("{ nope")
    with pytest.raises(InputError, match="not a trigger head config"):
        load_trigger(tmp_path)
    (tmp_path / WEIGHTS_FILE).unlink()
    with pytest.raises(ModelNotFoundError, match=WEIGHTS_FILE):
        load_trigger(tmp_path)


def test_from_pretrained_loads_the_head_next_to_the_model(tmp_path):
    from mmaccel.video.train import build_model
    from mmaccel.video.words import WordTokenizer

    words = ["bag", "shirt", "what", "?"]
    build_model(WordTokenizer(words)).save_pretrained(tmp_path)
    (tmp_path / "words.json").write_text(json.dumps(words))
    assert VideoStreamPipeline.from_pretrained(str(tmp_path)).trigger is None
    TriggerHead(128, ["bag", "shirt"], threshold=0.4).save(tmp_path)
    pipe = VideoStreamPipeline.from_pretrained(str(tmp_path))
    assert pipe.trigger.classes == ["bag", "shirt"] and pipe.trigger.threshold == 0.4
    assert pipe.request("shirt").subject == "shirt"
    TriggerHead(64, ["bag"]).save(tmp_path)
    with pytest.raises(InputError, match="size 64, the model's are 128"):
        VideoStreamPipeline.from_pretrained(str(tmp_path))


@needs_data
def test_a_short_training_run_lowers_the_loss_and_live_evaluation_equals_replay():
    from mmaccel.video.data import CLASSES, VOCAB
    from mmaccel.video.reduce import TemporalDrop
    from mmaccel.video.train import build_model
    from mmaccel.video.train_trigger import dev_requests, pick_threshold, record_streams, segment_probabilities, train_head
    from mmaccel.video.words import WordTokenizer

    tok = WordTokenizer(VOCAB)
    stream_model = QwenVLStream(build_model(tok).eval())
    pipes = {False: VideoStreamPipeline(stream_model, tok),
             True: VideoStreamPipeline(stream_model, tok, reduction=TemporalDrop("pixel"))}
    recordings = record_streams(pipes, [1, 2], 40, "mix", log=lambda line: None)
    assert [r.reduced for r in recordings] == [False, True] and len(recordings[0].hidden) == 20
    assert recordings[0].hidden[0].shape == (16, 128) and recordings[0].labels.shape == (20, len(CLASSES))
    head = TriggerHead(128, CLASSES, width=32)
    losses = train_head(head, recordings, steps=40, batch=16, lr=1e-2, seed=0, log=lambda line: None)
    assert sum(losses[-5:]) / 5 < losses[0]
    threshold, metrics = pick_threshold(head, recordings, dev_requests(recordings, 3, 0), grid=(0.3, 0.5, 0.7))
    assert threshold in (0.3, 0.5, 0.7) and metrics["requests"] >= 1

    # the live evaluation through the pipeline equals replaying the recorded probabilities
    rec = recordings[0]
    qs = dev_requests([rec], 4, 1)[0]
    probs = segment_probabilities(head, rec)
    head.threshold = 0.6
    fired = replay_requests(probs, rec.frames, head.classes, head.threshold, [(q.answer, q.frame) for q in qs])
    live = evaluate_triggers(VideoStreamPipeline(stream_model, tok, trigger=head), [rec.stream], [qs])
    assert live == trigger_metrics([(q.trigger_frame, f) for q, f in zip(qs, fired)])
    assert live["fires"] >= 1

    qs = early_requests(rec.stream, np.random.default_rng(0), within=10, subjects=3)
    assert len(qs) == 3 and len({q.answer for q in qs}) == 3 and len({q.frame for q in qs}) == 1
    assert qs[0].frame < 10 and all(q.kind == "when" for q in qs)


def test_partly_visible_classes_are_left_out_of_the_loss_with_min_visible():
    from mmaccel.video.data import CLASSES, Stream, Track
    from mmaccel.video.train_trigger import record, visible_share

    # a bag (class 8) entering from the left at 2 px a frame: 4 px in view at frame 1, whole from frame 13
    s = Stream(seed=0, split="test", num_frames=16, tracks=[Track(0, 8, 0, "right", 2, 40, 0)])
    track = s.tracks[0]
    assert visible_share(track, 1) == 4 / 28 and visible_share(track, 13) == 1.0

    class Pipe:                                   # a segment of one token every second frame
        reduction = ()

        def reset(self):
            self.t = -1

        def feed(self, frame):
            self.t += 1
            self.state = type("S", (), {"hidden": torch.zeros(1, 3, 4)})()
            return type("R", (), {"appended": self.t % 2 == 1})()

    rec = record(Pipe(), s, min_visible=0.5)
    bag = CLASSES.index("bag")
    assert rec.frames == [1, 3, 5, 7, 9, 11, 13, 15] and rec.labels[:, bag].tolist() == [1.0] * 8
    assert rec.weights[:, bag].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]      # shares 4, 8, 12, 16 .. of 28 px
    assert rec.weights[:, CLASSES.index("coat")].tolist() == [1.0] * 8   # not in view: a negative, counted
    assert record(Pipe(), s).weights.all()                              # by default every label counts
