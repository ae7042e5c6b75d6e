"""Reading `git format-patch` files: their message and their hunks.

The hunk check is deliberately stricter than `git apply` and `patch`: a hunk
must match the file exactly at the line numbers it names. A series that only
applies with an offset or with fuzz is stale and must be re-exported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.errors import HeaderParseError
from email.header import decode_header, make_header
from pathlib import Path

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
SUBJECT = re.compile(r"^(\[[A-Za-z0-9][A-Za-z0-9/._ -]*\])+ \S")
UPSTREAM_STATUS = re.compile(r"^(Pending|Not-needed|Submitted \S+://\S+|Accepted \S+)$")
TRAILER = re.compile(r"^([A-Za-z0-9-]+): (.*)$")
# DEP-3's Origin, for the upstream pull request a patch re-implements.
ORIGIN = re.compile(
    r"^upstream, https://github\.com/vllm-project/vllm/pull/[1-9][0-9]*$"
)
VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)")


@dataclass
class Hunk:
    header: str
    old_start: int
    old_lines: list[str]


@dataclass
class FileDiff:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    binary: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    added: int = 0
    removed: int = 0

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"


@dataclass
class Patch:
    name: str
    author: str
    subject: str
    body: str
    trailers: dict[str, list[str]]
    files: list[FileDiff]

    @property
    def upstream_status(self) -> str | None:
        values = self.trailers.get("Upstream-Status")
        return values[0] if values else None


def _decode(value: str) -> str:
    """Undo the RFC 2047 encoding format-patch gives non-ASCII headers."""
    try:
        return str(make_header(decode_header(value)))
    except (HeaderParseError, LookupError, ValueError):
        return value


def _split_message(lines: list[str]) -> tuple[dict[str, str], list[str], int]:
    """Headers, message lines, and the index where the diff part starts."""
    headers: dict[str, str] = {}
    i = 1 if lines and lines[0].startswith("From ") else 0
    last = None
    while i < len(lines) and lines[i] != "":
        line = lines[i]
        if line[:1] in (" ", "\t") and last:
            headers[last] += " " + line.strip()
        else:
            key, _, value = line.partition(":")
            last = key.strip()
            headers[last] = value.strip()
        i += 1
    message = []
    i += 1
    while (
        i < len(lines) and lines[i] != "---" and not lines[i].startswith("diff --git ")
    ):
        message.append(lines[i])
        i += 1
    return headers, message, i


def _trailers(message: list[str]) -> tuple[str, dict[str, list[str]]]:
    while message and not message[-1].strip():
        message = message[:-1]
    # The trailer block is the last paragraph, if all its lines are "Key: value".
    cut = len(message)
    while cut > 0 and message[cut - 1].strip():
        cut -= 1
    block = message[cut:]
    trailers: dict[str, list[str]] = {}
    if block and all(TRAILER.match(line) for line in block):
        for line in block:
            key, value = TRAILER.match(line).groups()  # type: ignore[union-attr]
            trailers.setdefault(key, []).append(value.strip())
        message = message[:cut]
    return "\n".join(message).strip(), trailers


def _strip_prefix(path: str) -> str | None:
    if path == "/dev/null":
        return None
    return path.split("/", 1)[1] if "/" in path else path


def _parse_diff(lines: list[str]) -> list[FileDiff]:
    files: list[FileDiff] = []
    current: FileDiff | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            a, b = line[len("diff --git ") :].split(" ", 1)
            current = FileDiff(_strip_prefix(a), _strip_prefix(b))
            files.append(current)
        elif current is None:
            pass
        elif line.startswith("new file mode"):
            current.old_path = None
        elif line.startswith("deleted file mode"):
            current.new_path = None
        elif line.startswith("GIT binary patch") or line.startswith("Binary files "):
            current.binary = True
        elif line.startswith("@@ "):
            match = HUNK_HEADER.match(line)
            if match is None:
                raise ValueError(f"malformed hunk header: {line!r}")
            old_start = int(match.group(1))
            old_count = int(match.group(2) or 1)
            new_count = int(match.group(4) or 1)
            hunk = Hunk(line, old_start, [])
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_count or seen_new < new_count):
                body = lines[i]
                tag, text = body[:1], body[1:]
                if tag == " " or body == "":
                    hunk.old_lines.append(text)
                    seen_old += 1
                    seen_new += 1
                elif tag == "-":
                    hunk.old_lines.append(text)
                    seen_old += 1
                    current.removed += 1
                elif tag == "+":
                    seen_new += 1
                    current.added += 1
                elif tag != "\\":
                    raise ValueError(f"unexpected line in hunk {line!r}: {body!r}")
                i += 1
            current.hunks.append(hunk)
            continue
        i += 1
    return files


def parse(path: Path) -> Patch:
    lines = path.read_text(encoding="utf-8").split("\n")
    headers, message, diff_start = _split_message(lines)
    body, trailers = _trailers(message)
    diff_lines = lines[diff_start:]
    first_diff = next(
        (n for n, line in enumerate(diff_lines) if line.startswith("diff --git ")),
        len(diff_lines),
    )
    return Patch(
        name=path.name,
        author=_decode(headers.get("From", "")),
        subject=_decode(headers.get("Subject", "")),
        body=body,
        trailers=trailers,
        files=_parse_diff(diff_lines[first_diff:]),
    )


def header_problems(patch: Patch, base_version: str | None = None) -> list[str]:
    problems = []
    if not SUBJECT.match(patch.subject):
        problems.append(
            f"subject {patch.subject!r} is not PR-style: it must start with a tag "
            "such as [MoE], [XPU], [CI/Build] or [Bugfix]"
        )
    if len(patch.body.split()) < 5:
        problems.append("the description does not say why the patch exists")
    if not patch.trailers.get("Signed-off-by"):
        problems.append("no Signed-off-by: trailer (vLLM requires the DCO)")
    status = patch.upstream_status
    if status is None:
        problems.append(
            "no Upstream-Status: trailer (Pending, Submitted <link>, "
            "Accepted <version> or Not-needed)"
        )
    elif not UPSTREAM_STATUS.match(status):
        problems.append(
            f"Upstream-Status {status!r} is not one of Pending, Submitted <link>, "
            "Accepted <version>, Not-needed"
        )
    problems += origin_problems(patch, base_version)
    if not patch.files:
        problems.append("the patch changes no file")
    return problems


def _version_key(version: str) -> tuple[int, ...] | None:
    match = VERSION.match(version)
    return tuple(int(x) for x in match.group(1).split(".")) if match else None


def origin_problems(patch: Patch, base_version: str | None = None) -> list[str]:
    """`Origin:` trailers, and what Upstream-Status then has to say.

    `Origin: upstream, https://github.com/vllm-project/vllm/pull/N` names an
    upstream pull request, merged after the base, that the patch re-implements.
    `Accepted <version>` needs at least one: the release carries the change
    through that pull request. `Not-needed` contradicts an Origin (upstream has
    the change). With `Pending` or `Submitted`, an Origin means upstream merged
    it but no release carries it yet.
    """
    problems = []
    origins = patch.trailers.get("Origin", [])
    for origin in origins:
        if not ORIGIN.match(origin):
            problems.append(
                f"Origin {origin!r} is not of the form "
                "'upstream, https://github.com/vllm-project/vllm/pull/<number>'"
            )
    for origin in sorted({o for o in origins if origins.count(o) > 1}):
        problems.append(f"Origin {origin!r} is given {origins.count(origin)} times")
    status = patch.upstream_status or ""
    if status.startswith("Accepted "):
        if not origins:
            problems.append(
                f"Upstream-Status {status!r} needs an 'Origin: upstream, "
                "https://github.com/vllm-project/vllm/pull/<number>' trailer "
                "naming the upstream pull request that release carries"
            )
        accepted = _version_key(status.split(" ", 1)[1])
        base = _version_key(base_version) if base_version else None
        if accepted and base and accepted <= base:
            problems.append(
                f"Upstream-Status {status!r} says the base {base_version} already "
                "carries it: drop the patch if the base has its change, else "
                "correct the trailer"
            )
    elif status == "Not-needed" and origins:
        problems.append(
            "Upstream-Status 'Not-needed' contradicts Origin: upstream has the change"
        )
    return problems


def hunk_problems(patch: Patch, root: Path) -> list[str]:
    """Where the patch would not apply exactly (no offset, no fuzz) under root."""
    problems = []
    for diff in patch.files:
        if diff.old_path is None:
            if (root / diff.path).exists():
                problems.append(f"{diff.path}: created by the patch but already exists")
            continue
        target = root / diff.old_path
        if not target.is_file():
            problems.append(f"{diff.old_path}: changed by the patch but does not exist")
            continue
        if diff.binary:
            continue
        current = target.read_text(encoding="utf-8", errors="surrogateescape").split(
            "\n"
        )
        for hunk in diff.hunks:
            start = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
            found = current[start : start + len(hunk.old_lines)]
            if found != hunk.old_lines:
                problems.append(
                    f"{diff.old_path}: hunk {hunk.header} does not match the file "
                    f"at line {hunk.old_start} (it would need an offset or fuzz)"
                )
    return problems
