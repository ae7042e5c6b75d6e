# SPDX-License-Identifier: Apache-2.0
"""The MoE layer the benchmarks time: one Qwen3-30B-A3B MoE layer."""

from __future__ import annotations

import torch

E, TOPK, HIDDEN, INTER = 128, 8, 2048, 768


def moe_layer_config(device: str, in_dtype: torch.dtype = torch.bfloat16):
    """The layer's FusedMoEConfig: no parallelism, SiLU, top-k routing.

    vLLM is imported here, so GPU scripts can install their stand-ins first.
    """
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    return FusedMoEConfig(
        num_experts=E,
        experts_per_token=TOPK,
        hidden_dim=HIDDEN,
        intermediate_size_per_partition=INTER,
        num_local_experts=E,
        num_logical_experts=E,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=in_dtype,
        device=device,
        routing_method=RoutingMethodType.TopK,
    )


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of 1 GiB (read + write)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (start.elapsed_time(end) / 1000)


def gemm_us_rotated(calls, iters: int, kernel: str = "fused_moe_kernel") -> float:
    """Profiler device time of the launches of kernels whose name contains
    ``kernel``, per call, the calls (one per routing set) replayed in turn."""
    from torch.profiler import ProfilerActivity, profile

    for fn in calls:
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            for fn in calls:
                fn()
        torch.cuda.synchronize()
    total = sum(
        evt.device_time
        for evt in prof.events()
        if evt.device_type == torch.autograd.DeviceType.CUDA and kernel in evt.name
    )
    return total / (iters * len(calls))
