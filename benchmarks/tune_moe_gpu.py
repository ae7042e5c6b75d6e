# SPDX-License-Identifier: Apache-2.0
"""Tune and benchmark the Triton fused-MoE GEMMs on one GPU, without vLLM's
compiled libraries.

Two modes:

``tune``
    For one MoE shape (--model) and one scheme (--dtype int8_w8a8, fp8_w8a8
    with 128x128 weight blocks, int4_w4a16 with group-128 scales (group 32
    for GPT-OSS-20B, whose 2880 is no multiple of 128) in the WNA16
    oracle's canonical layout, or bf16) sweeps a pruned space of Triton
    configs per batch size M and writes the winner table as a vLLM config
    file, ``E=..,N=..,device_name=..[,dtype=..][,block_shape=[128,128]].json``
    (M keys -> config dicts), the file name ``get_config_file_name`` of the
    tree on PYTHONPATH gives, plus the timings of every config tried.
``bench``
    Per M in 1 16 64 256 1024 4096, the GEMM time of bf16 and of each
    scheme with the config the tree picks by itself ("default": its shipped
    file, else its heuristic) and with a folder of tuned files ("tuned"),
    the ratio to bf16, the share of the memory-bound ideal (bytes of the
    active experts' weights and scales over the measured copy bandwidth),
    and the error of each GEMM against float64 math on the dequantized
    weights and quantized activations.

What is timed is what ``TritonExperts`` (``TritonWNA16Experts`` for int4:
two ``invoke_fused_moe_w4a16_kernel`` calls, including any reordering of
their inputs) launches for the two GEMMs: two
``invoke_fused_moe_triton_kernel`` calls (w13 with top_k, w2 with the
routing weights), on routing aligned by ``moe_align_block_size`` for the
config's BLOCK_SIZE_M. The calls for ROTATE routing sets are captured in one
CUDA graph and replayed, so the active experts' weights come from HBM and not
from L2 (at M=1 the int8 weights of 8 Qwen3-30B-A3B experts fit in an H100's
L2) and no Python or launch overhead is counted. Configs are compiled ahead
in worker processes (Triton's on-disk cache), then timed one by one.

vLLM's compiled libraries are not needed: int8_moe_gpu.py's stand-ins are
installed first. Usage (vLLM's Python tree on PYTHONPATH)::

    python benchmarks/tune_moe_gpu.py tune --model qwen3-30b-a3b \\
        --dtype int8_w8a8 --out-dir tuned/
    python benchmarks/tune_moe_gpu.py bench --tuned-dir tuned/
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
from int8_moe_gpu import _install_vllm_stand_ins  # noqa: E402
from moe_layer import copy_bandwidth  # noqa: E402

# name -> (experts, top-k, hidden, moe intermediate)
MODELS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "deepseek-v2-lite": (64, 6, 2048, 1408),
    "gpt-oss-20b": (32, 4, 2880, 2880),
}
DTYPES = ("bf16", "int8_w8a8", "fp8_w8a8", "int4_w4a16")
# int4 group size per model (default 128).
INT4_GROUP = {"gpt-oss-20b": 32}
BLOCK = [128, 128]  # fp8 weight blocks
M_FULL = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
M_BENCH = [1, 16, 64, 256, 1024, 4096]
ROTATE = 16
SMEM_BYTES = 227 * 1024


# --------------------------------------------------------------------------
# Problem
# --------------------------------------------------------------------------


class Problem:
    """Weights of one MoE layer in one scheme, and ROTATE routing sets with
    quantized GEMM inputs per M."""

    def __init__(self, model: str, dtype: str, empty: bool = False):
        from vllm.platforms import current_platform

        self.model, self.dtype = model, dtype
        # Compile workers need one routing set, not ROTATE (GPU memory).
        self.rotate = 1 if empty else ROTATE
        self.E, self.topk, self.K, self.N = MODELS[model]
        E, N, K = self.E, self.N, self.K
        dev = "cuda"
        self.fp8 = current_platform.fp8_dtype()
        gen = torch.Generator(device=dev).manual_seed(0)

        def weight(n, k):
            w = torch.randn(E, n, k, device=dev, generator=gen) / k**0.5
            return w.to(torch.bfloat16)

        self.s13 = self.s2 = None
        self.group = INT4_GROUP.get(model, 128)
        if empty and dtype == "int4_w4a16":
            u8, g = torch.uint8, self.group
            self.w13 = torch.zeros(E, 2 * N, K // 2, device=dev, dtype=u8)
            self.w2 = torch.zeros(E, K, N // 2, device=dev, dtype=u8)
            self.s13 = torch.ones(E, 2 * N, K // g, device=dev, dtype=torch.bfloat16)
            self.s2 = torch.ones(E, K, N // g, device=dev, dtype=torch.bfloat16)
        elif empty:
            # Compile workers: right shapes and dtypes, no values.
            wd = {"int8_w8a8": torch.int8, "fp8_w8a8": self.fp8}
            wd = wd.get(dtype, torch.bfloat16)
            self.w13 = torch.empty(E, 2 * N, K, device=dev, dtype=wd)
            self.w2 = torch.empty(E, K, N, device=dev, dtype=wd)
            if dtype == "int8_w8a8":
                self.s13 = torch.ones(E, 2 * N, 1, device=dev)
                self.s2 = torch.ones(E, K, 1, device=dev)
            elif dtype == "fp8_w8a8":
                bn, bk = BLOCK
                self.s13 = torch.ones(E, 2 * N // bn, K // bk, device=dev)
                self.s2 = torch.ones(E, K // bn, N // bk, device=dev)
        else:
            self.w13, self.w2 = weight(2 * N, K), weight(K, N)
        if empty:
            pass
        elif dtype == "int8_w8a8":
            self.w13, self.s13 = _quant_int8_channel(self.w13)
            self.w2, self.s2 = _quant_int8_channel(self.w2)
        elif dtype == "fp8_w8a8":
            self.w13, self.s13 = _quant_fp8_block(self.w13, self.fp8)
            self.w2, self.s2 = _quant_fp8_block(self.w2, self.fp8)
        elif dtype == "int4_w4a16":
            self.w13, self.s13 = _quant_int4(self.w13, self.group)
            self.w2, self.s2 = _quant_int4(self.w2, self.group)
        self.gen = gen
        self._sets: dict[int, list] = {}
        self._aligned: dict[tuple[int, int], list] = {}

    def aligned(self, m: int, block_m: int) -> list:
        """moe_align_block_size of each routing set for BLOCK_SIZE_M."""
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import (
            moe_align_block_size,
        )

        if (m, block_m) not in self._aligned:
            self._aligned[m, block_m] = [
                moe_align_block_size(s[5], block_m, self.E, None) for s in self.sets(m)
            ]
        return self._aligned[m, block_m]

    @property
    def block_shape(self):
        return BLOCK if self.dtype == "fp8_w8a8" else None

    @property
    def quant_block_shape(self):
        """The block_shape the quant config carries ([0, group] for int4)."""
        if self.dtype == "int4_w4a16":
            return [0, self.group]
        return self.block_shape

    def expert_bytes(self) -> int:
        """Bytes of one expert's weights and scales, both GEMMs."""
        n = self.w13[0].numel() * self.w13.element_size()
        n += self.w2[0].numel() * self.w2.element_size()
        if self.s13 is not None:
            n += self.s13.element_size() * (self.s13[0].numel() + self.s2[0].numel())
        return n

    def quant_act(self, x: torch.Tensor):
        if self.dtype == "int8_w8a8":
            s = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-10) / 127
            return torch.round(x.float() / s).clamp(-127, 127).to(torch.int8), s
        if self.dtype == "fp8_w8a8":
            m, k = x.shape
            g = x.float().reshape(m, k // BLOCK[1], BLOCK[1])
            s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448
            q = (g / s).clamp(-448, 448).to(self.fp8).reshape(m, k)
            return q, s.squeeze(-1).contiguous()
        return x, None

    def sets(self, m: int) -> list:
        """ROTATE (a1, a1_scale, a2, a2_scale, topk_weights, topk_ids)."""
        if m not in self._sets:
            out = []
            for _ in range(self.rotate):
                x = torch.randn(m, self.K, device="cuda", generator=self.gen)
                h = torch.randn(
                    m * self.topk, self.N, device="cuda", generator=self.gen
                )
                logits = torch.randn(m, self.E, device="cuda", generator=self.gen)
                tw, ti = logits.softmax(-1).topk(self.topk, dim=-1)
                tw = (tw / tw.sum(-1, keepdim=True)).contiguous()
                a1, a1s = self.quant_act(x.to(torch.bfloat16))
                a2, a2s = self.quant_act(h.to(torch.bfloat16))
                out.append((a1, a1s, a2, a2s, tw, ti.to(torch.int32)))
            self._sets[m] = out
        return self._sets[m]

    def active_experts(self, m: int) -> float:
        return sum(s[5].unique().numel() for s in self.sets(m)) / ROTATE


def _quant_int8_channel(w):
    s = w.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
    return torch.round(w.float() / s).clamp(-127, 127).to(torch.int8), s


def _quant_fp8_block(w, fp8):
    e, n, k = w.shape
    bn, bk = BLOCK
    g = w.float().reshape(e, n // bn, bn, k // bk, bk)
    s = g.abs().amax(dim=(2, 4), keepdim=True).clamp(min=1e-8) / 448
    q = (g / s).clamp(-448, 448).to(fp8).reshape(e, n, k)
    return q, s.reshape(e, n // bn, k // bk).contiguous()


def _quant_int4(w, group):
    """Symmetric int4 per group, the WNA16 oracle's canonical layout: uint8
    [E, N, K / 2] (low nibble = even k, value q + 8), bf16 scales."""
    e, n, k = w.shape
    g = w.float().reshape(e, n, k // group, group)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 7
    q = (torch.round(g / s).clamp(-8, 7) + 8).to(torch.uint8).reshape(e, n, k)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()
    return packed, s.squeeze(-1).to(torch.bfloat16).contiguous()


def _dequant(p: Problem, q, s):
    if p.dtype == "int4_w4a16":
        lo, hi = q & 0xF, q >> 4
        v = torch.stack([lo, hi], -1).reshape(*q.shape[:-1], -1).double() - 8
        return v * s.double().repeat_interleave(p.group, -1)
    if p.dtype == "int8_w8a8":
        return q.double() * s.double()
    if p.dtype == "fp8_w8a8":
        return q.double() * s.double().repeat_interleave(
            BLOCK[0], -2
        ).repeat_interleave(BLOCK[1], -1)
    return q.double()


def _dequant_act(p: Problem, q, s):
    if p.dtype == "int8_w8a8":
        return q.double() * s.double()
    if p.dtype == "fp8_w8a8":
        return q.double() * s.double().repeat_interleave(BLOCK[1], -1)
    return q.double()


# --------------------------------------------------------------------------
# The two GEMMs TritonExperts launches
# --------------------------------------------------------------------------


class Runner:
    def __init__(self, p: Problem, m: int, config: dict):
        self.p, self.m, self.config = p, m, config
        self.c1 = torch.empty(m, p.topk, 2 * p.N, device="cuda", dtype=torch.bfloat16)
        self.c3 = torch.empty(m, p.topk, p.K, device="cuda", dtype=torch.bfloat16)
        self.aligned = p.aligned(m, config["BLOCK_SIZE_M"])

    def call(self, i: int) -> None:
        from triton.language import bfloat16

        from vllm.model_executor.layers.fused_moe.fused_moe import (
            invoke_fused_moe_triton_kernel,
        )

        p = self.p
        a1, a1s, a2, a2s, tw, _ = p.sets(self.m)[i]
        sorted_ids, expert_ids, ntp = self.aligned[i]
        if p.dtype == "int4_w4a16":
            from vllm.model_executor.layers.fused_moe.fused_moe_w4a16 import (
                invoke_fused_moe_w4a16_kernel,
            )

            invoke_fused_moe_w4a16_kernel(
                a1, p.w13, self.c1, p.s13, None, None, sorted_ids, expert_ids,
                ntp, False, p.topk, self.config, p.group,
            )  # fmt: skip
            invoke_fused_moe_w4a16_kernel(
                a2, p.w2, self.c3, p.s2, None, tw, sorted_ids, expert_ids,
                ntp, True, 1, self.config, p.group,
            )  # fmt: skip
            return
        flags = dict(
            compute_type=bfloat16,
            use_fp8_w8a8=p.dtype == "fp8_w8a8",
            use_int8_w8a8=p.dtype == "int8_w8a8",
            use_int8_w8a16=False,
            use_int4_w4a16=False,
            per_channel_quant=p.dtype == "int8_w8a8",
            block_shape=p.block_shape,
        )
        invoke_fused_moe_triton_kernel(
            a1, p.w13, self.c1, a1s, p.s13, None, sorted_ids, expert_ids, ntp,
            False, p.topk, self.config, **flags,
        )  # fmt: skip
        invoke_fused_moe_triton_kernel(
            a2, p.w2, self.c3, a2s, p.s2, tw, sorted_ids, expert_ids, ntp,
            True, 1, self.config, **flags,
        )  # fmt: skip

    def time_us(self, replays: int) -> float:
        """µs per call: the ROTATE sets' calls in one CUDA graph."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.call(0)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(ROTATE):
                self.call(i)
        graph.replay()
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        del graph
        return start.elapsed_time(end) * 1000 / (replays * ROTATE)

    def error(self, rows: int = 128) -> float:
        """max |err| / max |ref| of both GEMMs of set 0 against float64."""
        p = self.p
        self.call(0)
        torch.cuda.synchronize()
        a1, a1s, a2, a2s, tw, ti = p.sets(self.m)[0]
        r = min(rows, self.m)
        x = _dequant_act(p, a1, a1s)[:r]
        h = _dequant_act(p, a2, a2s).view(self.m, p.topk, p.N)[:r]
        worst = 0.0
        for e in ti[:r].unique().tolist():
            t, j = (ti[:r] == e).nonzero(as_tuple=True)
            w13 = _dequant(p, p.w13[e], p.s13[e] if p.s13 is not None else None)
            w2 = _dequant(p, p.w2[e], p.s2[e] if p.s2 is not None else None)
            ref1 = x[t] @ w13.t()
            ref2 = (h[t, j] @ w2.t()) * tw[t, j, None].double()
            for got, ref in ((self.c1[t, j], ref1), (self.c3[t, j], ref2)):
                err = (got.double() - ref).abs().max() / ref.abs().max()
                worst = max(worst, err.item())
        return worst


# --------------------------------------------------------------------------
# Search space, compile ahead
# --------------------------------------------------------------------------


def search_space_int4(m: int, p_shape: tuple, stages: list[int]) -> list[dict]:
    """fused_moe_kernel_w4a16, pruned by tokens per expert: SWAP_AB (weights
    as wgmma's register operand) and not, SPLIT_NIBBLES (two dots on A's
    even / odd K columns) and not; the scale on the fp32 partial product
    only while memory bound."""
    E, topk, _, _ = p_shape
    tpe = m * topk / E
    swaps = [True]
    if tpe <= 1:
        bms, bns, bks, afters, swaps = [16], [32, 64], [128, 256], [True], [True, False]
        stages = stages[-1:]
    elif tpe <= 16:
        bms, bns, bks, afters = [16, 32], [64, 128], [64, 128], [True, False]
        stages = stages[:1]
    elif tpe < 48:
        bms, bns, bks, afters = [32, 64], [128, 256], [64, 128], [False]
        stages = stages[:1]
    else:
        # Compute bound: the nibble split never won here on an H100 (nor
        # did dequantizing in fp32, a variant tried and dropped).
        bms = [64, 128, 256] if tpe <= 256 else [128, 256]
        bns, bks, afters, swaps = [128, 256], [64, 128], [False], [True, False]
    splits = [True, False] if tpe < 48 else [False]
    out = []
    for bm, bn, bk, st, after, swap, split in itertools.product(
        bms, bns, bks, stages, afters, swaps, splits
    ):
        # Shared memory: A tile (bf16) and packed weight tile per stage.
        if st * (bm * bk * 2 + bn * bk // 2) > SMEM_BYTES:
            continue
        if not swap and (bm > 128 or bn > 128):
            continue
        if bm == 256 and bn == 256:
            continue
        out.append(
            dict(
                BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
                GROUP_SIZE_M=8 if tpe >= 2 * bm else 1, SPLIT_K=1,
                num_warps=8 if bm * bn >= 128 * 128 else 4, num_stages=st,
                SCALE_AFTER_DOT=after, SWAP_AB=swap, SPLIT_NIBBLES=split,
            )
        )  # fmt: skip
    return out


def search_space(m: int, p_shape: tuple, dtype: str, stages=(3, 4, 5)) -> list[dict]:
    E, topk, _, _ = p_shape
    tpe = m * topk / E  # tokens per expert
    if dtype == "int4_w4a16":
        return search_space_int4(m, p_shape, list(stages))
    if tpe <= 8:
        bms = [16]
    elif tpe <= 24:
        bms = [16, 32]
    elif tpe <= 64:
        bms = [16, 32, 64]
    elif tpe <= 192:
        bms = [32, 64, 128]
    else:
        bms = [64, 128]
    bns = (
        [32, 64, 128]
        if tpe <= 8
        else [64, 128, 256]
        if tpe > 64
        else [32, 64, 128, 256]
    )
    if dtype == "int8_w8a8":
        bks = [128, 256]
    elif dtype == "fp8_w8a8":
        bks = [64, 128]
    else:
        bks = [64, 128]
    esize = 2 if dtype == "bf16" else 1
    out = []
    for bm, bn, bk, warps, st in itertools.product(bms, bns, bks, [4, 8], stages):
        if st * (bm * bk + bk * bn) * esize > SMEM_BYTES:
            continue
        if warps == 8 and bm * bn < 64 * 64:
            continue
        if warps == 4 and bm * bn > 128 * 128:
            continue
        for gm in [1, 16] if tpe >= 2 * bm else [1]:
            out.append(
                dict(
                    BLOCK_SIZE_M=bm,
                    BLOCK_SIZE_N=bn,
                    BLOCK_SIZE_K=bk,
                    GROUP_SIZE_M=gm,
                    SPLIT_K=1,
                    num_warps=warps,
                    num_stages=st,
                )
            )
    return out


def _key(c: dict) -> tuple:
    return tuple(sorted(c.items()))


def _compile_worker(args) -> list:
    """Launch each (M, config) once so Triton compiles it to its disk
    cache; return the (M, config) pairs that failed."""
    model, dtype, jobs = args
    _install_vllm_stand_ins()
    p = Problem(model, dtype, empty=True)
    bad = []
    for m, cfg in jobs:
        try:
            Runner(p, m, cfg).call(0)
        except Exception as e:  # noqa: BLE001 - out of resources etc.
            bad.append((m, cfg, f"{type(e).__name__}: {str(e)[:80]}"))
    torch.cuda.synchronize()
    return bad


def compile_ahead(model, dtype, jobs, workers) -> set:
    """Compile every (M, config) in `workers` processes; returns failed keys."""
    if workers <= 1 or not jobs:
        return set()
    # One worker per config keeps each kernel compiled once.
    by_cfg: dict = {}
    for m, c in jobs:
        by_cfg.setdefault(_key(c), []).append((m, c))
    groups = list(by_cfg.values())
    chunks = [[] for _ in range(workers)]
    for i, g in enumerate(groups):
        chunks[i % workers].extend(g)
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        results = pool.map(_compile_worker, [(model, dtype, c) for c in chunks])
    bad = set()
    for r in results:
        for m, cfg, why in r:
            bad.add((m, _key(cfg)))
    if bad:
        print(f"  {len(bad)} (M, config) pairs failed to compile/launch", flush=True)
    return bad


# --------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------


def _device_name() -> str:
    from vllm.platforms import current_platform

    return current_platform.get_device_name().replace(" ", "_")


def tune(args) -> None:
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

    shape = MODELS[args.model]
    E, topk, K, N = shape
    p = Problem(args.model, args.dtype)
    ms = args.m or M_FULL
    spaces = {m: search_space(m, shape, args.dtype, args.stages) for m in ms}
    jobs = [(m, c) for m in ms for c in spaces[m]]
    t0 = time.time()
    bad = compile_ahead(args.model, args.dtype, jobs, args.workers)
    print(
        f"{args.model} {args.dtype}: {len(jobs)} (M, config) pairs, "
        f"{len({_key(c) for _, c in jobs})} configs compiled in "
        f"{time.time() - t0:.0f} s",
        flush=True,
    )
    best, table = {}, {}
    for m in ms:
        t1 = time.time()
        timed = []
        for c in spaces[m]:
            if (m, _key(c)) in bad:
                continue
            try:
                timed.append((Runner(p, m, c).time_us(2), c))
            except Exception as e:  # noqa: BLE001
                print(f"  M={m} {c}: {type(e).__name__}", flush=True)
        timed.sort(key=lambda t: t[0])
        if not timed:
            print(f"  M={m}: no config ran", flush=True)
            continue
        # Re-time the leaders longer; keep the fastest.
        final = sorted(
            ((Runner(p, m, c).time_us(10), c) for _, c in timed[: args.retime]),
            key=lambda t: t[0],
        )
        us, cfg = final[0]
        best[m] = cfg
        table[m] = dict(
            best_us=us,
            err=Runner(p, m, cfg).error(),
            all=[(t, c) for t, c in timed],
        )
        print(
            f"  M={m}: {len(timed)} configs in {time.time() - t1:.1f} s, best "
            f"{us:.1f} µs {cfg}, "
            f"err {table[m]['err']:.1e}",
            flush=True,
        )
    dtype_name = None if args.dtype == "bf16" else args.dtype
    name = get_config_file_name(  # int4: no block_shape in the name
        E, N, dtype_name, BLOCK if args.dtype == "fp8_w8a8" else None
    )
    os.makedirs(args.out_dir, exist_ok=True)
    out = {str(m): {k: v for k, v in c.items() if k != "SPLIT_K"}
           for m, c in best.items()}  # fmt: skip
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump({"triton_version": _triton_version(), **out}, f, indent=4)
        f.write("\n")
    with open(
        os.path.join(args.out_dir, f"sweep-{args.model}-{args.dtype}.json"), "w"
    ) as f:
        json.dump({str(m): v for m, v in table.items()}, f)
    print(f"wrote {name}", flush=True)


def _triton_version() -> str:
    from vllm.triton_utils import triton

    return triton.__version__


def _default_config(p: Problem, m: int) -> dict:
    """The config the tree on PYTHONPATH picks for this layer by itself."""
    from vllm.model_executor.layers.fused_moe import config as cfg_mod
    from vllm.model_executor.layers.fused_moe.fused_moe import (
        try_get_optimal_moe_config,
    )

    if p.dtype == "int8_w8a8":
        qc = cfg_mod.int8_w8a8_moe_quant_config(
            p.s13, p.s2, None, None, per_act_token_quant=True
        )
        name = qc.config_name(torch.int8)
    elif p.dtype == "fp8_w8a8":
        qc = cfg_mod.fp8_w8a8_moe_quant_config(p.s13, p.s2, block_shape=BLOCK)
        name = qc.config_name(p.fp8)
    elif p.dtype == "int4_w4a16":
        from vllm.model_executor.layers.fused_moe.fused_moe_w4a16 import (
            get_w4a16_moe_default_config,
        )

        # What TritonWNA16Experts picks for its Triton kernel: the tuned
        # file, else the kernel's own defaults.
        cfg = try_get_optimal_moe_config(
            p.w13.size(), p.w2.size(), p.topk, "int4_w4a16", m,
            p.quant_block_shape,
        )  # fmt: skip
        if not ("BLOCK_SIZE_N" in cfg and "BLOCK_SIZE_K" in cfg):
            cfg = get_w4a16_moe_default_config(m, p.E, p.topk)
        return dict(cfg)
    else:
        name = cfg_mod.FUSED_MOE_UNQUANTIZED_CONFIG.config_name(torch.bfloat16)
    return dict(
        try_get_optimal_moe_config(
            p.w13.size(), p.w2.size(), p.topk, name, m, p.block_shape
        )
    )


def bench(args) -> None:
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)  # fmt: skip
    E, topk, K, N = MODELS[args.model]
    rows = []
    bf16_us: dict[int, float] = {}
    for dtype in args.dtypes:
        p = Problem(args.model, dtype)
        tuned = None
        if args.tuned_dir:
            name = get_config_file_name(
                E, N, None if dtype == "bf16" else dtype, p.block_shape
            )
            path = os.path.join(args.tuned_dir, name)
            if os.path.exists(path):
                with open(path) as f:
                    tuned = {int(k): v for k, v in json.load(f).items()
                             if k != "triton_version"}  # fmt: skip
        for m in args.m or M_BENCH:
            ideal_us = p.active_experts(m) * p.expert_bytes() / bw * 1e6
            variants = [("default", _default_config(p, m))]
            if tuned:
                variants.append(("tuned", tuned[min(tuned, key=lambda k: abs(k - m))]))
            for label, cfg in variants:
                r = Runner(p, m, cfg)
                us = r.time_us(10)
                if dtype == "bf16" and label == "default":
                    bf16_us[m] = us
                row = dict(
                    tree=args.label, scheme=dtype, config=label, m=m, us=us,
                    x_bf16=bf16_us.get(m, float("nan")) / us,
                    pct_ideal=100 * ideal_us / us, err=r.error(), cfg=cfg,
                )  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    print()
    print("| tree | scheme | config | M | GEMM µs | x bf16 | % ideal | err |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['tree']} | {r['scheme']} | {r['config']} | {r['m']} | "
            f"{r['us']:.1f} | {r['x_bf16']:.2f} | {r['pct_ideal']:.0f} | "
            f"{r['err']:.1e} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), bw=bw, rows=rows), f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("tune")
    t.add_argument("--model", choices=MODELS, default="qwen3-30b-a3b")
    t.add_argument("--dtype", choices=DTYPES, default="int8_w8a8")
    t.add_argument("--m", type=int, nargs="+")
    t.add_argument("--out-dir", default="tuned")
    t.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    t.add_argument("--stages", type=int, nargs="+", default=[3, 4, 5])
    t.add_argument("--retime", type=int, default=6, help="leaders re-timed")
    b = sub.add_parser("bench")
    b.add_argument("--model", choices=MODELS, default="qwen3-30b-a3b")
    b.add_argument("--m", type=int, nargs="+")
    b.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    b.add_argument("--tuned-dir")
    b.add_argument("--label", default="")
    b.add_argument("--out")
    args = parser.parse_args()

    _install_vllm_stand_ins()
    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cuda"))
    tune(args) if args.mode == "tune" else bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
