"""Write tiny Qwen3-MoE checkpoints in real on-disk formats, fully offline.

Why: end-to-end tests of the fork (serving, quantized MoE kernels on CPU) need
a model that loads through exactly the same code paths as a real Hugging Face
checkpoint -- config.json, safetensors, tokenizer.json -- but is small enough
to load and run in seconds, and that can be produced without any network
access.  Random weights are fine for that, as long as the outputs are not
degenerate (greedy text must depend on the prompt), and as long as every
quantized variant comes with a bf16 "twin" whose weights are exactly the
dequantized quantized weights, so a test can compare a quantized run against a
plain bf16 run of the same function.

Usage::

    python tools/tiny_checkpoint --out build/models/tiny-bf16 --scheme bf16
    python tools/tiny_checkpoint --out build/models/tiny-fp8-tensor \\
        --scheme fp8-tensor          # also writes build/models/tiny-fp8-tensor-bf16twin
    python tools/tiny_checkpoint --verify build/models/tiny-fp8-tensor

(``python -m tiny_checkpoint ...`` works too with ``tools/`` on sys.path.)

Layout: ``common`` (model shape, weights, tokenizer, reference forward,
checkpoint I/O), one module per format family -- ``fp8`` (fp8-tensor,
fp8-block, fp8-channel-ct), ``int8`` (w8a8-int8), ``wna16`` (gptq-int4, awq-int4,
w4a16-ct), ``mxfp8`` (mxfp8-modelopt) -- ``schemes`` (the registry and
``generate``), ``verify`` and ``cli``.  ``gptoss`` writes a whole other
model, a tiny GPT-OSS-style biased MoE (``--scheme gpt-oss``: bf16, for
``--quantization fp8``, with its online-FP8 twin; ``schemes.MODELS``).

A format is a writer (bf16 master weights -> tensors to save, the
``quantization_config`` for config.json, extra JSON files, the dequantized
bf16 twin) plus a ``Codec`` that tells ``--verify`` which tensors to expect
and how to dequantize them.  ``FORMATS`` holds all of them; ``SCHEMES`` only
the ones the fork serves (``served=True``), which is what the e2e suite
iterates over.  To add a format: write it in its family module, register it
in ``schemes.FORMATS`` with ``served=False`` until the fork can load it.

Not quantized in any scheme: embeddings, ``lm_head``, all RMSNorms and the
router ``mlp.gate``.  vLLM builds the router as a ``ReplicatedLinear`` *with*
the quant config, so formats with an ignore list must name it (full prefix
match), which is also what the official Qwen3-MoE FP8 checkpoints do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .common import (
    CORPUS,
    EOS_TOKEN,
    PROMPTS,
    SHAPES,
    Shape,
    load_tensors,
    reference_greedy,
    reference_logits,
)
from .schemes import FORMATS, MODELS, SCHEMES, Format, generate
from .verify import expected_tensors, verify

__all__ = [
    "CORPUS",
    "EOS_TOKEN",
    "FORMATS",
    "MODELS",
    "PROMPTS",
    "SCHEMES",
    "SHAPES",
    "Format",
    "Shape",
    "expected_tensors",
    "generate",
    "load_tensors",
    "reference_greedy",
    "reference_logits",
    "source_digest",
    "verify",
]

PACKAGE_DIR = Path(__file__).resolve().parent


def source_digest() -> str:
    """sha256 over every source file of this package (names and contents):
    a cache key that changes whenever any format's code does."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()
