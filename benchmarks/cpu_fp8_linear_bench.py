"""One dense linear layer on CPU: bf16 vs the FP8 (W8A16) CPU kernel vs
torch._scaled_mm; microseconds per call.

For each shape [N, K] (the tiny Qwen3-MoE's attention projections and two
real ones) and M tokens this times, in the current process (the torch thread
count is printed):

* ``bf16``: the bf16 weight through vLLM's CPU unquantized GEMM
  (``dispatch_cpu_unquantized_gemm``: oneDNN with a prepacked weight here, or
  the CPU library's packed GEMM where vLLM picks it), what a bf16 model runs;
* ``fp8 cpu``: ``CPUFP8ScaledMMLinearKernel`` (FP8 weight in memory), as
  ``Fp8LinearMethod`` sets it up on CPU: the generated GEMV kernel
  (``cpu_fp8_gemv``) up to its ``GEMV_MAX_TOKENS`` tokens, else the weight
  widened per call and a bf16 GEMM;
* ``fp8 widen+GEMM``: the same kernel with the GEMV turned off (the path
  above ``GEMV_MAX_TOKENS`` tokens, and the one before the GEMV existed);
* ``_scaled_mm``: ``PerTensorTorchFP8ScaledMMLinearKernel``, what CPU
  selected before (FP8 activations, static scale), fewer repeats;
* with ``--compiled``: ``fp8 cpu`` under ``torch.compile(fullgraph=True,
  dynamic=True)`` (vLLM compiles the model with Inductor on CPU by default)
  and the block-scaled FP8 linear (``W8A8BlockFp8LinearOp``, 128x128
  blocks) eager and compiled.

With ``--mxfp8`` it times instead the CPU MXFP8 linear
(``cpu_mxfp8_w8a16_linear``'s implementation: the GEMV up to 24 tokens,
else widened per call) with the E8M0 scales as their uint8 bytes and as the
float32 values ModelOpt MXFP8 layers keep on CPU, against bf16.

``--cold`` rotates through enough copies of each weight to exceed the last
level cache (so weights come from DRAM, as in a real model) instead of
timing one weight that stays in cache. ``--threads 1`` keeps other
processes on a shared machine from stalling the threads of every op. Not a test: it asserts only that the
outputs agree. Timings on a small shared machine are noisy: each figure is
the median of --repeats calls.

Usage::

    .venv/bin/python benchmarks/cpu_fp8_linear_bench.py
    .venv/bin/python benchmarks/cpu_fp8_linear_bench.py --cold --repeats 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

SHAPES = {
    "tiny qkv_proj": (512, 256),
    "tiny o_proj": (256, 256),
    "2048x2048": (2048, 2048),
    "6144x2048": (6144, 2048),
    # Qwen3-30B-A3B's attention: 32 query heads and 4 KV heads of 128.
    "qwen3-30b-a3b qkv_proj": (5120, 2048),
    "qwen3-30b-a3b o_proj": (2048, 4096),
}


STAT = statistics.median


def _time(fn, calls: int, repeats: int) -> float:
    """Median (or with --stat min, minimum) microseconds per call of fn(i)
    over `repeats` calls."""
    for i in range(2):
        fn(i % calls)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i % calls)
        times.append(time.perf_counter() - t0)
    return STAT(times) * 1e6


def _check_close(name: str, m: int, ref: torch.Tensor, outs) -> None:
    """Raise if an output is off the bf16 output ref by more than 2%."""
    for out in outs:
        err = (out.float() - ref.float()).abs().max().item()
        if err > 2e-2 * ref.float().abs().max().item():
            raise RuntimeError(f"{name} M={m}: outputs differ by {err}")


@contextlib.contextmanager
def _gemv_off():
    from vllm.model_executor.layers.quantization.utils import cpu_fp8_gemv

    saved = cpu_fp8_gemv.GEMV_MAX_ROWS, cpu_fp8_gemv.GEMV_MAX_TOKENS
    # No row count takes the GEMV, in one call or in several.
    cpu_fp8_gemv.GEMV_MAX_ROWS = cpu_fp8_gemv.GEMV_MAX_TOKENS = 0
    try:
        yield
    finally:
        cpu_fp8_gemv.GEMV_MAX_ROWS, cpu_fp8_gemv.GEMV_MAX_TOKENS = saved


def _fp8_layers(kernel_cls, n: int, k: int, copies: int, process: bool):
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8StaticTensorSym,
    )

    config = FP8ScaledMMLinearLayerConfig(
        weight_quant_key=kFp8StaticTensorSym,
        activation_quant_key=kFp8StaticTensorSym,
        out_dtype=torch.bfloat16,
    )
    kernel = kernel_cls(
        config,
        layer_param_names=["weight", "weight_scale", "input_scale", "input_scale_ub"],
    )
    gen = torch.Generator().manual_seed(0)
    layers, dense = [], None
    for _ in range(copies):
        w = torch.randn(n, k, generator=gen)
        scale = w.abs().max() / 448.0
        q = (w / scale).to(torch.float8_e4m3fn)
        layer = torch.nn.Module()
        # Fp8LinearMethod leaves the weight as a [K, N] view of [N, K].
        layer.weight = torch.nn.Parameter(q.t(), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(scale.float(), requires_grad=False)
        layer.input_scale = torch.nn.Parameter(
            torch.tensor(0.02, dtype=torch.float32), requires_grad=False
        )
        layer.input_scale_ub = None
        if process:
            kernel.process_weights_after_loading(layer)
        layers.append(layer)
        if dense is None:
            dense = (q.float() * scale).to(torch.bfloat16)
    return kernel, layers, dense


def _mxfp8_table(args, shapes: list[str]) -> None:
    """MXFP8 linear on CPU, E8M0 bytes against float32 scales, and bf16."""
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import (
        _cpu_mxfp8_w8a16_linear,
        mxfp8_scales_as_float32,
    )

    print(
        "| shape [N, K] | M | bf16 us | mxfp8, uint8 scales us | x bf16 "
        "| mxfp8, float32 scales us | x bf16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in shapes:
        n, k = SHAPES[name]
        copies = 1
        if args.cold:
            copies = max(1, -(-args.cache_mib * 2**20 // (2 * n * k)))
        gen = torch.Generator().manual_seed(0)
        weights, e8m0, dense = [], [], None
        for _ in range(copies):
            weights.append(
                (torch.randn(n, k, generator=gen) * 8).to(torch.float8_e4m3fn)
            )
            e8m0.append(
                torch.randint(110, 120, (n, k // 32), generator=gen, dtype=torch.uint8)
            )
            if dense is None:
                scale = torch.exp2(e8m0[0].float() - 127).repeat_interleave(32, 1)
                dense = (weights[0].float() * scale).to(torch.bfloat16)
        floats = [mxfp8_scales_as_float32(s) for s in e8m0]
        bf16 = _bf16_layers(dense, copies)
        for m in args.m:
            x = torch.randn(m, k).to(torch.bfloat16)
            _check_close(
                name,
                m,
                bf16[0].cpu_linear(x, bf16[0].weight, None),
                (
                    _cpu_mxfp8_w8a16_linear(x, weights[0], scales[0], None)
                    for scales in (e8m0, floats)
                ),
            )
            t_bf16 = _time(
                lambda i: bf16[i].cpu_linear(x, bf16[i].weight, None),
                copies,
                args.repeats,
            )
            t_bytes, t_floats = (
                _time(
                    lambda i: _cpu_mxfp8_w8a16_linear(x, weights[i], scales[i], None),
                    copies,
                    args.repeats,
                )
                for scales in (e8m0, floats)
            )
            print(
                f"| {name} [{n}, {k}] | {m} | {t_bf16:.0f} | {t_bytes:.0f} | "
                f"{t_bytes / t_bf16:.2f} | {t_floats:.0f} | {t_floats / t_bf16:.2f} |",
                flush=True,
            )


def _bf16_layers(dense: torch.Tensor, copies: int):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layers = []
    for _ in range(copies):
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(dense.clone(), requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        layers.append(layer)
    return layers


def _compiled_fns(kernel, fp8_layers, n: int, k: int, copies: int):
    """fp8 cpu under torch.compile, and the 128x128 block-FP8 linear eager
    and compiled, each as fn(i, x)."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import (
        W8A8BlockFp8LinearOp,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        GroupShape,
    )

    gen = torch.Generator().manual_seed(1)
    block = 128
    weights = []
    for _ in range(copies):
        w = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn)
        scale = torch.rand(-(-n // block), -(-k // block), generator=gen) * 1e-2
        weights.append((w, scale))
    op = W8A8BlockFp8LinearOp(GroupShape(block, block), GroupShape(1, block))

    def block_fp8(i, x):
        return op.apply(x, *weights[i])

    def fp8(i, x):
        return kernel.apply_weights(fp8_layers[i], x)

    compiled_fp8 = torch.compile(fp8, fullgraph=True, dynamic=True)
    compiled_block = torch.compile(block_fp8, fullgraph=True, dynamic=True)
    return compiled_fp8, block_fp8, compiled_block


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None)
    parser.add_argument("--m", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--scaled-mm-repeats", type=int, default=3)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="rotate through weights larger than the last level cache",
    )
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's); on a loaded machine 1 thread "
        "is less disturbed by other processes than several",
    )
    parser.add_argument(
        "--stat",
        choices=["median", "min"],
        default="median",
        help="min is steadier than the median on a machine shared with others",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also time fp8 cpu under torch.compile and the block-FP8 linear",
    )
    parser.add_argument(
        "--mxfp8",
        action="store_true",
        help="time the CPU MXFP8 linear (uint8 and float32 scales) instead",
    )
    args = parser.parse_args(argv)
    global STAT
    STAT = min if args.stat == "min" else statistics.median
    if args.threads:
        torch.set_num_threads(args.threads)

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels.linear import (
        CPUFP8ScaledMMLinearKernel,
        PerTensorTorchFP8ScaledMMLinearKernel,
    )

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"nproc {os.cpu_count()}, loadavg {os.getloadavg()[0]:.2f}, "
        f"{'cold (weights rotated past ' + str(args.cache_mib) + ' MiB)' if args.cold else 'hot (one weight, in cache)'}, "
        f"{args.stat} of {args.repeats} calls (_scaled_mm: {args.scaled_mm_repeats})",
        flush=True,
    )
    print()
    if args.mxfp8:
        with set_current_vllm_config(VllmConfig()):
            _mxfp8_table(args, args.shapes or list(SHAPES))
        return 0
    extra = (
        " fp8 cpu compiled us | block fp8 us | block fp8 compiled us |"
        if args.compiled
        else ""
    )
    print(
        "| shape [N, K] | M | bf16 us | fp8 cpu us | x bf16 | fp8 widen+GEMM us "
        "| _scaled_mm us | x fp8 cpu |" + extra
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (3 * args.compiled))
    with set_current_vllm_config(VllmConfig()):
        for name in args.shapes or list(SHAPES):
            n, k = SHAPES[name]
            copies = 1
            if args.cold:
                copies = max(1, -(-args.cache_mib * 2**20 // (2 * n * k)))
            kernel, fp8_layers, dense = _fp8_layers(
                CPUFP8ScaledMMLinearKernel, n, k, copies, process=True
            )
            ref_kernel, ref_layers, _ = _fp8_layers(
                PerTensorTorchFP8ScaledMMLinearKernel, n, k, 1, process=False
            )
            bf16 = _bf16_layers(dense, copies)
            if args.compiled:
                compiled_fp8, block_fp8, compiled_block = _compiled_fns(
                    kernel, fp8_layers, n, k, copies
                )
            for m in args.m:
                x = torch.randn(m, k).to(torch.bfloat16)
                out_bf16 = bf16[0].cpu_linear(x, bf16[0].weight, None)
                out_fp8 = kernel.apply_weights(fp8_layers[0], x)
                with _gemv_off():
                    out_widened = kernel.apply_weights(fp8_layers[0], x)
                _check_close(name, m, out_bf16, (out_fp8, out_widened))
                t_bf16 = _time(
                    lambda i: bf16[i].cpu_linear(x, bf16[i].weight, None),
                    copies,
                    args.repeats,
                )
                t_fp8 = _time(
                    lambda i: kernel.apply_weights(fp8_layers[i], x),
                    copies,
                    args.repeats,
                )
                with _gemv_off():
                    t_widened = _time(
                        lambda i: kernel.apply_weights(fp8_layers[i], x),
                        copies,
                        args.repeats,
                    )
                t_ref = _time(
                    lambda i: ref_kernel.apply_weights(ref_layers[0], x),
                    1,
                    args.scaled_mm_repeats,
                )
                cols = ""
                if args.compiled:
                    times = [
                        _time(lambda i: fn(i, x), copies, args.repeats)
                        for fn in (compiled_fp8, block_fp8, compiled_block)
                    ]
                    cols = "".join(f" {t:.0f} |" for t in times)
                print(
                    f"| {name} [{n}, {k}] | {m} | {t_bf16:.0f} | {t_fp8:.0f} | "
                    f"{t_fp8 / t_bf16:.2f} | {t_widened:.0f} | {t_ref:.0f} | "
                    f"{t_ref / t_fp8:.0f} |" + cols,
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
