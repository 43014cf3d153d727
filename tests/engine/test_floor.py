"""Pass floors: the bytes a pass reads by kind, counted exactly on a tiny model; conversions between precisions; the
roofline of a machine."""

import torch

from mmaccel.engine.floor import PassCost, model_tensors, trace_pass
from mmaccel.engine.machine import Machine


def _linear_bytes(model) -> int:
    return sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_a_step_reads_every_linear_weight_once_its_embedding_rows_and_the_used_cache(target):
    hf = target.hf
    cfg = hf.config
    state = target.prefill([[1, 2, 3, 4, 5]] * 2, 8)
    for width in (1, 3):
        tokens = torch.full((2, width), 7)

        def run(tokens=tokens, width=width):
            target.step(state, tokens)
            state.rollback(width)
        cost = trace_pass(run, model_tensors(hf), [*state.cache.k, *state.cache.v])
        used = 5 + width                             # attention reads the committed slots and the new ones
        kv = cfg.num_hidden_layers * 2 * 2 * cfg.num_key_value_heads * used * target.head_dim * 4
        assert cost.weights == _linear_bytes(hf) + 2 * width * cfg.hidden_size * 4      # + the looked-up rows
        assert cost.kv == kv and cost.cross == 0 and cost.activations > 0
        assert cost.flops >= 2 * 2 * width * _linear_bytes(hf) // 4                    # 2 FLOPs per weight per token
    assert state.cache.lengths.tolist() == [5, 5]


def test_precisions_convert_the_bytes_they_store():
    cost = PassCost(weights=400, kv=80, cross=40, activations=8, flops=1000)
    assert cost.bytes == 528 and cost.to_dict()["bytes"] == 528
    assert cost.at("bf16") == PassCost(200, 40, 20, 4, 1000)
    assert cost.at("int8") == PassCost(100, 40, 20, 8, 1000)          # bf16 keys/values beside int8 weights
    assert cost.at("fp32") == cost


def test_the_floor_is_the_roofline_of_the_measured_machine():
    m = Machine("cpu", [], 2, read_gb_s=10.0, gemm_gflop_s={"fp32": 100.0, "bf16": 400.0, "int8": 400.0},
                cache_bytes=None)
    memory_bound = PassCost(weights=10**9, kv=0, cross=0, activations=0, flops=10**9)
    assert abs(memory_bound.floor_s(m, "fp32") - 0.1) < 1e-12 and abs(memory_bound.floor_s(m, "int8") - 0.025) < 1e-12
    compute_bound = PassCost(weights=10**6, kv=0, cross=0, activations=0, flops=10**12)
    assert abs(compute_bound.floor_s(m, "fp32") - 10.0) < 1e-9 and abs(compute_bound.floor_s(m, "bf16") - 2.5) < 1e-9
