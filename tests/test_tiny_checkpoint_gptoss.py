"""The tiny GPT-OSS-style biased MoE (``tiny_checkpoint --scheme gpt-oss``).

Checked without a server:

* the checkpoint is what Hugging Face transformers' ``GptOssForCausalLM``
  saves and loads (every tensor used, none missing), and transformers'
  forward equals the tool's fp32 reference, over more tokens than the
  sliding window;
* the twin is the online-FP8 rounding vLLM applies while loading: one
  E4M3 scale (amax / 448) per expert tensor and per fused q/k/v and o_proj,
  decoded here from the E4M3 bit layout; everything else is bit-identical;
* the e2e suite's tolerance rule (``tests/e2e/e2e_lib.judge``), fed the
  reference's greedy tokens and top-2 gaps, accepts the bf16 model against
  its FP8 twin (the weight rounding online FP8 adds) and rejects the same
  model with its expert biases zeroed (what a kernel that dropped them would
  serve): the bias magnitudes are large enough for the rule to notice.

Run with the fork's venv:
``.venv/bin/python -m pytest -q tests/test_tiny_checkpoint_gptoss.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = Path(__file__).resolve().parent
for p in (HERE.parent / "tools", HERE / "e2e"):
    if str(p) not in sys.path:
        sys.path.append(str(p))

import e2e_lib  # noqa: E402
import tiny_checkpoint  # noqa: E402
from tiny_checkpoint import gptoss  # noqa: E402

SEED = 0


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Small tensors: on a busy 2-core machine intra-op threads only wait."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Ckpt:
    def __init__(self, root: Path) -> None:
        self.dir = root / "tiny-gpt-oss"
        written = tiny_checkpoint.generate(self.dir, "gpt-oss", SEED, None, shards=1)
        assert written == [self.dir, root / "tiny-gpt-oss-bf16twin"]
        self.config = json.loads((self.dir / "config.json").read_text())
        self.shape = gptoss.shape_from_config(self.config)
        self.tensors = safetensors_torch.load_file(self.dir / "model.safetensors")
        self.twin = safetensors_torch.load_file(written[1] / "model.safetensors")
        self.twin_dir = written[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Ckpt:
    return Ckpt(tmp_path_factory.mktemp("tiny-gpt-oss"))


def test_config_is_gpt_oss(ckpt: Ckpt):
    c = ckpt.config
    assert c["architectures"] == ["GptOssForCausalLM"]
    assert c["model_type"] == "gpt_oss"
    assert "quantization_config" not in c  # served with --quantization fp8
    assert (c["num_local_experts"], c["num_experts_per_tok"]) == (8, 4)
    assert c["layer_types"] == ["sliding_attention", "full_attention"]
    assert c["rope_scaling"]["rope_type"] == "yarn"
    # The harmony tokens vLLM's gpt_oss reasoning parser looks up at startup.
    vocab = json.loads((ckpt.dir / "tokenizer.json").read_text())["added_tokens"]
    assert {t["content"] for t in vocab} >= set(gptoss.HARMONY_TOKENS)


def test_hf_transformers_loads_every_tensor_and_matches_reference(ckpt: Ckpt):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(ckpt.dir),
        dtype=torch.float32,
        local_files_only=True,
        attn_implementation="eager",
        output_loading_info=True,
    )
    assert type(model).__name__ == "GptOssForCausalLM"
    assert not any(info.values()), info  # missing / unexpected / mismatched
    experts = model.model.layers[1].mlp.experts
    e = ckpt.shape.experts
    h, i = ckpt.shape.hidden, ckpt.shape.intermediate
    assert tuple(experts.gate_up_proj.shape) == (e, h, 2 * i)
    assert tuple(experts.down_proj_bias.shape) == (e, h)
    assert problems_free(gptoss.hf_crosscheck_gptoss(ckpt.dir))


def problems_free(problems: list[str]) -> bool:
    assert not problems, problems
    return True


def e4m3_decode(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bits -> float64 from the format's definition."""
    b = q.view(torch.uint8).long()
    sign = torch.where(b >= 128, -1.0, 1.0).double()
    exp = (b // 8) % 16
    man = (b % 8).double()
    normal = (1 + man / 8) * torch.pow(2.0, (exp - 7).double())
    return sign * torch.where(exp == 0, man / 8 * 2.0**-6, normal)


def test_twin_is_the_online_fp8_rounding(ckpt: Ckpt):
    master, twin = ckpt.tensors, ckpt.twin
    assert twin.keys() == master.keys()
    groups: list[list[torch.Tensor]] = []
    rounded: set[str] = set()
    for layer in range(ckpt.shape.layers):
        p = f"model.layers.{layer}"
        for name in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            rounded.add(f"{p}.{name}")
            groups += [
                [master[f"{p}.{name}"][e], twin[f"{p}.{name}"][e]]
                for e in range(ckpt.shape.experts)
            ]
        qkv = [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"]
        rounded.update(qkv)
        rounded.add(f"{p}.self_attn.o_proj.weight")
        groups.append(
            [torch.cat([master[n] for n in qkv]), torch.cat([twin[n] for n in qkv])]
        )
        o = f"{p}.self_attn.o_proj.weight"
        groups.append([master[o], twin[o]])
    for m, t in groups:
        scale = m.double().abs().amax() / 448
        # Round to nearest E4M3 with this scale, decoded from the bits.
        q = (m.float() * (1 / scale.float())).clamp(-448, 448)
        q = q.to(torch.float8_e4m3fn)
        expected = (e4m3_decode(q) * scale).to(torch.bfloat16)
        assert torch.equal(t, expected)
        assert not torch.equal(t, m)  # something was rounded
        # Within half an E4M3 step (3 mantissa bits) plus bf16 rounding.
        err = (t.double() - m.double()).abs()
        assert (err <= m.double().abs() * (2.0**-4 + 2.0**-8) + scale * 2.0**-9).all()
    for name in master.keys() - rounded:
        assert torch.equal(twin[name], master[name]), name  # biases, sinks, ...


def reference_generations(
    w: dict[str, torch.Tensor], shape: gptoss.GptOssShape, prompt_ids: list[list[int]]
) -> list[e2e_lib.Generation]:
    """Greedy 16 tokens per prompt with top-2 logprobs, as e2e_lib.greedy
    returns them from a server."""
    out = []
    for prompt, ids in zip(e2e_lib.PROMPTS, prompt_ids, strict=True):
        path = gptoss.reference_greedy(w, shape, ids, e2e_lib.MAX_TOKENS)
        logp = gptoss.reference_logits(w, shape, ids + path[:-1]).log_softmax(-1)
        top = logp[len(ids) - 1 :].topk(2, -1)
        out.append(
            e2e_lib.Generation(
                prompt=prompt,
                prompt_ids=ids,
                text="",
                token_ids=path,
                top=[
                    list(zip(i.tolist(), v.tolist(), strict=True))
                    for i, v in zip(top.indices, top.values, strict=True)
                ],
            )
        )
    return out


def teacher_forced(
    w: dict[str, torch.Tensor], shape: gptoss.GptOssShape, ref: list[e2e_lib.Generation]
) -> list[list[int]]:
    """e2e_lib.teacher_forced_argmax computed with the reference forward."""
    out = []
    for g in ref:
        ids = g.prompt_ids + g.token_ids[:-1]
        logits = gptoss.reference_logits(w, shape, ids)
        out.append(logits[len(g.prompt_ids) - 1 :].argmax(-1).tolist())
    return out


def test_rule_rejects_dropped_expert_biases(ckpt: Ckpt):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt.dir / "tokenizer.json"))
    prompt_ids = [tok.encode(p).ids for p in e2e_lib.PROMPTS]
    shape = ckpt.shape
    twin = reference_generations(ckpt.twin, shape, prompt_ids)

    # Control: the bf16 master against its FP8 twin (the weight rounding
    # online FP8 adds) passes the rule.
    master = ckpt.tensors
    ok = e2e_lib.judge(
        reference_generations(master, shape, prompt_ids),
        twin,
        teacher_forced(master, shape, twin),
    )
    print(f"\nbf16 master vs FP8 twin (reference):\n{ok.report()}")
    assert ok.ok, ok.report()

    # The served model with its expert biases dropped must fail it.
    no_bias = gptoss.without_expert_biases(ckpt.twin)
    verdict = e2e_lib.judge(
        reference_generations(no_bias, shape, prompt_ids),
        twin,
        teacher_forced(no_bias, shape, twin),
    )
    print(f"\nexpert biases zeroed vs FP8 twin (reference):\n{verdict.report()}")
    assert not verdict.ok
    # Not marginally: far more teacher-forced flips than the rule allows,
    # and flips where the twin is confident.
    allowed = int(e2e_lib.MAX_FLIP_FRACTION * verdict.positions)
    assert len(verdict.flips) >= 3 * allowed, verdict.report()
    confident = [g for _, _, g in verdict.flips if g >= e2e_lib.GAP_THRESHOLD]
    assert len(confident) >= 10, verdict.report()


def test_verify_accepts_it_and_rejects_a_wrong_twin(ckpt: Ckpt, tmp_path: Path):
    assert gptoss.verify_gptoss(ckpt.dir, None) == []
    # A twin that is not the FP8 rounding (the master itself) is reported.
    assert gptoss.verify_gptoss(ckpt.dir, ckpt.dir) != []
