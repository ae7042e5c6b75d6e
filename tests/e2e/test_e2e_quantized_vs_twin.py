"""Quantized MoE served on CPU vs its bf16 twin, greedy, through the OpenAI API.

What runs: every quantized scheme of ``tiny_checkpoint.SCHEMES`` (everything
but ``bf16``; a served scheme added there is picked up here, formats
registered with ``served=False`` are not; vLLM reads the
quantization from the checkpoint's config.json) plus online
FP8 (``--quantization fp8``) and online int8 experts (``--quantization
experts_int8``) on the bf16 checkpoint, whose twin is the bf16 checkpoint
itself.  Each is served with ``--moe-backend auto`` and with
``--moe-backend cpu`` under the x86 kernel library vLLM loads by default,
one of the two compiled and the other eager, and one scheme per MoE scheme
family (FAMILIES) with ``--moe-backend cpu`` under every kernel library
this machine can run too (``VLLM_CPU_X86_KERNELS``; the AVX2 one on any
x86 CPU), see servers().  Each server is compared with its twin on 8 fixed
prompts x 16 greedy tokens (``ignore_eos``), its log must name the kernel
library and the MoE experts that library and scheme call for, and it then
takes 16 concurrent requests.  A deliberately wrong model (experts 0 and 1 swapped in
every layer of the FP8 block checkpoint) must fail the same rule.

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

Why (CPU kernels, and so the rounding, differ between ISAs and kernel
libraries: hence the margins):

* Logits are bf16, so logprobs move in steps of 1/16..1/8 nat and exact ties
  (gap 0) are common in this random-weight model (on the 0.19.1 line 7-11 of the twin's 128
  positions had gap < 0.1).  Numerics flip such ties, after which the
  free-running text legitimately goes elsewhere (it even differed between two
  runs of the same server), so "16 identical tokens" would be flaky.  (B)
  is what has statistical power: 128 positions per model.
Measured on vLLM 0.32.0 + the series, 2-core Xeon with AMX, one run of
every server of this module (diverging prompts of 8; teacher-forced
disagreements of 128, at the twin's gaps there):
* FP8 per-tensor and block, MXFP8, INT8 W8A8, online int8, int4 (GPTQ, AWQ,
  compressed-tensors), under each kernel library: 0-3/8 diverge; (B) 0-3/128,
  all at gaps <= 0.25.
* fp8-channel-ct (per-channel weights): 3/8; (B) 4-5/128 at gaps <= 0.75.
* online fp8 vs bf16 (not an exact twin: weights rounded to FP8 per tensor,
  and some linears quantize activations to FP8): 6-7/8; (B) 8-9/128 at gaps
  <= 0.6875.  This worst case sets T (about 2x its largest gap) and the cap
  (16, about 2x its count); on the 0.19.1 line it measured 5-7/128 at gaps
  up to 1.0.
* Wrong models fail: experts 0<->1 swapped in both layers (this module's
  test): (A) alone would pass (7/8 diverge, but at gaps <= 1.4375); (B) finds
  37/128 disagreements (2.3x the cap), 3 at gaps 1.5, 2.0, 3.25 >= T.

Compiled: ``vllm serve`` compiles the model by default (no
--enforce-eager), and the CPU MoE experts must work there too.  One server
per CPU MoE path runs compiled (servers() says which); the others, and the
twins, run with --enforce-eager to keep the suite's time.

Time: each server start is ~20-40 s eager on 2 shared cores (most of it
importing vLLM twice); compiling adds ~30-60 s.  Every server is started
once per module (module-scoped fixtures), the twins once each.
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
    # Online int8 experts (int8 weights, attention in bf16); experts_int8 is
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


# The x86 kernel libraries this machine can run (VLLM_CPU_X86_KERNELS), each
# with whether its AMX kernels run here; vLLM loads the last one by default.
LIBRARIES: dict[str, bool] = lib.x86_kernel_libraries()
DEFAULT_LIBRARY: str | None = list(LIBRARIES)[-1] if LIBRARIES else None

# One scheme per MoE scheme family (oracle): each is served with
# --moe-backend cpu under every library above, so the AVX2 library (which
# every x86 CPU runs, and which has none of the AMX or SGLang kernels) is
# covered on any x86 machine.
FAMILIES = {
    "fp8-block": "FP8",
    "w8a8-int8": "INT8 W8A8",
    "gptq-int4": "INT4 weight-only",
    "mxfp8-modelopt": "MXFP8",
}

# Variants whose experts upstream's AMX kernels serve when they run
# (CPUExpertsFp8 block W8A16, CPUExpertsInt8 W8A8, also for online int8,
# CPUExpertsInt4); everything else, and everything where the AMX kernels do
# not run, takes the fork's x86 kernels or CPUDequantExperts* classes.
AMX_UPSTREAM = {
    "fp8-block",
    "w8a8-int8",
    "online-int8",
    "gptq-int4",
    "awq-int4",
    "w4a16-ct",
}

# Checkpoints with static FP8 input scales, which the CPU MoE experts do not
# use (W8A16): their log must say so.
STATIC_INPUT_SCALES = {"fp8-tensor"}


@dataclass(frozen=True)
class Server:
    variant: Variant
    backend: str
    library: str | None
    compiled: bool

    @property
    def name(self) -> str:
        return "-".join(
            [self.variant.name, self.backend]
            + ([self.library] if self.library else [])
            + (["compiled"] if self.compiled else [])
        )


def servers() -> list[Server]:
    """Every variant with --moe-backend auto under the default library and
    with --moe-backend cpu, each family's scheme with --moe-backend cpu
    under every library.  Every variant runs compiled (``vllm serve``'s
    default) on one of its servers and eager on another: compiled are the
    auto servers of the FP8 per-tensor and block, int8 and int4 schemes
    (upstream's AMX kernels where they run, the fork's elsewhere), the
    --moe-backend cpu servers of the other variants, and every family's
    server under the AVX2 library (the fork's kernels, on any x86 CPU)."""
    compiled_auto = {"fp8-tensor", "fp8-block", "w8a8-int8", "gptq-int4"}
    out = []
    for v in variants():
        auto_compiled = v.name in compiled_auto
        out.append(Server(v, "auto", DEFAULT_LIBRARY, auto_compiled))
        if v.name in FAMILIES:
            out += [
                Server(v, "cpu", library, library == "avx2")
                for library in (LIBRARIES or {None: False})
            ]
        else:
            out.append(Server(v, "cpu", DEFAULT_LIBRARY, not auto_compiled))
    return out


# Variants whose experts the fork's x86 kernels serve where upstream's AMX
# kernels do not run, by the experts class their log names (online int8 runs
# W8A8, as upstream's AMX and Arm experts run it).
X86_KERNELS = {
    "fp8-tensor": "X86CPUExpertsFp8",
    "fp8-channel-ct": "X86CPUExpertsFp8",
    "fp8-block": "X86CPUExpertsFp8",
    "online-fp8": "X86CPUExpertsFp8",
    "mxfp8-modelopt": "X86CPUExpertsMxfp8",
    "w8a8-int8": "X86CPUExpertsInt8",
    "online-int8": "X86CPUExpertsInt8",
    "gptq-int4": "X86CPUExpertsWNA16",
    "awq-int4": "X86CPUExpertsWNA16",
    "w4a16-ct": "X86CPUExpertsWNA16",
}


def expected_experts(server: Server) -> str | None:
    """The experts class the server's MoE layers must run and its log name:
    None for upstream's AMX experts, the fork's C++ kernels where they serve
    the scheme, CPUDequantExperts* everywhere else."""
    amx = LIBRARIES.get(server.library or "", False)
    if amx and server.variant.name in AMX_UPSTREAM:
        return None
    return X86_KERNELS.get(server.variant.name, "CPUDequantExperts")


@dataclass
class Served:
    server: Server
    url: str
    twin: list[lib.Generation]

    @property
    def name(self) -> str:
        return self.server.name


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


@pytest.fixture(scope="module", params=servers(), ids=lambda server: server.name)
def quantized(request, checkpoints, twin_outputs):
    server: Server = request.param
    variant = server.variant
    ckpt = checkpoints.scheme(variant.scheme)
    twin_dir = ckpt.model if variant.online else ckpt.twin
    if twin_dir is None:
        pytest.fail(f"scheme {variant.scheme} wrote no bf16 twin")
    args = [*variant.serve_args, "--moe-backend", server.backend]
    with lib.serve(
        ckpt.model,
        args,
        log_name=server.name,
        compiled=server.compiled,
        library=server.library,
    ) as url:
        # The twin is served (once per module) only once the quantized model
        # is known to come up; both run at the same time for that moment.
        yield Served(server, url, twin_outputs(twin_dir))


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
        lib.swap_experts_0_1,
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
    """The server loaded the kernel library it was asked for, and its MoE
    layers took the path that library and scheme call for: upstream's AMX
    experts where they run and serve the scheme, the fork's C++ kernels where
    they serve it, CPUDequantExperts* everywhere else."""
    server = quantized.server
    log = lib.log_path(quantized.name).read_text(errors="replace")
    if server.library is not None:
        assert f"CPU kernel library: {server.library}" in log, quantized.name
    expected = expected_experts(server)
    dequant = "Using CPUDequantExperts" in log
    assert dequant == (expected == "CPUDequantExperts"), (
        f"{quantized.name}: CPUDequantExperts {'taken' if dequant else 'not taken'}"
        f" (AMX kernels: {LIBRARIES.get(server.library or '', False)})"
    )
    if expected is not None:
        assert f"Using {expected}" in log, f"{quantized.name}: {expected} not taken"
    if expected is not None and server.variant.name in STATIC_INPUT_SCALES:
        assert "the checkpoint's static input scales are ignored" in log, quantized.name


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


def test_every_family_is_served_under_every_library() -> None:
    """Each MoE scheme family has a --moe-backend cpu server under every
    kernel library this machine runs."""
    if not LIBRARIES:
        pytest.skip("not an x86 CPU: one kernel library")
    got = {(s.variant.name, s.library) for s in servers() if s.backend == "cpu"}
    want = {(f, library) for f in FAMILIES for library in LIBRARIES}
    assert want <= got, sorted(want - got)


def test_every_variant_is_served_auto_and_cpu_compiled_and_eager() -> None:
    for v in variants():
        mine = [s for s in servers() if s.variant == v]
        assert {s.backend for s in mine} == set(BACKENDS), v.name
        assert {s.compiled for s in mine} == {True, False}, v.name
