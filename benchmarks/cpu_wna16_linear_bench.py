"""One int4 linear layer on CPU, symmetric (GPTQ) or with zero points
(AutoAWQ, ``--awq``): bf16 vs the CPU int4 linear method's two paths;
microseconds per call.

* ``bf16``: the bf16 weight through vLLM's CPU unquantized GEMM
  (``dispatch_cpu_unquantized_gemm``), what a bf16 model runs;
* ``int4 GEMM``: ``CPUWNA16LinearKernel`` (GPTQ) or ``CPUAWQLinearMethod``
  (AWQ) as it sets a layer up where the CPU has no AMX: PyTorch's
  ``aten._weight_int4pack_mm_for_cpu``;
* ``cpu_gemm_wna16``: the same method with that path declined: the CPU
  library's ``cpu_gemm_wna16`` (``vec`` ISA), what ran before.

Weights are rotated through enough copies to exceed --cache-mib (they come
from DRAM, as in a real model). Not a test: it asserts only that the outputs
agree. Each figure is the median of --repeats calls.

Usage::

    .venv/bin/python benchmarks/cpu_wna16_linear_bench.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from cpu_fp8_linear_bench import _bf16_layers, _check_close, _time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from tiny_checkpoint.wna16 import AWQ_ORDER, pack_int4  # noqa: E402

SHAPES = {
    "tiny qkv_proj": (512, 256),
    # Qwen3-30B-A3B's attention: 32 query heads and 4 KV heads of 128.
    "qwen3-30b-a3b qkv_proj": (5120, 2048),
    "qwen3-30b-a3b o_proj": (2048, 4096),
}


def _int4_layers(n: int, k: int, copies: int, int4_gemm: bool, group_size: int):
    from vllm.model_executor.kernels.linear.mixed_precision import cpu
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import (
        MPLinearLayerConfig,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        pack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    config = MPLinearLayerConfig(
        full_weight_shape=(k, n),
        partition_weight_shape=(k, n),
        weight_type=scalar_types.uint4b8,
        act_type=torch.bfloat16,
        group_size=group_size,
        zero_points=False,
        has_g_idx=False,
    )
    kernel = cpu.CPUWNA16LinearKernel(config, "qweight", "scales")
    if not int4_gemm:
        kernel._int4_gemm_unsupported = lambda layer: "declined by the benchmark"
    gen = torch.Generator().manual_seed(0)
    layers, dense = [], None
    for _ in range(copies):
        q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
        scales = (torch.rand(k // group_size, n, generator=gen) * 0.02).bfloat16()
        layer = torch.nn.Module()
        for name, data in (
            ("qweight", pack_quantized_values_into_int32(q, scalar_types.uint4b8, 0)),
            ("scales", scales),
        ):
            param = torch.nn.Parameter(data, requires_grad=False)
            param.input_dim, param.output_dim, param.packed_dim = 0, 1, 0
            setattr(layer, name, param)
        if dense is None:
            dense = (q.float() - 8) * scales.float().repeat_interleave(group_size, 0)
            dense = dense.t().contiguous().bfloat16()
        kernel.process_weights_after_loading(layer)
        assert (layer.int4_gemm_group_size is not None) == int4_gemm
        layers.append(layer)
    return kernel, layers, dense


def _awq_layers(n: int, k: int, copies: int, int4_gemm: bool, group_size: int):
    """CPUAWQLinearMethod's layers, in AutoAWQ's GEMM layout: qweight and
    qzeros packed along N in AWQ's order, scales [G, N]."""
    from vllm.model_executor.layers.quantization import cpu_wna16

    config = cpu_wna16.CPUAWQConfig(4, group_size, True, False, [], {})
    method = cpu_wna16.CPUAWQLinearMethod(config)
    if not int4_gemm:
        method._process_for_int4_gemm = lambda *args: False
    gen = torch.Generator().manual_seed(0)
    layers, dense = [], None
    for _ in range(copies):
        q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
        z = torch.randint(0, 16, (k // group_size, n), generator=gen)
        scales = (torch.rand(k // group_size, n, generator=gen) * 0.02).bfloat16()
        layer = torch.nn.Module()
        for name, data in (
            ("qweight", pack_int4(q, dim=1, order=AWQ_ORDER)),
            ("qzeros", pack_int4(z, dim=1, order=AWQ_ORDER)),
            ("scales", scales),
        ):
            setattr(layer, name, torch.nn.Parameter(data, requires_grad=False))
        if dense is None:
            dense = (q.float() - z.float().repeat_interleave(group_size, 0)) * (
                scales.float().repeat_interleave(group_size, 0)
            )
            dense = dense.t().contiguous().bfloat16()
        method.process_weights_after_loading(layer)
        assert (layer.int4_gemm_group_size is not None) == int4_gemm
        layers.append(layer)
    return _AWQKernel(method), layers, dense


class _AWQKernel:
    """An AWQ linear method called as the GPTQ kernel is."""

    def __init__(self, method):
        self.method = method

    def apply_weights(self, layer, x, bias=None):
        return self.method.apply(layer, x, bias)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None)
    parser.add_argument("--m", nargs="+", type=int, default=[1, 4, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--awq", action="store_true", help="AutoAWQ layers (zero points)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from vllm.model_executor.kernels.linear.mixed_precision import cpu
    from vllm.model_executor.layers.quantization import cpu_wna16

    # Force the ISA the int4 GEMM is taken for, also on a machine with AMX.
    cpu._get_isa_hint = lambda dtype: "vec"
    cpu_wna16._get_isa_hint = lambda dtype: "vec"
    make_layers = _awq_layers if args.awq else _int4_layers
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, nproc "
        f"{os.cpu_count()}, loadavg {os.getloadavg()[0]:.2f}, "
        f"{'AWQ' if args.awq else 'GPTQ'} layers, weights rotated "
        f"past {args.cache_mib} MiB, group size {args.group_size}, median of "
        f"{args.repeats} calls\n"
    )
    print(
        "| shape [N, K] | M | bf16 us | int4 GEMM us | x bf16 "
        "| cpu_gemm_wna16 us | x bf16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.shapes or list(SHAPES):
        n, k = SHAPES[name]
        copies = max(1, -(-args.cache_mib * 2**20 // (2 * n * k)))
        kernel, int4_layers, dense = make_layers(n, k, copies, True, args.group_size)
        old_kernel, old_layers, _ = make_layers(n, k, copies, False, args.group_size)
        bf16 = _bf16_layers(dense, copies)
        for m in args.m:
            x = torch.randn(m, k).to(torch.bfloat16)
            _check_close(
                name,
                m,
                bf16[0].cpu_linear(x, bf16[0].weight, None),
                (
                    kern.apply_weights(layers[0], x)
                    for kern, layers in (
                        (kernel, int4_layers),
                        (old_kernel, old_layers),
                    )
                ),
            )
            t_bf16 = _time(
                lambda i: bf16[i].cpu_linear(x, bf16[i].weight, None),
                copies,
                args.repeats,
            )
            t_int4, t_old = (
                _time(lambda i: kern.apply_weights(layers[i], x), copies, args.repeats)
                for kern, layers in ((kernel, int4_layers), (old_kernel, old_layers))
            )
            print(
                f"| {name} [{n}, {k}] | {m} | {t_bf16:.0f} | {t_int4:.0f} | "
                f"{t_int4 / t_bf16:.2f} | {t_old:.0f} | {t_old / t_bf16:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
