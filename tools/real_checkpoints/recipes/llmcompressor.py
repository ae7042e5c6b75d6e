"""llm-compressor recipe: oneshot with the compressed-tensors preset schemes.

Run by the llmcompressor venv's python:
``llmcompressor.py --scheme FP8_DYNAMIC --base BF16_DIR --out DIR --work TMP``.
``W4A16-GPTQ`` is the W4A16 preset through GPTQModifier (calibrated,
default actorder). ``W4A16-G32``, ``W4A16-G64`` and ``W4A16-CHANNEL`` are the
W4A16 preset's weights in groups of 32 or 64 inputs and with one scale per
channel, ``W8A16-CHANNEL`` the W8A16 preset's with one scale per channel
(config groups of their own, as the tool's docs write custom schemes).
``W4A16-CHANNEL`` goes through GPTQModifier: rounded to nearest, 4-bit
weights with one scale per channel on this tiny random model flip next
tokens the bf16 twin holds by a wide margin (a top-2 gap of 2.4 nats),
which the e2e rule rejects. Every other scheme goes through
QuantizationModifier (round to nearest, data-free), the presets by name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# This file shares its name with the package it drives: take its own
# directory off sys.path before importing it, and load the helpers by path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_calib", HERE / "_calib.py")
calib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calib)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from llmcompressor import oneshot  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationScheme,
)
from llmcompressor.modeling.moe.linearize import load_quantizable_moe  # noqa: E402
from llmcompressor.modifiers.quantization import (  # noqa: E402
    GPTQModifier,
    QuantizationModifier,
)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

# What the Qwen3-MoE examples of llm-compressor leave alone: the LM head
# and the routers.
IGNORE = ["lm_head", "re:.*mlp.gate$"]
SCHEMES = [
    "FP8_DYNAMIC",
    "FP8_BLOCK",
    "W4A16",
    "W4A16-GPTQ",
    "W4A16_ASYM",
    "W4A16-G32",
    "W4A16-G64",
    "W4A16-CHANNEL",
    "W8A16",
    "W8A16-CHANNEL",
    "MXFP8",
    "W8A8",
]


# The W4A16 and W8A16 presets' weights (symmetric integers) at other
# granularities.
VARIANTS = {
    "W4A16-G32": {"num_bits": 4, "strategy": "group", "group_size": 32},
    "W4A16-G64": {"num_bits": 4, "strategy": "group", "group_size": 64},
    "W4A16-CHANNEL": {"num_bits": 4, "strategy": "channel"},
    "W8A16-CHANNEL": {"num_bits": 8, "strategy": "channel"},
}


def _config_groups(scheme: str) -> dict[str, QuantizationScheme]:
    weights = QuantizationArgs(type="int", symmetric=True, **VARIANTS[scheme])
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}


def main() -> None:
    args = calib.parse_args(SCHEMES)
    calib.seed_everything()
    base = calib.base_copy(args.base, args.work)
    calib.drop_unimportable_transformers_aliases()
    with load_quantizable_moe():
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(base)

    # the preset by name, or a variant's config groups
    if args.scheme in VARIANTS:
        scheme = {"config_groups": _config_groups(args.scheme)}
    else:
        scheme = {"targets": "Linear", "scheme": args.scheme.removesuffix("-GPTQ")}
    kwargs: dict[str, object] = {}
    if args.scheme in ("W4A16-GPTQ", "W4A16-CHANNEL"):
        recipe = GPTQModifier(**scheme, ignore=IGNORE)
        ids = calib.calibration_ids(calib.vocab_size(base))
        kwargs = {
            "dataset": Dataset.from_dict(
                {
                    "input_ids": ids.tolist(),
                    "attention_mask": torch.ones_like(ids).tolist(),
                }
            ),
            "num_calibration_samples": ids.shape[0],
            "max_seq_length": ids.shape[1],
            "shuffle_calibration_samples": False,
        }
    else:
        recipe = QuantizationModifier(**scheme, ignore=IGNORE)
    oneshot(model=model, recipe=recipe, **kwargs)
    model.save_pretrained(args.out, save_compressed=True)
    tokenizer.save_pretrained(args.out)


if __name__ == "__main__":
    main()
