# SPDX-License-Identifier: Apache-2.0
"""Where one call of a quantized CPU layer spends its time at decode size.

At the tiny model's shapes (tools/tiny_checkpoint: hidden 256, 8 experts,
top-2, MoE intermediate 128) the weights sit in cache and the kernels take a
few microseconds, so what a quantized layer costs next to bf16 is the
Python and dispatch around its kernel. This peels the layers of one call
apart, one token, median microseconds of --iters calls each:

* MoE (FP8, per-tensor scales, the default per-expert op):
  the custom op ``torch.ops.vllm.cpu_fp8_moe_per_expert``, the ``moe_gemv``
  it calls, the standalone-compiled GEMV that calls, and the bf16 layer
  (``CPUFusedMOE``) for comparison;
* one dense FP8 linear layer (per tensor, [N, K] = [512, 256], the tiny
  model's QKV projection): the custom op ``torch.ops.vllm.cpu_fp8_w8a16_linear``,
  the ``fp8_linear_gemv`` it calls, the standalone-compiled kernel that
  calls, and ``F.linear`` on the bf16 weight; each op also inside a
  ``torch.compile``d function, as the served model calls it.

Not a test; it asserts nothing. Usage, from the repository root with the
fork built::

    .venv/bin/python benchmarks/cpu_call_overhead.py [--iters 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

E, K, N, TOPK = 8, 256, 128, 2
DENSE_N = 512


def median_us(fn: Callable[[], object], iters: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def moe_rows(iters: int) -> list[tuple[str, float]]:
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts import (
        cpu_fp8_moe,  # noqa: F401  (registers the op)
        cpu_moe_gemv,
    )

    fp8 = torch.float8_e4m3fn
    w13 = (torch.randn(E, 2 * N, K) * 8).to(fp8)
    w2 = (torch.randn(E, K, N) * 8).to(fp8)
    s13, s2 = torch.rand(E) / 1000, torch.rand(E) / 1000
    x = torch.randn(1, K, dtype=torch.bfloat16)
    weights = torch.rand(1, TOPK)
    ids = torch.tensor([[1, 5]], dtype=torch.int32)
    silu = MoEActivation.SILU

    def op():
        return torch.ops.vllm.cpu_fp8_moe_per_expert(
            x, w13, w2, s13, s2, weights, ids, None, None, "silu", None
        )

    def gemv():
        return cpu_moe_gemv.moe_gemv(
            x, w13, w2, s13, s2, weights, ids, None, None, silu, fp8=True
        )

    # The arguments moe_gemv passes to its compiled one-token kernel.
    args = [
        x.float(), w13.view(torch.int8), w2.view(torch.int8),
        s13, s2, weights, ids,
    ]  # fmt: skip
    variant = (True, "output", None, None, silu, False, False)
    inputs = tuple((tuple(t.shape), t.dtype) for t in args)
    compiled = cpu_moe_gemv._compile_variant(
        variant, inputs, torch.get_num_threads()
    )[0]

    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(
        (w13.float() * s13.view(E, 1, 1)).bfloat16(), requires_grad=False
    )
    layer.w2_weight = torch.nn.Parameter(
        (w2.float() * s2.view(E, 1, 1)).bfloat16(), requires_grad=False
    )
    forward = cpu_fused_moe.CPUFusedMOE(layer).forward_method

    def bf16():
        return forward(layer, x, weights, ids, silu, E)

    op_compiled = torch.compile(op, fullgraph=True)
    bf16_compiled = torch.compile(bf16, fullgraph=True)
    return [
        ("MoE FP8: custom op", median_us(op, iters)),
        ("MoE FP8: moe_gemv", median_us(gemv, iters)),
        ("MoE FP8: standalone-compiled GEMV", median_us(lambda: compiled(*args), iters)),
        ("MoE FP8: custom op, in a compiled fn", median_us(op_compiled, iters)),
        ("MoE bf16: CPUFusedMOE", median_us(bf16, iters)),
        ("MoE bf16: CPUFusedMOE, in a compiled fn", median_us(bf16_compiled, iters)),
    ]


def dense_rows(iters: int) -> list[tuple[str, float]]:
    from vllm.model_executor.kernels.linear.scaled_mm import (
        cpu,  # noqa: F401  (registers the op)
    )
    from vllm.model_executor.layers.quantization.utils import cpu_fp8_gemv

    w = (torch.randn(DENSE_N, K) * 4).to(torch.float8_e4m3fn)
    s = torch.tensor([0.01])
    x = torch.randn(1, K, dtype=torch.bfloat16)
    w_bf16 = (w.float() * 0.01).bfloat16()

    def op():
        return torch.ops.vllm.cpu_fp8_w8a16_linear(x, w, s, None)

    def gemv():
        return cpu_fp8_gemv.fp8_linear_gemv(x, w, s, None)

    gemv()  # compiles the row buckets
    variant = ((DENSE_N, K), (1,), False, None, False, torch.get_num_threads())
    kernel = cpu_fp8_gemv._compile_row_buckets(*variant)[0]
    args = [x.float().contiguous(), w.view(torch.int8), s]

    def bf16():
        return torch.nn.functional.linear(x, w_bf16)

    return [
        ("dense FP8: custom op", median_us(op, iters)),
        ("dense FP8: fp8_linear_gemv", median_us(gemv, iters)),
        ("dense FP8: standalone-compiled GEMV", median_us(lambda: kernel(*args), iters)),
        ("dense FP8: custom op, in a compiled fn",
         median_us(torch.compile(op, fullgraph=True), iters)),
        ("dense bf16: F.linear", median_us(bf16, iters)),
        ("dense bf16: F.linear, in a compiled fn",
         median_us(torch.compile(bf16, fullgraph=True), iters)),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=1000)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"one token, {torch.get_num_threads()} threads, median of {args.iters}")
    print(f"{'what runs':<42} {'us/call':>8}")
    for name, us in moe_rows(args.iters) + dense_rows(args.iters):
        print(f"{name:<42} {us:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
