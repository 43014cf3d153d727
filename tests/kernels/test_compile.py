"""Every kernel compiles for real GPUs (sm_80, sm_90: Triton IR to PTX to cubin, with the ptxas Triton
ships), no GPU needed: the interpreter checks run the kernels' logic, this catches what only the
compiler rejects (loop-carried types, scalar control flow, float64 scans)."""

import pytest

from mmaccel.kernels.dispatch import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton is not installed")

ROW = {"n_ptr": "*i64", "next_ptr": "*i64"}
CHAIN = {"drafts_ptr": "*i64", "q_ptr": "*fp32", "p_ptr": "*fp32", "u_ptr": "*fp32", "e_ptr": "*fp32"}
GROUP = {"dist_ptr": "*fp32", "p_threshold": "fp32", "d_threshold": "fp32", "half_window": "i32"}
TREE = {"tokens_ptr": "*i64", "parents_ptr": "*i64"}
# kernel -> (module, argument types in order, compile-time constants)
KERNELS = {
    "chain": ("speculative", "_verify_chain", {**CHAIN, **ROW}, {"K": 4, "V": 1024, "BLOCK": 1024}),
    "pooled": ("pooled", "_accept_pooled", {**CHAIN, "neighbours_ptr": "*i64", "delta": "fp32", **ROW,
                                            "deviation_ptr": "*fp32"},
               {"K": 4, "V": 16384, "M": 50, "M_BLOCK": 64, "BLOCK": 1024}),
    "grouped": ("grouped", "_accept_grouped", {**CHAIN, **GROUP, **ROW, "deviation_ptr": "*fp32"},
                {"K": 8, "V": 16384, "BLOCK": 1024}),
    "grouped-coupled": ("grouped", "_accept_grouped_coupled",
                        {"drafts_ptr": "*i64", "p_ptr": "*fp32", "e_ptr": "*fp32", **GROUP, **ROW,
                         "deviation_ptr": "*fp32"}, {"K": 8, "V": 16384, "BLOCK": 1024}),
    "tree-sampled": ("tree_verify", "_verify_tree_sampled",
                     {**TREE, "p_ptr": "*fp32", "u_ptr": "*fp32", "e_ptr": "*fp32", "path_ptr": "*i64", **ROW},
                     {"N": 17, "V": 50257, "NB": 32, "BLOCK": 512}),
    "tree-greedy": ("tree_verify", "_verify_tree_greedy", {**TREE, "logits_ptr": "*fp32", "path_ptr": "*i64", **ROW},
                    {"N": 17, "V": 50257, "NB": 32, "BLOCK": 1024}),
    "tree-mask": ("tree_mask", "_ancestor_mask", {"parents_ptr": "*i64", "mask_ptr": "*i8"}, {"N": 65, "NB": 128}),
}
POINT_MASS = {"chain", "pooled", "grouped"}          # kernels with a point-mass branch: both are compiled


def _variants():
    for name in KERNELS:
        for point_mass in ((False, True) if name in POINT_MASS else (None,)):
            for arch in (80, 90):
                yield pytest.param(name, point_mass, arch, id=f"{name}-{'pm-' if point_mass else ''}sm{arch}")


@pytest.mark.parametrize("name, point_mass, arch", list(_variants()))
def test_compiles_to_cubin(name, point_mass, arch):
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, args, constants = KERNELS[name]
    fn = getattr(importlib.import_module(f"mmaccel.kernels.{module}"), kernel)
    if point_mass is not None:
        constants = {**constants, "POINT_MASS": point_mass}
    assert set(args) | set(constants) == set(fn.arg_names), "the table above is out of date with the kernel"
    signature = {a: args.get(a, "constexpr") for a in fn.arg_names}
    compiled = triton.compile(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", arch, 32))
    assert compiled.asm["cubin"] and f".target sm_{arch}" in compiled.asm["ptx"]
