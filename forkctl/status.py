"""status: a table of the series."""

from __future__ import annotations

from . import patchfile, series
from .config import Fork


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


def render(fork: Fork) -> str:
    header = ("patch", "subject", "files", "lines", "upstream")
    table = [header, *rows(fork)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
