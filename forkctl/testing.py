"""test: run the tests the series adds or changes, inside the tree, on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import PurePosixPath

from . import patchfile, series
from .config import Fork
from .errors import ForkError


def series_tests(fork: Fork) -> list[str]:
    """Test modules under the tree's tests/ that any patch adds or modifies."""
    found: dict[str, None] = {}
    for name in series.read(fork.series_file):
        for diff in patchfile.parse(fork.patches_dir / name).files:
            path = diff.new_path
            if path is None or not path.startswith("tests/"):
                continue
            if PurePosixPath(path).name.startswith("test_") and path.endswith(".py"):
                found[path] = None
    return [p for p in found if (fork.tree_dir / p).is_file()]


def cache_env(fork: Fork) -> dict[str, str]:
    cache = fork.root / "build" / "cache"
    return {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "HF_HUB_OFFLINE": "1",
    }


def run_tests(fork: Fork, extra: list[str]) -> int:
    tests = series_tests(fork)
    if not tests:
        raise ForkError("the series adds no tests under tests/: nothing to run")
    python = fork.venv_dir / "bin" / "python"
    if not python.exists():
        raise ForkError(f"no venv at {fork.venv_dir}: run `forkctl build` first")
    env = {**os.environ, **cache_env(fork)}
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *extra]
    print("+ " + " ".join(cmd), file=sys.stderr)
    code = subprocess.run(cmd, cwd=fork.tree_dir, env=env).returncode
    if code == 5:
        raise ForkError("pytest collected no tests from the series' test files")
    return code
