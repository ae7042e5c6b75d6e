"""WNA16 formats: int4 weights in groups of 128 along K, 16-bit activations.

Three on-disk layouts of the same idea, each as its tool writes it and as
vLLM 0.19.1 reads it (``gptq.py`` / ``gptq_marlin.py`` / ``moe_wna16.py``,
``awq.py`` / ``awq_marlin.py``, ``compressed_tensors/schemes/
compressed_tensors_wNa16.py`` and ``compressed_tensors_moe.py``).  For a
Linear / expert projection ``P`` with weight [N, K] (N out, K in), G = 128:

* ``gptq-int4`` (GPTQModel / AutoGPTQ, checkpoint_format ``gptq`` = v1,
  symmetric, desc_act false): ``P.qweight`` int32 [K/8, N] -- word (r, n)
  holds q[8r + i, n] in bits 4i..4i+3 (packed along K, low nibble first);
  ``P.qzeros`` int32 [K/G, N/8] -- packed along N the same way, holding
  zero - 1 (the v1 convention; symmetric 4-bit zero is 8, so every nibble
  is 7); ``P.scales`` fp16 [K/G, N]; ``P.g_idx`` int32 [K] = k // G.
  w = (q - (qzeros + 1)) * scale.  ``quantization_config`` as GPTQModel
  writes it (bits, group_size, desc_act, sym, lm_head, quant_method,
  checkpoint_format, pack_dtype, meta), also saved as quantize_config.json.
* ``awq-int4`` (AutoAWQ GEMM, zero point): ``P.qweight`` int32 [K, N/8] --
  packed along N in AWQ's interleaved order: nibble i of word c holds
  column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]; ``P.qzeros`` int32 [K/G, N/8]
  packed the same way (zero points as is, 0..15); ``P.scales`` fp16
  [K/G, N].  w = (q - zero) * scale.  ``{"quant_method": "awq", "version":
  "gemm", "zero_point": true, "bits": 4, "group_size": 128,
  "modules_to_not_convert": ["mlp.gate"]}`` (AutoAWQ and vLLM both match
  that list by substring; it keeps the routers in bf16).
* ``w4a16-ct`` (compressed-tensors ``pack-quantized`` as llm-compressor
  writes W4A16): ``P.weight_packed`` int32 [N, K/8] -- packed along K, low
  nibble first, values offset by +8 (q in -8..7 stored as 0..15);
  ``P.weight_scale`` bf16 [N, K/G]; ``P.weight_shape`` int64 [2] = [N, K];
  no zero point (symmetric).  w = q * scale.

Only what those tools quantize is quantized: the attention projections and
the experts.  The routers ``mlp.gate``, ``lm_head``, embeddings and norms stay
bf16.  Scales come from round-to-nearest min/max, not from a calibrated
GPTQ / AWQ search: the layout is what the tests need, not the accuracy.
The fp16 scales of GPTQ and AWQ are chosen among the values bf16 represents
exactly, so the twin (dequantized in fp32, rounded once to bf16) is what a
kernel computes whether it converts the scales to bf16 first or not.
"""

from __future__ import annotations

import torch

from .common import (
    ct_quantization_config,
    Codec,
    SchemeContext,
    SchemeOutput,
    TensorSpec,
    ct_ignored,
    is_quantized_module,
    quantize_modules,
)

BITS = 4
PACK = 32 // BITS  # int4 values per int32 word
GROUP = 128
UINT4_MAX = 2**BITS - 1  # 15
GPTQ_SYM_ZERO = (UINT4_MAX + 1) // 2  # 8
CT_INT4_MIN, CT_INT4_MAX = -8, 7
IDENTITY_ORDER = tuple(range(PACK))
# AutoAWQ's pack order: nibble i of a word holds column AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_IGNORE = ["mlp.gate"]


# --------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------


def pack_int4(
    values: torch.Tensor, dim: int, order: tuple[int, ...] = IDENTITY_ORDER
) -> torch.Tensor:
    """Pack unsigned 4-bit values (0..15) eight to an int32 along ``dim``.

    Nibble i (bits 4i..4i+3) of word j holds element 8j + order[i].
    """
    v = values.to(torch.int64).movedim(dim, -1)
    if v.shape[-1] % PACK or int(v.min()) < 0 or int(v.max()) > UINT4_MAX:
        raise ValueError(
            f"pack_int4: need 0..{UINT4_MAX} values, size divisible by {PACK}"
        )
    v = v.reshape(*v.shape[:-1], v.shape[-1] // PACK, PACK)
    words = torch.zeros(v.shape[:-1], dtype=torch.int64)
    for i, src in enumerate(order):
        words |= v[..., src] << (BITS * i)
    # Same 32 bits, as a signed int32.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def unpack_int4(
    words: torch.Tensor, dim: int, order: tuple[int, ...] = IDENTITY_ORDER
) -> torch.Tensor:
    """Inverse of pack_int4: int64 values 0..15, ``dim`` eight times longer."""
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    out = torch.empty(*w.shape, PACK, dtype=torch.int64)
    for i, dst in enumerate(order):
        out[..., dst] = (w >> (BITS * i)) & UINT4_MAX
    return out.reshape(*w.shape[:-1], -1).movedim(-1, dim)


def _groups(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> fp32 [N, K/G, G]."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"K={k} is not a multiple of the group size {GROUP}")
    return w.float().view(n, k // GROUP, GROUP)


def _fp16_scale(scale: torch.Tensor) -> torch.Tensor:
    """fp16 scales, rounded to values that bf16 represents exactly."""
    as_bf16 = scale.to(torch.bfloat16)
    out = as_bf16.to(torch.float16)
    if not torch.equal(out.float(), as_bf16.float()):
        raise ValueError("int4 scale out of fp16's exact range")
    return out


# --------------------------------------------------------------------------
# GPTQ (GPTQModel / AutoGPTQ, v1 checkpoint format)
# --------------------------------------------------------------------------


def gptq_int4_quant(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Symmetric int4, group 128: scale = 2 * max|w| / 15, zero 8."""
    n, k = w.shape
    g = _groups(w)
    scale = _fp16_scale(2 * g.abs().amax(-1).clamp(min=1e-8) / UINT4_MAX)
    s = scale.float()[..., None]
    q = (torch.round(g / s) + GPTQ_SYM_ZERO).clamp(0, UINT4_MAX)
    deq = ((q - GPTQ_SYM_ZERO) * s).view(n, k).to(torch.bfloat16)
    zeros = torch.full((k // GROUP, n), GPTQ_SYM_ZERO - 1)  # v1 stores zero - 1
    return {
        "qweight": pack_int4(q.view(n, k).t(), dim=0),
        "qzeros": pack_int4(zeros, dim=1),
        "scales": scale.t().contiguous(),
        "g_idx": torch.arange(k, dtype=torch.int32) // GROUP,
    }, deq


def gptq_config() -> dict[str, object]:
    """quantization_config (and quantize_config.json) as GPTQModel writes it."""
    return {
        "bits": BITS,
        "group_size": GROUP,
        "desc_act": False,
        "sym": True,
        "lm_head": False,
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
        "pack_dtype": "int32",
        "meta": {
            "quantizer": ["gptqmodel:2.2.0"],
            "uri": "https://github.com/modelcloud/gptqmodel",
            "damp_percent": 0.01,
            "damp_auto_increment": 0.0025,
            "static_groups": False,
            "true_sequential": True,
            "mse": 0.0,
        },
    }


def write_gptq_int4(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    tensors, twin = quantize_modules(weights, lambda _m, w: gptq_int4_quant(w))
    cfg = gptq_config()
    return SchemeOutput(
        tensors=tensors,
        quantization_config=cfg,
        twin=twin,
        extra_json={"quantize_config.json": cfg},
    )


def _gptq_tensors(
    module: str, n: int, k: int, qcfg: dict[str, object]
) -> dict[str, TensorSpec] | None:
    if not is_quantized_module(module):
        return None
    gs = _group_size(qcfg)
    return {
        "qweight": (torch.int32, (k // PACK, n)),
        "qzeros": (torch.int32, (k // gs, n // PACK)),
        "scales": (torch.float16, (k // gs, n)),
        "g_idx": (torch.int32, (k,)),
    }


def _gptq_dequant(
    module: str, tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> torch.Tensor:
    q = unpack_int4(tensors[f"{module}.qweight"], dim=0)  # [K, N]
    zeros = unpack_int4(tensors[f"{module}.qzeros"], dim=1)  # [K/G, N]
    if qcfg.get("checkpoint_format", "gptq") == "gptq":
        zeros = zeros + 1  # v1 stores zero - 1
    g_idx = tensors[f"{module}.g_idx"].long()
    scales = tensors[f"{module}.scales"].float()
    w = (q - zeros[g_idx]).float() * scales[g_idx]
    return w.t().contiguous().to(torch.bfloat16)


# --------------------------------------------------------------------------
# AWQ (AutoAWQ GEMM, zero point)
# --------------------------------------------------------------------------


def awq_int4_quant(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Asymmetric int4, group 128: scale = (max - min) / 15,
    zero = round(-min / scale) in 0..15."""
    n, k = w.shape
    g = _groups(w)
    wmax, wmin = g.amax(-1), g.amin(-1)
    scale = _fp16_scale((wmax - wmin).clamp(min=1e-5) / UINT4_MAX)
    s = scale.float()[..., None]
    zero = (-torch.round(wmin / scale.float())).clamp(0, UINT4_MAX)
    z = zero[..., None]
    q = (torch.round(g / s) + z).clamp(0, UINT4_MAX)
    deq = ((q - z) * s).view(n, k).to(torch.bfloat16)
    return {
        "qweight": pack_int4(q.view(n, k).t(), dim=1, order=AWQ_ORDER),
        "qzeros": pack_int4(zero.t(), dim=1, order=AWQ_ORDER),
        "scales": scale.t().contiguous(),
    }, deq


def awq_config() -> dict[str, object]:
    """quantization_config as AutoAWQ writes it for a GEMM checkpoint."""
    return {
        "bits": BITS,
        "group_size": GROUP,
        "modules_to_not_convert": AWQ_IGNORE,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    }


def write_awq_int4(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    tensors, twin = quantize_modules(weights, lambda _m, w: awq_int4_quant(w))
    return SchemeOutput(tensors=tensors, quantization_config=awq_config(), twin=twin)


def _awq_tensors(
    module: str, n: int, k: int, qcfg: dict[str, object]
) -> dict[str, TensorSpec] | None:
    skip = qcfg.get("modules_to_not_convert") or []
    assert isinstance(skip, list)
    if any(s in module for s in skip) or not is_quantized_module(module):
        return None
    gs = _group_size(qcfg)
    return {
        "qweight": (torch.int32, (k, n // PACK)),
        "qzeros": (torch.int32, (k // gs, n // PACK)),
        "scales": (torch.float16, (k // gs, n)),
    }


def _awq_dequant(
    module: str, tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> torch.Tensor:
    gs = _group_size(qcfg)
    q = unpack_int4(tensors[f"{module}.qweight"], dim=1, order=AWQ_ORDER)  # [K, N]
    zeros = unpack_int4(tensors[f"{module}.qzeros"], dim=1, order=AWQ_ORDER)
    scales = tensors[f"{module}.scales"].float()
    zeros = zeros.repeat_interleave(gs, 0)
    scales = scales.repeat_interleave(gs, 0)
    w = (q - zeros).float() * scales
    return w.t().contiguous().to(torch.bfloat16)


# --------------------------------------------------------------------------
# compressed-tensors W4A16 (pack-quantized, llm-compressor)
# --------------------------------------------------------------------------


def ct_int4_quant(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Symmetric int4, group 128, as compressed-tensors computes it:
    scale = max|w| / 7.5 (half the int4 range) stored in bf16,
    q = round(w / scale) clamped to [-8, 7]."""
    n, k = w.shape
    g = _groups(w)
    half_range = (CT_INT4_MAX - CT_INT4_MIN) / 2
    scale = (g.abs().amax(-1).clamp(min=1e-8) / half_range).to(torch.bfloat16)
    s = scale.float()[..., None]
    q = torch.round(g / s).clamp(CT_INT4_MIN, CT_INT4_MAX)
    deq = (q * s).view(n, k).to(torch.bfloat16)
    return {
        "weight_packed": pack_int4(q.view(n, k) - CT_INT4_MIN, dim=1),
        "weight_scale": scale,
        "weight_shape": torch.tensor([n, k], dtype=torch.int64),
    }, deq


def ct_w4a16_config() -> dict[str, object]:
    """quantization_config of an llm-compressor W4A16 (group 128) checkpoint."""
    return ct_quantization_config(
        "pack-quantized",
        weights={
            "actorder": None,
            "block_structure": None,
            "dynamic": False,
            "group_size": GROUP,
            "num_bits": BITS,
            "observer": "minmax",
            "observer_kwargs": {},
            "strategy": "group",
            "symmetric": True,
            "type": "int",
        },
        input_activations=None,
    )


def write_w4a16_ct(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    tensors, twin = quantize_modules(weights, lambda _m, w: ct_int4_quant(w))
    return SchemeOutput(
        tensors=tensors, quantization_config=ct_w4a16_config(), twin=twin
    )


def _ct_weights_args(qcfg: dict[str, object]) -> dict[str, object]:
    groups = qcfg["config_groups"]
    assert isinstance(groups, dict) and len(groups) == 1, groups
    (group,) = groups.values()
    return group["weights"]


def _ct_tensors(
    module: str, n: int, k: int, qcfg: dict[str, object]
) -> dict[str, TensorSpec] | None:
    ignore = qcfg.get("ignore") or []
    assert isinstance(ignore, list)
    if ct_ignored(module, ignore):
        return None
    gs = _ct_weights_args(qcfg)["group_size"]
    assert isinstance(gs, int)
    return {
        "weight_packed": (torch.int32, (n, k // PACK)),
        "weight_scale": (torch.bfloat16, (n, k // gs)),
        "weight_shape": (torch.int64, (2,)),
    }


def _ct_dequant(
    module: str, tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> torch.Tensor:
    n, k = tensors[f"{module}.weight_shape"].tolist()
    gs = _ct_weights_args(qcfg)["group_size"]
    assert isinstance(gs, int)
    q = unpack_int4(tensors[f"{module}.weight_packed"], dim=1)[:, :k] + CT_INT4_MIN
    scales = tensors[f"{module}.weight_scale"].float().repeat_interleave(gs, 1)
    return (q.float() * scales).to(torch.bfloat16)


# --------------------------------------------------------------------------
# Codecs
# --------------------------------------------------------------------------


def _group_size(qcfg: dict[str, object]) -> int:
    if qcfg.get("bits") != BITS:
        raise ValueError(f"only {BITS}-bit checkpoints are handled, got {qcfg}")
    gs = qcfg["group_size"]
    assert isinstance(gs, int)
    return gs


GPTQ_CODEC = Codec(
    claims=lambda qcfg: qcfg.get("quant_method") == "gptq",
    module_tensors=_gptq_tensors,
    dequantize=_gptq_dequant,
)
AWQ_CODEC = Codec(
    claims=lambda qcfg: qcfg.get("quant_method") == "awq",
    module_tensors=_awq_tensors,
    dequantize=_awq_dequant,
)
CT_CODEC = Codec(
    claims=lambda qcfg: (
        qcfg.get("quant_method") == "compressed-tensors"
        and qcfg.get("format") == "pack-quantized"
    ),
    module_tensors=_ct_tensors,
    dequantize=_ct_dequant,
)
