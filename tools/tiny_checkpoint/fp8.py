"""FP8 formats: ``fp8-tensor`` (AutoFP8), ``fp8-block`` (DeepSeek-V3) and
``fp8-channel-ct`` (compressed-tensors FP8_DYNAMIC).

Checked against vLLM's reader in
``vllm/model_executor/layers/quantization/fp8.py``:

* ``fp8-tensor``: AutoFP8-style serialized FP8, ``{"quant_method": "fp8",
  "activation_scheme": "static", "ignored_layers": [...]}``.  Every quantized
  Linear / expert projection ``P`` has ``P.weight`` (float8_e4m3fn),
  ``P.weight_scale`` and ``P.input_scale`` (float32 scalars, shape ``[]``, as
  AutoFP8 writes them).  Input scales are calibrated by running the bf16 twin
  over the embedded corpus.
* ``fp8-block``: DeepSeek-V3 / Qwen3-FP8 style, ``{"quant_method": "fp8",
  "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128,
  128], "modules_to_not_convert": [...]}``, with ``P.weight`` float8_e4m3fn and
  ``P.weight_scale_inv`` float32 of shape ``[ceil(N/128), ceil(K/128)]``.
  Despite the name, ``weight_scale_inv`` is the dequantization multiplier:
  ``w = fp8 * scale_inv`` blockwise.
* ``fp8-channel-ct``: compressed-tensors FP8 as llm-compressor's FP8_DYNAMIC
  scheme writes it, ``{"quant_method": "compressed-tensors", "format":
  "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"],
  "weights": float 8-bit symmetric "channel", "input_activations": float
  8-bit symmetric dynamic "token"}}, "ignore": ["lm_head", "re:.*mlp.gate$"]}``,
  with ``P.weight`` float8_e4m3fn and ``P.weight_scale`` float32 ``[out, 1]``
  (``w = fp8 * scale`` per output channel); no input scales.
"""

from __future__ import annotations

import torch

from .common import (
    ct_channel_token_config,
    ct_channel_codec,
    ActHook,
    Codec,
    SchemeContext,
    SchemeOutput,
    TensorSpec,
    calibrate_input_amax,
    fused_group,
    is_quantized_module,
    quantize_weights,
    unquantized_modules,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
BLOCK = (128, 128)


def _amax_to_scale(amax: torch.Tensor) -> torch.Tensor:
    return (amax.float().clamp(min=1e-12) / FP8_MAX).to(torch.float32)


def fp8_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def fp8_tensor_dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.float() * scale.float()).to(torch.bfloat16)


def _block_view(x: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, int, int]:
    """Pad x [N, K] to block multiples and view as [N/bn, bn, K/bk, bk]."""
    n, k = x.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=x.dtype)
    padded[:n, :k] = x
    return padded.view(nb, bn, kb, bk), nb, kb


def fp8_block_quant(
    w: torch.Tensor, block: tuple[int, int] = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    bn, bk = block
    n, k = w.shape
    blocks, nb, kb = _block_view(w.float(), bn, bk)
    scale_inv = _amax_to_scale(blocks.abs().amax(dim=(1, 3)))  # [nb, kb]
    q = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(nb * bn, kb * bk)[:n, :k].contiguous().to(FP8_DTYPE)
    return q, scale_inv


def fp8_block_dequant(
    q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = BLOCK
) -> torch.Tensor:
    bn, bk = block
    n, k = q.shape
    blocks, nb, kb = _block_view(q.float(), bn, bk)
    w = (blocks * scale_inv.float()[:, None, :, None]).view(nb * bn, kb * bk)
    return w[:n, :k].to(torch.bfloat16)


def fp8_channel_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel FP8: scale = max|w| / 448 over the row,
    float32 [out, 1]; q = w / scale cast to float8_e4m3fn."""
    scale = _amax_to_scale(w.float().abs().amax(dim=1, keepdim=True))
    return fp8_quant(w, scale), scale


def fp8_dynamic_token_act_quant(x: torch.Tensor) -> torch.Tensor:
    """Emulate dynamic per-token (per-row) fp8 activation quantization."""
    s = _amax_to_scale(x.abs().amax(-1, keepdim=True))
    return fp8_quant(x, s).float() * s


def fp8_dynamic_group_act_quant(x: torch.Tensor, group: int = 128) -> torch.Tensor:
    """Emulate per-token-group (1 x group) dynamic fp8 activation quant."""
    rows, k = x.shape
    g = x.reshape(rows, k // group, group)
    s = _amax_to_scale(g.abs().amax(-1, keepdim=True))
    return (fp8_quant(g, s).float() * s).reshape(rows, k)


# --------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------


def write_fp8_tensor(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    group_amax: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and is_quantized_module(module):
            key = fused_group(module) if ctx.shared_fused_scales else module
            amax = w.float().abs().max()
            group_amax[key] = torch.maximum(group_amax.get(key, amax), amax)

    def quant(module: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = fused_group(module) if ctx.shared_fused_scales else module
        scale = _amax_to_scale(group_amax[key])
        return fp8_quant(w, scale), scale

    tensors, twin = quantize_weights(weights, quant, fp8_tensor_dequant, "weight_scale")
    # Static activation scales, calibrated on the twin (what the quantized
    # model will actually compute, up to activation rounding).
    amax = calibrate_input_amax(twin, ctx.shape, ctx.tokenizer)
    for module, a in amax.items():
        tensors[f"{module}.input_scale"] = _amax_to_scale(torch.tensor(a))
    return SchemeOutput(
        tensors=tensors,
        quantization_config={
            "quant_method": "fp8",
            "activation_scheme": "static",
            "ignored_layers": unquantized_modules(ctx.shape),
        },
        twin=twin,
    )


def write_fp8_block(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    tensors, twin = quantize_weights(
        weights, lambda _m, w: fp8_block_quant(w), fp8_block_dequant, "weight_scale_inv"
    )
    return SchemeOutput(
        tensors=tensors,
        quantization_config={
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(BLOCK),
            "modules_to_not_convert": unquantized_modules(ctx.shape),
        },
        twin=twin,
    )


def ct_fp8_channel_config() -> dict[str, object]:
    """quantization_config of an llm-compressor FP8_DYNAMIC checkpoint."""
    return ct_channel_token_config("float", "float-quantized")


def write_fp8_channel_ct(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    """compressed-tensors FP8: FP8 weights with per-channel ``weight_scale``
    [out, 1], activations quantized dynamically per token at run time."""
    tensors, twin = quantize_weights(
        weights, lambda _m, w: fp8_channel_quant(w), fp8_tensor_dequant, "weight_scale"
    )
    return SchemeOutput(
        tensors=tensors, quantization_config=ct_fp8_channel_config(), twin=twin
    )


# --------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------


def effective_input_scales(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Static input scale per module as vLLM applies it.

    vLLM keeps one activation scale per fused Linear (max over q/k/v, over
    gate/up) and one per MoE layer for w13 and one for w2 (max over experts).
    """
    groups: dict[str, list[str]] = {}
    for name in tensors:
        if not name.endswith(".input_scale"):
            continue
        module = name.removesuffix(".input_scale")
        if ".mlp.experts." in module:
            layer, rest = module.split(".mlp.experts.")
            kind = "w2" if rest.endswith("down_proj") else "w13"
            key = f"{layer}.moe.{kind}"
        elif module.endswith(("q_proj", "k_proj", "v_proj")):
            key = module.rsplit(".", 1)[0] + ".qkv"
        else:
            key = module
        groups.setdefault(key, []).append(module)
    out: dict[str, torch.Tensor] = {}
    for modules in groups.values():
        s = torch.stack([tensors[f"{m}.input_scale"] for m in modules]).max()
        out.update(dict.fromkeys(modules, s))
    return out


def _claims(qcfg: dict[str, object]) -> bool:
    return qcfg.get("quant_method") == "fp8"


def _module_tensors(
    module: str, n: int, k: int, qcfg: dict[str, object]
) -> dict[str, TensorSpec] | None:
    ignored = qcfg.get("ignored_layers") or qcfg.get("modules_to_not_convert") or []
    assert isinstance(ignored, list)
    if module in ignored:
        return None
    spec: dict[str, TensorSpec] = {"weight": (FP8_DTYPE, (n, k))}
    block = qcfg.get("weight_block_size")
    if block is not None:
        assert isinstance(block, list)
        bn, bk = block
        spec["weight_scale_inv"] = (torch.float32, (-(-n // bn), -(-k // bk)))
    else:
        spec["weight_scale"] = (torch.float32, ())
    if qcfg["activation_scheme"] == "static":
        spec["input_scale"] = (torch.float32, ())
    return spec


def _dequantize(
    module: str, tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> torch.Tensor:
    q = tensors[f"{module}.weight"]
    block = qcfg.get("weight_block_size")
    if block is not None:
        assert isinstance(block, list)
        return fp8_block_dequant(
            q, tensors[f"{module}.weight_scale_inv"], (block[0], block[1])
        )
    return fp8_tensor_dequant(q, tensors[f"{module}.weight_scale"])


def _activation(
    tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> tuple[str, ActHook]:
    if qcfg["activation_scheme"] == "static":
        scales = effective_input_scales(tensors)

        def static(module: str, x: torch.Tensor) -> torch.Tensor:
            s = scales[module]
            return fp8_quant(x, s).float() * s

        return "fp8", static
    block = qcfg["weight_block_size"]
    assert isinstance(block, list)

    def dynamic(module: str, x: torch.Tensor) -> torch.Tensor:
        return fp8_dynamic_group_act_quant(x, int(block[1]))

    return "fp8", dynamic


CODEC = Codec(
    claims=_claims,
    module_tensors=_module_tensors,
    dequantize=_dequantize,
    activation=_activation,
)


CT_CODEC = ct_channel_codec(
    "float-quantized",
    FP8_DTYPE,
    torch.float32,
    fp8_tensor_dequant,
    "fp8",
    fp8_dynamic_token_act_quant,
)
