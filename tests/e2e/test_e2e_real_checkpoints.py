"""Checkpoints written by the real quantization tools, served on CPU vs their
bf16 twin.

What runs: every format of ``tools/real_checkpoints`` (llm-compressor,
auto-round and ModelOpt, each in its own hash-locked venv; the checkpoints
are cached by tool version, recipe and base, see that package).  The tools
quantize the tiny bf16 Qwen3-MoE of ``tiny_checkpoint``, which is the twin:
one bf16 server for every format.  Each format is served twice on the
kernels the fork adds for x86 without AMX:

* ``--moe-backend auto`` under the AVX-512 library (``_C_AVX512``);
* ``--moe-backend cpu`` under the AVX2 library (``_C_AVX2``, every x86 CPU);

one of the two compiled (``vllm serve``'s default), the other eager,
alternating by format.  Upstream's AMX kernels, which the default library
runs on an AMX machine, are served by test_e2e_quantized_vs_twin.py on the
hand-written checkpoints.

Each server must pass the tolerance rule of test_e2e_quantized_vs_twin.py
(e2e_lib.judge: the twin's top-2 logprob gap decides which disagreements
are near-ties, greedy and teacher-forced), its log must show the
quantization method vLLM detected and the MoE experts the fork's kernels
give that scheme, and a checkpoint with static FP8 input scales (ModelOpt
FP8) must say they are ignored.

Time: 24 servers and the twin took about 13 min on 2 cores with every
checkpoint cached, the 4 servers of two W4A16 variants 3 min more and the 4
of the last two formats (with the twin) 2 min 48 s; building the three tool
venvs and writing the sixteen checkpoints adds about 4 min on a machine that
has neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import e2e_lib as lib
import pytest
import real_checkpoints

LIBRARIES = lib.x86_kernel_libraries()

# The fork's x86 experts each scheme runs where upstream's AMX kernels do not.
EXPERTS = {
    "llmc-fp8-dynamic": "X86CPUExpertsFp8",
    "llmc-fp8-block": "X86CPUExpertsFp8",
    "mo-fp8": "X86CPUExpertsFp8",
    "llmc-mxfp8": "X86CPUExpertsMxfp8",
    "mo-mxfp8": "X86CPUExpertsMxfp8",
    "llmc-w8a8": "X86CPUExpertsInt8",
    "llmc-w8a16": "X86CPUExpertsWNA16",
    "llmc-w8a16-channel": "X86CPUExpertsWNA16",
    "llmc-w4a16": "X86CPUExpertsWNA16",
    "llmc-w4a16-gptq": "X86CPUExpertsWNA16",
    "llmc-w4a16-asym": "X86CPUExpertsWNA16",
    "llmc-w4a16-g32": "X86CPUExpertsWNA16",
    "llmc-w4a16-g64": "X86CPUExpertsWNA16",
    "llmc-w4a16-channel": "X86CPUExpertsWNA16",
    "ar-gptq": "X86CPUExpertsWNA16",
    "ar-awq": "X86CPUExpertsWNA16",
}

# Checkpoints with static FP8 input scales, which the CPU experts do not use.
STATIC_INPUT_SCALES = {"mo-fp8"}

# The twin is the model the tool quantized, not its dequantized weights, so
# the comparison also sees the quantization error.  Int4 with groups of 128
# on this random model moves many near-ties: up to a quarter of the
# teacher-forced positions may disagree (measured: 22/128 for
# llm-compressor's W4A16, all at twin gaps <= 1.0); every other rule of
# e2e_lib.judge stands, and test_rule_rejects_swapped_experts shows a wrong
# int4 model still fails.
INT4 = {
    "llmc-w4a16",
    "llmc-w4a16-gptq",
    "llmc-w4a16-asym",
    "llmc-w4a16-g32",
    "llmc-w4a16-g64",
    "llmc-w4a16-channel",
    "ar-gptq",
    "ar-awq",
}
INT4_MAX_FLIP_FRACTION = 0.25


def max_flip_fraction(fmt: str) -> float:
    return INT4_MAX_FLIP_FRACTION if fmt in INT4 else lib.MAX_FLIP_FRACTION


@dataclass(frozen=True)
class Server:
    fmt: str
    backend: str
    library: str
    compiled: bool

    @property
    def name(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        return f"real-{self.fmt}-{self.backend}-{self.library}-{mode}"


def servers() -> list[Server]:
    out = []
    for i, fmt in enumerate(real_checkpoints.FORMATS):
        auto_compiled = i % 2 == 0
        out.append(Server(fmt, "auto", "avx512", auto_compiled))
        out.append(Server(fmt, "cpu", "avx2", not auto_compiled))
    return [s for s in out if s.library in LIBRARIES]


def test_every_format_has_expected_experts() -> None:
    assert set(EXPERTS) == set(real_checkpoints.FORMATS)
    assert servers(), "this machine runs neither the AVX-512 nor the AVX2 library"


@pytest.fixture(scope="module")
def twin() -> list[lib.Generation]:
    base = real_checkpoints.ensure_base()
    with lib.serve(base, log_name="real-twin") as url:
        return lib.greedy(url, logprobs=2)


def test_rule_rejects_swapped_experts(checkpoints, twin) -> None:
    """llm-compressor's W4A16 with experts 0 and 1 swapped in every layer
    (weights, scales): under the int4 flip cap it must still fail."""
    model, _ = real_checkpoints.ensure("llmc-w4a16")
    stamp = real_checkpoints.cache.read_stamp(model)
    assert stamp is not None
    wrong = checkpoints.derive(
        "real-llmc-w4a16-swapped-experts-0-1",
        model,
        lib.swap_experts_0_1,
        "experts 0 and 1 swapped in every layer",
        base_key=stamp["key"],
    )
    with lib.serve(wrong, ["--moe-backend", "cpu"], log_name=wrong.name) as url:
        quant = lib.greedy(url)
        tf = lib.teacher_forced_argmax(url, twin)
    verdict = lib.judge(quant, twin, tf, max_flip_fraction=INT4_MAX_FLIP_FRACTION)
    print(f"\n{wrong.name}:\n{verdict.report()}")
    assert not verdict.ok, f"a wrong model passed the rule:\n{verdict.report()}"


@pytest.fixture(scope="module", params=servers(), ids=lambda s: s.name)
def served(request, twin):
    server: Server = request.param
    model, _ = real_checkpoints.ensure(server.fmt)
    with lib.serve(
        model,
        ["--moe-backend", server.backend],
        log_name=server.name,
        compiled=server.compiled,
        library=server.library,
    ) as url:
        yield server, url, twin


def test_matches_twin(served) -> None:
    server, url, twin = served
    quant = lib.greedy(url)
    tf = lib.teacher_forced_argmax(url, twin)
    verdict = lib.judge(
        quant, twin, tf, max_flip_fraction=max_flip_fraction(server.fmt)
    )
    print(f"\n{server.name}:\n{verdict.report()}")
    assert verdict.ok, f"{server.name} vs twin:\n{verdict.report()}"


def test_log_names_method_and_experts(served) -> None:
    server, _, _ = served
    fmt = real_checkpoints.FORMATS[server.fmt]
    log = lib.log_path(server.name).read_text(errors="replace")
    assert f"CPU kernel library: {server.library}" in log, server.name
    assert f"quantization={fmt.quantization}," in log, (
        f"{server.name}: vLLM did not detect {fmt.quantization}"
    )
    assert f"Using {EXPERTS[server.fmt]}" in log, (
        f"{server.name}: {EXPERTS[server.fmt]} not taken"
    )
    if server.fmt in STATIC_INPUT_SCALES:
        assert "the checkpoint's static input scales are ignored" in log, server.name
