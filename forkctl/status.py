"""status: a table of the series, how far the base is behind upstream's
releases on the index, and the patches whose Accepted trailer is due."""

from __future__ import annotations

from collections.abc import Callable

from . import patchfile, releases, series
from .config import Fork
from .errors import ForkError

# The lookup of a project's releases (oldest first); tests replace it.
index_versions: Callable[[str], list[str]] = releases.index_versions


def rows(fork: Fork) -> list[tuple[str, ...]]:
    table = []
    for name in series.read(fork.series_file):
        path = fork.patches_dir / name
        if not path.is_file():
            table.append((name, "(missing)", "", "", ""))
            continue
        patch = patchfile.parse(path)
        added = sum(d.added for d in patch.files)
        removed = sum(d.removed for d in patch.files)
        table.append(
            (
                name,
                patch.subject,
                str(len(patch.files)),
                f"+{added}/-{removed}",
                patch.upstream_status or "(none)",
            )
        )
    return table


def accepted(fork: Fork) -> list[tuple[str, str]]:
    """(patch, version) for each patch with an ``Upstream-Status: Accepted``."""
    found = []
    for name in series.read(fork.series_file):
        path = fork.patches_dir / name
        if path.is_file():
            status = patchfile.parse(path).upstream_status or ""
            if status.startswith("Accepted "):
                found.append((name, status.split(" ", 1)[1]))
    return found


def upstream_lines(fork: Fork) -> list[str]:
    project, base = fork.project, fork.version
    due = accepted(fork)
    try:
        versions = index_versions(project)
    except (ForkError, OSError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        lines = [
            f"base {project} {base}: releases behind: unknown (no index: {reason})"
        ]
        if due:
            lines.append("patches with Accepted trailers (the newest release unknown):")
            lines += [f"  {name} (Accepted {v})" for name, v in due]
        return lines
    key = releases.release_key
    newer = [v for v in versions if key(v) > key(base)]
    if not versions:
        lines = [f"base {project} {base}: the index lists no release of {project}"]
    elif newer:
        lines = [
            f"base {project} {base}: {len(newer)} release(s) behind "
            f"({', '.join(newer)}); newest {versions[-1]}"
        ]
    else:
        lines = [f"base {project} {base}: up to date (newest release {versions[-1]})"]
    if versions:
        newest = versions[-1]
        due = [(n, v) for n, v in due if key(v) and key(v) <= key(newest)]
        if due:
            lines.append(
                f"Accepted at or below {newest}, the newest release (whether the "
                f"content is upstream: forkctl rebase --onto {newest} --dry-run):"
            )
            lines += [f"  {name} (Accepted {v})" for name, v in due]
        else:
            lines.append(f"no patch has an Accepted trailer at or below {newest}")
    return lines


def render(fork: Fork) -> str:
    header = ("patch", "subject", "files", "lines", "upstream")
    table = [header, *rows(fork)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*lines, "", *upstream_lines(fork)])
