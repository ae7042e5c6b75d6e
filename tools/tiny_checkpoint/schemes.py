"""The format registry and ``generate``.

``FORMATS`` holds every format the tool can write; ``SCHEMES`` only those
the fork serves today (``served=True``).  The end-to-end suite parametrizes
over ``SCHEMES``, so a format that the fork cannot load yet is added with
``served=False``: it can be written, verified and unit-tested, but no e2e
test tries to serve it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import fp8, gptoss, int8, mxfp8, wna16
from .common import (
    EOS_TOKEN,
    Codec,
    SchemeContext,
    SchemeWriter,
    Shape,
    hf_config,
    init_weights,
    train_tokenizer,
    write_bf16,
    write_checkpoint,
)


@dataclass(frozen=True)
class Format:
    name: str
    write: SchemeWriter
    # How --verify reads it; None for the unquantized bf16 baseline.
    codec: Codec | None
    # Whether the fork can serve it (and the e2e suite runs it).
    served: bool = True


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("bf16", write_bf16, None),
        Format("fp8-tensor", fp8.write_fp8_tensor, fp8.CODEC),
        Format("fp8-block", fp8.write_fp8_block, fp8.CODEC),
        Format("fp8-channel-ct", fp8.write_fp8_channel_ct, fp8.CT_CODEC),
        Format("w8a8-int8", int8.write_w8a8_int8, int8.CODEC),
        Format("gptq-int4", wna16.write_gptq_int4, wna16.GPTQ_CODEC),
        Format("awq-int4", wna16.write_awq_int4, wna16.AWQ_CODEC),
        Format("w4a16-ct", wna16.write_w4a16_ct, wna16.CT_CODEC),
        Format("mxfp8-modelopt", mxfp8.write_mxfp8_modelopt, mxfp8.CODEC),
    )
}

# The served schemes (name -> writer): what the e2e suite iterates over.
SCHEMES: dict[str, SchemeWriter] = {
    name: f.write for name, f in FORMATS.items() if f.served
}


# Whole models outside the Qwen3-MoE family (name -> generate(out, seed,
# twin_dir, shards) -> written dirs): bf16 checkpoints that are quantized
# online (``--quantization ...``), each written with its twin.  Not in
# SCHEMES: the e2e suite serves them with their own flags.
MODELS: dict[str, Callable[[Path, int, Path | None, int], list[Path]]] = {
    gptoss.SCHEME: gptoss.generate_gptoss,
}


def codec_for(qcfg: dict[str, object]) -> Codec:
    """The codec that reads a config.json ``quantization_config``."""
    codecs = {id(f.codec): f.codec for f in FORMATS.values() if f.codec is not None}
    matches = [c for c in codecs.values() if c.claims(qcfg)]
    if len(matches) != 1:
        raise ValueError(
            f"{len(matches)} tiny_checkpoint formats read quantization_config "
            f"{qcfg!r}; expected exactly one"
        )
    return matches[0]


def generate(
    out: Path,
    scheme: str,
    seed: int,
    twin_dir: Path | None,
    shards: int,
    shared_fused_scales: bool = True,
    shape: Shape | None = None,
) -> list[Path]:
    """Write checkpoint ``scheme`` to ``out`` (and its bf16 twin) in
    ``shape`` (default: the tiny one); returns the directories written, the
    quantized one first."""
    if scheme in MODELS:
        if shape is not None:
            raise ValueError(f"{scheme!r} has a shape of its own; drop --shape")
        return MODELS[scheme](out, seed, twin_dir, shards)
    if scheme not in FORMATS:
        raise KeyError(
            f"unknown tiny_checkpoint scheme {scheme!r}; known: "
            f"{sorted([*FORMATS, *MODELS])}"
        )
    shape = shape or Shape()
    tok = train_tokenizer(shape.vocab_target)
    vocab = tok.get_vocab_size()
    eos_id = tok.token_to_id(EOS_TOKEN)
    weights = init_weights(shape, vocab, seed)
    ctx = SchemeContext(shape, tok, seed, shared_fused_scales)
    result = FORMATS[scheme].write(weights, ctx)

    config = hf_config(shape, vocab, eos_id)
    written = [out]
    if result.quantization_config is not None:
        config = {**config, "quantization_config": result.quantization_config}
    write_checkpoint(
        out, result.tensors, config, tok, eos_id, shards, result.extra_json
    )
    if result.twin is not None:
        twin_out = twin_dir or out.with_name(out.name + "-bf16twin")
        write_checkpoint(
            twin_out, result.twin, hf_config(shape, vocab, eos_id), tok, eos_id, shards
        )
        written.append(twin_out)
    return written
