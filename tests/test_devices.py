"""device= / dtype=: a device or dtype this machine cannot run, or modules on two devices, is a clear error."""

import pytest
import torch

from mmaccel.devices import check_same_device, resolve_device, resolve_dtype
from mmaccel.errors import InputError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_resolve_device(no_gpu):
    assert resolve_device(None) == resolve_device("cpu") == resolve_device("auto") == torch.device("cpu")
    with pytest.raises(InputError, match="sees no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(InputError, match="sees no CUDA GPU"):
        resolve_device("cuda:1")
    with pytest.raises(InputError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")


def test_resolve_dtype():
    cpu = torch.device("cpu")
    assert resolve_dtype(None, cpu) is None and resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype(torch.float16, cpu) == torch.float16
    with pytest.raises(InputError, match="unknown dtype 'int8'"):
        resolve_dtype("int8", cpu)
    with pytest.raises(InputError, match="floating torch dtype"):
        resolve_dtype(torch.int64, cpu)


def test_modules_on_two_devices_are_named():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta")
    check_same_device([("target", a), ("draft", None), ("tokenizer", torch.nn.Linear(2, 2))])
    with pytest.raises(InputError, match="the draft is on meta but the target is on cpu"):
        check_same_device([("target", a), ("draft", b)])


def test_pipelines_take_a_device_and_refuse_a_mixed_one(no_gpu, target, tiny_lm_dir):
    from mmaccel.image.pipeline import ImagePipeline
    from mmaccel.lm.hf import HFCausalLM
    from mmaccel.lm.pipeline import TextPipeline

    pipe = ImagePipeline.from_pretrained(device="cpu", dtype="float32")
    assert pipe.model.output.weight.device.type == "cpu"
    with pytest.raises(InputError, match="the drafter is on meta but the target GPT is on cpu"):
        ImagePipeline(pipe.model, pipe.vq, pipe.draft.to_empty(device="meta"))
    with pytest.raises(InputError, match="sees no CUDA GPU"):
        ImagePipeline.from_pretrained(device="cuda")
    text = TextPipeline.from_pretrained(str(tiny_lm_dir), draft=None, device="cpu")
    assert text.model.device.type == "cpu"
    meta = HFCausalLM(type(target.hf)(target.hf.config).to("meta"))
    with pytest.raises(InputError, match="the draft is on meta but the target is on cpu"):
        TextPipeline(target, text.tokenizer, meta)
    with pytest.raises(InputError, match="sees no CUDA GPU"):
        TextPipeline.from_pretrained(str(tiny_lm_dir), draft=None, device="cuda")


def test_commands_refuse_a_missing_gpu_in_one_line(no_gpu, capsys, tmp_path):
    from mmaccel.cli import main

    out = tmp_path / "run"
    for argv in (["image", "generate", "--labels", "1", "--device", "cuda", "--out", str(tmp_path / "png")],
                 ["eval", "image", "--method", "ar", "--num-samples", "4", "--out", str(out), "--device", "cuda"],
                 ["bench", "core", "--quick", "--device", "cuda"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "sees no CUDA GPU" in err[0]
    assert not out.exists() and not (tmp_path / "png").exists()          # nothing written half-way


def test_asr_pipeline_refuses_a_missing_gpu_before_loading(no_gpu):
    from mmaccel.speech.pipeline import ASRPipeline

    with pytest.raises(InputError, match="sees no CUDA GPU"):
        ASRPipeline.from_pretrained("builtin:tiny.en", device="cuda")
