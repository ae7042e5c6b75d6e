"""The tools, their pinned versions, and the formats each one writes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    # Short name: the lock file (locks/<name>.txt) and the recipe
    # (recipes/<name>.py) are named after it.
    name: str
    # The distribution pinned in the lock, and its version (which also names
    # the venv and the cache directory: <name>-<version>).
    package: str
    version: str
    # Extras of the package the tool needs (e.g. ModelOpt's Hugging Face
    # export), part of what the lock is resolved from.
    extras: str = ""

    @property
    def requirement(self) -> str:
        extras = f"[{self.extras}]" if self.extras else ""
        return f"{self.package}{extras}=={self.version}"

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.version}"


@dataclass(frozen=True)
class Format:
    name: str
    tool: Tool
    # What the recipe gets as --scheme (the tool's own preset name where it
    # has one).
    scheme: str
    # The quantization method vLLM should detect from config.json.
    quantization: str
    description: str


LLMCOMPRESSOR = Tool("llmcompressor", "llmcompressor", "0.14.0.1")
AUTOROUND = Tool("autoround", "auto-round", "0.15.1")
MODELOPT = Tool("modelopt", "nvidia-modelopt", "0.47.0", "hf")
TOOLS: dict[str, Tool] = {t.name: t for t in (LLMCOMPRESSOR, AUTOROUND, MODELOPT)}

CT = "compressed-tensors"

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "llmc-fp8-dynamic",
            LLMCOMPRESSOR,
            "FP8_DYNAMIC",
            CT,
            "FP8 per-channel weights, dynamic per-token FP8 activations",
        ),
        Format(
            "llmc-fp8-block",
            LLMCOMPRESSOR,
            "FP8_BLOCK",
            CT,
            "FP8 weights in 128x128 blocks, dynamic per-group activations",
        ),
        Format(
            "llmc-w4a16",
            LLMCOMPRESSOR,
            "W4A16",
            CT,
            "int4 symmetric g128 weights, round to nearest",
        ),
        Format(
            "llmc-w4a16-gptq",
            LLMCOMPRESSOR,
            "W4A16-GPTQ",
            CT,
            "int4 symmetric g128 weights, GPTQ (default actorder)",
        ),
        Format(
            "llmc-w4a16-asym",
            LLMCOMPRESSOR,
            "W4A16_ASYM",
            CT,
            "int4 asymmetric g128 weights (zero points), round to nearest",
        ),
        Format(
            "llmc-w4a16-g32",
            LLMCOMPRESSOR,
            "W4A16-G32",
            CT,
            "int4 symmetric weights in groups of 32, round to nearest",
        ),
        Format(
            "llmc-w4a16-g64",
            LLMCOMPRESSOR,
            "W4A16-G64",
            CT,
            "int4 symmetric weights in groups of 64, round to nearest",
        ),
        Format(
            "llmc-w4a16-channel",
            LLMCOMPRESSOR,
            "W4A16-CHANNEL",
            CT,
            "int4 symmetric per-channel weights, GPTQ (default actorder)",
        ),
        Format(
            "llmc-w8a16",
            LLMCOMPRESSOR,
            "W8A16",
            CT,
            "int8 symmetric g128 weights, bf16 activations",
        ),
        Format(
            "llmc-w8a16-channel",
            LLMCOMPRESSOR,
            "W8A16-CHANNEL",
            CT,
            "int8 symmetric per-channel weights, bf16 activations",
        ),
        Format(
            "llmc-mxfp8",
            LLMCOMPRESSOR,
            "MXFP8",
            CT,
            "MX FP8 weights (e8m0 scales per 32), MX FP8 activations",
        ),
        Format(
            "llmc-w8a8",
            LLMCOMPRESSOR,
            "W8A8",
            CT,
            "int8 per-channel weights, dynamic per-token int8 activations",
        ),
        Format(
            "ar-gptq",
            AUTOROUND,
            "auto_gptq",
            # What vLLM 0.32 logs for a quant_method "gptq" checkpoint on CPU.
            "auto_gptq",
            "int4 g128 symmetric, auto-round's auto_gptq export",
        ),
        Format(
            "ar-awq",
            AUTOROUND,
            "auto_awq",
            "awq",
            "int4 g128 asymmetric, auto-round's auto_awq export",
        ),
        Format(
            "mo-fp8",
            MODELOPT,
            "FP8_DEFAULT_CFG",
            "modelopt",
            "FP8 per-tensor weights and static activations",
        ),
        Format(
            "mo-mxfp8",
            MODELOPT,
            "MXFP8_DEFAULT_CFG",
            "modelopt_mxfp8",
            "MX FP8 weights and activations",
        ),
    )
}
