"""patches/series: quilt format, one patch file name a line, '#' comments."""

from __future__ import annotations

from pathlib import Path

DEFAULT_HEADER = [
    "# The fork's patch series, applied in this order on the pinned base by",
    "# `python3 -m forkctl sync`. One patch per upstreamable pull request.",
]


def read(path: Path) -> list[str]:
    if not path.exists():
        return []
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def header(path: Path) -> list[str]:
    """The leading comment block, kept across exports."""
    if not path.exists():
        return DEFAULT_HEADER
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines or DEFAULT_HEADER


def write(path: Path, names: list[str]) -> None:
    lines = header(path) + names
    path.write_text("\n".join(lines) + "\n")
