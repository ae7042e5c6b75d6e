"""Quantized MoE served on CPU vs its bf16 twin, greedy, through the OpenAI API.

What runs: every quantized scheme of ``tiny_checkpoint.SCHEMES`` (everything
but ``bf16``; a served scheme added there is picked up here, formats
registered with ``served=False`` are not; vLLM reads the
quantization from the checkpoint's config.json) plus online
FP8 (``--quantization fp8``) and online int8 experts (``--quantization
experts_int8``) on the bf16 checkpoint, whose twin is the bf16 checkpoint
itself.  Each is served with ``--moe-backend auto`` (one scheme per MoE
oracle also with ``--moe-backend cpu``, see EXPLICIT_CPU), and compared with its twin on 8 fixed prompts x 16
greedy tokens (``ignore_eos``).  The same servers then take 16 concurrent
requests.  A deliberately wrong model (experts 0 and 1 swapped in every layer
of the FP8 block checkpoint) must fail the same rule.

Tolerance rule
--------------
The twin is served with ``logprobs=2``; its *gap* at a position is its top-1
minus top-2 logprob there.  With T = 1.5 nats (e2e_lib.GAP_THRESHOLD):

(A) free-running: the quantized greedy tokens equal the twin's up to the first
    position where they differ (if any), and the twin's gap at that position
    is < T.  Tokens after it are not compared (the contexts differ).
(B) teacher-forced: fed the twin's own path (prompt + twin tokens so far: 128
    prefixes, max_tokens=1), the quantized model's greedy token may differ
    from the twin's only where the twin's gap is < T, and at most 12.5 % of
    the positions (16 of 128, e2e_lib.MAX_FLIP_FRACTION) may differ at all.

Why (measured on the 2-core AMD EPYC dev box: avx512f, avx512_bf16,
avx512_vnni, no AMX; two full runs plus a prompt_logprobs variant of (B).
CPU kernels, and so the rounding, differ on other ISAs: hence the margins):

* Logits are bf16, so logprobs move in steps of 1/16..1/8 nat and exact ties
  (gap 0) are common in this random-weight model: 7-11 of the twin's 128
  positions have gap < 0.1.  Numerics flip such ties, after which the
  free-running text legitimately goes elsewhere (it even differed between two
  runs of the same server), so "16 identical tokens" would be flaky.  (B)
  is what has statistical power: 128 positions per model.
* fp8-block (W8A16 everywhere on CPU, twin = the exact dequantized weights):
  4/8 prompts diverge, at twin gaps <= 0.25; (B) 2-3/128 disagreements, at
  gaps 0, 0 (, 0.25).  cpu and auto select the same kernel, same numbers.
* fp8-tensor (MoE W8A16, but the attention linears run
  PerTensorTorchFP8ScaledMMLinearKernel, i.e. FP8 *activations* with the
  checkpoint's static input scales): 4/8 diverge at gaps <= 0.6875; (B)
  1-2/128 at gaps 0.375, 0.6875.
* online fp8 vs bf16 (not an exact twin: weights rounded to FP8 per tensor,
  dynamic FP8 activations in the linears): 6/8 diverge at gaps <= 0.6875;
  (B) 5-7/128 at gaps 0, 0.0625, 0.1875, 0.1875, 0.5625, 0.6875, 1.0.  This
  worst case sets T (1.5x its largest gap) and the cap (16 = 2.3x its count).
* w8a8-int8 (tree with "[CPU][MoE] INT8 W8A8 MoE backend for CPU"): 1/8
  prompts diverge, (B) 1/128 disagreement at gap 0.0625.
* Wrong models fail: experts 0<->1 swapped in both layers (this module's
  test): (A) alone would pass (all 8 diverge, but at gaps <= 1.4375); (B)
  finds 38-40/128 disagreements (2.5x the cap), 3 at gaps 1.625, 2.0, 2.3125
  >= T.  o_proj transposed in both layers (square, so it loads; measured, not
  in the suite): (A) fails on 4 prompts (gaps 1.875-2.9375), (B) 84/128.

Compiled: ``vllm serve`` compiles the model by default (no
--enforce-eager), and the CPU MoE experts must work there too. One server per
CPU MoE backend path (COMPILED_SERVERS) runs compiled; the others, and the
twins, run with --enforce-eager to keep the suite's time.

Time: each server start is ~17-28 s eager on 2 shared cores (most of it
importing vLLM twice); compiling adds ~30-50 s (tiny model on this machine:
bf16 57 s, compressed-tensors FP8 87-94 s to the first completion compiled,
42 s eager; vLLM 0.19.1's compile cache does not load back on CPU, so a warm
cache saves nothing). Every server is started once per module
(module-scoped fixtures), the twins once each.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import e2e_lib as lib
import pytest

BACKENDS = ("cpu", "auto")


@dataclass(frozen=True)
class Variant:
    name: str
    scheme: str  # checkpoint to serve
    serve_args: tuple[str, ...]
    online: bool  # twin is the served (bf16) checkpoint itself


def variants() -> list[Variant]:
    out = [Variant(s, s, (), online=False) for s in lib.quantized_schemes()]
    out.append(Variant("online-fp8", "bf16", ("--quantization", "fp8"), online=True))
    # Online int8 experts (W8A16, attention in bf16); experts_int8 is
    # deprecated upstream, so it needs the opt-in flag.
    out.append(
        Variant(
            "online-int8",
            "bf16",
            ("--quantization", "experts_int8", "--allow-deprecated-quantization"),
            online=True,
        )
    )
    return out


# Every variant is served with --moe-backend auto (which picks the CPU
# backend of its oracle on this machine); one scheme per MoE oracle is served
# with --moe-backend cpu as well. Each extra server costs ~25 s on 2 cores.
EXPLICIT_CPU = {"fp8-block", "w8a8-int8", "gptq-int4"}


# (variant, backend) servers that run compiled, one per CPU MoE backend path;
# the others run with --enforce-eager.
COMPILED_SERVERS = {
    ("fp8-tensor", "auto"),  # FP8 per-expert custom op, per-tensor scales
    ("fp8-block", "auto"),  # FP8 per-expert custom op, block scales
    ("fp8-block", "cpu"),  # fused_experts_cpu FP8 (VLLM_CPU_SGL_KERNEL=1)
    ("fp8-channel-ct", "auto"),  # FP8 per-expert custom op
    ("mxfp8-modelopt", "auto"),  # FP8 per-expert custom op, E8M0 scales
    ("w8a8-int8", "auto"),  # fused_experts_cpu int8 W8A8
    ("online-int8", "auto"),  # INT8 per-expert custom op, W8A16
    ("gptq-int4", "auto"),  # WNA16 custom op on the int4 GEMM
}


# Servers run with VLLM_CPU_SGL_KERNEL=1: FP8 per-tensor and block experts
# then take fused_experts_cpu instead of the default per-expert custom op.
SGL_KERNEL_SERVERS = {("fp8-block", "cpu")}

# (variant, backend) -> a line its server log must have: the MoE path taken.
EXPECTED_MOE_PATH = {
    ("fp8-block", "auto"): "CPU FP8 MoE: FP8 weights with bf16 activations (W8A16) "
    "through the generated GEMV kernel",
    ("fp8-block", "cpu"): "CPU FP8 MoE: fused_experts_cpu with FP8 weights",
}
# vLLM's AVX2 CPU library has no fused_experts_cpu: there the switch cannot
# take the fused kernel, and the log must say why it did not.
NO_FUSED_OP_LINE = (
    "not fused_experts_cpu, because the CPU library has no fused_experts_cpu op"
)


def _backends(variant: Variant) -> tuple[str, ...]:
    return BACKENDS if variant.name in EXPLICIT_CPU else ("auto",)


def _params() -> list:
    return [
        pytest.param((v, b), id=f"{v.name}-{b}")
        for v in variants()
        for b in _backends(v)
    ]


@dataclass
class Served:
    variant: Variant
    backend: str
    url: str
    twin: list[lib.Generation]
    name: str


@pytest.fixture(scope="module")
def twin_outputs():
    """twin_outputs(dir) -> greedy generations (top-2 logprobs) of a bf16
    checkpoint; each checkpoint is served once per module."""
    cache: dict[Path, list[lib.Generation]] = {}

    def get(model: Path) -> list[lib.Generation]:
        if model not in cache:
            with lib.serve(model, log_name=f"twin-{model.name}") as url:
                cache[model] = lib.greedy(url, logprobs=2)
        return cache[model]

    return get


@pytest.fixture(scope="module", params=_params())
def quantized(request, checkpoints, twin_outputs):
    variant, backend = request.param
    ckpt = checkpoints.scheme(variant.scheme)
    twin_dir = ckpt.model if variant.online else ckpt.twin
    if twin_dir is None:
        pytest.fail(f"scheme {variant.scheme} wrote no bf16 twin")
    compiled = (variant.name, backend) in COMPILED_SERVERS
    sgl = (variant.name, backend) in SGL_KERNEL_SERVERS
    name = (
        f"{variant.name}-{backend}"
        + ("-compiled" if compiled else "")
        + ("-sgl" if sgl else "")
    )
    args = [*variant.serve_args, "--moe-backend", backend]
    env = {"VLLM_CPU_SGL_KERNEL": "1"} if sgl else {"VLLM_CPU_SGL_KERNEL": "0"}
    with lib.serve(ckpt.model, args, log_name=name, compiled=compiled, env=env) as url:
        # The twin is served (once per module) only once the quantized model
        # is known to come up; both run at the same time for that moment.
        yield Served(variant, backend, url, twin_outputs(twin_dir), name)


def _record(name: str, verdict: lib.Verdict) -> None:
    out = lib.E2E_ROOT / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(
        json.dumps(
            {
                "ok": verdict.ok,
                "divergent_prompts": verdict.divergent_prompts,
                "flips": verdict.flips,
                "positions": verdict.positions,
                "violations": verdict.violations,
                "details": verdict.lines,
            },
            indent=2,
        )
        + "\n"
    )


# --------------------------------------------------------------------------
# The rule must reject a wrong model.
# --------------------------------------------------------------------------


def _swap_experts_0_1(tensors: dict) -> None:
    layers = {int(n.split(".")[2]) for n in tensors if n.startswith("model.layers.")}
    for layer in sorted(layers):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            a = f"model.layers.{layer}.mlp.experts.0.{proj}."
            b = f"model.layers.{layer}.mlp.experts.1.{proj}."
            for name in [n for n in tensors if n.startswith(a)]:
                other = b + name[len(a) :]
                tensors[name], tensors[other] = tensors[other], tensors[name]


def test_rule_rejects_swapped_experts(checkpoints, twin_outputs) -> None:
    """Experts 0 and 1 swapped (weights and scales, every layer) in the FP8
    block checkpoint: served with --moe-backend cpu it must fail the rule
    against the real twin."""
    if "fp8-block" not in lib.tiny_checkpoint.SCHEMES:
        pytest.skip("tiny_checkpoint has no fp8-block scheme")
    ckpt = checkpoints.scheme("fp8-block")
    assert ckpt.twin is not None
    wrong = checkpoints.derive(
        "tiny-fp8-block-swapped-experts-0-1",
        ckpt.model,
        _swap_experts_0_1,
        "experts 0 and 1 swapped in every layer (weights and scales)",
    )
    with lib.serve(wrong, ["--moe-backend", "cpu"], log_name=wrong.name) as url:
        quant = lib.greedy(url)
        twin = twin_outputs(ckpt.twin)
        tf = lib.teacher_forced_argmax(url, twin)
    verdict = lib.judge(quant, twin, tf)
    _record(wrong.name, verdict)
    print(f"\n{wrong.name}:\n{verdict.report()}")
    assert not verdict.ok, f"a wrong model passed the rule:\n{verdict.report()}"


def test_greedy_matches_twin(quantized: Served) -> None:
    quant = lib.greedy(quantized.url)
    tf = lib.teacher_forced_argmax(quantized.url, quantized.twin)
    verdict = lib.judge(quant, quantized.twin, tf)
    _record(quantized.name, verdict)
    print(f"\n{quantized.name}:\n{verdict.report()}")
    assert verdict.ok, f"{quantized.name} vs twin:\n{verdict.report()}"


def test_moe_path_is_the_expected_one(quantized: Served) -> None:
    """The servers meant to cover one MoE path (the default per-expert op or
    fused_experts_cpu under VLLM_CPU_SGL_KERNEL=1) took it."""
    key = (quantized.variant.name, quantized.backend)
    if key not in EXPECTED_MOE_PATH:
        pytest.skip("no MoE path expectation for this server")
    expected = EXPECTED_MOE_PATH[key]
    if key in SGL_KERNEL_SERVERS and not lib.cpu_library_has_fused_experts():
        expected = NO_FUSED_OP_LINE
    log = lib.log_path(quantized.name).read_text(errors="replace")
    assert expected in log, f"{quantized.name}: no {expected!r} in its log"


# 16 distinct fixed prompts for the concurrency test.
CONCURRENT_PROMPTS = (
    *lib.PROMPTS,
    "Water boils at",
    "The train leaves the station at",
    "To make a simple bread,",
    "Once upon a time there was",
    "Economists argue about",
    "The market opens at",
    "Mountaineers carry ropes,",
    "Music is made of",
)


def test_concurrent_requests(quantized: Served) -> None:
    """16 requests in flight at once (threads released by a barrier): every
    one completes without error with exactly max_tokens tokens of text."""
    assert len(set(CONCURRENT_PROMPTS)) == 16
    max_tokens = 16
    model = lib.served_model(quantized.url)
    barrier = threading.Barrier(len(CONCURRENT_PROMPTS), timeout=60)
    results: dict[int, object] = {}

    def one(i: int, prompt: str) -> None:
        try:
            c = lib.client(quantized.url)
            barrier.wait()
            results[i] = c.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = e

    threads = [
        threading.Thread(target=one, args=(i, p), daemon=True)
        for i, p in enumerate(CONCURRENT_PROMPTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=lib.REQUEST_TIMEOUT_S + 60)
    assert not any(t.is_alive() for t in threads), "requests did not finish in time"
    errors = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert not errors, f"failed requests: {errors}"
    assert sorted(results) == list(range(len(CONCURRENT_PROMPTS)))
    texts = []
    for i, resp in sorted(results.items()):
        choice = resp.choices[0]  # type: ignore[attr-defined]
        assert choice.text, f"empty completion for {CONCURRENT_PROMPTS[i]!r}"
        assert choice.finish_reason == "length", choice
        assert resp.usage.completion_tokens == max_tokens, resp.usage  # type: ignore[attr-defined]
        texts.append(choice.text)
    # Prompt-dependent output, not one degenerate string for everyone.
    assert len(set(texts)) >= len(texts) // 2, texts


def test_compiled_servers_are_in_the_suite() -> None:
    """A COMPILED_SERVERS entry that names no server would leave its
    backend path uncompiled without a word."""
    served = {(v.name, b) for v in variants() for b in _backends(v)}
    assert COMPILED_SERVERS <= served, sorted(COMPILED_SERVERS - served)
    assert SGL_KERNEL_SERVERS <= served, sorted(SGL_KERNEL_SERVERS - served)
    assert set(EXPECTED_MOE_PATH) <= served, sorted(set(EXPECTED_MOE_PATH) - served)
