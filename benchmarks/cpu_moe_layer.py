# SPDX-License-Identifier: Apache-2.0
"""One MoE layer on CPU: each quantized kernel next to bf16, per token count.

The question: how fast is a quantized MoE layer against bf16 on this CPU, at
Qwen3-30B-A3B's shape (128 experts, top-8, hidden 2048, intermediate 768)?
Each row times the kernels the fork selects, called as its experts classes
call them, in one process and one run:

* bf16: upstream's cpu_fused_moe ("vec" micro-GEMM, weights prepacked);
* int8-w8a8: cpu_fused_moe_int8 with the x86 micro-GEMM ("vec");
* fp8-block, fp8-channel, mxfp8, int8-w8a16, int4-g128: cpu_fused_moe_wq
  on the weights as checkpoints store them (FP8 with 128x128, per-channel
  or E8M0 group-32 scales; INT8 per channel; UINT4 with groups of 128);
* int4-g128-dequant: CPUDequantExpertsWNA16's per-expert loop over
  PyTorch's int4 GEMM (what INT4 ran on x86 without AMX before the
  micro-GEMM, and the fallback now), with --dequant.

Every call routes its tokens to fresh random experts, and the last-level
cache is evicted before it (a served model's layers do not fit in cache
together; --warm-cache keeps it). The eviction takes the code and the
interpreter's state out of cache too, which a served layer finds there: after
it, each kernel is called once on experts the timed call does not use (not
timed), unless --cold-code. The kernels of a row are called in turns
for --seconds each, after warm-up; median per kernel; ratio = bf16 time /
kernel time.

Not a test; it asserts nothing. From the repository root with the fork built:

    VLLM_CPU_X86_KERNELS=avx2 .venv/bin/python benchmarks/cpu_moe_layer.py
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


def _routing(tokens: int, hidden: int, experts: int, topk: int):
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    while True:
        logits = torch.randn(tokens, experts)
        weights, ids = torch.topk(torch.softmax(logits, -1), topk)
        yield x, weights.contiguous(), ids.to(torch.int32).contiguous()


def _other_experts(experts: int):
    """rewarm for median_seconds: the call's first tokens, as many as use no
    more experts than the call leaves unused, with each expert they use
    replaced by its own unused one (so each gets the rows those tokens give it
    in the call, and the op takes the call's paths on other weights); None
    when not even the first token fits."""

    def rewarm(x, weights, ids):
        used = torch.zeros(experts, dtype=torch.bool)
        used[ids.flatten().long()] = True
        left = (~used).nonzero().flatten()
        tokens = 0
        seen = torch.zeros(experts, dtype=torch.bool)
        for row in ids.long():
            seen[row] = True
            if int(seen.sum()) > left.numel():
                break
            tokens += 1
        if tokens == 0:
            return None
        first = ids[:tokens].long()
        mine = first.flatten().unique()
        to = torch.full((experts,), -1, dtype=torch.int32)
        to[mine] = left[torch.randperm(left.numel())[: mine.numel()]].to(torch.int32)
        return x[:tokens], weights[:tokens], to[first].contiguous()

    return rewarm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--dequant", action="store_true")
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="do not evict the last-level cache before each call",
    )
    parser.add_argument(
        "--cold-code",
        action="store_true",
        help="no untimed call on other experts after each eviction: the timed "
        "call also finds the code and the interpreter's state in memory",
    )
    args = parser.parse_args()

    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    E, H, N = args.experts, args.hidden, args.intermediate
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * N, H, dtype=torch.bfloat16) / H**0.5
    w2 = torch.randn(E, H, N, dtype=torch.bfloat16) / N**0.5

    kernels = {}
    packed13 = ops.cpu_prepack_moe_weight(w13, "vec")
    packed2 = ops.cpu_prepack_moe_weight(w2, "vec")

    def bf16(x, weights, ids):
        out = torch.empty_like(x)
        ops.cpu_fused_moe(
            out, x, packed13, packed2, None, None, weights, ids, "silu", "vec"
        )

    kernels["bf16"] = bf16

    def per_channel(w):
        scale = w.float().abs().amax(-1) / 127.0
        return (w.float() / scale[..., None]).round().to(torch.int8), scale

    q13, s13 = per_channel(w13)
    q2, s2 = per_channel(w2)
    del w13, w2
    if hasattr(torch.ops._C, "cpu_fused_moe_int8"):
        i13 = ops.cpu_prepack_moe_weight_int8(q13, "vec")
        i2 = ops.cpu_prepack_moe_weight_int8(q2, "vec")

        def int8(x, weights, ids):
            out = torch.empty_like(x)
            ops.cpu_fused_moe_int8(
                out, x, i13, i2, s13, s2, None, None, weights, ids, "silu", "vec"
            )

        kernels["int8-w8a8"] = int8
    if hasattr(torch.ops._C, "cpu_fused_moe_wq"):
        # weight-only schemes as checkpoints store them, through cpu_fused_moe_wq
        f13 = (q13.float() / 2).to(torch.float8_e4m3fn).view(torch.uint8)
        f2 = (q2.float() / 2).to(torch.float8_e4m3fn).view(torch.uint8)
        u13 = (q13.to(torch.int16).div(16, rounding_mode="floor") + 8).to(torch.uint8)
        u2 = (q2.to(torch.int16).div(16, rounding_mode="floor") + 8).to(torch.uint8)
        u13 = ops.pack_uint4_for_cpu_wq(u13)
        u2 = ops.pack_uint4_for_cpu_wq(u2)
        wq = {
            "fp8-block": (f13, f2, "fp8_e4m3", (128, 128)),
            "fp8-channel": (f13, f2, "fp8_e4m3", None),
            "mxfp8": (f13, f2, "fp8_e4m3", None),
            "int8-w8a16": (q13, q2, "int8", None),
            "int4-g128": (u13, u2, "uint4", None),
        }

        def scales(name, n, k):
            if name == "fp8-block":
                return torch.rand(E, n // 128, k // 128)
            if name == "mxfp8":
                return torch.randint(118, 122, (E, n, k // 32), dtype=torch.uint8)
            if name == "int4-g128":
                return torch.rand(E, n, k // 128)
            return torch.rand(E, n, 1)

        def weight_only(name):
            w13q, w2q, weight_type, block = wq[name]
            s13q, s2q = scales(name, 2 * N, H), scales(name, H, N)

            def run(x, weights, ids):
                out = torch.empty_like(x)
                ops.cpu_fused_moe_wq(
                    out, x, w13q, w2q, s13q, s2q, None, None, None, None,
                    weights, ids, "silu", weight_type, block,
                )

            return run

        for name in wq:
            kernels[name] = weight_only(name)
    if args.dequant:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import (
            prepare_int4_moe_weight_for_cpu_dequant,
        )

        # the int4-g128 codes, packed for PyTorch's int4 GEMM
        v13 = q13.to(torch.int16).div(16, rounding_mode="floor") + 8
        v2 = q2.to(torch.int16).div(16, rounding_mode="floor") + 8
        p13, ps13, _ = prepare_int4_moe_weight_for_cpu_dequant(
            v13, torch.rand(E, 2 * N, H // 128), None, torch.bfloat16
        )
        p2, ps2, _ = prepare_int4_moe_weight_for_cpu_dequant(
            v2, torch.rand(E, H, N // 128), None, torch.bfloat16
        )

        def int4_dequant(x, weights, ids):
            out = torch.empty_like(x)
            torch.ops.vllm.cpu_dequant_moe(
                out, x, p13, p2, weights, ids, None, ps13, ps2, None, None,
                None, None, "CPUDequantExpertsWNA16", "silu", -1, -1, False,
                False, None,
            )

        kernels["int4-g128-dequant"] = int4_dequant

    # A served model's layers do not fit in cache together (a 48-layer
    # Qwen3-30B-A3B holds 30 GB of bf16 experts): each call finds its weights
    # in memory, unless --warm-cache.
    evict = eviction_buffer(args.warm_cache)
    print(
        describe_run(
            f"MoE layer E={E} top-{args.topk} hidden={H} intermediate={N}",
            args.warm_cache,
            rewarm=not args.cold_code,
        )
    )
    names = list(kernels)
    print_table_head(names)
    for tokens in args.tokens:
        times = median_seconds(
            {n: kernels[n] for n in names},
            _routing(tokens, H, E, args.topk),
            args.seconds,
            evict,
            None if args.cold_code else _other_experts(E),
        )
        print_table_row(tokens, times)


if __name__ == "__main__":
    main()
