"""The cache of tool-written checkpoints and ``ensure``.

Layout under ``$XDG_CACHE_HOME/vllm-fork`` (or ``$FORK_CACHE``)::

    tools/<tool>-<version>/                 the tool's venv (locks.ensure_venv)
    real-checkpoints/base-bf16/             the tiny bf16 model: the tools'
                                            input and the twin served beside
                                            every quantized checkpoint
    real-checkpoints/<tool>-<version>/<format>/   one written checkpoint

Every directory carries a stamp file (``STAMP``) holding the key it was
made under; a directory whose stamp does not match is rebuilt.  Writes go
to a temporary sibling that is renamed into place, so an interrupted run
never leaves a directory that looks complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from . import locks
from .formats import FORMATS, Format, Tool

HERE = Path(__file__).resolve().parent
RECIPES = HERE / "recipes"
TINY = HERE.parent / "tiny_checkpoint"
STAMP = ".real-checkpoint.json"
BASE_SEED = 0


def cache_root() -> Path:
    if explicit := os.environ.get("FORK_CACHE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "vllm-fork"


def venv_dir(tool: Tool) -> Path:
    return cache_root() / "tools" / tool.slug


def checkpoints_dir() -> Path:
    return cache_root() / "real-checkpoints"


def format_dir(fmt: Format) -> Path:
    return checkpoints_dir() / fmt.tool.slug / fmt.name


def files_digest(paths: list[tuple[str, Path]]) -> str:
    """sha256 over (name, contents) of the given files, in the given order."""
    h = hashlib.sha256()
    for name, path in paths:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def dir_digest(directory: Path) -> str:
    """Digest of every file of a checkpoint directory but its stamp."""
    files = sorted(
        (p.relative_to(directory).as_posix(), p)
        for p in directory.rglob("*")
        if p.is_file() and p.name != STAMP
    )
    return files_digest(files)


def recipe_files(tool: Tool) -> list[Path]:
    """What a recipe run executes from the repository: the tool's recipe
    and the helpers every recipe shares."""
    return [RECIPES / f"{tool.name}.py", RECIPES / "_calib.py"]


def recipe_digest(tool: Tool) -> str:
    return files_digest([(p.name, p) for p in recipe_files(tool)])


def cache_key(fmt: Format, lock_sha: str, recipe_sha: str, base_sha: str) -> str:
    """The key a written checkpoint is cached under: what made it."""
    fields = {
        "format": fmt.name,
        "scheme": fmt.scheme,
        "tool": fmt.tool.requirement,
        "lock": lock_sha,
        "recipe": recipe_sha,
        "base": base_sha,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def read_stamp(directory: Path) -> dict | None:
    try:
        return json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _publish(tmp: Path, final: Path, stamp: dict) -> None:
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One builder at a time across processes (pytest-xdist workers, two
    shells): held around every venv install and tool run, which also keeps
    the machine to one heavy process.  Not reentrant: take it once."""
    checkpoints_dir().mkdir(parents=True, exist_ok=True)
    with open(checkpoints_dir() / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_base(log=print) -> Path:
    """The tiny bf16 checkpoint (tiny_checkpoint --scheme bf16, default
    shape, seed 0), keyed by tiny_checkpoint's sources."""
    final = checkpoints_dir() / "base-bf16"
    key = files_digest([(p.name, p) for p in sorted(TINY.glob("*.py"))])
    stamp = read_stamp(final)
    if stamp and stamp.get("key") == key:
        return final
    with _build_lock():
        stamp = read_stamp(final)
        if not (stamp and stamp.get("key") == key):
            _write_base(final, key, log)
    return final


def _write_base(final: Path, key: str, log) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".base-bf16-", dir=final.parent))
    try:
        if str(TINY.parent) not in sys.path:
            sys.path.insert(0, str(TINY.parent))
        from tiny_checkpoint.schemes import generate

        shutil.rmtree(tmp)
        generate(tmp, "bf16", BASE_SEED, None, 1)
        _publish(tmp, final, {"key": key, "what": "tiny_checkpoint bf16 seed 0"})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"base: wrote {final}")


def ensure(name: str, log=print) -> tuple[Path, Path]:
    """(model_dir, twin_dir) of format ``name``: the checkpoint the tool
    wrote from the tiny bf16 model, and that bf16 model.  Builds the tool's
    venv and runs its recipe when the cache lacks a current copy."""
    fmt = FORMATS[name]
    base = ensure_base(log)
    key = cache_key(
        fmt, locks.lock_digest(fmt.tool.name), recipe_digest(fmt.tool), dir_digest(base)
    )
    final = format_dir(fmt)
    stamp = read_stamp(final)
    if stamp and stamp.get("key") == key:
        return final, base
    with _build_lock():
        stamp = read_stamp(final)
        if not (stamp and stamp.get("key") == key):
            _run_recipe(fmt, base, final, key, log)
    return final, base


def _run_recipe(fmt: Format, base: Path, final: Path, key: str, log) -> None:
    python = locks.ensure_venv(fmt.tool.name, venv_dir(fmt.tool), log)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{fmt.name}-", dir=final.parent))
    work = Path(tempfile.mkdtemp(prefix=f".{fmt.name}-work-", dir=final.parent))
    try:
        t0 = time.monotonic()
        cmd = [
            str(python),
            str(RECIPES / f"{fmt.tool.name}.py"),
            "--scheme",
            fmt.scheme,
            "--base",
            str(base),
            "--out",
            str(tmp),
            "--work",
            str(work),
        ]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
        env.pop("PYTHONPATH", None)
        subprocess.run(cmd, check=True, env=env)
        seconds = round(time.monotonic() - t0, 1)
        if not (tmp / "config.json").exists():
            raise RuntimeError(f"{fmt.name}: the recipe wrote no config.json")
        _publish(
            tmp,
            final,
            {
                "key": key,
                "format": fmt.name,
                "tool": fmt.tool.requirement,
                "seconds": seconds,
            },
        )
        log(f"{fmt.name}: wrote {final} in {seconds} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
