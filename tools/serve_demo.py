"""Start ``vllm serve`` on a model, send one completion, stop the server.

Why: this is the fork's "main job" smoke test -- the whole stack (CLI, API
server, engine core process, model loader, CPU kernels, detokenizer) has to
work for one OpenAI completion to come back.  The start/wait/stop logic is the
importable context manager ``running_server`` so end-to-end tests reuse it
instead of re-implementing process handling.

Usage::

    python tools/serve_demo.py --model build/models/tiny-bf16
    python tools/serve_demo.py --model build/models/tiny-fp8-tensor \
        --quantization fp8 -- --enforce-eager

Everything runs offline (HF_HUB_OFFLINE=1) with caches under
``<repo>/build/cache``; the server log goes to ``<repo>/build/serve-<name>.log``.
Exit status is 0 only if a completion came back and the server was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = REPO_ROOT / "build"
CACHE_DIR = BUILD_DIR / "cache"
HOST = "127.0.0.1"

# Flags for a tiny model on CPU.  --enforce-eager skips torch.compile /
# inductor, which dominates start-up for a model this small: on a 2-core box
# the tiny Qwen3-MoE was ready after ~22-26 s eager vs ~61 s compiled with a
# cold cache and ~38 s with a warm one, with the same greedy text.  Pass
# --no-enforce-eager (serve_demo) or COMPILED_SERVE_ARGS as default_args to
# compile, as `vllm serve` does by default.
ENFORCE_EAGER = "--enforce-eager"
COMPILED_SERVE_ARGS: tuple[str, ...] = (
    "--max-model-len",
    "512",
    "--dtype",
    "bfloat16",
    "--max-num-seqs",
    "16",
)
DEFAULT_SERVE_ARGS: tuple[str, ...] = (*COMPILED_SERVE_ARGS, ENFORCE_EAGER)

# Direct access, never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerError(RuntimeError):
    """The server died, never became healthy, or the request failed."""


def vllm_executable() -> Path:
    """The ``vllm`` entry point of the venv this interpreter belongs to.

    Not resolved through symlinks: a venv's bin/python usually links to the
    base interpreter, whose directory has no vllm.
    """
    exe = Path(sys.executable).parent / "vllm"
    if not exe.exists():
        raise ServerError(f"no vllm next to {sys.executable} ({exe} missing)")
    return exe


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the server: offline, caches inside build/."""
    env = dict(os.environ if base is None else base)
    for sub in ("vllm", "inductor", "xdg"):
        (CACHE_DIR / sub).mkdir(parents=True, exist_ok=True)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env["VLLM_CACHE_ROOT"] = str(CACHE_DIR / "vllm")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(CACHE_DIR / "inductor")
    env["XDG_CACHE_HOME"] = str(CACHE_DIR / "xdg")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    no_proxy = ",".join(filter(None, [env.get("NO_PROXY"), HOST, "localhost"]))
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    return env


def log_tail(path: Path, lines: int = 40) -> str:
    """Root-cause exception lines (first few) plus the last ``lines`` lines.

    The API server's own traceback ("Engine core initialization failed. See
    root cause above") ends the log, so the engine core's exception would
    otherwise scroll out of the tail.
    """
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    errors = [
        line
        for line in text
        if re.search(r"\b\w+(Error|Exception): ", line) and "WARNING" not in line
    ]
    head = ["errors in log:", *errors[:6], "..."] if errors else []
    return "\n".join([*head, *text[-lines:]])


def _healthy(base: str) -> bool:
    try:
        with _OPENER.open(f"{base}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGINT, then SIGTERM, then SIGKILL -- to the server's process group.

    The server runs in its own session (start_new_session=True), so its
    process group holds exactly the API server and the engine-core / worker
    processes it spawned, and nothing else.
    """
    if proc.poll() is not None:
        return
    pgid = proc.pid  # session leader: pgid == pid
    for sig, wait_s in (
        (signal.SIGINT, grace_s),
        (signal.SIGTERM, 10.0),
        (signal.SIGKILL, 10.0),
    ):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # Children that outlived the leader (same group) get the last word.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def running_server(
    model: str | os.PathLike[str],
    extra_args: Sequence[str] = (),
    *,
    port: int | None = None,
    log_path: Path | None = None,
    ready_timeout_s: float = 300.0,
    default_args: Sequence[str] = DEFAULT_SERVE_ARGS,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Run ``vllm serve MODEL`` on 127.0.0.1 and yield its ``/v1`` base URL.

    Waits (at most ``ready_timeout_s``) for ``/health``; raises ServerError
    with the tail of the server log if the process exits or never gets
    healthy.  The server is always stopped on exit from the ``with`` block.
    ``extra_args`` come after ``default_args`` so they can override them.
    """
    model = Path(model)
    port = port or free_port()
    log_path = log_path or BUILD_DIR / f"serve-{model.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(vllm_executable()),
        "serve",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        *default_args,
        *extra_args,
    ]
    base = f"http://{HOST}:{port}"
    with log_path.open("wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(env),
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + ready_timeout_s
            while not _healthy(base):
                if proc.poll() is not None:
                    raise ServerError(
                        f"vllm serve exited with {proc.returncode} before it was "
                        f"ready; tail of {log_path}:\n{log_tail(log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"vllm serve not healthy after {ready_timeout_s:.0f}s; "
                        f"tail of {log_path}:\n{log_tail(log_path)}"
                    )
                time.sleep(0.5)
            yield f"{base}/v1"
        finally:
            _stop(proc)


def request_json(
    base_url: str, path: str, body: dict | None = None, timeout_s: float = 300.0
) -> dict:
    """GET (no body) or POST a JSON body to ``base_url/path``; its JSON reply.
    The standard library's client, no proxy: lighter on a small machine than
    the openai client. An HTTP error raises ServerError with the server's
    message."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{base_url}/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(request, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace").strip()
        raise ServerError(f"/{path}: HTTP {e.code}: {detail}") from e
    except ValueError as e:
        raise ServerError(f"/{path}: the reply is not JSON: {e}") from e


def complete(base_url: str, prompt: str, max_tokens: int = 16) -> tuple[str, str]:
    """One greedy completion with the openai client; returns (model, text)."""
    import httpx
    from openai import OpenAI

    client = OpenAI(
        base_url=base_url,
        api_key="EMPTY",
        timeout=120.0,
        max_retries=0,
        http_client=httpx.Client(trust_env=False, timeout=120.0),
    )
    model = client.models.list().data[0].id
    resp = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0
    )
    return model, resp.choices[0].text


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--quantization", help="passed as vllm --quantization")
    parser.add_argument("--moe-backend", help="passed as vllm --moe-backend")
    parser.add_argument("--port", type=int, help="default: a free port")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-enforce-eager",
        action="store_true",
        help="drop --enforce-eager from the default flags (compile the model)",
    )
    args = parser.parse_args(argv)

    extra: list[str] = []
    if args.quantization:
        extra += ["--quantization", args.quantization]
    if args.moe_backend:
        extra += ["--moe-backend", args.moe_backend]
    extra += passthrough
    defaults = COMPILED_SERVE_ARGS if args.no_enforce_eager else DEFAULT_SERVE_ARGS

    t0 = time.monotonic()
    try:
        with running_server(
            args.model,
            extra,
            port=args.port,
            ready_timeout_s=args.ready_timeout,
            default_args=defaults,
        ) as base_url:
            ready_s = time.monotonic() - t0
            print(f"server ready at {base_url} after {ready_s:.1f}s", flush=True)
            t1 = time.monotonic()
            model, text = complete(base_url, args.prompt, args.max_tokens)
            print(f"completion took {time.monotonic() - t1:.2f}s (model {model})")
            print(f"prompt:     {args.prompt!r}")
            print(f"completion: {text!r}", flush=True)
    except Exception as e:  # noqa: BLE001 - report any failure as exit 1
        print(f"serve_demo FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"server stopped; total {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
