"""Common code of the tiny checkpoint writers: model, tokenizer, reference.

Everything here is format-independent: the Qwen3-MoE shape and config.json,
the deterministic random bf16 master weights, the locally trained tokenizer,
a pure-torch fp32 reference forward (calibration and self-checks), the types
a format writer works with, and reading / writing checkpoint directories.
The format families live in their own modules (``fp8``, ``int8``,
``wna16``, ``mxfp8``) and are registered in ``schemes``.
"""

from __future__ import annotations

import os

# Nothing in here may touch the network; make HF libraries refuse to try.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import json
import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A few KB of plain English to train the tokenizer on and to calibrate static
# activation scales with.  Written for this script; no external source.
CORPUS = """\
The capital of France is Paris. The capital of Germany is Berlin. The capital
of Italy is Rome, and the capital of Spain is Madrid. Paris is known for its
museums, its cafes and the long river that runs through the middle of the city.
Berlin is a large city with many parks, lakes and old train stations. Rome is
one of the oldest cities in Europe, and people have lived there for thousands
of years. Madrid sits on a high plain in the center of the country.

The weather today is cold and windy, with a chance of rain in the afternoon.
Tomorrow the sun will come out and the temperature will rise a little. In the
summer the days are long and warm; in the winter the nights are long and the
roads are often covered with snow and ice. Farmers watch the sky closely,
because a late frost in spring can ruin a whole year of work.

To make a simple bread, mix flour, water, salt and a little yeast in a large
bowl. Knead the dough for ten minutes until it is smooth, then let it rest in a
warm place for an hour. Shape the loaf, bake it in a hot oven for about forty
minutes, and let it cool before you cut it. A good soup starts with onions,
carrots and celery cooked slowly in butter, then water or stock, a few herbs,
and plenty of patience.

A computer program is a list of instructions that a machine can follow. Good
programs are easy to read, easy to test and easy to change. When a program
fails, the first step is to reproduce the failure, the second step is to read
the error message carefully, and the third step is to make the smallest change
that fixes the problem. Tests make it safe to change code later, because they
tell you quickly when something that used to work has stopped working.

Water boils at one hundred degrees at sea level and freezes at zero. Light from
the sun takes about eight minutes to reach the earth. The moon goes around the
earth about once a month, and the earth goes around the sun once a year. Plants
use light, water and air to make sugar, and they give off the oxygen that
animals need to breathe. The ocean covers most of the surface of the planet.

Once upon a time there was a small village at the edge of a dark forest. The
people of the village were farmers and weavers, and every autumn they held a
market in the square. One year a stranger arrived with a cart full of books.
He said that he would trade one book for one story, and by the end of the week
every child in the village had a book, and the stranger had a thousand stories.

The train leaves the station at seven in the morning and arrives in the city
before noon. Passengers may bring one large bag and one small bag. Please keep
your ticket until the end of the journey, and ask the conductor if you need
help. The next train to the coast departs from platform four at half past nine.

Music is made of sound and silence arranged in time. A song may be slow or
fast, loud or soft, happy or sad. Many people learn to play the piano or the
guitar when they are young, and some keep playing for the rest of their lives.
A small band can fill a room with noise, but a single voice can fill it with
feeling. The best teachers say that practice matters more than talent.

History is the study of what people did, what they believed, and why things
changed. Old letters, maps, coins and buildings all tell part of the story.
Historians compare many sources, because every source has a point of view.
The invention of writing, the printing press and the telephone each changed
how quickly ideas could travel from one place to another.

The market opens at eight and closes at six. Apples, pears, plums and grapes
are sold by the kilogram; bread, cheese and eggs are sold by the piece. On
Saturdays there are more people, more noise and more choice. Children like the
stall that sells honey, and old men like the stall that sells newspapers and
strong black coffee. In the evening the square is quiet again.

Numbers are everywhere: one, two, three, four, five, six, seven, eight, nine,
ten. Twelve months make a year, seven days make a week, and sixty minutes make
an hour. The sum of two and two is four, and half of ten is five. Engineers use
numbers to build bridges that stand for a hundred years, and doctors use them
to measure the health of their patients.

Foxes, wolves and bears live in the northern woods, while lizards, snakes and
camels are at home in the desert. Whales sing to each other across enormous
distances, and dolphins hunt together in clever groups. Bees visit thousands of
flowers every day, carrying pollen from blossom to blossom. An owl can turn its
head almost all the way around, and a hummingbird can fly backwards.

The football match began in bright sunshine, but by the second half a heavy
storm had turned the pitch into mud. The goalkeeper made three brilliant saves,
the striker missed an easy chance, and the crowd sang until the final whistle.
Tennis, cricket, swimming, cycling and basketball are popular in many countries,
and marathon runners train for months before a race.

Doctors and nurses work long shifts in the hospital. A patient with a fever
should drink plenty of fluids and rest. Vaccines teach the immune system to
recognise dangerous viruses and bacteria. Regular exercise, a balanced diet and
enough sleep protect the heart, the lungs and the brain. Pharmacists explain
how often to take each medicine and which side effects to expect.

Astronomers use giant telescopes to study distant galaxies, nebulae and comets.
Jupiter is the largest planet in the solar system; Mercury is the smallest and
the closest to the sun. Rockets must reach tremendous speed to escape gravity,
and astronauts aboard the space station grow vegetables, repair equipment and
photograph hurricanes swirling over the oceans below.

The architect sketched a cathedral with tall windows, narrow arches and a
copper roof that would slowly turn green. Bricks, concrete, timber, steel and
glass each behave differently in heat, frost and earthquakes. Engineers check
every beam and bolt, plumbers install pipes, electricians connect cables, and
painters finish the walls in pale yellow and deep blue.

Economists argue about inflation, wages, taxes, interest rates and trade. When
prices climb quickly, families must budget carefully; when unemployment falls,
businesses compete harder for workers. Banks lend money to companies that want
to expand, and investors buy shares hoping their value will grow. A recession
usually ends, although nobody can predict exactly when.

The sailors raised the anchor at dawn, hoisted the sails and steered toward the
lighthouse. Gulls circled above the harbour, fishermen mended their nets on the
quay, and a ferry carrying tourists, bicycles and crates of oranges sounded its
horn. Navigators once relied on the stars, a compass and a sextant; today
satellites guide almost every vessel.

In the garden we planted tulips, roses, lavender, tomatoes, beans and
strawberries. Earthworms keep the soil healthy, and ladybirds eat the aphids
that damage young leaves. Gardeners prune hedges in winter, sow seeds in spring,
water thirsty plants in summer and rake fallen leaves in autumn. Compost turns
kitchen scraps into rich dark earth.

Chess players think several moves ahead. The knight jumps in an unusual shape,
the bishop slides diagonally, the rook travels in straight lines and the queen
combines both powers. A careless pawn move can weaken the king for the rest of
the game. Grandmasters study famous openings, endgames and puzzles for hours.

Mountaineers carry ropes, helmets, crampons and warm jackets. Above a certain
altitude the air becomes thin, and climbers breathe slowly to avoid dizziness.
Glaciers carve valleys, avalanches thunder down steep slopes, and alpine meadows
bloom with tiny purple flowers for a few short weeks each year.

The library was quiet except for the rustle of pages and the soft ticking of a
clock. Students borrowed dictionaries, encyclopedias, novels, poetry, atlases and
biographies. The librarian recommended a mystery about a detective who solved
crimes by noticing small details that everyone else ignored, like a missing
button, a muddy shoe or an unusual smell of perfume.
"""

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "To make a simple bread,",
    "A computer program is",
    "The weather today is",
    "Numbers are everywhere:",
    "The train leaves the station at",
    "Music is made of",
    "The market opens at",
    "Water boils at",
    "Paris is known for",
    "Good programs are",
]


# --------------------------------------------------------------------------
# Model shape and weights
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """Qwen3-MoE dimensions. hidden != moe_intermediate on purpose."""

    hidden: int = 256
    layers: int = 2
    experts: int = 8
    top_k: int = 2
    moe_intermediate: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    max_positions: int = 2048
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    vocab_target: int = 2000


# Named shapes (``--shape``). "tiny" is what the tests serve: its weights fit
# in the caches and a step's time is mostly the calls around the kernels.
# "qwen3-30b-a3b-2l" is two layers of Qwen3-30B-A3B at its real widths (its
# experts, 1.2 GB a layer in bf16, are read from memory at every step), for
# benchmarks of what serving a real MoE model spends on its layers.
SHAPES: dict[str, Shape] = {
    "tiny": Shape(),
    "qwen3-30b-a3b-2l": Shape(
        hidden=2048,
        experts=128,
        top_k=8,
        moe_intermediate=768,
        heads=32,
        kv_heads=4,
        head_dim=128,
    ),
}


def hf_config(shape: Shape, vocab_size: int, eos_id: int) -> dict[str, object]:
    """config.json contents, modelled on Qwen/Qwen3-30B-A3B's config."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "decoder_sparse_step": 1,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        # Dense MLP size; unused because every layer is sparse.
        "intermediate_size": 4 * shape.hidden,
        "max_position_embeddings": shape.max_positions,
        "max_window_layers": shape.layers,
        "mlp_only_layers": [],
        "moe_intermediate_size": shape.moe_intermediate,
        "norm_topk_prob": True,
        "num_attention_heads": shape.heads,
        "num_experts": shape.experts,
        "num_experts_per_tok": shape.top_k,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "output_router_logits": False,
        "rms_norm_eps": shape.rms_eps,
        "rope_scaling": None,
        "rope_theta": shape.rope_theta,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def shape_from_config(cfg: dict[str, object]) -> Shape:
    def get(key: str) -> int:
        value = cfg[key]
        assert isinstance(value, int), key
        return value

    return Shape(
        hidden=get("hidden_size"),
        layers=get("num_hidden_layers"),
        experts=get("num_experts"),
        top_k=get("num_experts_per_tok"),
        moe_intermediate=get("moe_intermediate_size"),
        heads=get("num_attention_heads"),
        kv_heads=get("num_key_value_heads"),
        head_dim=get("head_dim"),
        max_positions=get("max_position_embeddings"),
        rope_theta=float(cfg["rope_theta"]),  # type: ignore[arg-type]
        rms_eps=float(cfg["rms_norm_eps"]),  # type: ignore[arg-type]
    )


def linear_shapes(shape: Shape) -> dict[str, tuple[int, int]]:
    """[out, in] of every Linear weight (the quantizable ones + the router)."""
    h, i = shape.hidden, shape.moe_intermediate
    shapes: dict[str, tuple[int, int]] = {}
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        shapes[f"{p}.self_attn.q_proj"] = (shape.heads * shape.head_dim, h)
        shapes[f"{p}.self_attn.k_proj"] = (shape.kv_heads * shape.head_dim, h)
        shapes[f"{p}.self_attn.v_proj"] = (shape.kv_heads * shape.head_dim, h)
        shapes[f"{p}.self_attn.o_proj"] = (h, shape.heads * shape.head_dim)
        shapes[f"{p}.mlp.gate"] = (shape.experts, h)
        for e in range(shape.experts):
            shapes[f"{p}.mlp.experts.{e}.gate_proj"] = (i, h)
            shapes[f"{p}.mlp.experts.{e}.up_proj"] = (i, h)
            shapes[f"{p}.mlp.experts.{e}.down_proj"] = (h, i)
    return shapes


def unquantized_modules(shape: Shape) -> list[str]:
    """Module prefixes every quantized scheme leaves in bf16 (vLLM names)."""
    return ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(shape.layers)]


def is_quantized_module(module: str) -> bool:
    return module.endswith("_proj")


def weight_spec(shape: Shape, vocab: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the bf16 checkpoint."""
    spec: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, shape.hidden),
        "model.norm.weight": (shape.hidden,),
        "lm_head.weight": (vocab, shape.hidden),
    }
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        spec[f"{p}.input_layernorm.weight"] = (shape.hidden,)
        spec[f"{p}.post_attention_layernorm.weight"] = (shape.hidden,)
        spec[f"{p}.self_attn.q_norm.weight"] = (shape.head_dim,)
        spec[f"{p}.self_attn.k_norm.weight"] = (shape.head_dim,)
    for module, (n, k) in linear_shapes(shape).items():
        spec[f"{module}.weight"] = (n, k)
    return spec


def init_weights(shape: Shape, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Random bf16 weights, deterministic for a seed.

    Linear weights use std 1/sqrt(fan_in) (unit-variance activations through
    the stack).  Embeddings use std 2, so the token identity carries a good
    share of the residual stream: measured with the reference forward, this
    keeps greedy decoding of the fp8 variants (weights *and* fp8 activation
    rounding) equal to the bf16 twin for most prompts, while real bugs
    (swapped experts, a dropped q_norm) still change the text for most
    prompts; with std 1 fp8 activation noise alone flipped most 16-token
    continuations.  lm_head std 0.25 gives logits with std ~4 (argmax does not
    depend on it, logprobs do).  Norm weights are random around 1 so that a
    norm that is skipped or applied to the wrong tensor changes the output.
    """
    gen = torch.Generator().manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, dims in sorted(weight_spec(shape, vocab).items()):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(dims, generator=gen)
        elif name == "model.embed_tokens.weight":
            t = 2.0 * torch.randn(dims, generator=gen)
        elif name == "lm_head.weight":
            t = 0.25 * torch.randn(dims, generator=gen)
        else:
            t = torch.randn(dims, generator=gen) / math.sqrt(dims[1])
        weights[name] = t.to(torch.bfloat16)
    return weights


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------


def train_tokenizer(
    vocab_target: int, special_tokens: list[str] = SPECIAL_TOKENS
) -> Tokenizer:
    """Byte-level BPE trained on CORPUS (deterministic); ``special_tokens``
    get the first ids, in order (the first one is EOS_TOKEN)."""
    from tokenizers import decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_target,
        min_frequency=1,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    special = [t.content for _, t in sorted(tok.get_added_tokens_decoder().items())]
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in special
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in special if t != EOS_TOKEN],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out / "tokenizer_config.json", cfg)


# --------------------------------------------------------------------------
# Reference forward (pure torch, fp32) -- calibration and self-checks
# --------------------------------------------------------------------------

ActHook = Callable[[str, torch.Tensor], torch.Tensor]


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding; x is [heads, seq, head_dim]."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    cos = torch.cat([freqs.cos(), freqs.cos()], -1)
    sin = torch.cat([freqs.sin(), freqs.sin()], -1)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_logits(
    w: dict[str, torch.Tensor],
    shape: Shape,
    ids: list[int],
    act_hook: ActHook | None = None,
) -> torch.Tensor:
    """Logits [seq, vocab] of the bf16 model computed in fp32.

    ``act_hook(module, x)`` sees (and may replace) the input of every
    quantizable Linear / expert projection -- used to record calibration
    amaxes and to emulate activation quantization.
    """
    f = {k: v.float() for k, v in w.items()}
    hook: ActHook = act_hook or (lambda _m, x: x)

    def lin(module: str, x: torch.Tensor) -> torch.Tensor:
        if is_quantized_module(module):
            x = hook(module, x)
        return x @ f[f"{module}.weight"].t()

    seq = len(ids)
    h = f["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((seq, seq), float("-inf")).triu(1)
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        x = _rms_norm(h, f[f"{p}.input_layernorm.weight"], shape.rms_eps)
        q = lin(f"{p}.self_attn.q_proj", x).view(seq, shape.heads, shape.head_dim)
        k = lin(f"{p}.self_attn.k_proj", x).view(seq, shape.kv_heads, shape.head_dim)
        v = lin(f"{p}.self_attn.v_proj", x).view(seq, shape.kv_heads, shape.head_dim)
        q = _rms_norm(q, f[f"{p}.self_attn.q_norm.weight"], shape.rms_eps)
        k = _rms_norm(k, f[f"{p}.self_attn.k_norm.weight"], shape.rms_eps)
        q = _rope(q.transpose(0, 1), shape.rope_theta)
        k = _rope(k.transpose(0, 1), shape.rope_theta)
        rep = shape.heads // shape.kv_heads
        k = k.repeat_interleave(rep, 0)
        v = v.transpose(0, 1).repeat_interleave(rep, 0)
        att = (q @ k.transpose(1, 2)) / math.sqrt(shape.head_dim) + mask
        o = (att.softmax(-1) @ v).transpose(0, 1).reshape(seq, -1)
        h = h + lin(f"{p}.self_attn.o_proj", o)

        x = _rms_norm(h, f[f"{p}.post_attention_layernorm.weight"], shape.rms_eps)
        probs = lin(f"{p}.mlp.gate", x).softmax(-1)
        top_p, top_i = probs.topk(shape.top_k, -1)
        top_p = top_p / top_p.sum(-1, keepdim=True)  # norm_topk_prob
        moe = torch.zeros_like(x)
        for e in range(shape.experts):
            rows, slot = (top_i == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            pe = f"{p}.mlp.experts.{e}"
            xe = x[rows]
            inner = torch.nn.functional.silu(lin(f"{pe}.gate_proj", xe))
            inner = inner * lin(f"{pe}.up_proj", xe)
            moe[rows] += top_p[rows, slot, None] * lin(f"{pe}.down_proj", inner)
        h = h + moe
    h = _rms_norm(h, f["model.norm.weight"], shape.rms_eps)
    return h @ f["lm_head.weight"].t()


def reference_greedy(
    w: dict[str, torch.Tensor],
    shape: Shape,
    ids: list[int],
    n: int,
    act_hook: ActHook | None = None,
) -> list[int]:
    ids = list(ids)
    out: list[int] = []
    for _ in range(n):
        nxt = int(reference_logits(w, shape, ids, act_hook)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


def calibration_ids(tok: Tokenizer) -> list[list[int]]:
    chunks = [p for p in CORPUS.split("\n\n") if p.strip()]
    return [tok.encode(c).ids for c in chunks]


def calibrate_input_amax(
    w: dict[str, torch.Tensor], shape: Shape, tok: Tokenizer
) -> dict[str, float]:
    """Per-module max |input| over the corpus (static activation scales)."""
    amax: dict[str, float] = {}

    def record(module: str, x: torch.Tensor) -> torch.Tensor:
        if x.numel():
            amax[module] = max(amax.get(module, 0.0), float(x.abs().max()))
        return x

    for ids in calibration_ids(tok):
        reference_logits(w, shape, ids, record)
    # Experts no calibration token was routed to get the layer-wide maximum.
    for module in linear_shapes(shape):
        if not is_quantized_module(module) or module in amax:
            continue
        layer_prefix = module.split(".mlp.experts.")[0]
        proj = module.rsplit(".", 1)[1]
        amax[module] = max(
            v
            for k, v in amax.items()
            if k.startswith(layer_prefix + ".mlp.experts.") and k.endswith(proj)
        )
    return amax


# --------------------------------------------------------------------------
# What a format writer gets and returns
# --------------------------------------------------------------------------


@dataclass
class SchemeContext:
    shape: Shape
    tokenizer: Tokenizer
    seed: int
    # Per-tensor schemes: give the shards vLLM fuses (q/k/v, gate/up) one
    # common scale, so vLLM's "requantize with the max scale" step is lossless
    # and the twin is exactly what vLLM computes with.  False writes one
    # scale per shard (what AutoFP8 does), exercising the requantize path.
    shared_fused_scales: bool = True


@dataclass
class SchemeOutput:
    tensors: dict[str, torch.Tensor]
    quantization_config: dict[str, object] | None = None
    twin: dict[str, torch.Tensor] | None = None
    # Extra JSON files of the quantized directory (file name -> contents),
    # e.g. GPTQModel's quantize_config.json or ModelOpt's hf_quant_config.json.
    extra_json: dict[str, object] = field(default_factory=dict)


SchemeWriter = Callable[[dict[str, torch.Tensor], SchemeContext], SchemeOutput]

TensorSpec = tuple[torch.dtype, tuple[int, ...]]


def no_activation_quant(
    tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
) -> tuple[str, ActHook] | None:
    return None


@dataclass(frozen=True)
class Codec:
    """How ``--verify`` reads one family of on-disk formats.

    ``claims(qcfg)``: whether a config.json ``quantization_config`` is ours.
    ``module_tensors(module, n, k, qcfg)``: the tensors (suffix -> dtype,
    dims) that replace ``module.weight`` [n, k] on disk, or None where the
    module stays bf16.  ``dequantize(module, tensors, qcfg)``: the bf16
    weight [n, k] of a quantized module.  ``activation(tensors, qcfg)``: a
    label and a hook emulating activation quantization, or None for
    weight-only formats.
    """

    claims: Callable[[dict[str, object]], bool]
    module_tensors: Callable[
        [str, int, int, dict[str, object]], dict[str, TensorSpec] | None
    ]
    dequantize: Callable[
        [str, dict[str, torch.Tensor], dict[str, object]], torch.Tensor
    ]
    activation: Callable[
        [dict[str, torch.Tensor], dict[str, object]], tuple[str, ActHook] | None
    ] = no_activation_quant


def ct_channel_codec(
    fmt: str,
    weight_dtype: torch.dtype,
    scale_dtype: torch.dtype,
    dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    act_label: str,
    act_quant: Callable[[torch.Tensor], torch.Tensor],
) -> Codec:
    """The codec of a compressed-tensors checkpoint with per-channel weight
    scales (``weight`` [n, k], ``weight_scale`` [n, 1]) and dynamic
    per-token activation quantization, in ``format`` fmt."""

    def claims(qcfg: dict[str, object]) -> bool:
        return qcfg.get("quant_method") == "compressed-tensors" and (
            qcfg.get("format") == fmt
        )

    def module_tensors(
        module: str, n: int, k: int, qcfg: dict[str, object]
    ) -> dict[str, TensorSpec] | None:
        if not is_quantized_module(module):
            return None
        return {"weight": (weight_dtype, (n, k)), "weight_scale": (scale_dtype, (n, 1))}

    def dequantize(
        module: str, tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
    ) -> torch.Tensor:
        return dequant(tensors[f"{module}.weight"], tensors[f"{module}.weight_scale"])

    def activation(
        tensors: dict[str, torch.Tensor], qcfg: dict[str, object]
    ) -> tuple[str, ActHook]:
        return act_label, lambda module, x: act_quant(x)

    return Codec(claims, module_tensors, dequantize, activation)


def write_bf16(weights: dict[str, torch.Tensor], ctx: SchemeContext) -> SchemeOutput:
    return SchemeOutput(tensors=dict(weights))


def fused_group(module: str) -> str:
    """The vLLM fused Linear a checkpoint module is loaded into."""
    parent, proj = module.rsplit(".", 1)
    if proj in ("q_proj", "k_proj", "v_proj"):
        return f"{parent}.qkv_proj"
    if proj in ("gate_proj", "up_proj"):
        return f"{parent}.gate_up_proj"
    return module


# The ignore list of llm-compressor's Qwen3-MoE recipes (compressed-tensors
# formats): the LM head and every router (vLLM builds ``mlp.gate`` as a
# Linear with the quant config).
CT_IGNORE = ["lm_head", "re:.*mlp.gate$"]


def ct_quantization_config(
    fmt: str,
    weights: dict[str, object],
    input_activations: dict[str, object] | None,
) -> dict[str, object]:
    """quantization_config as llm-compressor writes it: one config group
    over every Linear outside CT_IGNORE, stored in format fmt."""
    return {
        "config_groups": {
            "group_0": {
                "format": fmt,
                "input_activations": input_activations,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": CT_IGNORE,
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": "0.12.2",
    }


def ct_channel_token_config(value_type: str, fmt: str) -> dict[str, object]:
    """8-bit per-channel weights, dynamic per-token activations (llm-compressor's
    W8A8 int8 and FP8_DYNAMIC schemes); value_type "int" or "float"."""
    common = {
        "actorder": None,
        "block_structure": None,
        "group_size": None,
        "num_bits": 8,
        "observer_kwargs": {},
        "symmetric": True,
        "type": value_type,
    }
    return ct_quantization_config(
        fmt,
        weights={
            **common,
            "dynamic": False,
            "observer": "minmax",
            "strategy": "channel",
        },
        input_activations={
            **common,
            "dynamic": True,
            "observer": None,
            "strategy": "token",
        },
    )


def ct_ignored(module: str, ignore: list[str]) -> bool:
    """Whether compressed-tensors' ``ignore`` list names ``module``
    (``re:`` entries are regexes matched from the start, others exact)."""
    return any(
        re.match(e[3:], module) if e.startswith("re:") else e == module for e in ignore
    )


ModuleQuant = Callable[
    [str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]
]


def quantize_modules(
    weights: dict[str, torch.Tensor], quant: ModuleQuant
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Quantize every quantizable ``*.weight``; returns (tensors, twin).

    ``quant(module, w)`` returns the tensors that replace ``module.weight``
    on disk (suffix -> tensor; suffix ``weight`` keeps the name) and the
    dequantized bf16 weight for the twin.
    """
    tensors: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and is_quantized_module(module):
            on_disk, deq = quant(module, w)
            for suffix, t in on_disk.items():
                tensors[f"{module}.{suffix}"] = t
            twin[name] = deq
        else:
            tensors[name] = w
            twin[name] = w
    return tensors, twin


def quantize_weights(
    weights: dict[str, torch.Tensor],
    quant: Callable[[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scale_suffix: str,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """quantize_modules for formats with one ``weight`` and one scale."""

    def one(module: str, w: torch.Tensor):
        q, s = quant(module, w)
        return {"weight": q, scale_suffix: s}, dequant(q, s)

    return quantize_modules(weights, one)


# --------------------------------------------------------------------------
# Reading and writing checkpoint directories
# --------------------------------------------------------------------------


def write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_checkpoint(
    out: Path,
    tensors: dict[str, torch.Tensor],
    config: dict[str, object],
    tok: Tokenizer,
    eos_id: int,
    shards: int,
    extra_json: dict[str, object] | None = None,
) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    write_json(out / "config.json", config)
    write_json(
        out / "generation_config.json",
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False},
    )
    save_tokenizer(tok, out)
    for fname, obj in (extra_json or {}).items():
        write_json(out / fname, obj)
    names = sorted(tensors)
    tensors = {n: tensors[n].contiguous() for n in names}
    if shards <= 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    per = -(-len(names) // shards)
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i * per : (i + 1) * per]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(
        out / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def load_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                assert name not in tensors, f"duplicate tensor {name}"
                tensors[name] = fh.get_tensor(name)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        assert set(weight_map) == set(tensors), "index.json does not match shards"
    return tensors
