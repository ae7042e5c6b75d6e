"""export: write the tree's commits after the base back to patches/."""

from __future__ import annotations

import re
from pathlib import Path

from . import series
from .config import Fork
from .errors import ForkError
from .git import git, out
from .tree import BASE_TAG, mark_synced

FORMAT_PATCH = (
    "format-patch",
    "--stdout",
    "--zero-commit",
    "--no-signature",
    "--full-index",
    "--keep-subject",
    "--no-numbered",
    "--no-renames",
    "--binary",
    "--stat=80",
    "--diff-algorithm=myers",
    "--encoding=UTF-8",
)


def slug(subject: str, limit: int = 64) -> str:
    """A file name from the subject, cut at a word boundary."""
    words = re.sub(r"[^a-z0-9]+", " ", subject.lower()).split()
    name = ""
    for word in words:
        if name and len(name) + 1 + len(word) > limit:
            break
        name = f"{name}-{word}" if name else word
    return name[:limit]


def export(fork: Fork, tree: Path | None = None) -> list[str]:
    """The commits of ``tree`` (default: the fork's tree) after its base."""
    tree = tree or fork.tree_dir
    if not (tree / ".git").is_dir():
        raise ForkError(f"no tree at {tree}: run `forkctl sync` first")
    commits = out(tree, "rev-list", "--reverse", f"{BASE_TAG}..HEAD").split()
    names: list[str] = []
    texts: dict[str, str] = {}
    for commit in commits:
        subject = out(tree, "log", "-1", "--format=%s", commit)
        name = slug(subject) or "patch"
        candidate, n = f"{name}.patch", 2
        while candidate in texts:
            candidate, n = f"{name}-{n}.patch", n + 1
        texts[candidate] = git(tree, *FORMAT_PATCH, "-1", commit).stdout
        names.append(candidate)

    fork.patches_dir.mkdir(exist_ok=True)
    for stale in fork.patches_dir.glob("*.patch"):
        if stale.name not in texts:
            stale.unlink()
    for name, text in texts.items():
        path: Path = fork.patches_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    series.write(fork.series_file, names)
    mark_synced(fork, tree)
    return names
