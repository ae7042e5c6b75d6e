"""test: run the tests the series adds or changes, inside the tree, on CPU."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

from . import patchfile, series
from .config import Fork
from .errors import ForkError


PLUGIN_DIR = Path(__file__).parent / "pytest_plugins"

ADDED_TEST = re.compile(r"^\+[ \t]*(?:async[ \t]+)?def[ \t]+(test\w*)[ \t]*\(", re.M)


def series_tests(fork: Fork) -> list[str]:
    """Test modules under the tree's tests/ that any patch adds or modifies;
    with [test] scope = "added", in modules the base already has, the node ids
    of the tests the series adds instead."""
    found: dict[str, None] = {}
    created: set[str] = set()
    added: dict[str, set[str]] = {}
    for name in series.read(fork.series_file):
        text = (fork.patches_dir / name).read_text(encoding="utf-8")
        for diff, chunk in zip(
            patchfile.parse(fork.patches_dir / name).files, _file_chunks(text)
        ):
            path = diff.new_path
            if path is None or not path.startswith("tests/"):
                continue
            if PurePosixPath(path).name.startswith("test_") and path.endswith(".py"):
                found[path] = None
                if diff.old_path is None:
                    created.add(path)
                added.setdefault(path, set()).update(ADDED_TEST.findall(chunk))
    selected = []
    for path in found:
        file = fork.tree_dir / path
        if not file.is_file():
            continue
        if fork.test_scope == "added" and path not in created:
            selected += _node_ids(path, file, added.get(path, set()))
        else:
            selected.append(path)
    return selected


def _file_chunks(text: str) -> list[str]:
    """The patch's diff, one chunk per file, in the order of its files."""
    return text.split("\ndiff --git ")[1:]


def _node_ids(path: str, file: Path, names: set[str]) -> list[str]:
    """pytest node ids of the named test functions (or methods) in the file."""
    ids = []
    for node in ast.parse(file.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in names:
                ids.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef):
            ids += [
                f"{path}::{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name in names
            ]
    return ids


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
    # Modules the base has run only the series' tests, selected by the plugin
    # (see pytest_plugins/forkctl_select.py) rather than by node ids.
    node_ids = [test for test in tests if "::" in test]
    modules = list(dict.fromkeys(test.split("::", 1)[0] for test in tests))
    env = {
        **os.environ,
        **cache_env(fork),
        "FORKCTL_TESTS": "\n".join(node_ids),
        "PYTHONPATH": os.pathsep.join(
            [str(PLUGIN_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    cmd = [
        str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "forkctl_select", *modules, *extra,
    ]  # fmt: skip
    print(
        f"+ FORKCTL_TESTS=<{len(node_ids)} tests of the base's modules> "
        + " ".join(cmd),
        file=sys.stderr,
    )
    code = subprocess.run(cmd, cwd=fork.tree_dir, env=env).returncode
    if code == 5:
        raise ForkError("pytest collected no tests from the series' test files")
    return code
