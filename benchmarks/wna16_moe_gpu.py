# SPDX-License-Identifier: Apache-2.0
"""INT4 W4A16 (WNA16 oracle, TRITON backend) vs bf16 fused MoE on one GPU.

Runs the WNA16 oracle's TRITON backend (TritonWNA16Experts, the canonical
uint8 layout, symmetric group-128 int4) and the bf16 Triton experts at a
Qwen3-30B-A3B MoE layer shape -- 128 experts, top-8, hidden 2048,
intermediate 768 -- and prints per M, for bf16, the old int4 kernel
(upstream's fused_moe_kernel_gptq_awq with its default config, what the
TRITON backend launched before fused_moe_kernel_w4a16) and the new one
(fused_moe_kernel_w4a16, what TritonWNA16Experts launches now):

* each int4 kernel's error against float64 math on the dequantized weights;
* the time of the two GEMM kernels per call (profiler device time of the
  fused_moe_kernel launches), with the routing rotated over ROTATE sets so
  the active experts' weights come from HBM and not from L2 (at M=1 the
  int4 weights of 8 experts fit in an H100's 50 MB L2);
* the speed-up over bf16 and each GEMM's share of the memory-bound ideal:
  the bytes of the active experts' weights and scales over the copy
  bandwidth measured in the same run.

vLLM's compiled libraries are not needed: int8_moe_gpu.py's stand-ins are
used, and the compiled moe_wna16_gemm that fused_experts prefers at small M
on CUDA is switched off so the old Triton kernel is what is timed.
--w4a16-configs FILE times the new kernel with the configs of a tuned-config
file ({"M": config}, e.g. from wna16_w4a16_sweep_gpu.py) instead of its
defaults.

Usage (vLLM's Python tree on PYTHONPATH)::

    python benchmarks/wna16_moe_gpu.py [--m 1 16 64 256 1024 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_moe_gpu import _install_vllm_stand_ins, reference  # noqa: E402
from moe_layer import (  # noqa: E402
    E,
    HIDDEN,
    INTER,
    TOPK,
    copy_bandwidth,
    gemm_us_rotated,
    moe_layer_config,
)

GROUP = 128
ROTATE = 16


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group-128 int4 in the WNA16 oracle's canonical layout:
    uint8 [E, N, K/2], low nibble = even k, value q + 8; scales [E, N, K/G]."""
    e, n, k = w.shape
    g = w.float().reshape(e, n, k // GROUP, GROUP)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 7
    q = (torch.round(g / scale).clamp(-8, 7) + 8).to(torch.uint8).reshape(e, n, k)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return packed.contiguous(), scale.squeeze(-1).to(torch.bfloat16).contiguous()


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    lo, hi = packed & 0xF, packed >> 4
    q = torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], -1).double() - 8
    return q * scale.double().repeat_interleave(GROUP, -1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--m", type=int, nargs="+", default=[1, 16, 64, 256, 1024, 4096]
    )
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--w4a16-configs", help="tuned configs ({M: config}) for the new kernel"
    )
    args = parser.parse_args()
    tuned = None
    if args.w4a16_configs:
        with open(args.w4a16_configs) as f:
            tuned = {int(k): v for k, v in json.load(f).items()}

    _install_vllm_stand_ins()
    from vllm.model_executor.layers.fused_moe import fused_moe as fused_moe_module

    fused_moe_module.should_moe_wna16_use_cuda = lambda *a, **k: False

    import dataclasses

    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FUSED_MOE_UNQUANTIZED_CONFIG,
    )
    from vllm.model_executor.layers.fused_moe import override_config
    from vllm.model_executor.layers.fused_moe.fused_moe import (
        TritonExperts,
        TritonWNA16Experts,
        get_default_config,
        invoke_fused_moe_wna16_triton_kernel,
    )
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import (
        moe_align_block_size,
    )
    from vllm.triton_utils import tl
    from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import (
        WNA16MoEBackend,
        make_wna16_moe_kernel,
        make_wna16_moe_quant_config,
        select_wna16_moe_backend,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        wna16_weight_key,
    )
    from vllm.v1.worker.workspace import init_workspace_manager

    device = torch.device("cuda")
    init_workspace_manager(device)
    bandwidth = copy_bandwidth()
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s"
    )

    moe = moe_layer_config("cuda")
    key = wna16_weight_key(4, GROUP, False, torch.bfloat16)
    backend, experts_cls = select_wna16_moe_backend(
        dataclasses.replace(moe, moe_backend="triton"), key
    )
    assert (backend, experts_cls) == (WNA16MoEBackend.TRITON, TritonWNA16Experts)
    print(f"WNA16 MoE oracle selected {backend.value} / {experts_cls.__name__}")

    gen = torch.Generator(device=device).manual_seed(0)
    w13 = (
        torch.randn(E, 2 * INTER, HIDDEN, device=device, generator=gen) / HIDDEN**0.5
    ).to(torch.bfloat16)
    w2 = (torch.randn(E, HIDDEN, INTER, device=device, generator=gen) / INTER**0.5).to(
        torch.bfloat16
    )
    q13, s13 = quantize_int4(w13)
    q2, s2 = quantize_int4(w2)
    int4_kernel = make_wna16_moe_kernel(
        make_wna16_moe_quant_config(4, GROUP, s13, s2), moe, TritonWNA16Experts
    )
    bf16_kernel = make_wna16_moe_kernel(
        FUSED_MOE_UNQUANTIZED_CONFIG, moe, TritonExperts
    )
    # Bytes per expert read by the two GEMMs.
    int4_expert_bytes = (
        q13[0].numel() + q2[0].numel() + 2 * (s13[0].numel() + s2[0].numel())
    )
    bf16_expert_bytes = 2 * (w13[0].numel() + w2[0].numel())

    rows = []
    for m in args.m:
        sets = []
        for _ in range(ROTATE):
            x = torch.randn(m, HIDDEN, device=device, generator=gen).to(torch.bfloat16)
            logits = torch.randn(m, E, device=device, generator=gen)
            tw, ti = logits.softmax(-1).topk(TOPK, dim=-1)
            sets.append((x, tw / tw.sum(-1, keepdim=True), ti.to(torch.int32)))

        def old_int4(s):
            """What TritonWNA16Experts launched for int4 before
            fused_moe_kernel_w4a16: fused_moe_kernel_gptq_awq, default config."""
            x, tw, ti = s
            config = get_default_config(
                m, E, INTER, HIDDEN, TOPK, "int4_w4a16", [0, GROUP]
            )
            c1 = torch.empty(m, TOPK, 2 * INTER, device=device, dtype=x.dtype)
            c2 = torch.empty(m * TOPK, INTER, device=device, dtype=x.dtype)
            c3 = torch.empty(m, TOPK, HIDDEN, device=device, dtype=x.dtype)

            def run():
                sorted_ids, expert_ids, npad = moe_align_block_size(
                    ti, config["BLOCK_SIZE_M"], E, None
                )
                for a, w, sc, c, mul, k in (
                    (x, q13, s13, c1, False, TOPK),
                    (None, q2, s2, c3, True, 1),
                ):
                    if a is None:
                        torch.ops._C.silu_and_mul(c2, c1.view(-1, 2 * INTER))
                        a = c2
                    invoke_fused_moe_wna16_triton_kernel(
                        a, w, c, sc, None, tw, sorted_ids, expert_ids, npad,
                        mul, k, config, tl.bfloat16, False, True, [0, GROUP],
                    )  # fmt: skip
                return c3.sum(dim=1)

            return run

        def call(kernel, a, b, s, configs=None):
            x, tw, ti = s
            if configs is not None:
                cfg = configs[min(configs, key=lambda k: abs(k - m))]

                def tuned_run():
                    with override_config(cfg):
                        return call(kernel, a, b, s)()

                return tuned_run
            return lambda: kernel.apply(
                hidden_states=x,
                w1=a,
                w2=b,
                topk_weights=tw,
                topk_ids=ti,
                activation=MoEActivation.SILU,
                global_num_experts=E,
                expert_map=None,
                apply_router_weight_on_input=False,
            )

        x, tw, ti = sets[0]
        rows_ref = slice(0, min(m, 64))
        out = call(int4_kernel, q13, q2, sets[0], tuned)().double()[rows_ref]
        out_old = old_int4(sets[0])().double()[rows_ref]
        ref = reference(
            x[rows_ref],
            dequantize_int4(q13, s13),
            dequantize_int4(q2, s2),
            tw[rows_ref],
            ti[rows_ref],
            w8a8=False,
        )
        err = (out - ref).abs().max().item()
        err_old = (out_old - ref).abs().max().item()
        scale = ref.abs().max().item()

        iters = args.iters if m <= 1024 else 2
        bf16_us = gemm_us_rotated([call(bf16_kernel, w13, w2, s) for s in sets], iters)
        old_us = gemm_us_rotated([old_int4(s) for s in sets], iters)
        int4_us = gemm_us_rotated(
            [call(int4_kernel, q13, q2, s, tuned) for s in sets], iters
        )
        active = sum(s[2].unique().numel() for s in sets) / ROTATE
        int4_ideal_us = active * int4_expert_bytes / bandwidth * 1e6
        bf16_ideal_us = active * bf16_expert_bytes / bandwidth * 1e6
        row = dict(
            m=m,
            active_experts=active,
            int4_err=err,
            old_int4_err=err_old,
            ref_max_abs=scale,
            bf16_gemm_us=bf16_us,
            old_int4_gemm_us=old_us,
            int4_gemm_us=int4_us,
            old_speedup=bf16_us / old_us,
            speedup=bf16_us / int4_us,
            bf16_pct_of_ideal=100 * bf16_ideal_us / bf16_us,
            old_int4_pct_of_ideal=100 * int4_ideal_us / old_us,
            int4_pct_of_ideal=100 * int4_ideal_us / int4_us,
            int4_ok=err <= 2e-2 * scale + 1e-3,
        )
        rows.append(row)
        print(json.dumps(row))

    print()
    print(
        "| M | active experts | bf16 GEMM µs | old int4 µs | new int4 µs | "
        "old x bf16 | new x bf16 | bf16 % of ideal | old int4 % of ideal | "
        "new int4 % of ideal | old int4 max err | new int4 max err (max abs ref) |"
    )
    print("|---:" * 12 + "|")
    for r in rows:
        print(
            f"| {r['m']} | {r['active_experts']:.1f} | {r['bf16_gemm_us']:.1f} | "
            f"{r['old_int4_gemm_us']:.1f} | {r['int4_gemm_us']:.1f} | "
            f"{r['old_speedup']:.2f}x | {r['speedup']:.2f}x | "
            f"{r['bf16_pct_of_ideal']:.0f} % | {r['old_int4_pct_of_ideal']:.0f} % | "
            f"{r['int4_pct_of_ideal']:.0f} % | {r['old_int4_err']:.2e} | "
            f"{r['int4_err']:.2e} ({r['ref_max_abs']:.2f}) |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0 if all(r["int4_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
