# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.32.0 (+ fork patches) Triton fused MoE on one GPU: bf16 vs int8
W8A8 (per-channel weights, per-token activations) vs FP8 128x128-block vs
int4 W4A16 (group 128), at the Qwen3-30B-A3B MoE layer shape (E=128, top-8,
hidden 2048, intermediate 768).

Every layer is built through 0.32.0's own oracles and experts classes:
TritonExperts (make_unquantized_moe_kernel / make_int8_moe_kernel /
make_fp8_moe_kernel) and TritonWNA16Experts (make_wna16_moe_kernel, which on
CUDA launches the fork's fused_moe_kernel_w4a16). Each oracle's own backend
choice on this machine is recorded too (without vLLM's compiled libraries).

Per M it reports:
* GPU time per call, the routing rotated over --rotate (16) random routing
  sets so the active experts' weights come from HBM, not L2:
  - graph_us: all kernels of one call (routing alignment, GEMMs, activation,
    activation quantization, reduction), the 16 calls captured in one CUDA
    graph and replayed, timed with CUDA events;
  - gemm_us: torch.profiler device time of the fused_moe_kernel* launches
    (the two Triton GEMMs) per call, same rotation;
  - all_us: profiler device time of every kernel per call.
* each quantized kernel's max abs error against a float64 reference on its
  own dequantized weights (activations unquantized), and against a float64
  reference that also fake-quantizes activations as the kernel does (int8
  per-token, FP8 per-1x128 group); bf16 against float64 on bf16 weights.

vLLM's compiled libraries are not needed: empty vllm._C modules, the CUDA
platform pinned, PyTorch / Triton stand-ins for the compiled ops the Triton
path reaches (moe_align_block_size, moe_sum, silu_and_mul,
per_token_group_fp8_quant, silu_and_mul_per_block_quant; capability probes
answer False). The stand-ins count in graph_us/all_us for every scheme alike;
gemm_us is pure Triton.

Expects PYTHONPATH to hold the unpacked vllm tree and the wheels' target dir.

    python bench.py --out $OUT/bench032.json [--smoke] [--m 1 4 16]
    python bench.py --dry-import      # CPU: stand-ins + imports + kernel build
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
import types

os.environ.setdefault("VLLM_TARGET_DEVICE", "cuda")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402

E, TOPK, HIDDEN, INTER = 128, 8, 2048, 768
GROUP = 128  # int4 group size, FP8 block
FP8 = torch.float8_e4m3fn
SCHEMES = ("bf16", "int8_w8a8", "fp8_block", "int4_w4a16")
DEFAULT_M = (1, 4, 16, 64, 256, 1024)


# --------------------------------------------------------------------------
# vLLM without its compiled libraries
# --------------------------------------------------------------------------


def _moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    scatter_idx: torch.Tensor | None = None,
) -> None:
    """PyTorch moe_align_block_size: the CUDA op's outputs, no host syncs.

    sorted_ids: per expert, its (token*topk + slot) indices in order, padded
    to a multiple of block_size with numel; expert_ids: the expert of each
    block (blocks past the end: clamped, never read -- the Triton kernels
    stop at num_tokens_post_pad); scatter_idx[i]: position of flat index i
    in sorted_ids."""
    assert expert_map is None, "stand-in has no expert_map support"
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # no bincount: it syncs
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(numel, device=flat.device) - first[sorted_experts]
    pos = starts[sorted_experts] + rank
    sorted_ids.fill_(numel)
    sorted_ids[pos] = order.to(torch.int32)
    blocks = torch.arange(expert_ids.numel(), device=flat.device) * block_size
    block_expert = torch.searchsorted(ends, blocks, right=True)
    expert_ids.copy_(block_expert.clamp(max=num_experts - 1).to(torch.int32))
    num_tokens_post_pad.copy_(ends[-1:].to(torch.int32))
    if scatter_idx is not None:
        scatter_idx.view(-1)[order] = pos.to(torch.int32)


def _moe_sum(inp, out, topk_ids=None, expert_map=None):
    assert expert_map is None
    torch.sum(inp, dim=1, out=out)


def _run_group_quant_fp8(x, x_q, x_s, group_size, eps, fp8_min, fp8_max, ue8m0):
    """vLLM's Triton fallback kernel (fp8_utils), row-major scales."""
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    fp8_utils._per_token_group_quant_fp8[(x.numel() // group_size,)](
        x,
        x_q,
        x_s,
        group_size,
        x.shape[-1],
        x.stride(-2),
        eps,
        fp8_min=fp8_min,
        fp8_max=fp8_max,
        use_ue8m0=ue8m0,
        BLOCK=group_size,
        num_warps=1,
        num_stages=1,
    )


def _register_ops() -> None:
    @torch.library.custom_op("_C::silu_and_mul", mutates_args=("result",))
    def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:
        d = input.shape[-1] // 2
        torch.mul(torch.nn.functional.silu(input[..., :d]), input[..., d:], out=result)

    @torch.library.custom_op(
        "_C::per_token_group_fp8_quant", mutates_args=("output_q", "output_s")
    )
    def per_token_group_fp8_quant(
        input: torch.Tensor,
        output_q: torch.Tensor,
        output_s: torch.Tensor,
        group_size: int,
        eps: float,
        fp8_min: float,
        fp8_max: float,
        scale_ue8m0: bool,
        is_scale_transposed: bool,
        is_tma_aligned: bool,
    ) -> None:
        assert not is_scale_transposed and not is_tma_aligned
        _run_group_quant_fp8(
            input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0
        )

    @torch.library.custom_op(
        "_C::silu_and_mul_per_block_quant", mutates_args=("out", "scales")
    )
    def silu_and_mul_per_block_quant(
        out: torch.Tensor,
        input: torch.Tensor,
        scales: torch.Tensor,
        group_size: int,
        scale_ub: torch.Tensor | None,
        is_scale_transposed: bool,
    ) -> None:
        """Unfused: SiLU-and-mul in PyTorch, then the Triton group quant."""
        assert scale_ub is None and not is_scale_transposed
        assert out.dtype == FP8
        d = input.shape[-1] // 2
        act = torch.nn.functional.silu(input[..., :d]) * input[..., d:]
        finfo = torch.finfo(FP8)
        _run_group_quant_fp8(
            act.contiguous(), out, scales, group_size, 1e-10, finfo.min, finfo.max,
            False,
        )  # fmt: skip


class _StubModule(types.ModuleType):
    """A module whose every public attribute is a function that raises: for
    compiled-extension wrappers imported at module level but never called on
    the Triton MoE path (e.g. vllm.vllm_flash_attn)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr.isupper() or attr.endswith("_AVAILABLE"):
            return False

        def _missing(*a, **k):
            raise RuntimeError(f"{self.__name__}.{attr} is a stand-in (not compiled)")

        return _missing


# Third-party packages that vLLM 0.32.0's import chain (vllm.config ->
# entrypoints, multimodal, parsers, ...) imports at module level but the
# Triton MoE path never uses. Not carried (too large for the bundle): when
# they are missing, a lenient stand-in module is imported instead (a real
# installed package always wins: the finder is consulted last).
AUTO_STUB = {
    "PIL", "uvloop", "openai_harmony", "tvm_ffi", "xgrammar", "llguidance",
    "openai", "aiohttp", "fastapi", "starlette", "cv2", "outlines_core",
    "lark", "lm_format_enforcer", "mistral_common", "sentencepiece",
    "tiktoken", "compressed_tensors", "gguf", "blake3", "anthropic",
    "mcp", "opentelemetry", "prometheus_fastapi_instrumentator", "watchfiles",
    "setproctitle", "ijson", "depyf", "pybase64", 
    "partial_json_parser", "jsonschema", "python_multipart", "multipart",
    "email_validator", "uvicorn", "httpx2", "anyio", "sniffio", "diskcache",
    "prometheus_client", "cpuinfo", 
    "pydantic_extra_types", "pydantic_settings", "model_hosting_container_standards",
    "pythonjsonlogger", "loguru", "grpc", "annotated_doc", "rich", "dill",
}  # fmt: skip


class _Lenient(type):
    """Metaclass of stand-in attributes: any attribute, call, subscript,
    union or subclassing works."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _lenient(f"{cls.__name__}.{attr}")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return type.__call__(cls)

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


def _any_schema(cls, source, handler):
    from pydantic_core import core_schema

    return core_schema.any_schema()


def _lenient(name):
    return _Lenient(
        name.rsplit(".", 1)[-1],
        (),
        {
            "__init__": lambda self, *a, **k: None,
            "__init_subclass__": classmethod(lambda cls, **k: None),
            "__get_pydantic_core_schema__": classmethod(_any_schema),
        },
    )


class _AutoStubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr == "__version__":
            return "0.0.0"
        return _lenient(f"{self.__name__}.{attr}")


class _AutoStubFinder:
    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        if name.split(".")[0] not in AUTO_STUB:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        mod = _AutoStubModule(spec.name)
        mod.__path__ = []
        mod.__version__ = "0.0.0"
        return mod

    def exec_module(self, module):
        STUBBED.add(module.__name__.split(".")[0])


STUBBED: set = set()


def install_stand_ins(fake_device: bool = False) -> dict:
    """Everything vLLM's Triton MoE path needs from its compiled libraries.
    fake_device: CPU dry run; answer capability/name queries as an H100."""
    sys.meta_path.append(_AutoStubFinder())
    for name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C"):
        sys.modules.setdefault(name, types.ModuleType(name))
    for name in ("vllm.vllm_flash_attn", "vllm.vllm_flash_attn.flash_attn_interface"):
        mod = _StubModule(name)
        if name == "vllm.vllm_flash_attn":
            mod.__path__ = []
        sys.modules.setdefault(name, mod)
    _register_ops()

    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    if fake_device:
        CudaPlatform.get_device_capability = classmethod(
            lambda cls, device_id=0: DeviceCapability(9, 0)
        )
        CudaPlatform.get_device_name = classmethod(
            lambda cls, device_id=0: "NVIDIA H100 80GB HBM3"
        )
        CudaPlatform.is_device_capability = classmethod(
            lambda cls, cap, device_id=0: (cap if isinstance(cap, int) else
                                           cap[0] * 10 + cap[1]) == 90
        )  # fmt: skip
        CudaPlatform.has_device_capability = classmethod(
            lambda cls, cap, device_id=0: (cap if isinstance(cap, int) else
                                           cap[0] * 10 + cap[1]) <= 90
        )  # fmt: skip
    vllm.platforms._current_platform = CudaPlatform()
    vllm.platforms.current_platform = vllm.platforms._current_platform

    from vllm import _custom_ops as ops

    ops.moe_align_block_size = _moe_align_block_size
    ops.moe_sum = _moe_sum
    ops.cutlass_scaled_mm_supports_fp8 = lambda *_: False
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda *_: False
    ops.cutlass_group_gemm_supported = lambda *_: False
    ops.cutlass_scaled_mm_supports_fp4 = lambda *_: False

    # The compiled moe_wna16_gemm is absent: never route int4/int8 WNA16 to it
    # (the fork's TritonWNA16Experts does not for int4 on CUDA anyway).
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    fm.should_moe_wna16_use_cuda = lambda *a, **k: False
    return dict(
        platform=type(vllm.platforms.current_platform).__name__,
        stubbed_packages=sorted(STUBBED),
    )


# --------------------------------------------------------------------------
# Quantization (independent of vLLM) and float64 references
# --------------------------------------------------------------------------


def quant_int8_channel(w):
    scale = w.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    q = torch.round(w.float() / scale).clamp(-127, 127).to(torch.int8)
    return q, scale  # scale [E, N, 1] fp32


def dequant_int8(q, s):
    return q.double() * s.double()


def quant_fp8_block(w):
    e, n, k = w.shape
    b = w.float().reshape(e, n // GROUP, GROUP, k // GROUP, GROUP)
    scale = b.abs().amax(dim=(2, 4), keepdim=True).clamp(min=1e-12) / 448
    q = (b / scale).clamp(-448, 448).to(FP8).reshape(e, n, k)
    return q, scale.reshape(e, n // GROUP, k // GROUP).contiguous()


def dequant_fp8_block(q, s):
    e, n, k = q.shape
    s = s.double().repeat_interleave(GROUP, 1).repeat_interleave(GROUP, 2)
    return q.double() * s


def quant_int4(w):
    """Symmetric group-128 int4 in the WNA16 oracle's canonical layout:
    uint8 [E, N, K/2], low nibble = even k, value q + 8; scales [E, N, K/G]."""
    e, n, k = w.shape
    g = w.float().reshape(e, n, k // GROUP, GROUP)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 7
    q = (torch.round(g / scale).clamp(-8, 7) + 8).to(torch.uint8).reshape(e, n, k)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return packed.contiguous(), scale.squeeze(-1).to(torch.bfloat16).contiguous()


def dequant_int4(packed, scale):
    lo, hi = packed & 0xF, packed >> 4
    q = torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], -1).double() - 8
    return q * scale.double().repeat_interleave(GROUP, -1)


def fq_int8_token(x):
    s = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 127
    return torch.round(x / s).clamp(-127, 127) * s


def fq_fp8_group(x):
    g = x.reshape(*x.shape[:-1], -1, GROUP)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448
    q = (g / s).float().clamp(-448, 448).to(FP8).double()
    return (q * s).reshape(x.shape)


def reference(x, w13, w2, tw, ti, act_fq=None):
    """float64 MoE layer; act_fq fake-quantizes both GEMMs' inputs."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    xd = x.double()
    for e in ti.unique().tolist():
        rows, slot = (ti == e).nonzero(as_tuple=True)
        xe = xd[rows]
        if act_fq is not None:
            xe = act_fq(xe)
        h = xe @ w13[e].double().t()
        a = torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:]
        if act_fq is not None:
            a = act_fq(a)
        out.index_add_(0, rows, (a @ w2[e].double().t()) * tw[rows, slot, None].double())
    return out


# --------------------------------------------------------------------------
# Layers through 0.32.0's oracles
# --------------------------------------------------------------------------


def moe_config(device):
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
        intermediate_size=INTER,
        num_local_experts=E,
        num_logical_experts=E,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=torch.bfloat16,
        device=device,
        routing_method=RoutingMethodType.TopK,
    )


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        return f"error: {type(e).__name__}: {e}"[:300]


def oracle_choices(moe) -> dict:
    """What each 0.32.0 oracle selects here (informational; the benchmark
    builds the Triton experts explicitly)."""
    import dataclasses

    from vllm.model_executor.layers.fused_moe.oracle import fp8 as o_fp8
    from vllm.model_executor.layers.fused_moe.oracle import int8 as o_int8
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16 as o_wna16
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as o_unq
    from vllm.model_executor.layers.quantization.utils import quant_utils as qu

    def name(r):
        b, cls = r
        return f"{b.value} / {getattr(cls, '__name__', cls)}"

    out = {}
    out["bf16"] = _try(lambda: name(o_unq.select_unquantized_moe_backend(moe)))
    out["int8_w8a8"] = _try(
        lambda: name(
            o_int8.select_int8_moe_backend(
                moe, qu.kInt8StaticChannelSym, qu.kInt8DynamicTokenSym
            )
        )
    )
    out["fp8_block"] = _try(
        lambda: name(
            o_fp8.select_fp8_moe_backend(
                moe, qu.kFp8Static128BlockSym, qu.kFp8Dynamic128Sym
            )
        )
    )
    out["int4_w4a16(moe_backend=triton)"] = _try(
        lambda: name(
            o_wna16.select_wna16_moe_backend(
                dataclasses.replace(moe, moe_backend="triton"),
                qu.kInt4Static,
                None,
                may_have_zp=False,
                may_have_bias=False,
            )
        )
    )
    return out


def build_layers(device, schemes, seed=0) -> dict:
    """{scheme: (kernel, w13, w2, w13_deq_f64, w2_deq_f64, act_fq, bytes/expert)}"""
    from vllm.model_executor.layers.fused_moe.config import (
        FUSED_MOE_UNQUANTIZED_CONFIG,
    )
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import (
        TritonExperts,
        TritonWNA16Experts,
    )
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as o_fp8
    from vllm.model_executor.layers.fused_moe.oracle import int8 as o_int8
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16 as o_wna16
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as o_unq

    moe = moe_config(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.randn(E, 2 * INTER, HIDDEN, device=device, generator=gen)
    w13 = (w13 / HIDDEN**0.5).to(torch.bfloat16)
    w2 = torch.randn(E, HIDDEN, INTER, device=device, generator=gen)
    w2 = (w2 / INTER**0.5).to(torch.bfloat16)
    layers = {}
    if "bf16" in schemes:
        k = o_unq.make_unquantized_moe_kernel(
            FUSED_MOE_UNQUANTIZED_CONFIG, moe, o_unq.UnquantizedMoeBackend.TRITON,
            TritonExperts,
        )  # fmt: skip
        layers["bf16"] = (k, w13, w2, w13, w2, None, 2 * (w13[0].numel() + w2[0].numel()))
    if "int8_w8a8" in schemes:
        q13, s13 = quant_int8_channel(w13)
        q2, s2 = quant_int8_channel(w2)
        cfg = o_int8.make_int8_moe_quant_config(
            o_int8.Int8MoeBackend.TRITON, s13, s2, per_act_token_quant=True
        )
        assert cfg.use_int8_w8a8 and cfg.per_act_token_quant
        k = o_int8.make_int8_moe_kernel(o_int8.Int8MoeBackend.TRITON, cfg, moe, TritonExperts)
        nbytes = q13[0].numel() + q2[0].numel() + 4 * (s13[0].numel() + s2[0].numel())
        layers["int8_w8a8"] = (
            k, q13, q2, dequant_int8(q13, s13), dequant_int8(q2, s2), fq_int8_token,
            nbytes,
        )  # fmt: skip
    if "fp8_block" in schemes:
        q13, s13 = quant_fp8_block(w13)
        q2, s2 = quant_fp8_block(w2)
        cfg = o_fp8.make_fp8_moe_quant_config(
            o_fp8.Fp8MoeBackend.TRITON, s13, s2, None, None, block_shape=[GROUP, GROUP]
        )
        assert cfg.use_fp8_w8a8 and cfg.block_shape == [GROUP, GROUP]
        k = o_fp8.make_fp8_moe_kernel(cfg, moe, TritonExperts, o_fp8.Fp8MoeBackend.TRITON)
        nbytes = q13[0].numel() + q2[0].numel() + 4 * (s13[0].numel() + s2[0].numel())
        layers["fp8_block"] = (
            k, q13, q2, dequant_fp8_block(q13, s13), dequant_fp8_block(q2, s2),
            fq_fp8_group, nbytes,
        )  # fmt: skip
    if "int4_w4a16" in schemes:
        q13, s13 = quant_int4(w13)
        q2, s2 = quant_int4(w2)
        cfg = o_wna16.make_wna16_moe_quant_config(s13, s2, group_size=GROUP, num_bits=4)
        assert cfg.use_int4_w4a16
        k = o_wna16.make_wna16_moe_kernel(
            cfg, moe, TritonWNA16Experts, o_wna16.WNA16MoEBackend.TRITON
        )
        nbytes = q13[0].numel() + q2[0].numel() + 2 * (s13[0].numel() + s2[0].numel())
        layers["int4_w4a16"] = (
            k, q13, q2, dequant_int4(q13, s13), dequant_int4(q2, s2), None, nbytes,
        )  # fmt: skip
    return dict(moe=moe, layers=layers)


def kernel_description(kernel) -> dict:
    impl = getattr(kernel, "impl", kernel)
    experts = getattr(impl, "fused_experts", None) or getattr(impl, "experts", None)
    pf = getattr(impl, "prepare_finalize", None)
    return dict(
        experts=type(experts).__name__ if experts is not None else repr(kernel)[:80],
        prepare_finalize=type(pf).__name__ if pf is not None else None,
    )


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    bw = 2 * a.numel() * 10 / (s.elapsed_time(e) / 1000)
    del a, b
    return bw


def profile_rotated(calls, iters):
    """Profiler device time per call: (GEMM µs, all µs, {kernel: µs})."""
    from torch.profiler import ProfilerActivity, profile

    for fn in calls:
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            for fn in calls:
                fn()
        torch.cuda.synchronize()
    n = iters * len(calls)
    per = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per[evt.name] = per.get(evt.name, 0.0) + evt.device_time / n
    gemm = sum(v for k, v in per.items() if "fused_moe_kernel" in k)
    return gemm, sum(per.values()), per


def graph_rotated(calls, iters):
    """µs per call: all calls captured in one CUDA graph, replayed, timed with
    CUDA events. None (with the reason) if capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                for fn in calls:
                    fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in calls:
                fn()
        for _ in range(3):
            graph.replay()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        torch.cuda.synchronize()
        s.record()
        for _ in range(iters):
            graph.replay()
        e.record()
        torch.cuda.synchronize()
        us = s.elapsed_time(e) * 1000 / (iters * len(calls))
        del graph
        return us, None
    except Exception as ex:  # noqa: BLE001
        torch.cuda.synchronize()
        return None, f"{type(ex).__name__}: {ex}"[:300]


def events_rotated(calls, iters):
    """µs per call from CUDA events around eager launches (includes launch
    gaps: an upper bound; used when graph capture fails)."""
    for fn in calls:
        fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        for fn in calls:
            fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / (iters * len(calls))


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def make_sets(m, rotate, device, gen):
    sets = []
    for _ in range(rotate):
        x = torch.randn(m, HIDDEN, device=device, generator=gen).to(torch.bfloat16)
        logits = torch.randn(m, E, device=device, generator=gen)
        tw, ti = logits.softmax(-1).topk(TOPK, dim=-1)
        sets.append((x, (tw / tw.sum(-1, keepdim=True)).contiguous(), ti.to(torch.int32)))
    return sets


def make_call(kernel, w1, w2, s):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    x, tw, ti = s
    return lambda: kernel.apply(
        hidden_states=x,
        w1=w1,
        w2=w2,
        topk_weights=tw,
        topk_ids=ti,
        activation=MoEActivation.SILU,
        global_num_experts=E,
        expert_map=None,
        apply_router_weight_on_input=False,
    )


def config_used(scheme, layer, m) -> dict | None:
    """The Triton config 0.32.0 picks for this call (try_get_optimal_moe_config
    with the experts' config name), and whether it came from a file."""
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    kernel, w1, w2 = layer[0], layer[1], layer[2]
    impl = getattr(kernel, "impl", kernel)
    experts = getattr(impl, "fused_experts", None)
    if experts is None:
        return None
    try:
        name = experts.quant_config.config_name(torch.bfloat16)
        cfg = fm.try_get_optimal_moe_config(
            w1.size(), w2.size(), TOPK, name, m, block_shape=experts.block_shape
        )
        out = dict(config_name=name, config=dict(cfg))
        try:
            n = w2.shape[2] if scheme != "int4_w4a16" else w2.shape[2] * 2
            out["file"] = fm.get_config_file_name(E, n, name, experts.block_shape)
            out["file_found"] = fm.get_moe_configs(E, n, name, *(
                experts.block_shape or [None, None])) is not None  # fmt: skip
        except Exception as ex:  # noqa: BLE001
            out["file"] = f"? {type(ex).__name__}: {ex}"[:200]
        return out
    except Exception as ex:  # noqa: BLE001
        return dict(error=f"{type(ex).__name__}: {ex}"[:300])


def run_bench(args) -> int:
    info = install_stand_ins()
    from vllm.platforms import current_platform
    from vllm.v1.worker.workspace import init_workspace_manager

    device = torch.device("cuda")
    init_workspace_manager(device)
    bw = copy_bandwidth()
    head = dict(
        device=torch.cuda.get_device_name(),
        capability=str(current_platform.get_device_capability()),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        vllm_file=__import__("vllm").__file__,
        copy_bandwidth_TBps=bw / 1e12,
        rotate=args.rotate,
        shape=dict(E=E, topk=TOPK, hidden=HIDDEN, inter=INTER, group=GROUP),
        **info,
    )
    head["stubbed_packages"] = sorted(STUBBED)
    print(json.dumps(head))
    built = build_layers(device, args.schemes)
    head["oracle_choices"] = oracle_choices(built["moe"])
    head["kernels"] = {s: kernel_description(L[0]) for s, L in built["layers"].items()}
    print("oracles:", json.dumps(head["oracle_choices"]))
    print("kernels:", json.dumps(head["kernels"]))
    layers = built["layers"]
    result = dict(head, rows=[], errors=[])

    def dump():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    gen = torch.Generator(device=device).manual_seed(1)
    ok = True
    for m in args.m:
        sets = make_sets(m, args.rotate, device, gen)
        active = sum(s[2].unique().numel() for s in sets) / len(sets)
        iters = args.iters if m <= 256 else max(3, args.iters // 4)
        x0, tw0, ti0 = sets[0]
        nref = min(m, 64)
        for scheme in args.schemes:
            L = layers[scheme]
            kernel, w1, w2, d1, d2, fq, nbytes = L
            row = dict(m=m, scheme=scheme, active_experts=active)
            t0 = time.time()
            try:
                row["config"] = config_used(scheme, L, m)
                out = make_call(kernel, w1, w2, sets[0])()[:nref].double()
                ref = reference(x0[:nref], d1, d2, tw0[:nref], ti0[:nref])
                row["ref_max_abs"] = ref.abs().max().item()
                row["max_err_vs_dequant_f64"] = (out - ref).abs().max().item()
                if fq is not None:
                    ref_fq = reference(x0[:nref], d1, d2, tw0[:nref], ti0[:nref], fq)
                    row["max_err_vs_dequant_actq_f64"] = (out - ref_fq).abs().max().item()
                row["finite"] = bool(torch.isfinite(out).all())
                tol_ref = ref_fq if fq is not None else ref
                tol = (
                    3e-2 if scheme in ("int8_w8a8", "fp8_block") else 2e-2
                ) * row["ref_max_abs"] + 1e-3
                row["ok"] = row["finite"] and (out - tol_ref).abs().max().item() <= tol
                calls = [make_call(kernel, w1, w2, s) for s in sets]
                g, ga, per = profile_rotated(calls, iters)
                row["gemm_us"], row["all_us"] = g, ga
                row["kernels_us"] = dict(sorted(per.items(), key=lambda kv: -kv[1])[:12])
                gus, gerr = graph_rotated(calls, max(iters, 5))
                row["graph_us"] = gus
                if gerr:
                    row["graph_error"] = gerr
                    row["events_eager_us"] = events_rotated(calls, iters)
                ideal = active * nbytes / bw * 1e6
                row["gemm_pct_of_copy_bw"] = 100 * ideal / g if g else None
            except Exception as ex:  # noqa: BLE001
                row["ok"] = False
                row["error"] = f"{type(ex).__name__}: {ex}"[:500]
                result["errors"].append(traceback.format_exc()[-3000:])
                traceback.print_exc()
                torch.cuda.synchronize()
            row["wall_s"] = round(time.time() - t0, 2)
            ok &= bool(row.get("ok"))
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("kernels_us",)}))
            sys.stdout.flush()
            dump()
        del sets
        torch.cuda.empty_cache()

    # Table
    def f(v, fmt="{:.1f}"):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    by = {(r["m"], r["scheme"]): r for r in result["rows"]}
    print(f"\n{head['device']}, rotate={args.rotate}, copy {bw / 1e12:.2f} TB/s")
    print("| M | scheme | graph µs (all kernels) | x bf16 | GEMM µs (profiler) | x bf16 |"
          " GEMM % of copy-BW ideal | max err vs f64 dequant | w/ act-quant ref |"
          " max abs ref | config file |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for m in args.m:
        base = by.get((m, "bf16"), {})
        for s in args.schemes:
            r = by.get((m, s))
            if r is None:
                continue
            sg = (base.get("graph_us") / r["graph_us"]) if base.get("graph_us") and r.get("graph_us") else None
            sk = (base.get("gemm_us") / r["gemm_us"]) if base.get("gemm_us") and r.get("gemm_us") else None
            cf = (r.get("config") or {})
            cfs = "found" if cf.get("file_found") else "default"
            print(
                f"| {m} | {s} | {f(r.get('graph_us'))} | {f(sg, '{:.2f}x')} | "
                f"{f(r.get('gemm_us'))} | {f(sk, '{:.2f}x')} | "
                f"{f(r.get('gemm_pct_of_copy_bw'), '{:.0f} %')} | "
                f"{f(r.get('max_err_vs_dequant_f64'), '{:.2e}')} | "
                f"{f(r.get('max_err_vs_dequant_actq_f64'), '{:.2e}')} | "
                f"{f(r.get('ref_max_abs'), '{:.3f}')} | {cfs} |"
                + (f" ERROR {r['error'][:80]}" if "error" in r else "")
            )
    result["all_ok"] = ok
    dump()
    print(f"all_ok={ok}; JSON: {args.out}")
    return 0 if ok else 1


def dry_import(args) -> int:
    """CPU check: stand-ins, platform pin, every import, layer construction
    on CPU tensors (no kernel launched)."""
    info = install_stand_ins(fake_device=True)
    import vllm
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import (  # noqa: F401
        TritonExperts,
        TritonWNA16Experts,
    )
    from vllm.model_executor.layers.fused_moe import fused_moe_w4a16  # noqa: F401

    info["stubbed_packages"] = sorted(STUBBED)
    print("vllm from", vllm.__file__, "platform", info)
    built = build_layers("cpu", args.schemes)
    print("kernels:", {s: kernel_description(L[0]) for s, L in built["layers"].items()})
    print("oracles:", json.dumps(oracle_choices(built["moe"]), indent=1))
    for s, L in built["layers"].items():
        for m in (1, 64, 1024):
            print(s, m, json.dumps(config_used(s, L, m)))
    # Stand-in sanity on CPU tensors.
    ti = torch.randint(0, E, (5, TOPK), dtype=torch.int32)
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import (
        moe_align_block_size,
    )

    sid, eid, npad = moe_align_block_size(ti, 16, E, None)
    n = int(npad)
    valid = sid[:n][sid[:n] < ti.numel()]
    assert sorted(valid.tolist()) == list(range(ti.numel()))
    flat = ti.flatten()
    for b in range(n // 16):
        ids = sid[b * 16 : (b + 1) * 16]
        ids = ids[ids < ti.numel()]
        assert (flat[ids.long()] == eid[b]).all()
    print("moe_align_block_size stand-in: ok", n, "padded")
    print("DRY IMPORT OK")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=list(DEFAULT_M))
    p.add_argument("--schemes", nargs="+", default=None, choices=SCHEMES)
    p.add_argument("--rotate", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench032.json"))
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one M (16), one scheme (fp8_block: it reaches every stand-in; "
        "--schemes overrides), 3 iterations",
    )
    p.add_argument("--dry-import", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.m = [16]
        args.iters = 3
        args.schemes = args.schemes or ["fp8_block"]
    args.schemes = args.schemes or list(SCHEMES)
    if args.dry_import:
        return dry_import(args)
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
