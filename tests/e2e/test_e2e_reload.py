"""Weight reload on CPU, every served scheme and the online ones.

RL frameworks update a served model's weights in place through
``collective_rpc("reload_weights")``: each layer is loaded again in the
checkpoint's format and processed again into the kernel's (repacked int4,
float32 MXFP8 scales, oneDNN handles, ...). For each scheme this loads the
tiny checkpoint A in process (``vllm.LLM``, eager, greedy), reloads it with B
(A with its two decoder layers swapped: the same format, other weights),
then with A again, and compares:

* the reloaded B's tokens with those of B loaded fresh in another process;
* A's tokens before and after the round trip;
* A's with B's (so that the first check cannot pass on a reload that did
  nothing).

Every variant loads under the x86 kernel library vLLM picks by default; the
INT8 ones (W8A8 and online int8) also under the AVX2 library, where the
fork's X86CPUExpertsInt8 repacks their weights at load (on an AMX machine
the default library runs upstream's AMX experts instead).

One subprocess per model load: two engines do not fit one process's CPU KV
cache. About 7 min for all cases on 2 cores (a 256-token batch limit
keeps the start-up profiling run short).
"""

from __future__ import annotations

import json
import subprocess
import sys

import e2e_lib as lib
import pytest
from test_e2e_quantized_vs_twin import LIBRARIES, Variant, variants

MAX_TOKENS = 12
PROMPTS = lib.PROMPTS[:3]
TIMEOUT_S = 600

_CHILD = r"""
import json, os, sys
from vllm import LLM, SamplingParams

first, second, mode, max_tokens = sys.argv[1:5]
prompts = json.loads(sys.argv[5])
engine_args = json.loads(sys.argv[6])
params = SamplingParams(temperature=0, max_tokens=int(max_tokens), ignore_eos=True)


def generate(llm):
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


llm = LLM(second if mode == "fresh" else first, **engine_args)
result = {"first": generate(llm)}
if mode == "reload":
    llm.collective_rpc("reload_weights", kwargs={"weights_path": second})
    result["second"] = generate(llm)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": first})
    result["first_again"] = generate(llm)
print("RESULT " + json.dumps(result))
"""


def _swap_layers(tensors: dict) -> None:
    """Swap every tensor of decoder layers 0 and 1 (same shapes, scales
    stay with their weights)."""
    zero, one = "model.layers.0.", "model.layers.1."
    for name in [n for n in tensors if n.startswith(zero)]:
        other = one + name[len(zero) :]
        tensors[name], tensors[other] = tensors[other], tensors[name]


def _engine_args(variant: Variant) -> dict:
    args: dict = {
        "dtype": "bfloat16",
        "max_model_len": 256,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 256,
        "enforce_eager": True,
        "moe_backend": "cpu",
    }
    flags = list(variant.serve_args)
    if "--quantization" in flags:
        args["quantization"] = flags[flags.index("--quantization") + 1]
    if "--allow-deprecated-quantization" in flags:
        args["allow_deprecated_quantization"] = True
    return args


# Variants whose experts repack their weights at load under the AVX2
# library, reloaded there too, and the experts class that repacks them.
REPACKED_ON_AVX2 = {
    "w8a8-int8": "X86CPUExpertsInt8",
    "online-int8": "X86CPUExpertsInt8",
    "gptq-int4": "X86CPUExpertsWNA16",
}


def cases() -> list[tuple[Variant, str | None]]:
    """(variant, x86 kernel library or None for vLLM's default)."""
    out: list[tuple[Variant, str | None]] = [(v, None) for v in variants()]
    if "avx2" in LIBRARIES:
        out += [(v, "avx2") for v in variants() if v.name in REPACKED_ON_AVX2]
    return out


def _run(
    first, second, mode: str, variant: Variant, library: str | None = None
) -> dict:
    # Offline, caches inside build/, as the e2e servers run.
    env = lib.serve_demo.server_env()
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    if library is not None:
        env["VLLM_CPU_X86_KERNELS"] = library
    name = variant.name + (f"-{library}" if library else "")
    cmd = [
        sys.executable,
        "-c",
        _CHILD,
        str(first),
        str(second),
        mode,
        str(MAX_TOKENS),
        json.dumps(list(PROMPTS)),
        json.dumps(_engine_args(variant)),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S
    )
    log = lib.log_path(f"reload-{name}-{mode}")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.fail(f"{name} {mode} exited with {proc.returncode}: {tail} (log: {log})")
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize(
    "variant,library",
    cases(),
    ids=lambda c: c.name if isinstance(c, Variant) else (c or "default"),
)
def test_reload_matches_a_fresh_load(
    checkpoints, variant: Variant, library: str | None
) -> None:
    first = checkpoints.scheme(variant.scheme).model
    second = checkpoints.derive(
        f"tiny-{variant.scheme}-layers-swapped",
        first,
        _swap_layers,
        "decoder layers 0 and 1 swapped",
    )
    reloaded = _run(first, second, "reload", variant, library)
    fresh = _run(first, second, "fresh", variant, library)
    if library == "avx2":
        log = lib.log_path(f"reload-{variant.name}-avx2-reload").read_text(
            errors="replace"
        )
        experts = REPACKED_ON_AVX2[variant.name]
        assert f"Using {experts}" in log, (
            f"{variant.name} under avx2 did not take {experts}"
        )
    assert reloaded["first"] != fresh["first"], (
        f"{variant.name}: the two checkpoints generate the same tokens, so "
        "the reload is not tested"
    )
    assert reloaded["second"] == fresh["first"], (
        f"{variant.name}: reloaded with the swapped checkpoint it generates "
        f"{reloaded['second']}, loaded fresh {fresh['first']}"
    )
    assert reloaded["first_again"] == reloaded["first"], (
        f"{variant.name}: after reloading the first checkpoint back it "
        f"generates {reloaded['first_again']}, not {reloaded['first']}"
    )
