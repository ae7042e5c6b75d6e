"""``--verify``: re-read a written checkpoint and check it.

Names, dtypes and shapes against what vLLM's readers expect for the
config's format, the tokenizer files, and for quantized formats that
dequantizing the on-disk tensors gives exactly the bf16 twin.  Then the
reference forward shows how often greedy decoding with emulated activation
quantization agrees with the twin, next to a control (two experts swapped)
that a real bug would look like.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from .common import (
    EOS_TOKEN,
    PROMPTS,
    ActHook,
    Shape,
    TensorSpec,
    linear_shapes,
    load_tensors,
    reference_greedy,
    reference_logits,
    shape_from_config,
    weight_spec,
)
from .gptoss import MODEL_TYPE as GPT_OSS, hf_crosscheck_gptoss, verify_gptoss
from .schemes import codec_for


def expected_tensors(config: dict[str, object]) -> dict[str, TensorSpec]:
    """Name -> (dtype, shape) that vLLM's readers expect for this config."""
    shape = shape_from_config(config)
    vocab = config["vocab_size"]
    assert isinstance(vocab, int)
    qcfg = config.get("quantization_config")
    spec = {n: (torch.bfloat16, s) for n, s in weight_spec(shape, vocab).items()}
    if qcfg is None:
        return spec
    assert isinstance(qcfg, dict)
    codec = codec_for(qcfg)
    for module, (n, k) in linear_shapes(shape).items():
        on_disk = codec.module_tensors(module, n, k, qcfg)
        if on_disk is None:
            continue
        del spec[f"{module}.weight"]
        spec.update({f"{module}.{suffix}": s for suffix, s in on_disk.items()})
    return spec


def dequantized_weights(
    config: dict[str, object], tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The bf16 weights a quantized checkpoint stands for (twin layout)."""
    qcfg = config["quantization_config"]
    assert isinstance(qcfg, dict)
    codec = codec_for(qcfg)
    shape = shape_from_config(config)
    deq = {n: t for n, t in tensors.items() if n.endswith(".weight")}
    for module, (n, k) in linear_shapes(shape).items():
        if codec.module_tensors(module, n, k, qcfg) is not None:
            deq[f"{module}.weight"] = codec.dequantize(module, tensors, qcfg)
    return deq


def compare_greedy(
    base: dict[str, torch.Tensor],
    other: dict[str, torch.Tensor],
    shape: Shape,
    tok: Tokenizer,
    prompts: list[str],
    n: int = 16,
    other_hook: ActHook | None = None,
) -> str:
    """How often greedy decoding of ``other`` matches ``base``.

    Reports free-running agreement (all n tokens identical) and
    teacher-forced top-1 agreement along base's greedy path (per-step flip
    rate, which is what a robust comparison should be built on).
    """
    identical = tf_match = tf_total = 0
    for prompt in prompts:
        ids = tok.encode(prompt).ids
        path = reference_greedy(base, shape, ids, n)
        identical += path == reference_greedy(other, shape, ids, n, other_hook)
        logits = reference_logits(other, shape, ids + path[:-1], other_hook)
        top1 = logits[len(ids) - 1 :].argmax(-1).tolist()
        tf_match += sum(x == y for x, y in zip(top1, path, strict=True))
        tf_total += n
    return (
        f"{n}-token greedy identical for {identical}/{len(prompts)} prompts; "
        f"teacher-forced top-1 {tf_match}/{tf_total}"
    )


def verify(model_dir: Path, twin_dir: Path | None) -> list[str]:
    """Self-check a written checkpoint; returns a list of problems (empty = ok)."""
    problems: list[str] = []
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") == GPT_OSS:
        return verify_gptoss(model_dir, twin_dir)
    tensors = load_tensors(model_dir)
    spec = expected_tensors(config)
    for name in sorted(set(spec) | set(tensors)):
        if name not in tensors:
            problems.append(f"missing tensor {name}")
        elif name not in spec:
            problems.append(f"unexpected tensor {name}")
        else:
            dtype, dims = spec[name]
            t = tensors[name]
            if t.dtype != dtype or tuple(t.shape) != dims:
                problems.append(
                    f"{name}: got {t.dtype} {tuple(t.shape)}, want {dtype} {dims}"
                )
            elif not torch.isfinite(t.float()).all():
                problems.append(f"{name}: non-finite values")
    for fname in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if not (model_dir / fname).exists():
            problems.append(f"missing {fname}")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    if tok.get_vocab_size() != config["vocab_size"]:
        problems.append(
            f"tokenizer vocab {tok.get_vocab_size()} != config {config['vocab_size']}"
        )
    if problems:
        return problems
    print(f"  {len(tensors)} tensors: names, dtypes, shapes ok")

    shape = shape_from_config(config)
    qcfg = config.get("quantization_config")
    prompts = PROMPTS
    if qcfg is None:
        bf16 = tensors
    else:
        twin_dir = twin_dir or model_dir.with_name(model_dir.name + "-bf16twin")
        twin = load_tensors(twin_dir)
        deq = dequantized_weights(config, tensors)
        if set(deq) != set(twin):
            problems.append(f"twin {twin_dir} has different tensor names")
            return problems
        bad = [n for n in deq if not torch.equal(deq[n], twin[n])]
        if bad:
            problems.append(f"twin differs from dequantized weights: {bad[:5]}")
            return problems
        print(f"  twin {twin_dir} == dequantized weights (bit-exact)")
        bf16 = twin

        # Emulate the activation quantization too, and see how often greedy
        # decoding of the quantized model agrees with the twin.
        assert isinstance(qcfg, dict)
        act = codec_for(qcfg).activation(tensors, qcfg)
        if act is None:
            print("  weight-only format: the twin is the whole model")
        else:
            kind, hook = act
            stats = compare_greedy(bf16, bf16, shape, tok, prompts, other_hook=hook)
            print(f"  emulated {kind} (weights + activations) vs twin: {stats}")

    # Control: a real bug (experts 0 and 1 swapped in every layer) must be
    # much more visible than the fp8 noise above.
    swapped = dict(bf16)
    for layer in range(shape.layers):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            a = f"model.layers.{layer}.mlp.experts.0.{proj}.weight"
            b = f"model.layers.{layer}.mlp.experts.1.{proj}.weight"
            swapped[a], swapped[b] = bf16[b], bf16[a]
    stats = compare_greedy(bf16, swapped, shape, tok, prompts)
    print(f"  control, experts 0<->1 swapped vs bf16: {stats}")

    outs = {}
    for prompt in prompts:
        ids = tok.encode(prompt).ids
        outs[prompt] = tok.decode(reference_greedy(bf16, shape, ids, 16))
    for prompt, text in list(outs.items())[:3]:
        print(f"  reference greedy: {prompt!r} -> {text!r}")
    if len(set(outs.values())) < len(prompts) // 2:
        problems.append(f"degenerate outputs: {outs}")
    return problems


def hf_crosscheck(model_dir: Path) -> list[str]:
    """Load a bf16 dir with transformers and compare logits to the reference."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        print("  transformers not installed; skipping HF cross-check")
        return []
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") == GPT_OSS:
        return hf_crosscheck_gptoss(model_dir)
    shape = shape_from_config(config)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    )
    hf_tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    prompt = PROMPTS[0]
    ids = hf_tok(prompt)["input_ids"]
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0]
    ref = reference_logits(load_tensors(model_dir), shape, ids)
    err = float((hf - ref).abs().max())
    print(f"  transformers {type(model).__name__}: max |logit diff| vs ref {err:.2e}")
    if err > 1e-3:
        return [f"transformers logits differ from reference by {err}"]
    if hf_tok.eos_token != EOS_TOKEN:
        return [f"transformers tokenizer eos {hf_tok.eos_token!r}"]
    return []
