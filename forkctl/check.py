"""check: the series is well-formed, applies exactly, and passes upstream's hooks."""

from __future__ import annotations

import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from . import artifacts, ci_schema, hooks, patchfile, series
from .config import Fork
from .git import BASE_IDENTITY, clean_env, git, out
from .tree import unpack_sdist


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


def _commit(root: Path, message: str, paths: list[str]) -> str:
    env = clean_env(**BASE_IDENTITY)
    if paths:
        git(root, "add", "-A", "--force", "--", *paths, env=env)
    git(root, "commit", "-q", "--allow-empty", "--no-verify", "-m", message, env=env)
    return out(root, "rev-parse", "HEAD")


def check(fork: Fork) -> list[str]:
    problems = series_problems(fork)
    sdist = artifacts.fetch(fork, fork.sdist)
    patches: list[patchfile.Patch] = []
    for name in series.read(fork.series_file):
        path = fork.patches_dir / name
        if not path.is_file():
            continue
        try:
            patches.append(patchfile.parse(path))
        except (ValueError, UnicodeDecodeError) as e:
            problems.append(f"{name}: cannot be read as a patch: {e}")
    touched: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="forkctl-check-") as scratch:
        # A git repository: the base's files the series changes as one commit,
        # then one commit per patch, so `git blame` names the patch of a line.
        root = Path(scratch) / "src"
        unpack_sdist(sdist, root)
        git(root, "init", "-q", "-b", "main")
        changed = {p for patch in patches for d in patch.files for p in (d.old_path,)}
        in_base = sorted(p for p in changed if p and (root / p).exists())
        if (root / hooks.CONFIG).is_file():
            in_base.append(hooks.CONFIG)
        blame = hooks.Blame(root)
        _commit(root, "base", in_base)
        for patch in patches:
            name = patch.name
            problems += [
                f"{name}: {p}"
                for p in patchfile.header_problems(patch, base_version=fork.version)
            ]
            hunks = patchfile.hunk_problems(patch, root)
            if hunks:
                problems += [f"{name}: {p}" for p in hunks]
                problems.append(f"{name}: later patches were checked without it")
                continue
            proc = subprocess.run(
                ["git", "apply", "--whitespace=nowarn", str(fork.patches_dir / name)],
                cwd=root,
                capture_output=True,
                text=True,
                env=clean_env(),
            )
            if proc.returncode != 0:
                problems.append(f"{name}: git apply failed: {proc.stderr.strip()}")
                continue
            paths = sorted(
                {p for d in patch.files for p in (d.old_path, d.new_path) if p}
            )
            blame.record(_commit(root, name, paths), name, paths)
            touched |= {d.path for d in patch.files if d.new_path}
        files = sorted(f for f in touched if (root / f).is_file())
        config_out = fork.root / "build" / "pre-commit" / "config.yaml"
        problems += hooks.run(fork, root, files, blame, config_out)
        problems += ci_schema.run(fork, root, files, lambda p: _patch_of(blame, p))
    return problems


def _patch_of(blame: hooks.Blame, path: str) -> str:
    """The patch to name for a problem in a whole file: the last that changes it."""
    changed = blame.changed.get(path, [])
    if len(changed) > 1:
        return f"{changed[-1]} (patches that change the file: {', '.join(changed)})"
    return changed[0] if changed else "base"


def report(fork: Fork, where: str = "") -> int:
    """Run `check`, print its problems and verdict; the exit status."""
    problems = check(fork)
    for problem in problems:
        print(f"problem: {problem}")
    suffix = f" on {where}" if where else ""
    if problems:
        print(f"{len(problems)} problem(s) in the series{suffix}")
        return 1
    print(f"series ok: {len(series.read(fork.series_file))} patches{suffix}")
    return 0
