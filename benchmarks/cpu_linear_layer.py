# SPDX-License-Identifier: Apache-2.0
"""One quantized linear layer on CPU next to bf16, per token count.

The question: how fast is a dense FP8 (W8A16) or INT8 (W8A8) linear layer
against bf16 on this CPU, at Qwen3-30B-A3B's attention widths (qkv 2048 ->
5120, o 4096 -> 2048; --shapes N,K ...)? Each column times what the fork
runs for the layer, in one process and one run:

* bf16: the weight prepacked for oneDNN's onednn_mm, as vLLM's CPU
  unquantized linear layers run it (ISA capped with VLLM_CPU_X86_KERNELS:
  see cpu_harness.cap_onednn_isa), or torch's linear where oneDNN has no
  bf16 matmul (AVX2), as vLLM falls back;
* fp8-channel, fp8-block (128x128), mxfp8 (E8M0 groups of 32):
  cpu_fp8_w8a16_linear, the op of CPUFp8W8A16LinearKernel and
  CPUMxfp8LinearKernel (on x86, the C++ kernel cpu_wq_linear);
* fp8-block-pytorch: the same op widening the weight in PyTorch ops (what
  other CPUs and the layers the kernel does not take run), with --pytorch;
* int8-w8a8: cpu_int8_linear (per-token dynamic activations), the x86 path
  of CPUInt8ScaledMMLinearKernel without AMX; int8-w8a8-onednn: upstream's
  oneDNN path of the same kernel (quantize, onednn_scaled_mm).

Fresh random activations per call, the last-level cache evicted before it
(--warm-cache keeps it); the kernels of a row are called in turns for
--seconds each after warm-up, median per kernel; ratio = bf16 time / kernel
time. Not a test; it asserts nothing. From the
repository root with the fork built:

    VLLM_CPU_X86_KERNELS=avx512 .venv/bin/python benchmarks/cpu_linear_layer.py
"""

from __future__ import annotations

import argparse

from cpu_harness import (
    cap_onednn_isa,
    describe_run,
    eviction_buffer,
    median_seconds,
    print_table_head,
    print_table_row,
)

cap_onednn_isa()

import torch  # noqa: E402


def _activations(tokens: int, k: int):
    while True:
        yield (torch.randn(tokens, k, dtype=torch.bfloat16),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", nargs="+", default=["5120,2048", "2048,4096"], help="N,K"
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--pytorch", action="store_true")
    parser.add_argument("--warm-cache", action="store_true")
    args = parser.parse_args()

    from vllm import _custom_ops as ops
    from vllm.model_executor.kernels.linear.scaled_mm import cpu as cpu_linear
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    evict = eviction_buffer(args.warm_cache)
    print(describe_run("linear layer", args.warm_cache))
    torch.manual_seed(0)
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split(","))
        w = torch.randn(n, k) / k**0.5
        w_bf16 = w.to(torch.bfloat16)
        try:
            handler = ops.create_onednn_mm(w_bf16.t(), 32)
            bf16 = lambda x: ops.onednn_mm(handler, x, None)  # noqa: E731
        except RuntimeError:
            # oneDNN has no bf16 matmul for this ISA (AVX2): vLLM falls back
            # to torch's linear
            bf16 = lambda x: torch.nn.functional.linear(x, w_bf16)  # noqa: E731
        fp8 = (w * 64).to(torch.float8_e4m3fn)
        channel = torch.rand(n) / 64
        block = torch.rand(-(-n // 128), -(-k // 128)) / 64
        mx = cpu_linear.e8m0_to_float32(
            torch.randint(118, 122, (n, k // 32), dtype=torch.uint8)
        )
        kernels = {
            "bf16": bf16,
            "fp8-channel": lambda x: cpu_linear.cpu_fp8_w8a16_linear(x, fp8, channel),
            "fp8-block": lambda x: cpu_linear.cpu_fp8_w8a16_linear(
                x, fp8, block, [128, 128]
            ),
            "mxfp8": lambda x: cpu_linear.cpu_fp8_w8a16_linear(x, fp8, mx, [1, 32]),
        }
        if args.pytorch:

            def pytorch(x):
                skips = cpu_linear._cpu_wq_linear_skips
                cpu_linear._cpu_wq_linear_skips = lambda *a: "--pytorch"
                try:
                    return cpu_linear.cpu_fp8_w8a16_linear(x, fp8, block, [128, 128])
                finally:
                    cpu_linear._cpu_wq_linear_skips = skips

            kernels["fp8-block-pytorch"] = pytorch
        q = (w / w.abs().amax(1, keepdim=True) * 127).round().to(torch.int8)
        q_scale = torch.rand(n) / 64
        if hasattr(torch.ops._C, "cpu_int8_linear"):
            packed = ops.cpu_prepack_moe_weight_int8(q.unsqueeze(0), "vec")[0]

            def int8(x):
                out = torch.empty(x.shape[0], n, dtype=x.dtype)
                ops.cpu_int8_linear(out, x, packed, q_scale, None)
                return out

            kernels["int8-w8a8"] = int8
        dnnl = ops.create_onednn_scaled_mm(
            q.t(), q_scale.reshape(-1, 1), torch.bfloat16, True, False, 32
        )

        def int8_onednn(x):
            x_q, x_s, _ = ops.onednn_scaled_int8_quant(x, None, None, True)
            out = torch.empty(x.shape[0], n, dtype=x.dtype)
            ops.onednn_scaled_mm(dnnl, x_q, out, x_s, None, None, None)
            return out

        kernels["int8-w8a8-onednn"] = int8_onednn
        names = list(kernels)
        print(f"\n[N, K] = [{n}, {k}]")
        print_table_head(names)
        for tokens in args.tokens:
            times = median_seconds(
                kernels, _activations(tokens, k), args.seconds, evict
            )
            print_table_row(tokens, times)


if __name__ == "__main__":
    main()
