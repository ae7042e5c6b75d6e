"""Serve the tiny Qwen3-MoE on CPU in every scheme the fork serves; time it.

With ``--shape qwen3-30b-a3b-2l`` the checkpoints are two layers of
Qwen3-30B-A3B at its real widths instead: there the layers' weights are read
from memory at every step, as in a real model, where the tiny model's fit in
the caches and its steps are mostly the calls around the kernels.

For each model -- every served scheme of tools/tiny_checkpoint
(``tiny_checkpoint.SCHEMES``: bf16, the FP8, int8, int4 and MXFP8 formats;
checkpoints written to build/models/ if missing) plus the online variants on
the bf16 checkpoint (``--quantization fp8`` and ``--quantization
experts_int8``) -- this starts ``vllm serve`` through
tools/serve_demo.running_server (127.0.0.1, always stopped) and measures:

* ready_s: from starting the process to /health answering 200;
* batch-1 output tokens/s: requests one after another (fixed prompts,
  greedy, max_tokens each, ignore_eos so every request decodes exactly
  max_tokens), total completion tokens / total wall time;
* concurrent output tokens/s: N requests in flight at once (threads released
  together), total completion tokens / wall time of the burst.

The servers run with VLLM_USE_SPINLOOP_EXT=1 unless the environment sets it,
and the requests go through the standard library's HTTP client (SERVER_ENV
below says why).

A warm-up request and a short warm-up burst run first (the first requests
of a server pay one-off costs).  Each throughput figure is the median of --repeats runs.  Not a test:
it asserts nothing about speed.  Timings on a small shared machine are noisy;
the load average before and after is printed with the machine facts.  The
Markdown table gives each figure's ratio to bf16's (when bf16 is in the run);
a model whose server does not start or whose requests fail is reported as
such in the table (with the first line of the error) and the run goes on.

Usage::

    .venv/bin/python benchmarks/cpu_serve_bench.py
    .venv/bin/python benchmarks/cpu_serve_bench.py --models bf16 fp8-block \\
        --max-tokens 64 --concurrency 16 --repeats 3 --json build/bench.json
    .venv/bin/python benchmarks/cpu_serve_bench.py --max-tokens 32 --repeats 1
    .venv/bin/python benchmarks/cpu_serve_bench.py --shape qwen3-30b-a3b-2l \
        --models bf16 fp8-block fp8-tensor w8a8-int8 --compile
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import serve_demo  # noqa: E402
import tiny_checkpoint  # noqa: E402
from cpu_harness import cap_onednn_isa  # noqa: E402

MODELS_DIR = REPO / "build" / "models"

# name -> (tiny_checkpoint scheme, extra `vllm serve` flags): every scheme the
# fork serves (bf16 first, the baseline of the ratios), then the online
# quantizations of the bf16 checkpoint, as the e2e suite serves them.
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    scheme: (scheme, ("--moe-backend", "cpu"))
    for scheme in sorted(tiny_checkpoint.SCHEMES, key=lambda s: s != "bf16")
}
MODELS["online-fp8"] = ("bf16", ("--moe-backend", "cpu", "--quantization", "fp8"))
MODELS["online-int8"] = (
    "bf16",
    (
        "--moe-backend",
        "cpu",
        "--quantization",
        "experts_int8",
        "--allow-deprecated-quantization",
    ),
)

# The checkpoint tool's prompt set, plus four: one per concurrent request.
PROMPTS = (
    *tiny_checkpoint.PROMPTS,
    "The football match began",
    "Chess players think",
    "In the garden we planted",
    "The sailors raised the anchor",
)

CPU_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
)


def machine_facts() -> dict[str, object]:
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "?":
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    except (OSError, ValueError):
        nproc = len(os.sched_getaffinity(0))
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "?"
    try:
        from importlib.metadata import version

        vllm_version = version("vllm")
    except Exception:  # noqa: BLE001
        vllm_version = "?"
    return {
        "nproc": nproc,
        "cpu_model": model,
        "cpu_flags": {f: f in flags for f in CPU_FLAGS},
        "python": platform.python_version(),
        "torch": torch_version,
        "vllm": vllm_version,
        "loadavg": os.getloadavg(),
    }


def ensure_checkpoint(scheme: str, shape: str = "tiny") -> Path:
    out = MODELS_DIR / f"{shape}-{scheme}"
    if not (out / "config.json").exists():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "tools" / "tiny_checkpoint"),
                "--out",
                str(out),
                "--scheme",
                scheme,
                *(("--shape", shape) if shape != "tiny" else ()),
            ],
            check=True,
        )
    return out


# A client on the same 2-core machine competes with the server for the CPU.
# With upstream's default wait of the engine core for its worker (a Python
# loop of sched_yield() over the shared-memory queue, for 1 s after each read)
# a burst's requests went out mostly one at a time in 7 of 32 16-concurrent
# runs of the tiny model (550-1190 tok/s against 4080-5370; 2 more in part):
# they reached the server as the one before finished, and the server added
# each within a millisecond. With upstream's C extension for that wait
# (VLLM_USE_SPINLOOP_EXT=1; on Intel also a busy poll, for up to 0.1 s at a
# time, releasing the GIL around a pause between its checks and calling no
# sched_yield()), 1 run of 28 with this client did, 1 more in part. A remote
# client would not compete for the server's cores. The servers get it unless
# the environment says otherwise. The requests go through the standard
# library's HTTP client: 16 threads with httpx (the openai client's) sent 7 of
# 12 bursts one request at a time, this client 0 of 16.
SERVER_ENV = {"VLLM_USE_SPINLOOP_EXT": "1"}


def _model(base_url: str) -> str:
    return serve_demo.request_json(base_url, "models")["data"][0]["id"]


def _complete(base_url: str, model: str, prompt: str, max_tokens: int) -> int:
    resp = serve_demo.request_json(
        base_url,
        "completions",
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    )
    n = resp.get("usage", {}).get("completion_tokens")
    if n != max_tokens:
        raise RuntimeError(f"got {n} tokens, wanted {max_tokens} (ignore_eos?)")
    return n


def batch1_tps(base_url: str, model: str, n_requests: int, max_tokens: int) -> float:
    t0 = time.perf_counter()
    tokens = sum(
        _complete(base_url, model, PROMPTS[i % len(PROMPTS)], max_tokens)
        for i in range(n_requests)
    )
    return tokens / (time.perf_counter() - t0)


def concurrent_tps(base_url: str, model: str, n: int, max_tokens: int) -> float:
    barrier = threading.Barrier(n + 1, timeout=60)
    results: list[int | BaseException] = [0] * n

    def one(i: int) -> None:
        try:
            barrier.wait()
            results[i] = _complete(
                base_url, model, PROMPTS[i % len(PROMPTS)], max_tokens
            )
        except BaseException as e:  # noqa: BLE001 - re-raised below
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        raise RuntimeError("concurrent requests did not finish within 600 s")
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} concurrent requests failed: {errors[0]!r}")
    return sum(results) / wall  # type: ignore[arg-type]


@dataclass
class Row:
    model: str
    ready_s: float
    batch1_tps: float
    batch1_runs: list[float]
    concurrent_tps: float
    concurrent_runs: list[float]
    error: str | None = None


def failed_row(name: str, err: BaseException) -> Row:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    # The server's own error (last log line) says more than the wrapper's.
    detail = (lines[-1] if lines else type(err).__name__).replace("|", "/")
    return Row(name, float("nan"), float("nan"), [], float("nan"), [], detail)


def _serve_args(args: argparse.Namespace) -> list[str]:
    """The serve arguments every scheme gets (without --enforce-eager when
    --compile is given)."""
    return [
        a
        for a in serve_demo.DEFAULT_SERVE_ARGS
        if not (args.compile and a == "--enforce-eager")
    ]


def server_env_settings() -> dict[str, str]:
    """SERVER_ENV as the servers get it (the environment's values win)."""
    return {k: os.environ.get(k, v) for k, v in SERVER_ENV.items()}


def bench_one(name: str, args: argparse.Namespace) -> Row:
    scheme, flags = MODELS[name]
    path = ensure_checkpoint(scheme, args.shape)
    defaults = _serve_args(args)
    log = REPO / "build" / "bench" / f"serve-{name}.log"
    t0 = time.perf_counter()
    with serve_demo.running_server(
        path,
        list(flags),
        log_path=log,
        default_args=defaults,
        ready_timeout_s=600,
        env={**SERVER_ENV, **os.environ},
    ) as base_url:
        ready = time.perf_counter() - t0
        if "disabling VLLM_USE_SPINLOOP_EXT" in log.read_text(errors="replace"):
            print(f"  {name}: the server could not load vllm.spinloop", flush=True)
        model = _model(base_url)
        # Warm-up: one request, then one short burst (first-call costs).
        _complete(base_url, model, "Warm-up: the weather today is", 8)
        concurrent_tps(base_url, model, args.concurrency, 8)
        b1 = [
            batch1_tps(base_url, model, args.batch1_requests, args.max_tokens)
            for _ in range(args.repeats)
        ]
        cc = [
            concurrent_tps(base_url, model, args.concurrency, args.max_tokens)
            for _ in range(args.repeats)
        ]
    return Row(name, ready, statistics.median(b1), b1, statistics.median(cc), cc)


def markdown_table(rows: list[Row], concurrency: int) -> str:
    """One line per model; ``x bf16`` is the figure over bf16's."""
    base = next((r for r in rows if r.model == "bf16" and r.error is None), None)

    def ratio(value: float, ref: float | None) -> str:
        return f"{value / ref:.2f}" if ref else "-"

    head = (
        "| model | ready s | batch-1 tok/s | x bf16 | "
        f"{concurrency} concurrent tok/s | x bf16 |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.error is not None:
            lines.append(f"| {r.model} | fails: {r.error} | - | - | - | - |")
            continue
        lines.append(
            f"| {r.model} | {r.ready_s:.1f} | {r.batch1_tps:.1f} | "
            f"{ratio(r.batch1_tps, base and base.batch1_tps)} | "
            f"{r.concurrent_tps:.1f} | "
            f"{ratio(r.concurrent_tps, base and base.concurrent_tps)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), default=list(MODELS)
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--batch1-requests",
        type=int,
        default=4,
        help="sequential requests per batch-1 run",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compile", action="store_true", help="drop --enforce-eager (torch.compile)"
    )
    parser.add_argument(
        "--shape",
        choices=sorted(tiny_checkpoint.SHAPES),
        default="tiny",
        help="checkpoint dimensions: the tiny test model, or two layers of "
        "Qwen3-30B-A3B at its real widths (2.4 GB in bf16; written on first use)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    onednn_isa = cap_onednn_isa()  # inherited by every server
    facts = machine_facts() | {
        "x86_kernels": os.environ.get("VLLM_CPU_X86_KERNELS"),
        "onednn_max_cpu_isa": onednn_isa,
    }
    flags = " ".join(
        f"{f}={'yes' if v else 'no'}" for f, v in facts["cpu_flags"].items()
    )  # type: ignore[union-attr]
    print(f"machine: nproc={facts['nproc']}  cpu: {facts['cpu_model']}")
    print(f"flags:   {flags}")
    print(f"python {facts['python']}, torch {facts['torch']}, vllm {facts['vllm']}")
    print(
        f"VLLM_CPU_X86_KERNELS={facts['x86_kernels']}, "
        f"ONEDNN_MAX_CPU_ISA={facts['onednn_max_cpu_isa']}"
    )
    print(f"loadavg before: {' '.join(f'{x:.2f}' for x in facts['loadavg'])}")  # type: ignore[union-attr]
    print(
        f"settings: {args.shape} model, max_tokens={args.max_tokens} ignore_eos "
        "greedy, batch-1 = "
        f"{args.batch1_requests} sequential requests, concurrency={args.concurrency}, "
        f"median of {args.repeats}, "
        f"{'compiled' if args.compile else '--enforce-eager'}, "
        f"serve args {' '.join(_serve_args(args))}, server environment "
        + " ".join(f"{k}={v}" for k, v in server_env_settings().items()),
        flush=True,
    )
    rows = []
    for name in args.models:
        try:
            row = bench_one(name, args)
        except (serve_demo.ServerError, RuntimeError, OSError) as e:
            row = failed_row(name, e)
            print(f"  {name}: FAILED: {row.error}", flush=True)
        else:
            print(
                f"  {name}: ready {row.ready_s:.1f}s, batch-1 runs "
                f"{[round(x, 1) for x in row.batch1_runs]} tok/s, concurrent runs "
                f"{[round(x, 1) for x in row.concurrent_runs]} tok/s",
                flush=True,
            )
        rows.append(row)
    after = os.getloadavg()
    print(f"loadavg after:  {' '.join(f'{x:.2f}' for x in after)}")
    print()
    print(markdown_table(rows, args.concurrency))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "machine": facts,
                    "loadavg_after": after,
                    "settings": vars(args)
                    | {"json": str(args.json), "server_env": server_env_settings()},
                    "rows": [asdict(r) for r in rows],
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
