# SPDX-License-Identifier: Apache-2.0
"""Config sweep of the Triton W4A16 MoE kernel (fused_moe_kernel_w4a16).

For each M, times both GEMMs of a Qwen3-30B-A3B MoE layer (E=128, top-8,
hidden 2048, intermediate 768, symmetric int4 group 128, the WNA16 oracle's
canonical layout) for every config of a grid, with the routing rotated over
ROTATE sets (weights from HBM, not L2) and the ROTATE launches of a config
captured in one CUDA graph. The kernels are compiled ahead in worker
processes (into Triton's disk cache), so the timing loop only loads them.

Prints and writes (--out) per M the best config for the sum of both GEMMs,
in vLLM's tuned-config format ({"M": {BLOCK_SIZE_M: ..., ...}}), plus the
ten best of each M.

Usage (vLLM's Python tree on PYTHONPATH)::

    python benchmarks/wna16_w4a16_sweep_gpu.py --out w4a16_configs.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_layer import E, HIDDEN, INTER, TOPK  # noqa: E402

GROUP = 128
ROTATE = 16


def config_space(m: int) -> list[dict]:
    """The grid for batch m: SWAP_AB tiles (dequantized weights as wgmma's
    register operand), plus the kernel's default config for reference."""
    from vllm.model_executor.layers.fused_moe.fused_moe_w4a16 import (
        get_w4a16_moe_default_config,
    )

    tokens_per_expert = m * TOPK / E
    afters = [True, False]
    if tokens_per_expert <= 1:
        grid = dict(bm=[16], bn=[64, 128], bk=[128, 256], w=[4], s=[3, 4, 6])
    elif tokens_per_expert <= 16:
        grid = dict(bm=[16, 32], bn=[64, 128], bk=[64, 128], w=[4], s=[3, 4])
    elif tokens_per_expert <= 64:
        grid = dict(bm=[32, 64], bn=[128, 256], bk=[64, 128], w=[4, 8], s=[3])
    else:
        grid = dict(bm=[64, 128, 256], bn=[128, 256], bk=[64, 128], w=[4, 8], s=[3])
        afters = [False]
    gm = [8] if tokens_per_expert > 64 else [1]
    out = [dict(get_w4a16_moe_default_config(m, E, TOPK), SWAP_AB=False)]
    for bm, bn, bk, w, s, g, after in itertools.product(
        grid["bm"], grid["bn"], grid["bk"], grid["w"], grid["s"], gm, afters
    ):
        if bk > GROUP and after:
            continue
        out.append(
            dict(
                BLOCK_SIZE_M=bm,
                BLOCK_SIZE_N=bn,
                BLOCK_SIZE_K=bk,
                GROUP_SIZE_M=g,
                num_warps=w,
                num_stages=s,
                SCALE_AFTER_DOT=after,
                SWAP_AB=True,
            )
        )
    return out


def _key(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


def _gemm_inputs(num_experts: int, device):
    """Weights of both GEMMs (random bytes: the sweep times, it does not
    check numerics) and scales."""
    q13 = torch.randint(
        0, 256, (num_experts, 2 * INTER, HIDDEN // 2), dtype=torch.uint8, device=device
    )
    q2 = torch.randint(
        0, 256, (num_experts, HIDDEN, INTER // 2), dtype=torch.uint8, device=device
    )
    s13 = (
        torch.rand(num_experts, 2 * INTER, HIDDEN // GROUP, device=device).to(
            torch.bfloat16
        )
        * 0.01
    )
    s2 = (
        torch.rand(num_experts, HIDDEN, INTER // GROUP, device=device).to(
            torch.bfloat16
        )
        * 0.01
    )
    return q13, q2, s13, s2


def _launch(gemm, cfg, a, w, s, c, tw, sorted_ids, expert_ids, npad):
    from vllm.model_executor.layers.fused_moe.fused_moe_w4a16 import (
        invoke_fused_moe_w4a16_kernel,
    )

    invoke_fused_moe_w4a16_kernel(
        a,
        w,
        c,
        s,
        None,
        tw if gemm == 2 else None,
        sorted_ids,
        expert_ids,
        npad,
        gemm == 2,
        TOPK if gemm == 1 else 1,
        cfg,
        GROUP,
    )


def _compile_worker(cfgs: list[dict]) -> int:
    """Compile (by running once on a 2-expert problem with the same argument
    specialization) every config for both GEMMs."""
    from int8_moe_gpu import _install_vllm_stand_ins

    _install_vllm_stand_ins()
    device = torch.device("cuda")
    q13, q2, s13, s2 = _gemm_inputs(2, device)
    m = 4
    x = torch.randn(m, HIDDEN, device=device).to(torch.bfloat16)
    inter = torch.randn(m * TOPK, INTER, device=device).to(torch.bfloat16)
    tw = torch.rand(m, TOPK, device=device)
    c1 = torch.empty(m, TOPK, 2 * INTER, device=device, dtype=torch.bfloat16)
    c2 = torch.empty(m, TOPK, HIDDEN, device=device, dtype=torch.bfloat16)
    done = 0
    for cfg in cfgs:
        bm = cfg["BLOCK_SIZE_M"]
        sorted_ids = torch.arange(bm, device=device, dtype=torch.int32)
        sorted_ids[m * TOPK :] = m * TOPK
        expert_ids = torch.zeros(1, device=device, dtype=torch.int32)
        npad = torch.tensor([bm], device=device, dtype=torch.int32)
        try:
            _launch(1, cfg, x, q13, s13, c1, None, sorted_ids, expert_ids, npad)
            _launch(2, cfg, inter, q2, s2, c2, tw, sorted_ids, expert_ids, npad)
            done += 1
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"compile failed {_key(cfg)}: {exc!r}"[:400], flush=True)
    torch.cuda.synchronize()
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--m", type=int, nargs="+", default=[1, 16, 64, 256, 1024, 4096]
    )
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--out", default="w4a16_configs.json")
    args = parser.parse_args()

    from int8_moe_gpu import _install_vllm_stand_ins

    _install_vllm_stand_ins()
    all_cfgs: dict[str, dict] = {}
    for m in args.m:
        for cfg in config_space(m):
            all_cfgs[_key(cfg)] = cfg
    cfgs = list(all_cfgs.values())
    t0 = time.time()
    chunks = [cfgs[i :: args.workers] for i in range(args.workers)]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        done = sum(pool.map(_compile_worker, chunks))
    print(
        f"compiled {done}/{len(cfgs)} configs in {time.time() - t0:.0f} s", flush=True
    )

    from int8_moe_gpu import _moe_align_block_size

    device = torch.device("cuda")
    q13, q2, s13, s2 = _gemm_inputs(E, device)
    gen = torch.Generator(device=device).manual_seed(0)
    results: dict[int, list] = {}
    best: dict[str, dict] = {}
    for m in args.m:
        sets = []
        for _ in range(ROTATE):
            x = torch.randn(m, HIDDEN, device=device, generator=gen).to(torch.bfloat16)
            logits = torch.randn(m, E, device=device, generator=gen)
            tw, ti = logits.softmax(-1).topk(TOPK, dim=-1)
            inter = torch.randn(m * TOPK, INTER, device=device, generator=gen).to(
                torch.bfloat16
            )
            sets.append((x, inter, tw.contiguous(), ti.to(torch.int32)))
        c1 = torch.empty(m, TOPK, 2 * INTER, device=device, dtype=torch.bfloat16)
        c2 = torch.empty(m, TOPK, HIDDEN, device=device, dtype=torch.bfloat16)
        aligned: dict[int, list] = {}
        rows = []
        t_m = time.time()
        for cfg in config_space(m):
            bm = cfg["BLOCK_SIZE_M"]
            if bm not in aligned:
                aligned[bm] = []
                for x, inter, tw, ti in sets:
                    max_pad = ti.numel() + E * (bm - 1)
                    sorted_ids = torch.empty(max_pad, dtype=torch.int32, device=device)
                    expert_ids = torch.empty(
                        (max_pad + bm - 1) // bm, dtype=torch.int32, device=device
                    )
                    npad = torch.empty(1, dtype=torch.int32, device=device)
                    _moe_align_block_size(ti, E, bm, sorted_ids, expert_ids, npad)
                    aligned[bm].append((sorted_ids, expert_ids, npad))
            times = []
            try:
                for gemm in (1, 2):

                    def run(gemm=gemm, cfg=cfg, bm=bm):
                        for (x, inter, tw, _), (si, ei, npad) in zip(sets, aligned[bm]):
                            if gemm == 1:
                                _launch(1, cfg, x, q13, s13, c1, None, si, ei, npad)
                            else:
                                _launch(2, cfg, inter, q2, s2, c2, tw, si, ei, npad)

                    run()
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        run()
                    graph.replay()
                    reps = 3 if m <= 1024 else 1
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(reps):
                        graph.replay()
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end) * 1000 / (reps * ROTATE))
                    del graph
            except Exception as exc:  # noqa: BLE001
                print(f"M={m} failed {_key(cfg)}: {exc!r}"[:300], flush=True)
                continue
            rows.append((times[0] + times[1], times[0], times[1], cfg))
        rows.sort(key=lambda r: r[0])
        results[m] = rows
        print(
            f"M={m}: {len(rows)} configs in {time.time() - t_m:.0f} s; best:",
            flush=True,
        )
        for total, g1, g2, cfg in rows[:10]:
            print(f"  {total:8.1f} us ({g1:.1f} + {g2:.1f})  {_key(cfg)}", flush=True)
        best[str(m)] = rows[0][3]
    with open(args.out, "w") as f:
        json.dump(best, f, indent=1)
    print(json.dumps(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
