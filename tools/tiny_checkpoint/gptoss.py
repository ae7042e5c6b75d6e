"""A tiny biased MoE in the GPT-OSS style (``gpt-oss``), for online FP8.

Why: GPT-OSS is the MoE whose experts have biases and the SwiGLU-OAI
activation (``swigluoai``); quantizing it must keep the biases.  The
checkpoint is bf16, served with ``--quantization fp8`` (vLLM quantizes the
experts and the attention Linears while loading), next to a bf16 twin that
holds the weights online FP8 computes with.

Layout: what Hugging Face transformers' ``GptOssForCausalLM`` saves
(``modeling_gpt_oss.py``; e.g. the bf16 conversions of openai/gpt-oss-20b),
which vLLM 0.19.1's ``GptOssForCausalLM`` (``models/gpt_oss.py``) reads,
per layer ``L`` (prefix ``model.layers.L``):

* ``self_attn.{q,k,v,o}_proj.{weight,bias}`` (``attention_bias``: true) and
  ``self_attn.sinks`` [heads] (one attention-sink logit per head);
* ``mlp.router.{weight,bias}`` [E, H], [E]: logits = x W^T + b, top-k over
  the logits, softmax over the k selected (= softmax, top-k, renormalize);
* ``mlp.experts.gate_up_proj`` [E, H, 2I] (used as ``x @ W``, so stored
  input-major, the transpose of a Linear weight), its columns *interleaved*
  gate, up, gate, up, ...; ``mlp.experts.gate_up_proj_bias`` [E, 2I] in the
  same order; ``mlp.experts.down_proj`` [E, I, H] and
  ``mlp.experts.down_proj_bias`` [E, H].  vLLM maps them to ``w13_weight``
  (transposed per expert to [E, 2I, H], still interleaved), ``w13_bias``,
  ``w2_weight`` [E, H, I] and ``w2_bias``;
* ``input_layernorm`` / ``post_attention_layernorm`` weights; plus
  ``model.embed_tokens``, ``model.norm`` and ``lm_head``.

The expert MLP is SwiGLU-OAI with the biases inside:
``gate, up = (x @ W13 + b13)[::2], [1::2]``; ``gate = min(gate, 7)``,
``up = clamp(up, -7, 7)``; ``h = (up + 1) * gate * sigmoid(1.702 * gate)``;
``out = h @ W2 + b2``.  Attention: grouped-query, YaRN rotary embedding
(GPT-OSS's parameters), sinks, and a sliding window on even layers (vLLM
uses ``layer_idx % 2 == 0``; ``layer_types`` says the same).

The twin (``OUT-bf16twin``, same layout) holds what vLLM's online FP8
computes with: every expert's w13 and w2 and the fused q/k/v and o_proj
weights rounded to FP8 E4M3 with one dynamic scale per tensor (amax / 448),
dequantized to bf16, as ``Fp8OnlineMoEMethod`` / ``Fp8OnlineLinearMethod``
do.  Biases, sinks, norms, router, embeddings and lm_head are not
quantized, so they are the master's bit for bit.  Served with
``--quantization fp8`` on CPU, the experts run W8A16 (per-expert path,
biases added there) and so do the FP8 attention Linears, so only kernel
rounding separates the two.  The e2e comparison
(``tests/e2e/test_e2e_gptoss_online_fp8.py``) runs it through vLLM's
offline ``LLM`` API: ``vllm serve`` of a gpt_oss model needs the harmony
vocabulary file at startup, which cannot be fetched offline.

Magnitudes: see ``init_weights``; expert biases are large enough that a
kernel dropping them changes the greedy text well beyond what the e2e rule
tolerates (``tests/test_tiny_checkpoint_gptoss.py`` applies
``tests/e2e/e2e_lib.judge`` to the reference: 98/128 teacher-forced flips,
against 11/128 for the bf16 model vs its FP8 twin).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from .common import (
    EOS_TOKEN,
    PROMPTS,
    SPECIAL_TOKENS,
    _rms_norm,
    load_tensors,
    train_tokenizer,
    write_checkpoint,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
SCHEME = "gpt-oss"
MODEL_TYPE = "gpt_oss"
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
# The harmony format's special tokens (o200k_harmony, which gpt-oss uses):
# vLLM serves gpt_oss models with the harmony reasoning parser, which looks
# them up in the vocabulary at startup.
HARMONY_TOKENS = [
    "<|startoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
]


@dataclass(frozen=True)
class GptOssShape:
    """GPT-OSS dimensions, scaled down (gpt-oss-20b: hidden 2880, 24
    layers, 32 experts, top-4, 64 heads, 8 kv heads, window 128)."""

    hidden: int = 256
    layers: int = 2
    experts: int = 8
    top_k: int = 4
    intermediate: int = 128  # per expert
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    # Shorter than the prompts plus 16 generated tokens, so the window of
    # layer 0 matters in the e2e comparisons.
    sliding_window: int = 16
    max_positions: int = 131072
    rope_theta: float = 150000.0
    # YaRN as in gpt-oss-20b's config.json.
    yarn_factor: float = 32.0
    yarn_original_max: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rms_eps: float = 1e-5
    vocab_target: int = 2000


@dataclass(frozen=True)
class Magnitudes:
    """Standard deviations of the random weights (see init_weights)."""

    embed: float = 2.0
    lm_head: float = 0.25
    attn_bias: float = 0.1
    sinks: float = 1.0
    router_bias: float = 0.5
    gate_up_bias: float = 1.0
    down_bias: float = 1.0


def layer_types(shape: GptOssShape) -> list[str]:
    return [
        "sliding_attention" if i % 2 == 0 else "full_attention"
        for i in range(shape.layers)
    ]


def hf_config(shape: GptOssShape, vocab_size: int, eos_id: int) -> dict[str, object]:
    """config.json, modelled on a bf16 openai/gpt-oss-20b config.json."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": MODEL_TYPE,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "experts_per_token": shape.top_k,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initial_context_length": shape.yarn_original_max,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "layer_types": layer_types(shape),
        "max_position_embeddings": shape.max_positions,
        "num_attention_heads": shape.heads,
        "num_experts_per_tok": shape.top_k,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "num_local_experts": shape.experts,
        "output_router_logits": False,
        "rms_norm_eps": shape.rms_eps,
        "rope_scaling": {
            "beta_fast": shape.yarn_beta_fast,
            "beta_slow": shape.yarn_beta_slow,
            "factor": shape.yarn_factor,
            "original_max_position_embeddings": shape.yarn_original_max,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": shape.rope_theta,
        "router_aux_loss_coef": 0.9,
        "sliding_window": shape.sliding_window,
        "swiglu_limit": SWIGLU_LIMIT,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def shape_from_config(cfg: dict[str, object]) -> GptOssShape:
    rope = cfg["rope_scaling"]
    assert isinstance(rope, dict)
    return GptOssShape(
        hidden=int(cfg["hidden_size"]),  # type: ignore[call-overload]
        layers=int(cfg["num_hidden_layers"]),  # type: ignore[call-overload]
        experts=int(cfg["num_local_experts"]),  # type: ignore[call-overload]
        top_k=int(cfg["num_experts_per_tok"]),  # type: ignore[call-overload]
        intermediate=int(cfg["intermediate_size"]),  # type: ignore[call-overload]
        heads=int(cfg["num_attention_heads"]),  # type: ignore[call-overload]
        kv_heads=int(cfg["num_key_value_heads"]),  # type: ignore[call-overload]
        head_dim=int(cfg["head_dim"]),  # type: ignore[call-overload]
        sliding_window=int(cfg["sliding_window"]),  # type: ignore[call-overload]
        max_positions=int(cfg["max_position_embeddings"]),  # type: ignore[call-overload]
        rope_theta=float(cfg["rope_theta"]),  # type: ignore[arg-type]
        yarn_factor=float(rope["factor"]),
        yarn_original_max=int(rope["original_max_position_embeddings"]),
        yarn_beta_fast=float(rope["beta_fast"]),
        yarn_beta_slow=float(rope["beta_slow"]),
        rms_eps=float(cfg["rms_norm_eps"]),  # type: ignore[arg-type]
    )


EXPERT_BIASES = ("mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias")


def weight_spec(shape: GptOssShape, vocab: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the bf16 checkpoint (HF layout)."""
    h, i, e = shape.hidden, shape.intermediate, shape.experts
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    spec: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        spec[f"{p}.input_layernorm.weight"] = (h,)
        spec[f"{p}.post_attention_layernorm.weight"] = (h,)
        for proj, out_dim, in_dim in (
            ("q_proj", q, h),
            ("k_proj", kv, h),
            ("v_proj", kv, h),
            ("o_proj", h, q),
        ):
            spec[f"{p}.self_attn.{proj}.weight"] = (out_dim, in_dim)
            spec[f"{p}.self_attn.{proj}.bias"] = (out_dim,)
        spec[f"{p}.self_attn.sinks"] = (shape.heads,)
        spec[f"{p}.mlp.router.weight"] = (e, h)
        spec[f"{p}.mlp.router.bias"] = (e,)
        spec[f"{p}.mlp.experts.gate_up_proj"] = (e, h, 2 * i)
        spec[f"{p}.mlp.experts.gate_up_proj_bias"] = (e, 2 * i)
        spec[f"{p}.mlp.experts.down_proj"] = (e, i, h)
        spec[f"{p}.mlp.experts.down_proj_bias"] = (e, h)
    return spec


def init_weights(
    shape: GptOssShape, vocab: int, seed: int, mag: Magnitudes = Magnitudes()
) -> dict[str, torch.Tensor]:
    """Random bf16 weights, deterministic for a seed.

    Matrices use std 1/sqrt(fan_in) (the expert matrices are stored
    input-major, so fan_in is their middle dimension); embeddings, lm_head
    and norms as in the Qwen3-MoE checkpoints (common.init_weights).
    Expert biases have std 1: the same size as the matrix products they are
    added to, so they move the SwiGLU-OAI gates (and which clamp applies) and
    every expert's output; measured with reference_logits, zeroing them
    changes most greedy tokens (see the module docstring).  Sinks have std 1 (a
    sink logit comparable to the attention scores), the router bias 0.5.
    """
    gen = torch.Generator().manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, dims in sorted(weight_spec(shape, vocab).items()):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(dims, generator=gen)
        elif name == "model.embed_tokens.weight":
            t = mag.embed * torch.randn(dims, generator=gen)
        elif name == "lm_head.weight":
            t = mag.lm_head * torch.randn(dims, generator=gen)
        elif name.endswith(".sinks"):
            t = mag.sinks * torch.randn(dims, generator=gen)
        elif name.endswith("router.bias"):
            t = mag.router_bias * torch.randn(dims, generator=gen)
        elif name.endswith("gate_up_proj_bias"):
            t = mag.gate_up_bias * torch.randn(dims, generator=gen)
        elif name.endswith("down_proj_bias"):
            t = mag.down_bias * torch.randn(dims, generator=gen)
        elif name.endswith(".bias"):
            t = mag.attn_bias * torch.randn(dims, generator=gen)
        elif name.endswith(("gate_up_proj", "down_proj")):
            t = torch.randn(dims, generator=gen) / math.sqrt(dims[1])
        else:
            t = torch.randn(dims, generator=gen) / math.sqrt(dims[-1])
        weights[name] = t.to(torch.bfloat16)
    return weights


def without_expert_biases(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same weights with every expert bias zeroed (what a kernel that
    drops the biases computes)."""
    return {
        n: torch.zeros_like(t) if n.endswith(EXPERT_BIASES) else t for n, t in w.items()
    }


# --------------------------------------------------------------------------
# Online FP8, as vLLM does it while loading (the twin)
# --------------------------------------------------------------------------


def fp8_round_per_tensor(w: torch.Tensor) -> torch.Tensor:
    """bf16 -> FP8 E4M3 with one dynamic scale (amax / 448) -> bf16, the
    arithmetic of vLLM's dynamic per-tensor scaled_fp8_quant (multiply by
    the reciprocal of the scale, clamp, round to nearest) and of the CPU
    experts' dequantization (fp8 * scale in float32, rounded to bf16)."""
    x = w.float()
    scale = (x.abs().amax() / FP8_MAX).clamp(min=1.0 / (FP8_MAX * 512.0))
    q = (x * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return (q.float() * scale).to(torch.bfloat16)


def online_fp8_twin(
    w: dict[str, torch.Tensor], shape: GptOssShape
) -> dict[str, torch.Tensor]:
    """The weights ``--quantization fp8`` computes with: per expert one scale
    for w13 (gate_up_proj) and one for w2 (down_proj); one for the fused
    q/k/v weight and one for o_proj of each layer."""
    twin = dict(w)
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        for name in (f"{p}.mlp.experts.gate_up_proj", f"{p}.mlp.experts.down_proj"):
            twin[name] = torch.stack([fp8_round_per_tensor(x) for x in w[name]])
        a = f"{p}.self_attn"
        qkv = [f"{a}.{proj}.weight" for proj in ("q_proj", "k_proj", "v_proj")]
        fused = fp8_round_per_tensor(torch.cat([w[n] for n in qkv]))
        for name, part in zip(
            qkv, fused.split([w[n].shape[0] for n in qkv]), strict=True
        ):
            twin[name] = part.contiguous()
        twin[f"{a}.o_proj.weight"] = fp8_round_per_tensor(w[f"{a}.o_proj.weight"])
    return twin


# --------------------------------------------------------------------------
# Reference forward (pure torch, fp32)
# --------------------------------------------------------------------------


def yarn_inv_freq_and_mscale(shape: GptOssShape) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): per-frequency blend of the original (high
    frequencies) and the factor-interpolated (low frequencies) rotary
    frequencies, with a linear ramp between the dims that rotate beta_fast
    and beta_slow times over the original context; cos/sin scaled by
    0.1 ln(factor) + 1.  ``truncate: false``: the ramp ends are not rounded."""
    dim, base = shape.head_dim, shape.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (shape.yarn_factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        ctx = shape.yarn_original_max
        return dim * math.log(ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(correction_dim(shape.yarn_beta_fast), 0.0)
    high = min(correction_dim(shape.yarn_beta_slow), dim - 1.0)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(
        0, 1
    )
    keep = 1.0 - ramp  # 1: original frequency, 0: interpolated
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    mscale = 0.1 * math.log(shape.yarn_factor) + 1.0 if shape.yarn_factor > 1 else 1.0
    return inv_freq.float(), mscale


def _rope(x: torch.Tensor, inv_freq: torch.Tensor, mscale: float) -> torch.Tensor:
    """Neox-style rotary embedding; x is [heads, seq, head_dim]."""
    seq = x.shape[-2]
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    cos = torch.cat([freqs.cos(), freqs.cos()], -1) * mscale
    sin = torch.cat([freqs.sin(), freqs.sin()], -1) * mscale
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def swiglu_oai(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(max=SWIGLU_LIMIT)
    up = up.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return (up + 1) * gate * torch.sigmoid(SWIGLU_ALPHA * gate)


def reference_logits(
    w: dict[str, torch.Tensor], shape: GptOssShape, ids: list[int]
) -> torch.Tensor:
    """Logits [seq, vocab] of the bf16 model computed in fp32."""
    f = {k: v.float() for k, v in w.items()}
    seq = len(ids)
    inv_freq, mscale = yarn_inv_freq_and_mscale(shape)
    pos = torch.arange(seq)
    causal = pos[None, :] <= pos[:, None]
    windowed = causal & (pos[:, None] - pos[None, :] < shape.sliding_window)
    h = f["model.embed_tokens.weight"][torch.tensor(ids)]
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        a = f"{p}.self_attn"

        def lin(proj: str, x: torch.Tensor, a: str = a) -> torch.Tensor:
            return x @ f[f"{a}.{proj}.weight"].t() + f[f"{a}.{proj}.bias"]

        x = _rms_norm(h, f[f"{p}.input_layernorm.weight"], shape.rms_eps)
        q = lin("q_proj", x).view(seq, shape.heads, shape.head_dim).transpose(0, 1)
        k = lin("k_proj", x).view(seq, shape.kv_heads, shape.head_dim).transpose(0, 1)
        v = lin("v_proj", x).view(seq, shape.kv_heads, shape.head_dim).transpose(0, 1)
        q, k = _rope(q, inv_freq, mscale), _rope(k, inv_freq, mscale)
        rep = shape.heads // shape.kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        mask = windowed if layer % 2 == 0 else causal
        scores = (q @ k.transpose(1, 2)) / math.sqrt(shape.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        # The sink: one more logit per head that takes probability mass and
        # contributes no value.
        sink = f[f"{a}.sinks"][:, None, None].expand(-1, seq, 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        o = (probs @ v).transpose(0, 1).reshape(seq, -1)
        h = h + lin("o_proj", o)

        x = _rms_norm(h, f[f"{p}.post_attention_layernorm.weight"], shape.rms_eps)
        m = f"{p}.mlp"
        logits = x @ f[f"{m}.router.weight"].t() + f[f"{m}.router.bias"]
        top_v, top_i = logits.topk(shape.top_k, -1)
        top_p = top_v.softmax(-1)
        moe = torch.zeros_like(x)
        for e in range(shape.experts):
            rows, slot = (top_i == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x[rows]
            gate_up = xe @ f[f"{m}.experts.gate_up_proj"][e]
            gate_up = gate_up + f[f"{m}.experts.gate_up_proj_bias"][e]
            out = swiglu_oai(gate_up) @ f[f"{m}.experts.down_proj"][e]
            out = out + f[f"{m}.experts.down_proj_bias"][e]
            moe[rows] += top_p[rows, slot, None] * out
        h = h + moe
    h = _rms_norm(h, f["model.norm.weight"], shape.rms_eps)
    return h @ f["lm_head.weight"].t()


def reference_greedy(
    w: dict[str, torch.Tensor], shape: GptOssShape, ids: list[int], n: int
) -> list[int]:
    ids = list(ids)
    out: list[int] = []
    for _ in range(n):
        nxt = int(reference_logits(w, shape, ids)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


# --------------------------------------------------------------------------
# Writing and verifying
# --------------------------------------------------------------------------


def generate_gptoss(
    out: Path,
    seed: int,
    twin_dir: Path | None,
    shards: int,
    shape: GptOssShape | None = None,
) -> list[Path]:
    """Write the bf16 GPT-OSS-style checkpoint to ``out`` and its online-FP8
    twin; returns [out, twin]."""
    shape = shape or GptOssShape()
    tok = train_tokenizer(shape.vocab_target, [*SPECIAL_TOKENS, *HARMONY_TOKENS])
    vocab = tok.get_vocab_size()
    eos_id = tok.token_to_id(EOS_TOKEN)
    weights = init_weights(shape, vocab, seed)
    config = hf_config(shape, vocab, eos_id)
    write_checkpoint(out, weights, config, tok, eos_id, shards)
    twin_out = twin_dir or out.with_name(out.name + "-bf16twin")
    write_checkpoint(
        twin_out, online_fp8_twin(weights, shape), config, tok, eos_id, shards
    )
    return [out, twin_out]


def verify_gptoss(model_dir: Path, twin_dir: Path | None) -> list[str]:
    """Names, dtypes and shapes; the twin is the online-FP8 rounding of the
    checkpoint; greedy text is prompt-dependent and depends on the expert
    biases."""
    problems: list[str] = []
    config = json.loads((model_dir / "config.json").read_text())
    shape = shape_from_config(config)
    vocab = config["vocab_size"]
    tensors = load_tensors(model_dir)
    spec = weight_spec(shape, vocab)
    for name in sorted(set(spec) | set(tensors)):
        if name not in tensors:
            problems.append(f"missing tensor {name}")
        elif name not in spec:
            problems.append(f"unexpected tensor {name}")
        elif tensors[name].dtype != torch.bfloat16 or (
            tuple(tensors[name].shape) != spec[name]
        ):
            t = tensors[name]
            problems.append(
                f"{name}: got {t.dtype} {tuple(t.shape)}, "
                f"want {torch.bfloat16} {spec[name]}"
            )
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    if tok.get_vocab_size() != vocab:
        problems.append(f"tokenizer vocab {tok.get_vocab_size()} != config {vocab}")
    if problems:
        return problems
    print(f"  {len(tensors)} tensors: names, dtypes, shapes ok (GPT-OSS HF layout)")

    twin_dir = twin_dir or model_dir.with_name(model_dir.name + "-bf16twin")
    twin = load_tensors(twin_dir)
    expected = online_fp8_twin(tensors, shape)
    if set(twin) != set(expected):
        return [f"twin {twin_dir} has different tensor names"]
    bad = sorted(n for n in expected if not torch.equal(expected[n], twin[n]))
    if bad:
        return [f"twin {twin_dir} is not the online-FP8 rounding: {bad[:5]}"]
    print(f"  twin {twin_dir} == online FP8 rounding of the checkpoint (bit-exact)")

    # Greedy on the twin; the same path teacher-forced without the expert
    # biases shows how much they matter.
    outs, flips, total = {}, 0, 0
    no_bias = without_expert_biases(twin)
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids
        path = reference_greedy(twin, shape, ids, 16)
        outs[prompt] = tok.decode(path)
        tf = reference_logits(no_bias, shape, ids + path[:-1])[len(ids) - 1 :]
        flips += sum(a != b for a, b in zip(tf.argmax(-1).tolist(), path))
        total += len(path)
    for prompt, text in list(outs.items())[:3]:
        print(f"  reference greedy: {prompt!r} -> {text!r}")
    print(
        f"  expert biases zeroed: {flips}/{total} teacher-forced greedy tokens change"
    )
    if len(set(outs.values())) < len(PROMPTS) // 2:
        problems.append(f"degenerate outputs: {outs}")
    if flips < total // 4:
        problems.append(f"expert biases change only {flips}/{total} tokens")
    return problems


def hf_crosscheck_gptoss(model_dir: Path) -> list[str]:
    """Load the checkpoint with transformers' GptOssForCausalLM (eager
    attention, float32) and compare its logits with reference_logits."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("  transformers not installed; skipping HF cross-check")
        return []
    config = json.loads((model_dir / "config.json").read_text())
    shape = shape_from_config(config)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        dtype=torch.float32,
        local_files_only=True,
        attn_implementation="eager",
    )
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    # Longer than the sliding window, so the window is checked too.
    ids = tok.encode(" ".join(PROMPTS[:4])).ids
    assert len(ids) > shape.sliding_window
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0]
    ref = reference_logits(load_tensors(model_dir), shape, ids)
    err = float((hf - ref).abs().max())
    print(f"  transformers {type(model).__name__}: max |logit diff| vs ref {err:.2e}")
    if err > 1e-3:
        return [f"transformers logits differ from reference by {err}"]
    return []
