"""StepGraphs (mmaccel/core/graphs.py) on the emulated CUDA device of tests/emulated_cuda.py, whose graphs
behave as CUDA's: capturing runs nothing, a replay runs the recorded kernels on the same memory and no
Python. So a step that changes its state in place replays correctly, and one that reassigns a Python
attribute does not (the negative control: the emulation catches what a GPU would get wrong)."""

import torch

from mmaccel.core.graphs import StepGraphs
from tests.emulated_cuda import emulated_cuda, on_host


def _run(step, calls: int, graphs: StepGraphs | None):
    outs = []
    for i in range(calls):
        x = torch.full((2,), float(i + 1), device="cuda")
        outs.append(on_host(graphs.run("step", step, x)[0] if graphs is not None else step(x)[0]))
    return outs


def test_in_place_state_replays_exactly_and_reassigned_state_does_not():
    with emulated_cuda() as report:
        total = torch.zeros(2, device="cuda")

        def in_place(x):
            total.add_(x)
            return (total * 2,)

        graphs = StepGraphs(warmup=1)
        graphed = _run(in_place, 5, graphs)
        assert len(graphs) == 1 and report.replays == 4          # call 1 eager, 2 captured and replayed, then replays
        total.zero_()
        assert all(torch.equal(a, b) for a, b in zip(graphed, _run(in_place, 5, None)))

        state = {"total": torch.zeros(2, device="cuda")}

        def reassigned(x):
            state["total"] = state["total"] + x                  # a new tensor: the graph keeps reading the old one
            return (state["total"] * 2,)

        wrong = _run(reassigned, 5, StepGraphs(warmup=1))
        state["total"] = torch.zeros(2, device="cuda")
        right = _run(reassigned, 5, None)
    assert torch.equal(wrong[1], right[1]) and not torch.equal(wrong[4], right[4])


def test_a_capture_runs_nothing_and_shapes_get_graphs_of_their_own():
    with emulated_cuda():
        seen = torch.zeros(1, device="cuda")

        def count(x):
            seen.add_(1)
            return (x + seen,)

        graphs = StepGraphs(warmup=0)
        out = graphs.run(("T", 1), count, torch.ones(1, device="cuda"))[0]
        assert on_host(seen).item() == 1 and on_host(out).item() == 2     # captured (no effect), replayed once
        graphs.run(("T", 3), count, torch.ones(3, device="cuda"))
        graphs.run(("T", 1), count, torch.ones(1, device="cuda"))
        assert len(graphs) == 2 and on_host(seen).item() == 3
