# SPDX-License-Identifier: Apache-2.0
"""Per-token decode time of the tiny Qwen3-MoE on CPU, in process, per scheme.

cpu_serve_bench.py times HTTP requests; on a shared 2-core machine its runs
spread by up to 25 %, which hides differences of a hundred microseconds a
token. This runs vLLM's ``LLM`` inside the process (the engine core too:
VLLM_ENABLE_V1_MULTIPROCESSING=0), compiled as ``vllm serve`` runs by
default, with the same flags per scheme as cpu_serve_bench.MODELS, and times
greedy generations of one prompt (batch 1): microseconds per decoded token,
one fresh process per model, ratio to bf16. ``--profile`` also prints
torch.profiler's table of one generation per model (the profiler slows
Python-heavy ops more than kernels: read it for where time goes, not for
how much). ``--op-times`` also prints, per model, the wall time per token
and per call spent inside each of vLLM's CPU custom ops named ``cpu_*``
(their Python implementations, timed around the call): what a quantized
layer costs in the running model.

Not a test; it asserts nothing. Usage, from the repository root with the
fork built::

    .venv/bin/python benchmarks/cpu_decode_step.py --models bf16 fp8-tensor
"""

from __future__ import annotations

import argparse
import collections
import functools
import inspect
import json
import os
import subprocess
import sys
import time

from cpu_harness import cap_onednn_isa
from cpu_serve_bench import MODELS, ensure_checkpoint


def _engine_kwargs(flags: tuple[str, ...]) -> dict[str, object]:
    """`vllm serve` flags as LLM keyword arguments ("--a-b v" -> a_b="v",
    a flag without a value -> True)."""
    kwargs: dict[str, object] = {}
    i = 0
    while i < len(flags):
        key = flags[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            kwargs[key] = flags[i + 1]
            i += 2
        else:
            kwargs[key] = True
            i += 1
    return kwargs


# Seconds and calls per timed op (--op-times), in the child process.
_op_seconds: collections.Counter[str] = collections.Counter()
_op_calls: collections.Counter[str] = collections.Counter()


def _timed(name: str, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _op_seconds[name] += time.perf_counter() - start
            _op_calls[name] += 1

    # The custom-op registration reads the schema from the signature.
    timed.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return timed


def _time_ops() -> None:
    """Times vLLM's CPU custom ops (those named cpu_*, registered after
    this)."""
    import vllm.utils.torch_utils as torch_utils

    register = torch_utils.direct_register_custom_op

    def timed_register(op_name, op_func, *args, **kwargs):
        if op_name.startswith("cpu_"):
            op_func = _timed(op_name, op_func)
        return register(op_name, op_func, *args, **kwargs)

    torch_utils.direct_register_custom_op = timed_register


def run_model(
    name: str, tokens: int, repeats: int, profile: bool, op_times: bool
) -> None:
    """In the child process: one model, one JSON line on stdout."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if op_times:
        _time_ops()
    from vllm import LLM, SamplingParams

    scheme, flags = MODELS[name]
    llm = LLM(
        model=str(ensure_checkpoint(scheme)),
        max_model_len=512,
        max_num_seqs=16,
        dtype="bfloat16",
        **_engine_kwargs(flags),
    )
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    prompt = ["The capital of France is"]
    for _ in range(3):
        llm.generate(prompt, params, use_tqdm=False)
    per_token = []
    _op_seconds.clear()
    _op_calls.clear()
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)
        per_token.append((time.perf_counter() - start) / tokens * 1e6)
    if op_times:
        generated = repeats * tokens
        print(f"{name}: inside each op, per token and per call", file=sys.stderr)
        for op, seconds in sorted(_op_seconds.items()):
            print(
                f"  {op:<32} {seconds / generated * 1e6:8.1f} us/token "
                f"{_op_calls[op] / generated:5.1f} calls/token "
                f"{seconds / _op_calls[op] * 1e6:8.1f} us/call",
                file=sys.stderr,
            )
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.generate(prompt, params, use_tqdm=False)
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=70, max_name_column_width=60
        )
        print(table, file=sys.stderr)
    print("RESULT " + json.dumps({"model": name, "us_per_token": per_token}))


def main() -> None:
    cap_onednn_isa()  # inherited by each model's child process
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--op-times", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_model(args.child, args.tokens, args.repeats, args.profile, args.op_times)
        return
    print(
        f"batch 1, greedy, {args.tokens} tokens, compiled, one process per "
        f"model; median (min) of {args.repeats} generations, loadavg "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"{'model':<16} {'us/token':>9} {'(min)':>7} {'x bf16':>7}")
    bf16 = None
    for name in args.models:
        cmd = [sys.executable, __file__, "--child", name]
        cmd += ["--tokens", str(args.tokens), "--repeats", str(args.repeats)]
        if args.profile:
            cmd.append("--profile")
        if args.op_times:
            cmd.append("--op-times")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{name:<16} failed (exit code {proc.returncode})", flush=True)
            continue
        times = sorted(json.loads(lines[-1][len("RESULT ") :])["us_per_token"])
        median = times[len(times) // 2]
        if name == "bf16":
            bf16 = median
        ratio = f"{median / bf16:.2f}" if bf16 else "-"
        print(f"{name:<16} {median:>9.0f} {times[0]:>7.0f} {ratio:>7}", flush=True)


if __name__ == "__main__":
    main()
