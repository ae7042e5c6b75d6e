"""MXFP8 formats: ``mxfp8-modelopt`` (NVIDIA ModelOpt MXFP8 export).

As vLLM 0.19.1 reads it (``modelopt.py``: ``ModelOptMxFp8Config``,
``ModelOptMxFp8LinearMethod``, ``ModelOptMxFp8FusedMoE``;
``utils/mxfp8_utils.py``): every quantized Linear / expert projection ``P``
with weight [N, K] has ``P.weight`` float8_e4m3fn [N, K] and
``P.weight_scale`` uint8 [N, K/32] -- one E8M0 scale per row and block of 32
along K, the byte being a biased power-of-two exponent:
``w = fp8 * 2 ** (scale - 127)``.  No input scales: activations are
quantized to MXFP8 dynamically.

Config as ModelOpt exports it: ``hf_quant_config.json`` = ``{"producer":
{...}, "quantization": {"quant_algo": "MXFP8", "kv_cache_quant_algo": null,
"exclude_modules": [...]}}`` (vLLM requires both keys there) and the same in
config.json's ``quantization_config`` in ModelOpt's compressed-tensors-like
form ``{"ignore": [...], "quant_algo": "MXFP8", "producer": {...},
"quant_method": "modelopt"}``.  Excluded: ``lm_head`` and the routers.

The block exponent is ceil(log2(amax / 448)) (ModelOpt's choice), so no
element saturates.  An fp8 value times a power of two is exact in bf16, so
the twin is exactly what any MXFP8 kernel dequantizes to.
"""

from __future__ import annotations

import math

import torch

from .common import (
    ActHook,
    Codec,
    SchemeContext,
    SchemeOutput,
    TensorSpec,
    quantize_modules,
    unquantized_modules,
)

MXFP8_DTYPE = torch.float8_e4m3fn
MXFP8_MAX = float(torch.finfo(MXFP8_DTYPE).max)  # 448.0
MXFP8_BLOCK = 32
E8M0_BIAS = 127
MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.39.0"}


def mxfp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (fp8 [..., K], uint8 E8M0 scales [..., K/32])."""
    k = x.shape[-1]
    if k % MXFP8_BLOCK:
        raise ValueError(f"MXFP8 needs K divisible by {MXFP8_BLOCK}, got {k}")
    blocks = x.float().reshape(*x.shape[:-1], k // MXFP8_BLOCK, MXFP8_BLOCK)
    amax = blocks.abs().amax(-1).clamp(min=2.0**-126)
    exp = torch.ceil(torch.log2(amax / MXFP8_MAX)).clamp(-E8M0_BIAS, E8M0_BIAS)
    q = (blocks / torch.exp2(exp)[..., None]).clamp(-MXFP8_MAX, MXFP8_MAX)
    q = q.to(MXFP8_DTYPE).reshape(x.shape)
    return q, (exp + E8M0_BIAS).to(torch.uint8)


def mxfp8_dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    k = q.shape[-1]
    blocks = q.float().reshape(*q.shape[:-1], k // MXFP8_BLOCK, MXFP8_BLOCK)
    descale = torch.exp2(scale.float() - E8M0_BIAS)[..., None]
    return (blocks * descale).reshape(q.shape).to(torch.bfloat16)


def write_mxfp8_modelopt(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    def quant(module: str, w: torch.Tensor):
        q, s = mxfp8_quant(w)
        return {"weight": q, "weight_scale": s}, mxfp8_dequant(q, s)

    tensors, twin = quantize_modules(weights, quant)
    exclude = unquantized_modules(ctx.shape)
    hf_quant_config = {
        "producer": MODELOPT_PRODUCER,
        "quantization": {
            "quant_algo": "MXFP8",
            "kv_cache_quant_algo": None,
            "exclude_modules": exclude,
        },
    }
    return SchemeOutput(
        tensors=tensors,
        quantization_config={
            "ignore": exclude,
            "quant_algo": "MXFP8",
            "producer": MODELOPT_PRODUCER,
            "quant_method": "modelopt",
        },
        twin=twin,
        extra_json={"hf_quant_config.json": hf_quant_config},
    )


def _claims(qcfg: dict[str, object]) -> bool:
    return (
        qcfg.get("quant_method") == "modelopt"
        and str(qcfg.get("quant_algo", "")).upper() == "MXFP8"
    )


def _module_tensors(
    module: str, n: int, k: int, qcfg: dict[str, object]
) -> dict[str, TensorSpec] | None:
    ignore = qcfg.get("ignore") or []
    assert isinstance(ignore, list)
    if module in ignore:
        return None
    return {
        "weight": (MXFP8_DTYPE, (n, k)),
        "weight_scale": (torch.uint8, (n, math.ceil(k / MXFP8_BLOCK))),
    }


def _dequantize(
    module: str, tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> torch.Tensor:
    return mxfp8_dequant(tensors[f"{module}.weight"], tensors[f"{module}.weight_scale"])


def _activation(
    tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> tuple[str, ActHook]:
    def act(module: str, x: torch.Tensor) -> torch.Tensor:
        return mxfp8_dequant(*mxfp8_quant(x)).float()

    return "mxfp8", act


CODEC = Codec(
    claims=_claims,
    module_tensors=_module_tensors,
    dequantize=_dequantize,
    activation=_activation,
)
