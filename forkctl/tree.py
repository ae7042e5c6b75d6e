"""sync: materialize the base sources plus the series as a git work tree."""

from __future__ import annotations

import hashlib
import shutil
import sys
import tarfile
from pathlib import Path

from . import artifacts, patchfile, series
from .config import Fork
from .errors import ForkError
from .git import BASE_IDENTITY, clean_env, git, out

BASE_TAG = "base"
SYNCED_TAG = "synced"
SERIES_STAMP = "forkctl-series"


def series_digest(fork: Fork) -> str:
    """Identifies the content of patches/, to tell when the tree is stale."""
    digest = hashlib.sha256()
    for path in [fork.series_file, *sorted(fork.patches_dir.glob("*.patch"))]:
        if path.exists():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def mark_synced(fork: Fork, tree: Path) -> None:
    git(tree, "tag", "-f", SYNCED_TAG)
    (tree / ".git" / SERIES_STAMP).write_text(series_digest(fork))


def ensure_current(fork: Fork) -> Path:
    """Sync the tree if it is missing or older than patches/ (never over local work)."""
    tree = fork.tree_dir
    stamp = tree / ".git" / SERIES_STAMP
    if stamp.exists() and stamp.read_text() == series_digest(fork):
        return tree
    if tree.exists() and (reason := local_work(tree)):
        raise ForkError(
            f"the tree is older than patches/, but {reason}; "
            "export it, or `forkctl sync --force` to discard it"
        )
    return sync(fork)


def unpack_sdist(sdist: Path, dest: Path) -> None:
    """Unpack the sdist's single top-level folder into dest."""
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if not rest:
                continue
            member.name = rest
            members.append(member)
        tar.extractall(dest, members=members, filter="data")
    # setuptools' metadata from making the sdist: on sys.path from the tree's
    # root it would shadow the installed distribution's version.
    for egg_info in dest.glob("*.egg-info"):
        shutil.rmtree(egg_info)


def local_work(tree: Path) -> str | None:
    if not (tree / ".git").is_dir():
        return f"{tree} exists but is not a tree made by forkctl"
    dirty = git(tree, "status", "--porcelain").stdout.strip()
    if dirty:
        return f"{tree} has uncommitted changes:\n{dirty}"
    synced = git(tree, "rev-parse", "-q", "--verify", SYNCED_TAG, check=False)
    head = out(tree, "rev-parse", "HEAD")
    if synced.returncode != 0 or synced.stdout.strip() != head:
        return f"{tree} has commits that were not exported (run `forkctl export`)"
    return None


def apply_series(fork: Fork, tree: Path) -> None:
    env = clean_env(**{k: v for k, v in BASE_IDENTITY.items() if "COMMITTER" in k})
    for name in series.read(fork.series_file):
        path = fork.patches_dir / name
        if not path.is_file():
            raise ForkError(f"{name}: listed in patches/series but not in patches/")
        problems = patchfile.hunk_problems(patchfile.parse(path), tree)
        if problems:
            raise ForkError(
                f"{name} does not apply; the tree stops at the last good patch:\n  "
                + "\n  ".join(problems)
            )
        result = git(
            tree,
            "am",
            "--keep",
            "--keep-cr",
            "--quiet",
            str(path),
            env=env,
            check=False,
        )
        if result.returncode != 0:
            git(tree, "am", "--abort", env=env, check=False)
            raise ForkError(
                f"{name} does not apply; the tree stops at the last good patch:\n"
                + (result.stderr or result.stdout).strip()
            )
        print(f"applied {name}", file=sys.stderr)


def commit_base(tree: Path, fork: Fork, message: str) -> None:
    """Commit an unpacked sdist as the first commit of a new repository, with
    a fixed identity and date so that its commit id is reproducible."""
    git(tree, "init", "-q", "-b", "main")
    # The whole sdist, even files its own .gitignore names, so that patches to
    # them apply; except the files the build rewrites, which would dirty the tree.
    git(tree, "add", "-A", "--force")
    for path in fork.build_outputs:
        git(tree, "rm", "-q", "--cached", "--ignore-unmatch", path)
    git(
        tree,
        "commit",
        "-q",
        "--no-verify",
        "-m",
        message,
        env=clean_env(**BASE_IDENTITY),
    )


def sync(fork: Fork, force: bool = False) -> Path:
    tree = fork.tree_dir
    if tree.exists():
        reason = local_work(tree)
        if reason and not force:
            raise ForkError(
                f"refusing to replace the tree: {reason}\n(--force discards it)"
            )
    # Verify the base before the old tree is thrown away.
    sdist = artifacts.fetch(fork, fork.sdist)
    if tree.exists():
        shutil.rmtree(tree)
    unpack_sdist(sdist, tree)
    commit_base(
        tree,
        fork,
        f"vLLM {fork.version} (pinned base)\n\nUnpacked from {fork.sdist.filename}, "
        f"sha256 {fork.sdist.sha256}.",
    )
    git(tree, "tag", BASE_TAG)
    try:
        apply_series(fork, tree)
    finally:
        mark_synced(fork, tree)
    print(f"tree ready at {tree} ({out(tree, 'rev-parse', '--short', 'HEAD')})")
    return tree
