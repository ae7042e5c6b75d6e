"""upstream PATCH: a patch of the series as the contributor sends it upstream.

The series' patches are authored and signed off by the fork's shared identity
and carry the fork's DEP-3 bookkeeping (``Upstream-Status:``, ``Origin:``).
vLLM takes pull requests under the DCO from a person: the copy written here
has the contributor as author and a ``Signed-off-by:`` of theirs in place of
the fork's, and none of the fork's trailers. Message and diff are otherwise
the patch's own, byte for byte, so ``git am -k`` on upstream main gives the
commit to push for the pull request.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import series
from .config import Fork
from .errors import ForkError

# Trailers only the fork's series uses; upstream's commit keeps the rest.
FORK_TRAILERS = ("Upstream-Status", "Origin", "Signed-off-by")
TRAILER = re.compile(r"^([A-Za-z0-9-]+): ")
IDENTITY = re.compile(r"^[^<>\n]+ <[^<>\s]+@[^<>\s]+>$")


def contributor(root: Path, identity: str | None = None) -> str:
    """``Name <email>``: as given, else the repository's git identity."""
    if identity is None:
        found = []
        for key in ("user.name", "user.email"):
            proc = subprocess.run(
                ["git", "config", key], cwd=root, capture_output=True, text=True
            )
            found.append(proc.stdout.strip())
        name, email = found
        if not (name and email):
            raise ForkError(
                "no git identity to sign off with: set `git config user.name` and "
                "`git config user.email`, or pass --signoff 'Name <email>'"
            )
        identity = f"{name} <{email}>"
    if not IDENTITY.match(identity):
        raise ForkError(f"{identity!r} is not of the form 'Name <email>'")
    return identity


def _resolve(fork: Fork, name: str) -> Path:
    listed = series.read(fork.series_file)
    matches = [n for n in listed if n == name or n == f"{name}.patch"]
    if not matches and name.isdigit() and 1 <= int(name) <= len(listed):
        matches = [listed[int(name) - 1]]
    if not matches:
        raise ForkError(
            f"{name!r} is not a patch of the series (a file name in "
            f"{fork.series_file}, or its position from 1 to {len(listed)})"
        )
    return fork.patches_dir / matches[0]


def rewrite(text: str, identity: str) -> str:
    """The format-patch text with the contributor as author and signer."""
    lines = text.split("\n")
    head_end = lines.index("")
    head: list[str] = []
    skipping = False
    for line in lines[:head_end]:
        if line.startswith("From:"):
            head.append(f"From: {identity}")
            skipping = True
        elif skipping and line[:1] in (" ", "\t"):
            continue  # the folded rest of the fork's From: header
        else:
            skipping = False
            head.append(line)
    body_end = next(
        i
        for i in range(head_end + 1, len(lines))
        if lines[i] == "---" or lines[i].startswith("diff --git ")
    )
    message = lines[head_end + 1 : body_end]
    while message and not message[-1].strip():
        message.pop()
    # The trailer block is the last paragraph, when every line of it is one.
    cut = len(message)
    while cut > 0 and message[cut - 1].strip():
        cut -= 1
    block = message[cut:]
    if block and all(TRAILER.match(line) for line in block):
        block = [line for line in block if TRAILER.match(line)[1] not in FORK_TRAILERS]
        message = message[:cut]
        while message and not message[-1].strip():
            message.pop()
    else:
        block = []
    kept = [*message, "", *block, f"Signed-off-by: {identity}"]
    return "\n".join([*head, "", *kept, "", *lines[body_end:]])


def for_upstream(
    fork: Fork, name: str, identity: str | None = None, out_dir: Path | None = None
) -> Path:
    source = _resolve(fork, name)
    signer = contributor(fork.root, identity)
    target_dir = out_dir or fork.root / "build" / "upstream"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / source.name
    target.write_text(rewrite(source.read_text(encoding="utf-8"), signer))
    return target
