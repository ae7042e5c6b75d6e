# SPDX-License-Identifier: Apache-2.0
"""One MoE layer on CPU: bf16 vs the fork's quantized CPU experts.

Times one MoE layer at the Qwen3-30B-A3B shape (128 experts, top-8, hidden
2048, intermediate 768: 1.2 GB of bf16 expert weights, far more than the
caches) for several batch sizes, with fresh random routing on every call so
that the active experts' weights come from memory:

* ``bf16``: the unquantized CPU MoE path vLLM takes on CPU
  (cpu_fused_moe.CPUFusedMOE: the CPU library's cpu_fused_moe grouped GEMM
  on prepacked weights, or SGLFusedMOE's fused_experts_cpu where vLLM would
  pick it, on AMX CPUs with VLLM_CPU_SGL_KERNEL=1);
* ``int4``: CPUExpertsWNA16 (PyTorch's CPU int4 GEMM), symmetric group-128
  int4, and ``int4-zp`` with zero points;
* ``int8``: CPUExpertsInt8 (int8 W8A8, fused_experts_cpu), and
  ``int8-w8a16`` (online int8 experts: per-expert W8A16);
* ``fp8``: CPUExpertsFp8 (FP8 W8A16) with 128x128 block scales, and
  ``fp8-tensor``, ``fp8-channel`` with per-tensor and per-channel scales,
  ``mxfp8`` with E8M0 block-32 scales; ``fp8-sgl`` and ``fp8-tensor-sgl``
  are block and per-tensor FP8 built as with VLLM_CPU_SGL_KERNEL=1
  (fused_experts_cpu on VNNI-packed weights instead of the default
  generated GEMV / per-expert loop).

The quantized layers run through the modular kernel as vLLM builds it. The
schemes take turns call by call on the same inputs (all are in memory at
once, about 3 GB), so that other load on the machine falls on all alike. For
each it prints the median (and minimum) microseconds per call, the GB/s of weights read
(the bytes of the experts a call uses, scales and zero points included) and
the ratio of its time to bf16's. Weights are random (the numerics are
checked by the tests, not here). Add a scheme by adding a builder to SCHEMES.

On a machine that other processes load, pass ``--threads 1``: with more
threads every parallel region waits for its slowest thread, which weighs on
the per-expert loops (two regions per expert) far more than on the one
fused_experts_cpu call, and the medians stop meaning much.

Usage, from the repository root with the fork built::

    .venv/bin/python benchmarks/cpu_moe_layer_bench.py [--m 1 4 16 64]
        [--schemes bf16 int4 ...] [--iters 20] [--threads N]
        [--shape tiny] [--compile]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from moe_layer import E, HIDDEN, INTER, TOPK, moe_layer_config  # noqa: E402

GROUP = 128

# The per-expert ops of the FP8 and int8 W8A16 experts run the generated
# GEMV kernel (cpu_moe_gemv) up to its GEMV_MAX_TOKENS tokens.
_GEMV_OR_PER_EXPERT = "generated GEMV (small M), else per-expert"


# --shape tiny: the MoE layer of tools/tiny_checkpoint's models.
TINY = dict(E=8, TOPK=2, HIDDEN=256, INTER=128)


def _moe_config():
    return dataclasses.replace(
        moe_layer_config("cpu"),
        num_experts=E,
        experts_per_token=TOPK,
        hidden_dim=HIDDEN,
        intermediate_size_per_partition=INTER,
        num_local_experts=E,
        num_logical_experts=E,
    )


def _modular(experts_cls, moe, quant_config):
    from vllm.model_executor.layers.fused_moe.oracle.selection import (
        make_modular_moe_kernel,
    )

    return make_modular_moe_kernel(quant_config, moe, experts_cls, inplace=False)


def _run_modular(kernel, w13, w2):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    def run(x, topk_weights, topk_ids):
        return kernel.apply(
            x,
            w13,
            w2,
            topk_weights,
            topk_ids,
            activation=MoEActivation.SILU,
            global_num_experts=E,
            expert_map=None,
            apply_router_weight_on_input=False,
        )

    return run


@dataclasses.dataclass
class Scheme:
    run: Callable  # (x, topk_weights, topk_ids) -> output
    bytes_per_expert: int
    path: str


def build_bf16() -> Scheme:
    import vllm.envs as envs
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.utils import check_cpu_sgl_kernel

    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(
        torch.randn(E, 2 * INTER, HIDDEN, dtype=torch.bfloat16) / 45,
        requires_grad=False,
    )
    layer.w2_weight = torch.nn.Parameter(
        torch.randn(E, HIDDEN, INTER, dtype=torch.bfloat16) / 28,
        requires_grad=False,
    )
    # As UnquantizedFusedMoEMethod picks the CPU kernel on x86.
    if (
        envs.VLLM_CPU_SGL_KERNEL
        and check_cpu_sgl_kernel(2 * INTER, HIDDEN, torch.bfloat16)
        and check_cpu_sgl_kernel(HIDDEN, INTER, torch.bfloat16)
    ):
        layer.w13_weight.data = torch.ops._C.convert_weight_packed(layer.w13_weight)
        layer.w2_weight.data = torch.ops._C.convert_weight_packed(layer.w2_weight)

        def run(x, topk_weights, topk_ids):
            return torch.ops._C.fused_experts_cpu(
                x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids,
                False, False, False, None, None, None, None, None, True,
            )  # fmt: skip

        path = "SGLFusedMOE (fused_experts_cpu)"
    else:
        impl = cpu_fused_moe.CPUFusedMOE(layer)
        forward = impl.forward_method

        def run(x, topk_weights, topk_ids):
            return forward(layer, x, topk_weights, topk_ids, MoEActivation.SILU, E)

        path = f"CPUFusedMOE ({forward.__name__}, isa {impl.isa})"
    return Scheme(run, 3 * HIDDEN * INTER * 2, path)


def _build_int4(zero_points: bool) -> Scheme:
    from vllm.model_executor.layers.fused_moe.config import (
        int4_w4a16_moe_quant_config,
    )
    from vllm.model_executor.layers.fused_moe.experts.cpu_wna16_moe import (
        CPUExpertsWNA16,
        prepare_wna16_moe_layer_for_cpu,
    )

    moe = _moe_config()
    layer = SimpleNamespace(moe_config=moe)

    def rand_bytes(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8)

    w13 = rand_bytes(E, 2 * INTER, HIDDEN // 2)
    w2 = rand_bytes(E, HIDDEN, INTER // 2)
    s13 = torch.rand(E, 2 * INTER, HIDDEN // GROUP, dtype=torch.bfloat16) / 100
    s2 = torch.rand(E, HIDDEN, INTER // GROUP, dtype=torch.bfloat16) / 100
    z13 = rand_bytes(E, INTER, HIDDEN // GROUP) if zero_points else None
    z2 = rand_bytes(E, HIDDEN // 2, INTER // GROUP) if zero_points else None
    w13, w2, s13, s2, z13, z2 = prepare_wna16_moe_layer_for_cpu(
        layer, w13, w2, s13, s2, z13, z2, group_size=GROUP, bits=4
    )
    quant_config = int4_w4a16_moe_quant_config(s13, s2, z13, z2, block_shape=[0, GROUP])
    kernel = _modular(CPUExpertsWNA16, moe, quant_config)
    path = (
        "int4 GEMM (_weight_int4pack_mm_for_cpu)"
        if kernel.fused_experts.use_fused_kernel
        else "per-expert"
    )
    elems = 3 * HIDDEN * INTER
    # int4 weights and a bf16 (scale, offset) pair per group and channel.
    per_expert = elems // 2 + elems // GROUP * 2 * 2
    return Scheme(_run_modular(kernel, w13, w2), per_expert, path)


def build_int4() -> Scheme:
    return _build_int4(zero_points=False)


def build_int4_zp() -> Scheme:
    return _build_int4(zero_points=True)


def build_int8() -> Scheme:
    return _build_int8(weight_only=False)


def build_int8_w8a16() -> Scheme:
    return _build_int8(weight_only=True)


def _build_int8(weight_only: bool) -> Scheme:
    """int8 per-channel weights: W8A8 (dynamic per-token activations,
    compressed-tensors) or W8A16 (online --quantization experts_int8)."""
    from vllm.model_executor.layers.fused_moe.config import (
        int8_w8a8_moe_quant_config,
        int8_w8a16_moe_quant_config,
    )
    from vllm.model_executor.layers.fused_moe.experts.cpu_int8_moe import (
        CPUExpertsInt8,
        prepare_int8_moe_layer_for_cpu,
    )

    moe = _moe_config()
    layer = SimpleNamespace(moe_config=moe)
    w13 = torch.randint(-127, 128, (E, 2 * INTER, HIDDEN), dtype=torch.int8)
    w2 = torch.randint(-127, 128, (E, HIDDEN, INTER), dtype=torch.int8)
    s13 = torch.rand(E, 2 * INTER, 1) / 1000
    s2 = torch.rand(E, HIDDEN, 1) / 1000
    w13, w2 = prepare_int8_moe_layer_for_cpu(layer, w13, w2, weight_only)
    if weight_only:
        quant_config = int8_w8a16_moe_quant_config(s13, s2, None, None)
    else:
        quant_config = int8_w8a8_moe_quant_config(
            s13, s2, None, None, per_act_token_quant=True
        )
    kernel = _modular(CPUExpertsInt8, moe, quant_config)
    path = (
        "fused_experts_cpu W8A8"
        if kernel.fused_experts.use_fused_kernel
        else _GEMV_OR_PER_EXPERT
        if weight_only
        else "per-expert W8A8"
    )
    per_expert = 3 * HIDDEN * INTER + 4 * (2 * INTER + HIDDEN)
    return Scheme(_run_modular(kernel, w13, w2), per_expert, path)


def _build_fp8(scales: str) -> Scheme:
    """FP8 experts with ``scales`` "block" (128x128), "tensor", "channel" or
    "mxfp8" (E8M0 scales per row and block of 32 along K)."""
    from vllm.model_executor.layers.fused_moe.config import (
        fp8_w8a16_moe_quant_config,
    )
    from vllm.model_executor.layers.fused_moe.experts.cpu_fp8_moe import (
        CPUExpertsFp8,
    )
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import (
        Fp8MoeBackend,
        convert_to_fp8_moe_kernel_format,
    )

    moe = _moe_config()
    layer = SimpleNamespace(moe_config=moe)
    fp8 = torch.float8_e4m3fn
    w13 = (torch.randn(E, 2 * INTER, HIDDEN, dtype=torch.bfloat16) * 8).to(fp8)
    w2 = (torch.randn(E, HIDDEN, INTER, dtype=torch.bfloat16) * 8).to(fp8)
    block: list[int] | None
    if scales == "block":
        block = [128, 128]
        s13 = torch.rand(E, 2 * INTER // 128, HIDDEN // 128) / 1000
        s2 = torch.rand(E, HIDDEN // 128, INTER // 128) / 1000
    elif scales == "mxfp8":
        block = [1, 32]
        s13 = torch.randint(110, 120, (E, 2 * INTER, HIDDEN // 32), dtype=torch.uint8)
        s2 = torch.randint(110, 120, (E, HIDDEN, INTER // 32), dtype=torch.uint8)
    elif scales == "channel":
        block = None
        s13 = torch.rand(E, 2 * INTER, 1) / 1000
        s2 = torch.rand(E, HIDDEN, 1) / 1000
    else:
        block = None
        s13 = torch.rand(E) / 1000
        s2 = torch.rand(E) / 1000
    if block is not None:
        layer.weight_block_size = block
    # As the served layer converts them (VNNI packing, scale layouts).
    w13, w2, s13, s2 = convert_to_fp8_moe_kernel_format(
        Fp8MoeBackend.CPU, layer, w13, w2, s13, s2, None, None
    )
    quant_config = fp8_w8a16_moe_quant_config(s13, s2, block_shape=block)
    kernel = _modular(CPUExpertsFp8, moe, quant_config)
    path = (
        "fused_experts_cpu FP8 W8A16"
        if kernel.fused_experts.fused_block is not None
        else _GEMV_OR_PER_EXPERT
    )
    per_expert = 3 * HIDDEN * INTER + s13[0].nbytes + s2[0].nbytes
    return Scheme(_run_modular(kernel, w13, w2), per_expert, path)


def build_fp8() -> Scheme:
    return _build_fp8("block")


def build_fp8_tensor() -> Scheme:
    return _build_fp8("tensor")


def build_fp8_channel() -> Scheme:
    return _build_fp8("channel")


def _with_sgl_kernel(build: Callable[[], Scheme]) -> Scheme:
    """build() as a server started with VLLM_CPU_SGL_KERNEL=1 builds it."""
    previous = os.environ.get("VLLM_CPU_SGL_KERNEL")
    os.environ["VLLM_CPU_SGL_KERNEL"] = "1"
    try:
        return build()
    finally:
        if previous is None:
            del os.environ["VLLM_CPU_SGL_KERNEL"]
        else:
            os.environ["VLLM_CPU_SGL_KERNEL"] = previous


def build_fp8_sgl() -> Scheme:
    return _with_sgl_kernel(build_fp8)


def build_fp8_tensor_sgl() -> Scheme:
    return _with_sgl_kernel(build_fp8_tensor)


def build_mxfp8() -> Scheme:
    return _build_fp8("mxfp8")


SCHEMES: dict[str, Callable[[], Scheme]] = {
    "bf16": build_bf16,
    "int4": build_int4,
    "int4-zp": build_int4_zp,
    "int8": build_int8,
    "int8-w8a16": build_int8_w8a16,
    "fp8": build_fp8,
    "fp8-tensor": build_fp8_tensor,
    "fp8-channel": build_fp8_channel,
    "fp8-sgl": build_fp8_sgl,
    "fp8-tensor-sgl": build_fp8_tensor_sgl,
    "mxfp8": build_mxfp8,
}


def _routings(m: int, count: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        logits = torch.randn(m, E, generator=gen)
        topk_weights, topk_ids = logits.softmax(-1).topk(TOPK, dim=-1)
        topk_weights /= topk_weights.sum(-1, keepdim=True)
        x = torch.randn(m, HIDDEN, generator=gen).to(torch.bfloat16)
        out.append((x, topk_weights, topk_ids.to(torch.int32)))
    return out


def time_schemes(schemes: dict[str, Scheme], m: int, iters: int, warmup: int):
    """Median and minimum seconds per call of each scheme. The schemes take
    turns on the same inputs, call by call, so that load from other
    processes on the machine falls on all of them alike."""
    inputs = _routings(m, warmup + iters, seed=m)
    times: dict[str, list[float]] = {name: [] for name in schemes}
    names = list(schemes)
    for i, (x, topk_weights, topk_ids) in enumerate(inputs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            schemes[name].run(x, topk_weights, topk_ids)
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[name].append(elapsed)
    active = statistics.mean(len(torch.unique(ids)) for _, _, ids in inputs[warmup:])
    return {
        name: (statistics.median(t) * 1e6, min(t) * 1e6, active)
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument(
        "--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES)
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--shape",
        choices=["qwen3-30b-a3b", "tiny"],
        default="qwen3-30b-a3b",
        help="tiny: E=8, top-2, hidden 256, intermediate 128 (tiny_checkpoint)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="run each scheme under torch.compile(fullgraph=True), as vLLM "
        "serves by default",
    )
    args = parser.parse_args()
    if args.shape == "tiny":
        globals().update(TINY)
    if args.compile:
        # Each scheme is its own function; the workspace manager's first
        # allocation is guarded on, too.
        torch._dynamo.config.recompile_limit = 64

    from vllm.v1.worker.workspace import init_workspace_manager

    if args.threads:
        torch.set_num_threads(args.threads)
    init_workspace_manager(torch.device("cpu"))
    torch.manual_seed(0)
    print(
        f"MoE layer E={E} top-{TOPK} hidden={HIDDEN} inter={INTER}, "
        f"{torch.get_num_threads()} threads, "
        f"{'compiled' if args.compile else 'eager'}, random routing per call, "
        f"median (and min) of {args.iters} calls"
    )
    schemes = {}
    for name in args.schemes:
        schemes[name] = SCHEMES[name]()
        if args.compile:
            schemes[name].run = torch.compile(schemes[name].run, fullgraph=True)
        print(f"{name}: {schemes[name].path}", flush=True)
        gc.collect()

    print()
    print(
        f"{'scheme':<11} {'M':>4} {'experts':>8} {'us/call':>9} {'(min)':>9} "
        f"{'GB/s':>6} {'vs bf16':>8}"
    )
    for m in args.m:
        rows = time_schemes(schemes, m, args.iters, args.warmup)
        for name, (us, us_min, active) in rows.items():
            gbps = active * schemes[name].bytes_per_expert / (us * 1e-6) / 1e9
            ratio = f"{us / rows['bf16'][0]:.2f}x" if "bf16" in rows else "-"
            print(
                f"{name:<11} {m:>4} {active:>8.1f} {us:>9.0f} {us_min:>9.0f} "
                f"{gbps:>6.1f} {ratio:>8}",
                flush=True,
            )


if __name__ == "__main__":
    main()
