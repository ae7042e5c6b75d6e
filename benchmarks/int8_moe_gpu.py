# SPDX-License-Identifier: Apache-2.0
"""INT8 W8A8 vs bf16 fused MoE through the fork's Triton path, on one GPU.

Runs the fork's Triton experts (TritonExperts through the INT8 MoE oracle's
selection, quant config and kernel builder) at a Qwen3-30B-A3B MoE layer
shape -- 128 experts, top-8, hidden 2048, intermediate 768 -- for several
batch sizes, and reports for each:

* the error of the int8 W8A8 kernel against a float64 W8A8 reference on the
  dequantized weights (activations fake-quantized per token in front of both
  GEMMs, as the kernel does), and against the float64 layer without
  activation quantization; the error of the bf16 kernel against float64;
* GPU time per call of bf16 and int8 W8A8 side by side, measured in the same
  run with torch.profiler: the Triton GEMM kernels alone (fused_moe_kernel)
  and every kernel the call launches (routing alignment, activation,
  activation quantization, reduction), and the int8/bf16 ratios.

vLLM's compiled libraries are not needed (they are too large to carry to a
GPU machine): the script registers empty ``vllm._C`` modules, pins the CUDA
platform, and stands in for the few compiled ops around the Triton GEMMs
(moe_align_block_size, moe_sum, silu_and_mul) with PyTorch code that does
not synchronize with the host. The per-token int8 activation quantization is
vLLM's own Triton kernel. Those stand-ins are counted in "all kernels" time
for both dtypes alike; the GEMM columns are pure Triton.

Usage (vLLM's Python tree on PYTHONPATH)::

    python benchmarks/int8_moe_gpu.py [--m 1 16 256 4096] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import types

import torch

from moe_layer import E, HIDDEN, INTER, TOPK, moe_layer_config  # noqa: E402


# --------------------------------------------------------------------------
# vLLM without its compiled libraries
# --------------------------------------------------------------------------


def _moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    expert_map: torch.Tensor | None = None,
) -> None:
    """PyTorch moe_align_block_size, same outputs as the CUDA op, no syncs."""
    assert expert_map is None
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # no bincount: it syncs
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(numel, device=flat.device) - first[sorted_experts]
    sorted_ids.fill_(numel)
    sorted_ids[starts[sorted_experts] + rank] = order.to(torch.int32)
    blocks = torch.arange(expert_ids.numel(), device=flat.device) * block_size
    block_expert = torch.searchsorted(ends, blocks, right=True)
    expert_ids.copy_(block_expert.clamp(max=num_experts - 1).to(torch.int32))
    num_tokens_post_pad.copy_(ends[-1:].to(torch.int32))


def _install_vllm_stand_ins() -> None:
    for name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C"):
        sys.modules.setdefault(name, types.ModuleType(name))

    @torch.library.custom_op("_C::silu_and_mul", mutates_args=("result",))
    def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:
        d = input.shape[-1] // 2
        torch.mul(torch.nn.functional.silu(input[..., :d]), input[..., d:], out=result)

    # Pin the platform before anything resolves it: without the compiled
    # libraries, detection would not find CUDA.
    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform

    vllm.platforms._current_platform = CudaPlatform()
    vllm.platforms.current_platform = vllm.platforms._current_platform

    from vllm import _custom_ops as ops

    ops.moe_align_block_size = _moe_align_block_size
    ops.moe_sum = lambda inp, out: torch.sum(inp, dim=1, out=out)
    ops.cutlass_scaled_mm_supports_fp8 = lambda *_: False
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda *_: False
    ops.cutlass_group_gemm_supported = lambda *_: False


# --------------------------------------------------------------------------
# Problem, reference
# --------------------------------------------------------------------------


def _quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    q = torch.round(w.float() / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


def _fake_quant_per_token(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 127
    return torch.round(x / scale) * scale


def reference(x, w13, w2, topk_weights, topk_ids, w8a8: bool) -> torch.Tensor:
    """float64 MoE; w8a8 quantizes both GEMMs' inputs per token."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    xd = x.double()
    for e in topk_ids.unique().tolist():
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        xe = xd[rows]
        if w8a8:
            xe = _fake_quant_per_token(xe)
        h = xe @ w13[e].double().t()
        a = torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:]
        if w8a8:
            a = _fake_quant_per_token(a)
        out.index_add_(
            0, rows, (a @ w2[e].double().t()) * topk_weights[rows, slot, None]
        )
    return out


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def gpu_time_per_call(fn, iters: int) -> tuple[float, float, dict[str, float]]:
    """(GEMM µs, all-kernels µs, µs per kernel name) per call, from the
    profiler's device times."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name] = per_kernel.get(evt.name, 0.0) + evt.device_time
    per_kernel = {k: v / iters for k, v in per_kernel.items()}
    gemm = sum(v for k, v in per_kernel.items() if "fused_moe_kernel" in k)
    return gemm, sum(per_kernel.values()), per_kernel


def graph_time_per_call(fn, iters: int) -> float | None:
    """µs per call replaying the whole call as a CUDA graph (no Python or
    launch overhead), or None if it cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(3):
            graph.replay()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000 / iters
    except Exception as e:  # noqa: BLE001 - report and fall back
        print(f"  (CUDA graph capture failed: {type(e).__name__}: {e})")
        torch.cuda.synchronize()
        return None


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a and b else float("nan")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    _install_vllm_stand_ins()

    from vllm.model_executor.layers.fused_moe.config import (
        FUSED_MOE_UNQUANTIZED_CONFIG,
    )
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.fused_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.oracle.int8 import (
        Int8MoeBackend,
        make_int8_moe_kernel,
        make_int8_moe_quant_config,
        select_int8_moe_backend,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kInt8DynamicTokenSym,
        kInt8StaticChannelSym,
    )
    from vllm.platforms import current_platform
    from vllm.v1.worker.workspace import init_workspace_manager

    device = torch.device("cuda")
    init_workspace_manager(device)
    print(
        f"{torch.cuda.get_device_name()} (capability "
        f"{current_platform.get_device_capability()}), torch {torch.__version__}"
    )

    moe = moe_layer_config("cuda")
    backend, experts_cls = select_int8_moe_backend(
        moe, kInt8StaticChannelSym, kInt8DynamicTokenSym
    )
    assert (backend, experts_cls) == (Int8MoeBackend.TRITON, TritonExperts)
    print(f"INT8 MoE oracle selected {backend.value} / {experts_cls.__name__}")

    gen = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(E, 2 * INTER, HIDDEN, device=device, generator=gen)
    w13 = (w13 / HIDDEN**0.5).to(torch.bfloat16)
    w2 = torch.randn(E, HIDDEN, INTER, device=device, generator=gen)
    w2 = (w2 / INTER**0.5).to(torch.bfloat16)
    w13_q, w13_s = _quantize_per_channel(w13)
    w2_q, w2_s = _quantize_per_channel(w2)
    w13_deq = w13_q.double() * w13_s.double()
    w2_deq = w2_q.double() * w2_s.double()

    int8_config = make_int8_moe_quant_config(w13_s, w2_s, per_act_token_quant=True)
    assert int8_config.use_int8_w8a8 and int8_config.per_act_token_quant
    int8_kernel = make_int8_moe_kernel(int8_config, moe, TritonExperts)
    # Same modular kernel, unquantized: the bf16 baseline.
    bf16_kernel = make_int8_moe_kernel(FUSED_MOE_UNQUANTIZED_CONFIG, moe, TritonExperts)

    rows = []
    for m in args.m:
        x = torch.randn(m, HIDDEN, device=device, generator=gen).to(torch.bfloat16)
        logits = torch.randn(m, E, device=device, generator=gen)
        topk_weights, topk_ids = logits.softmax(-1).topk(TOPK, dim=-1)
        topk_weights = topk_weights / topk_weights.sum(-1, keepdim=True)
        topk_ids = topk_ids.to(torch.int32)

        def run(kernel, w1, w2_):
            return kernel.apply(
                hidden_states=x,
                w1=w1,
                w2=w2_,
                topk_weights=topk_weights,
                topk_ids=topk_ids,
                activation=MoEActivation.SILU,
                global_num_experts=E,
                expert_map=None,
                apply_router_weight_on_input=False,
            )

        out_int8 = run(int8_kernel, w13_q, w2_q).double()
        out_bf16 = run(bf16_kernel, w13, w2).double()
        ref_w8a8 = reference(x, w13_deq, w2_deq, topk_weights, topk_ids, True)
        ref_deq = reference(x, w13_deq, w2_deq, topk_weights, topk_ids, False)
        ref_bf16 = reference(x, w13, w2, topk_weights, topk_ids, False)
        scale = ref_w8a8.abs().max().item()

        iters = args.iters if m <= 256 else max(10, args.iters // 5)
        bf16_fn = lambda: run(bf16_kernel, w13, w2)  # noqa: E731
        int8_fn = lambda: run(int8_kernel, w13_q, w2_q)  # noqa: E731
        bf16_gemm, bf16_all, bf16_k = gpu_time_per_call(bf16_fn, iters)
        int8_gemm, int8_all, int8_k = gpu_time_per_call(int8_fn, iters)
        bf16_graph = graph_time_per_call(bf16_fn, iters)
        int8_graph = graph_time_per_call(int8_fn, iters)
        row = dict(
            m=m,
            int8_err_vs_w8a8_ref=(out_int8 - ref_w8a8).abs().max().item(),
            int8_err_vs_float_ref=(out_int8 - ref_deq).abs().max().item(),
            bf16_err_vs_float_ref=(out_bf16 - ref_bf16).abs().max().item(),
            ref_max_abs=scale,
            bf16_graph_us=bf16_graph,
            int8_graph_us=int8_graph,
            graph_ratio=_ratio(int8_graph, bf16_graph),
            bf16_gemm_us=bf16_gemm,
            int8_gemm_us=int8_gemm,
            gemm_ratio=_ratio(int8_gemm, bf16_gemm),
            bf16_all_us=bf16_all,
            int8_all_us=int8_all,
            all_ratio=_ratio(int8_all, bf16_all),
            bf16_kernels_us=bf16_k,
            int8_kernels_us=int8_k,
        )
        # W8A8 must track its own reference within bf16 rounding (a W8A16 or
        # indexing bug would not).
        row["int8_ok"] = row["int8_err_vs_w8a8_ref"] <= 3e-2 * scale + 1e-3
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if "kernels" not in k}))

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f}"

    print()
    print(
        "| M | int8 max err vs W8A8 ref | int8 max err vs float ref | "
        "bf16 max err vs float ref | max abs ref | bf16 µs | int8 µs | int8/bf16 |"
        " bf16 GEMM µs | int8 GEMM µs | GEMM int8/bf16 |"
    )
    print("|---:" * 11 + "|")
    for r in rows:
        print(
            f"| {r['m']} | {r['int8_err_vs_w8a8_ref']:.2e} | "
            f"{r['int8_err_vs_float_ref']:.2e} | {r['bf16_err_vs_float_ref']:.2e} | "
            f"{r['ref_max_abs']:.3f} | {fmt(r['bf16_graph_us'])} | "
            f"{fmt(r['int8_graph_us'])} | {r['graph_ratio']:.2f} | "
            f"{r['bf16_gemm_us']:.1f} | {r['int8_gemm_us']:.1f} | "
            f"{r['gemm_ratio']:.2f} |"
        )
    print(
        "µs: one call replayed as a CUDA graph (all kernels: routing alignment, "
        "GEMMs, activation, int8 quantization, reduction); GEMM: the two Triton "
        "fused_moe_kernel launches alone (profiler device time)."
    )
    for r in rows:
        print(
            f"  M={r['m']}: all kernels (profiler) bf16 {r['bf16_all_us']:.1f} µs, "
            f"int8 {r['int8_all_us']:.1f} µs, ratio {r['all_ratio']:.2f}"
        )
    top = sorted(rows[-1]["int8_kernels_us"].items(), key=lambda kv: -kv[1])[:6]
    print(f"int8 kernels at M={rows[-1]['m']} (µs/call):")
    for name, us in top:
        print(f"  {us:9.1f}  {name[:100]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    device=torch.cuda.get_device_name(),
                    torch=torch.__version__,
                    shape=dict(E=E, topk=TOPK, hidden=HIDDEN, inter=INTER),
                    rows=rows,
                ),
                f,
                indent=1,
            )
    return 0 if all(r["int8_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
