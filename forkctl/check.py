"""check: the series is well-formed, applies exactly, and is ruff clean."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from . import artifacts, patchfile, series
from .config import Fork
from .tree import unpack_sdist


def _ruff(fork: Fork) -> str | None:
    candidate = fork.venv_dir / "bin" / "ruff"
    if candidate.is_file():
        return str(candidate)
    return shutil.which("ruff")


def series_problems(fork: Fork) -> list[str]:
    listed = series.read(fork.series_file)
    present = {p.name for p in fork.patches_dir.glob("*.patch")}
    problems = []
    if not fork.series_file.exists():
        problems.append("patches/series: missing")
    for name, count in Counter(listed).items():
        if count > 1:
            problems.append(f"patches/series: {name} is listed {count} times")
    for name in listed:
        if name not in present:
            problems.append(f"patches/series: {name} is listed but not in patches/")
    for name in sorted(present - set(listed)):
        problems.append(f"patches/{name}: not listed in patches/series")
    return problems


def ruff_problems(fork: Fork, root: Path, files: list[str]) -> list[str]:
    if not files:
        return []
    ruff = _ruff(fork)
    if ruff is None:
        version = fork.tools.get("ruff", "")
        return [
            f"ruff not found: run `python3 -m forkctl build` or pip install ruff=={version}"
        ]
    problems = []
    for args in (["check", "--no-fix", "--quiet"], ["format", "--check", "--quiet"]):
        proc = subprocess.run(
            [ruff, *args, *files], cwd=root, capture_output=True, text=True
        )
        if proc.returncode != 0:
            report = (proc.stdout + proc.stderr).strip()
            problems.append(f"ruff {args[0]}:\n    " + report.replace("\n", "\n    "))
    return problems


def check(fork: Fork) -> list[str]:
    problems = series_problems(fork)
    sdist = artifacts.fetch(fork, fork.sdist)
    touched: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="forkctl-check-") as scratch:
        root = Path(scratch) / "src"
        unpack_sdist(sdist, root)
        for name in series.read(fork.series_file):
            path = fork.patches_dir / name
            if not path.is_file():
                continue
            try:
                patch = patchfile.parse(path)
            except (ValueError, UnicodeDecodeError) as e:
                problems.append(f"{name}: cannot be read as a patch: {e}")
                continue
            problems += [f"{name}: {p}" for p in patchfile.header_problems(patch)]
            hunks = patchfile.hunk_problems(patch, root)
            if hunks:
                problems += [f"{name}: {p}" for p in hunks]
                problems.append(f"{name}: later patches were checked without it")
                continue
            proc = subprocess.run(
                ["git", "apply", "--whitespace=nowarn", str(path)],
                cwd=root,
                capture_output=True,
                text=True,
                env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"},
            )
            if proc.returncode != 0:
                problems.append(f"{name}: git apply failed: {proc.stderr.strip()}")
                continue
            touched |= {d.path for d in patch.files if d.new_path}
        python_files = sorted(
            f for f in touched if f.endswith(".py") and (root / f).is_file()
        )
        problems += ruff_problems(fork, root, python_files)
    return problems
