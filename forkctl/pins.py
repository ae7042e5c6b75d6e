"""Move fork.toml's pins to a new upstream release (the end of a rebase).

fork.toml is edited in place, line by line, so that its comments and layout
stay. The sdist's pin is the one the rebase verified. A wheel's and torch's
move only where fork.toml pins the target's: ``[rebase.wheels.NAME]
"VERSION" = "<sha256>"`` (the file name is the current one with the version
replaced) and ``[rebase.torch] "VERSION" = "<torch version>"``; the others are
returned as left to move, never guessed.
"""

from __future__ import annotations

import re

from .config import Artifact, Fork
from .errors import ForkError

SECTION = re.compile(r"^\s*\[([^\[\]]+)\]\s*(?:#.*)?$")


def set_key(text: str, section: str, key: str, value: str) -> str:
    """``key = "value"`` in ``[section]``, keeping the rest of the line."""
    lines = text.split("\n")
    inside = False
    pattern = re.compile(rf'^(\s*{re.escape(key)}\s*=\s*)"[^"]*"(.*)$')
    for i, line in enumerate(lines):
        if match := SECTION.match(line):
            inside = match.group(1).strip() == section
        elif inside and (match := pattern.match(line)):
            lines[i] = f'{match.group(1)}"{value}"{match.group(2)}'
            return "\n".join(lines)
    raise ForkError(f'fork.toml: no {key} = "..." in [{section}] to move')


def move(fork: Fork, version: str, sdist: Artifact) -> tuple[list[str], list[str]]:
    """Rewrite fork.toml for ``version``; the pins moved and those left to move."""
    path = fork.root / "fork.toml"
    text = path.read_text()
    text = set_key(text, "upstream", "version", version)
    text = set_key(text, "upstream.sdist", "filename", sdist.filename)
    text = set_key(text, "upstream.sdist", "sha256", sdist.sha256)
    moved = [f"upstream.version {version}", f"upstream.sdist {sdist.filename}"]
    left = []
    for name, wheel in fork.wheels.items():
        digest = fork.rebase_wheels.get(name, {}).get(version)
        filename = wheel.filename.replace(fork.version, version)
        if digest and filename != wheel.filename:
            text = set_key(text, f"wheels.{name}", "filename", filename)
            text = set_key(text, f"wheels.{name}", "sha256", digest)
            moved.append(f"wheels.{name} {filename}")
        else:
            left.append(
                f"wheels.{name}: still {wheel.filename} (no [rebase.wheels.{name}] "
                f'"{version}" pin)'
            )
    if torch := fork.rebase_torch.get(version):
        text = set_key(text, "torch", "version", torch)
        moved.append(f"torch {torch}")
    else:
        left.append(
            f"torch: still {fork.torch_version} (no [rebase.torch] "
            f'"{version}" pin; the target\'s requirements name the one it builds with)'
        )
    stale = [
        str(n)
        for n, line in enumerate(text.split("\n"), 1)
        if line.lstrip().startswith("#") and fork.version in line
    ]
    if stale:
        left.append(
            f"comments that name {fork.version}: fork.toml line(s) {', '.join(stale)}"
        )
    path.write_text(text)
    return moved, left
