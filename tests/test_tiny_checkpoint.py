"""The checkpoint tool's int4 (WNA16) and MXFP8 formats, checked from the bits.

Each format is generated once into a temporary directory and read back with
safetensors.  The tensors are then unpacked here, independently of the
tool's own pack/unpack code, straight from the documented bit layout of the
tool that writes the format (GPTQModel v1, AutoAWQ GEMM, compressed-tensors
pack-quantized, ModelOpt MXFP8), and must reproduce the bf16 twin exactly.
They must also stay within one quantization step of the bf16 master weights
(so a wrong scale cannot hide behind a twin made from the same mistake), use
the whole int4 range, and have one scale per 128 inputs.

Run with the fork's venv: ``.venv/bin/python -m pytest -q tests/test_tiny_checkpoint.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOOLS = Path(__file__).resolve().parents[1] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import tiny_checkpoint  # noqa: E402
from tiny_checkpoint import common  # noqa: E402
from tiny_checkpoint.verify import dequantized_weights  # noqa: E402

SEED = 5
GROUP = 128
WNA16_FORMATS = ("gptq-int4", "awq-int4", "w4a16-ct")
# GPTQ v1 symmetric 4-bit: zero point 8 stored as 8 - 1 = 7 in every nibble.
GPTQ_V1_SYM_QZEROS_WORD = 0x77777777
# AutoAWQ: nibble i (bits 4i..4i+3) of a word holds column 8c + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class Ckpt:
    def __init__(self, root: Path, scheme: str) -> None:
        self.dir = root / scheme
        written = tiny_checkpoint.generate(self.dir, scheme, SEED, None, shards=1)
        assert written == [self.dir, root / f"{scheme}-bf16twin"]
        self.config = json.loads((self.dir / "config.json").read_text())
        self.qcfg = self.config["quantization_config"]
        self.tensors = safetensors_torch.load_file(self.dir / "model.safetensors")
        self.twin = safetensors_torch.load_file(written[1] / "model.safetensors")
        shape = common.shape_from_config(self.config)
        master = common.init_weights(shape, self.config["vocab_size"], SEED)
        self.master = master
        self.linears = common.linear_shapes(shape)

    def quantized(self) -> dict[str, tuple[int, int]]:
        """Module -> (N, K) of the modules that must be quantized."""
        return {m: nk for m, nk in self.linears.items() if m.endswith("_proj")}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tensors are small: on a busy machine, intra-op threads only wait
    for each other (measured: 10x slower with 2 threads under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ckpt]:
    root = tmp_path_factory.mktemp("tiny")
    return {s: Ckpt(root, s) for s in (*WNA16_FORMATS, "mxfp8-modelopt")}


# --------------------------------------------------------------------------
# Independent unpacking: plain integer ops on the int32 words
# --------------------------------------------------------------------------


def nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> int64 [..., W, 8]: nibble i = bits 4i..4i+3."""
    u = words.to(torch.int64) % (1 << 32)  # the unsigned 32-bit word
    return torch.stack([(u // (16**i)) % 16 for i in range(8)], dim=-1)


def gptq_unpack(t: dict[str, torch.Tensor], m: str) -> tuple[torch.Tensor, ...]:
    """GPTQ v1: qweight [K/8, N], K packed low nibble first; qzeros
    [K/G, N/8] packed along N, stores zero - 1."""
    qw = nibbles(t[f"{m}.qweight"])  # [K/8, N, 8]: row 8r + i
    q = qw.permute(0, 2, 1).reshape(-1, qw.shape[1])  # [K, N]
    zeros = nibbles(t[f"{m}.qzeros"]).reshape(t[f"{m}.qzeros"].shape[0], -1) + 1
    return q, zeros, t[f"{m}.scales"].double()


def awq_unpack(t: dict[str, torch.Tensor], m: str) -> tuple[torch.Tensor, ...]:
    """AutoAWQ GEMM: qweight [K, N/8] and qzeros [K/G, N/8], interleaved."""

    def cols(words: torch.Tensor) -> torch.Tensor:
        nib = nibbles(words)  # [R, W, 8], nibble i -> column 8c + AWQ_ORDER[i]
        out = torch.empty_like(nib)
        for i, col in enumerate(AWQ_ORDER):
            out[..., col] = nib[..., i]
        return out.reshape(words.shape[0], -1)

    return cols(t[f"{m}.qweight"]), cols(t[f"{m}.qzeros"]), t[f"{m}.scales"].double()


def ct_unpack(t: dict[str, torch.Tensor], m: str) -> tuple[torch.Tensor, ...]:
    """compressed-tensors pack-quantized: [N, K/8], K packed low nibble
    first, value + 8 stored; weight_scale [N, K/G]."""
    n, k = t[f"{m}.weight_shape"].tolist()
    q = nibbles(t[f"{m}.weight_packed"]).reshape(n, -1)[:, :k] - 8
    return q, t[f"{m}.weight_scale"].double()


def to_bf16(w: torch.Tensor) -> torch.Tensor:
    return w.to(torch.bfloat16)


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------


def test_every_served_format_is_a_scheme():
    # The e2e suite serves every scheme against its twin.
    assert set(tiny_checkpoint.SCHEMES) == {
        name for name, f in tiny_checkpoint.FORMATS.items() if f.served
    }
    assert set(tiny_checkpoint.SCHEMES) >= {
        "bf16",
        "fp8-tensor",
        "fp8-block",
        "w8a8-int8",
        "mxfp8-modelopt",
        *WNA16_FORMATS,
    }


def test_source_digest_covers_every_module():
    pkg = Path(tiny_checkpoint.__file__).parent
    names = {p.name for p in pkg.glob("*.py")}
    assert {"common.py", "fp8.py", "int8.py", "wna16.py", "mxfp8.py"} <= names
    assert tiny_checkpoint.source_digest() == tiny_checkpoint.source_digest()
    assert len(tiny_checkpoint.source_digest()) == 64


# --------------------------------------------------------------------------
# Layout common to all four: what is quantized, what stays bf16
# --------------------------------------------------------------------------

ON_DISK = {
    "gptq-int4": lambda n, k: {
        "qweight": (torch.int32, (k // 8, n)),
        "qzeros": (torch.int32, (k // GROUP, n // 8)),
        "scales": (torch.float16, (k // GROUP, n)),
        "g_idx": (torch.int32, (k,)),
    },
    "awq-int4": lambda n, k: {
        "qweight": (torch.int32, (k, n // 8)),
        "qzeros": (torch.int32, (k // GROUP, n // 8)),
        "scales": (torch.float16, (k // GROUP, n)),
    },
    "w4a16-ct": lambda n, k: {
        "weight_packed": (torch.int32, (n, k // 8)),
        "weight_scale": (torch.bfloat16, (n, k // GROUP)),
        "weight_shape": (torch.int64, (2,)),
    },
    "mxfp8-modelopt": lambda n, k: {
        "weight": (torch.float8_e4m3fn, (n, k)),
        "weight_scale": (torch.uint8, (n, k // 32)),
    },
}


@pytest.mark.parametrize("scheme", WNA16_FORMATS)
def test_layout(ckpts: dict[str, Ckpt], scheme: str):
    c = ckpts[scheme]
    expected: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for m, (n, k) in c.linears.items():
        if m.endswith("_proj"):
            for suffix, spec in ON_DISK[scheme](n, k).items():
                expected[f"{m}.{suffix}"] = spec
        else:  # the routers
            expected[f"{m}.weight"] = (torch.bfloat16, (n, k))
    for name, t in c.master.items():
        module = name.removesuffix(".weight")
        if module not in c.linears:  # embeddings, lm_head, norms
            expected[name] = (torch.bfloat16, tuple(t.shape))
    got = {n: (t.dtype, tuple(t.shape)) for n, t in c.tensors.items()}
    assert got == expected
    # Unquantized tensors are the master weights, bit for bit.
    for name in ("lm_head.weight", "model.layers.1.mlp.gate.weight"):
        assert torch.equal(c.tensors[name], c.master[name])
    # The twin has the bf16 checkpoint's layout.
    assert {n: tuple(t.shape) for n, t in c.twin.items()} == {
        n: tuple(t.shape) for n, t in c.master.items()
    }
    assert all(t.dtype == torch.bfloat16 for t in c.twin.values())


def test_gptq_config(ckpts: dict[str, Ckpt]):
    c = ckpts["gptq-int4"]
    q = c.qcfg
    assert (q["quant_method"], q["bits"], q["group_size"]) == ("gptq", 4, GROUP)
    assert (q["desc_act"], q["sym"], q["lm_head"]) == (False, True, False)
    assert q["checkpoint_format"] == "gptq"
    assert json.loads((c.dir / "quantize_config.json").read_text()) == q


def test_awq_config(ckpts: dict[str, Ckpt]):
    q = ckpts["awq-int4"].qcfg
    assert (q["quant_method"], q["version"], q["zero_point"]) == ("awq", "gemm", True)
    assert (q["bits"], q["group_size"]) == (4, GROUP)
    # Substring match in AutoAWQ and vLLM: the routers, not the experts.
    assert q["modules_to_not_convert"] == ["mlp.gate"]


def test_ct_config(ckpts: dict[str, Ckpt]):
    q = ckpts["w4a16-ct"].qcfg
    assert q["quant_method"] == "compressed-tensors"
    assert q["format"] == "pack-quantized"
    (group,) = q["config_groups"].values()
    assert group["format"] == "pack-quantized" and group["targets"] == ["Linear"]
    assert group["input_activations"] is None
    w = group["weights"]
    assert (w["num_bits"], w["type"], w["symmetric"]) == (4, "int", True)
    assert (w["strategy"], w["group_size"]) == ("group", GROUP)
    assert q["ignore"] == ["lm_head", "re:.*mlp.gate$"]


def test_mxfp8_config(ckpts: dict[str, Ckpt]):
    c = ckpts["mxfp8-modelopt"]
    hf = json.loads((c.dir / "hf_quant_config.json").read_text())
    quant = hf["quantization"]
    assert quant["quant_algo"] == "MXFP8"
    assert "kv_cache_quant_algo" in quant  # vLLM requires the key
    routers = [m for m in c.linears if m.endswith("mlp.gate")]
    assert sorted(quant["exclude_modules"]) == sorted(["lm_head", *routers])
    assert c.qcfg["quant_method"] == "modelopt"
    assert c.qcfg["quant_algo"] == "MXFP8"
    assert c.qcfg["ignore"] == quant["exclude_modules"]


# --------------------------------------------------------------------------
# Bits -> twin, independently
# --------------------------------------------------------------------------


def _check_close_to_master(c: Ckpt, m: str, deq: torch.Tensor, step: torch.Tensor):
    """|twin - master| within about one quantization step per (row, group):
    half a step of rounding, plus half a step where AWQ's largest value is
    clamped, plus the rounding of the scale itself to bf16 (2**-9 x 15)."""
    master = c.master[f"{m}.weight"].double()
    err = (deq - master).abs()
    assert (err <= step * 1.1).all(), m
    assert err.mean() < 0.5 * step.mean(), m  # not all clamped / zeroed


def test_gptq_unpacks_to_twin(ckpts: dict[str, Ckpt]):
    c = ckpts["gptq-int4"]
    seen: set[int] = set()
    for m, (n, k) in c.quantized().items():
        q, zeros, scales = gptq_unpack(c.tensors, m)
        assert scales.shape == (k // GROUP, n)
        raw_zeros = c.tensors[f"{m}.qzeros"]
        assert (raw_zeros == GPTQ_V1_SYM_QZEROS_WORD).all(), m
        g_idx = c.tensors[f"{m}.g_idx"]
        assert g_idx.tolist() == [i // GROUP for i in range(k)]
        g = g_idx.long()
        deq = ((q - zeros[g]).double() * scales[g]).t()  # [N, K]
        assert torch.equal(to_bf16(deq), c.twin[f"{m}.weight"]), m
        _check_close_to_master(c, m, deq, scales[g].t())
        seen |= set(q.unique().tolist())
    assert seen == set(range(16))


def test_awq_unpacks_to_twin(ckpts: dict[str, Ckpt]):
    c = ckpts["awq-int4"]
    seen: set[int] = set()
    for m, (n, k) in c.quantized().items():
        q, zeros, scales = awq_unpack(c.tensors, m)
        assert q.shape == (k, n) and zeros.shape == (k // GROUP, n)
        g = torch.arange(k) // GROUP
        deq = ((q - zeros[g]).double() * scales[g]).t()
        assert torch.equal(to_bf16(deq), c.twin[f"{m}.weight"]), m
        _check_close_to_master(c, m, deq, scales[g].t())
        seen |= set(q.unique().tolist())
    assert seen == set(range(16))


def test_ct_unpacks_to_twin(ckpts: dict[str, Ckpt]):
    c = ckpts["w4a16-ct"]
    seen: set[int] = set()
    for m, (n, k) in c.quantized().items():
        assert c.tensors[f"{m}.weight_shape"].tolist() == [n, k]
        q, scales = ct_unpack(c.tensors, m)
        assert scales.shape == (n, k // GROUP)
        s = scales[:, torch.arange(k) // GROUP]
        deq = q.double() * s
        assert torch.equal(to_bf16(deq), c.twin[f"{m}.weight"]), m
        _check_close_to_master(c, m, deq, s)
        seen |= set(q.unique().tolist())
    assert seen == set(range(-8, 8))


def test_mxfp8_unpacks_to_twin(ckpts: dict[str, Ckpt]):
    c = ckpts["mxfp8-modelopt"]
    for m, (n, k) in c.quantized().items():
        w = c.tensors[f"{m}.weight"].double()
        e8m0 = c.tensors[f"{m}.weight_scale"].long()  # biased exponent
        scale = torch.pow(2.0, (e8m0 - 127).double())[:, torch.arange(k) // 32]
        deq = w * scale
        assert torch.equal(to_bf16(deq), c.twin[f"{m}.weight"]), m
        # The exponent is the smallest that does not saturate: each block's
        # largest |fp8| lies in (224, 448].
        amax = w.abs().view(n, k // 32, 32).amax(-1)
        assert (amax <= 448).all() and (amax >= 224).all(), m
        master = c.master[f"{m}.weight"].double()
        # e4m3 has 3 mantissa bits: relative step 2**-3 (half of it rounding),
        # absolute step 2**-9 * scale in the subnormal range.
        tol = master.abs() * 2.0**-4 + scale * 2.0**-9
        assert ((deq - master).abs() <= tol).all(), m


@pytest.mark.parametrize("scheme", WNA16_FORMATS)
def test_groups_are_distinct(ckpts: dict[str, Ckpt], scheme: str):
    """K = 256 projections have two groups with their own scales."""
    c = ckpts[scheme]
    m = "model.layers.0.mlp.experts.3.gate_proj"
    assert c.linears[m] == (128, 256)
    scale = {
        "gptq-int4": lambda: c.tensors[f"{m}.scales"].t(),
        "awq-int4": lambda: c.tensors[f"{m}.scales"].t(),
        "w4a16-ct": lambda: c.tensors[f"{m}.weight_scale"],
        "mxfp8-modelopt": lambda: c.tensors[f"{m}.weight_scale"][:, ::4],
    }[scheme]()
    assert scale.shape == (128, 2)
    assert (scale[:, 0] != scale[:, 1]).any()


# --------------------------------------------------------------------------
# The tool's own --verify codecs agree, and notice a flipped nibble
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", WNA16_FORMATS)
def test_verify_codec_matches_and_detects_corruption(
    ckpts: dict[str, Ckpt], scheme: str
):
    c = ckpts[scheme]
    spec = tiny_checkpoint.expected_tensors(c.config)
    assert {n: (t.dtype, tuple(t.shape)) for n, t in c.tensors.items()} == spec
    deq = dequantized_weights(c.config, c.tensors)
    assert deq.keys() == c.twin.keys()
    assert all(torch.equal(deq[n], c.twin[n]) for n in deq)

    m = "model.layers.1.self_attn.o_proj"
    name = {
        "gptq-int4": "qweight",
        "awq-int4": "qweight",
        "w4a16-ct": "weight_packed",
        "mxfp8-modelopt": "weight",
    }[scheme]
    broken = dict(c.tensors)
    t = broken[f"{m}.{name}"].clone()
    flat = t.view(torch.uint8).view(-1)
    flat[5] ^= 0x04  # one bit of one stored value
    broken[f"{m}.{name}"] = t
    deq = dequantized_weights(c.config, broken)
    assert not torch.equal(deq[f"{m}.weight"], c.twin[f"{m}.weight"])


# --------------------------------------------------------------------------
# compressed-tensors FP8 (channel weights, dynamic token activations)
# --------------------------------------------------------------------------


def e4m3_decode(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bits -> float64, from the format's definition (sign,
    4 exponent bits with bias 7, 3 mantissa bits, subnormals at exponent 0),
    without torch's fp8 conversion."""
    b = q.view(torch.uint8).long()
    sign = torch.where(b >= 128, -1.0, 1.0).double()
    exp = (b // 8) % 16
    man = (b % 8).double()
    normal = (1 + man / 8) * torch.pow(2.0, (exp - 7).double())
    subnormal = man / 8 * 2.0**-6
    assert not ((exp == 15) & (man == 7)).any(), "NaN stored"
    return sign * torch.where(exp == 0, subnormal, normal)


@pytest.fixture(scope="module")
def fp8_channel(tmp_path_factory: pytest.TempPathFactory) -> Ckpt:
    return Ckpt(tmp_path_factory.mktemp("tiny-fp8ch"), "fp8-channel-ct")


def test_fp8_channel_ct_is_served():
    assert "fp8-channel-ct" in tiny_checkpoint.SCHEMES


def test_fp8_channel_ct_config(fp8_channel: Ckpt):
    q = fp8_channel.qcfg
    assert q["quant_method"] == "compressed-tensors"
    assert q["format"] == "float-quantized"
    (group,) = q["config_groups"].values()
    assert group["targets"] == ["Linear"]
    w, a = group["weights"], group["input_activations"]
    assert (w["num_bits"], w["type"], w["symmetric"]) == (8, "float", True)
    assert (w["strategy"], w["dynamic"]) == ("channel", False)
    assert (a["num_bits"], a["type"], a["symmetric"]) == (8, "float", True)
    assert (a["strategy"], a["dynamic"]) == ("token", True)
    assert q["ignore"] == ["lm_head", "re:.*mlp.gate$"]


def test_fp8_channel_ct_layout_and_bits(fp8_channel: Ckpt):
    c = fp8_channel
    expected: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for m, (n, k) in c.linears.items():
        if m.endswith("_proj"):
            expected[f"{m}.weight"] = (torch.float8_e4m3fn, (n, k))
            expected[f"{m}.weight_scale"] = (torch.float32, (n, 1))
        else:  # the routers stay bf16
            expected[f"{m}.weight"] = (torch.bfloat16, (n, k))
    for name, t in c.master.items():
        if name.removesuffix(".weight") not in c.linears:
            expected[name] = (torch.bfloat16, tuple(t.shape))
    assert {n: (t.dtype, tuple(t.shape)) for n, t in c.tensors.items()} == expected
    assert torch.equal(c.tensors["lm_head.weight"], c.master["lm_head.weight"])
    for m, (n, k) in c.quantized().items():
        w = e4m3_decode(c.tensors[f"{m}.weight"])
        scale = c.tensors[f"{m}.weight_scale"].double()
        deq = w * scale
        assert torch.equal(to_bf16(deq), c.twin[f"{m}.weight"]), m
        # Each row's largest magnitude maps to the top of the e4m3 range.
        assert torch.equal(w.abs().amax(dim=1), torch.full((n,), 448.0)), m
        master = c.master[f"{m}.weight"].double()
        torch.testing.assert_close(
            scale[:, 0], master.abs().amax(dim=1) / 448, rtol=1e-6, atol=0
        )
        # 3 mantissa bits: half a relative step 2**-4, subnormals 2**-10.
        tol = master.abs() * 2.0**-4 + scale * 2.0**-10
        assert ((deq - master).abs() <= tol).all(), m
    # The tool's own --verify codec agrees, and sees one flipped bit.
    spec = tiny_checkpoint.expected_tensors(c.config)
    assert {n: (t.dtype, tuple(t.shape)) for n, t in c.tensors.items()} == spec
    deq_all = dequantized_weights(c.config, c.tensors)
    assert all(torch.equal(deq_all[n], c.twin[n]) for n in c.twin)
    m = "model.layers.1.self_attn.o_proj"
    broken = dict(c.tensors)
    t = broken[f"{m}.weight"].clone()
    t.view(torch.uint8).view(-1)[5] ^= 0x04
    broken[f"{m}.weight"] = t
    deq_broken = dequantized_weights(c.config, broken)
    assert not torch.equal(deq_broken[f"{m}.weight"], c.twin[f"{m}.weight"])


def test_real_width_shape_is_qwen3_30b_a3b():
    """--shape qwen3-30b-a3b-2l: Qwen3-30B-A3B's published widths (its
    config.json), two layers, written through the same config code."""
    shape = tiny_checkpoint.SHAPES["qwen3-30b-a3b-2l"]
    cfg = common.hf_config(shape, vocab_size=2000, eos_id=0)
    assert {
        k: cfg[k]
        for k in (
            "hidden_size",
            "moe_intermediate_size",
            "num_experts",
            "num_experts_per_tok",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_hidden_layers",
        )
    } == {
        "hidden_size": 2048,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 2,
    }
    assert common.shape_from_config(cfg) == shape


def test_shape_is_refused_for_models_of_their_own_shape(tmp_path):
    with pytest.raises(ValueError, match="shape of its own"):
        tiny_checkpoint.generate(
            tmp_path / "m", "gpt-oss", 0, None, 1,
            shape=tiny_checkpoint.SHAPES["tiny"],
        )  # fmt: skip
