"""INT8 formats: ``w8a8-int8`` (compressed-tensors W8A8 as llm-compressor
writes it).

``{"quant_method": "compressed-tensors", "format": "int-quantized",
"config_groups": {"group_0": {"targets": ["Linear"], "weights": int8
symmetric "channel", "input_activations": int8 symmetric dynamic
"token"}}, "ignore": ["lm_head", "re:.*mlp.gate$"], ...}``, with
``P.weight`` int8 and ``P.weight_scale`` bf16 of shape ``[out, 1]``
(``w = int8 * scale`` per output channel); no input scales, no zero points.
"""

from __future__ import annotations

import torch

from .common import (
    ct_channel_token_config,
    ct_channel_codec,
    SchemeContext,
    SchemeOutput,
    quantize_weights,
)

INT8_MIN, INT8_MAX = -128, 127



def int8_channel_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8, as compressed-tensors computes it.

    scale = max|w| / 127.5 over the row (half the int8 range), stored in the
    model's dtype (bf16) with shape [out, 1]; q = round(w / scale) clamped to
    [-128, 127] with that stored scale.  No zero point is saved (symmetric).
    """
    amax = w.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-8)
    scale = (amax / ((INT8_MAX - INT8_MIN) / 2)).to(torch.bfloat16)
    q = torch.round(w.float() / scale.float()).clamp(INT8_MIN, INT8_MAX)
    return q.to(torch.int8), scale


def int8_channel_dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.float() * scale.float()).to(torch.bfloat16)


def int8_dynamic_token_act_quant(x: torch.Tensor) -> torch.Tensor:
    """Emulate dynamic symmetric per-token int8 activation quantization."""
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-10) / INT8_MAX
    return torch.round(x / s).clamp(-INT8_MAX, INT8_MAX) * s


def ct_w8a8_int8_config() -> dict[str, object]:
    """quantization_config of an llm-compressor W8A8 (int8) checkpoint."""
    return ct_channel_token_config("int", "int-quantized")


def write_w8a8_int8(
    weights: dict[str, torch.Tensor], ctx: SchemeContext
) -> SchemeOutput:
    """compressed-tensors W8A8 int8: int8 weights with per-channel
    ``weight_scale`` [out, 1], activations quantized dynamically per token
    at run time (no input scales on disk)."""
    tensors, twin = quantize_weights(
        weights,
        lambda _m, w: int8_channel_quant(w),
        int8_channel_dequant,
        "weight_scale",
    )
    return SchemeOutput(
        tensors=tensors, quantization_config=ct_w8a8_int8_config(), twin=twin
    )


CODEC = ct_channel_codec(
    "int-quantized",
    torch.int8,
    torch.bfloat16,
    int8_channel_dequant,
    "int8",
    int8_dynamic_token_act_quant,
)
