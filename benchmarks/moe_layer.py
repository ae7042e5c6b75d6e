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
