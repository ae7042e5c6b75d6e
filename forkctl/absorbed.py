"""Is a patch's change already in a tree? Hunk by hunk, and what remains.

A hunk is in the tree when it applies in reverse there (``git apply --check
--reverse``: its new lines stand where the patch puts them, with its context).
A file the patch creates is in the tree when the tree has it with the patch's
content (the reverse, a deletion, must leave nothing); one it deletes, when the
tree lacks it. A binary or mode-only change of a file is one unit.

The ``Upstream-Status:`` trailer plays no part: only content counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .git import git

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass
class Section:
    """One file of the diff: its header lines and its hunks (each from its @@)."""

    path: str
    header: list[str]
    hunks: list[list[str]] = field(default_factory=list)


@dataclass
class Diff:
    preamble: list[str]  # the message, through the "---" line
    sections: list[Section]

    def units(self) -> list[tuple[int, int | None]]:
        """(section, hunk) per hunk; (section, None) for a file without hunks."""
        return [
            (s, h)
            for s, section in enumerate(self.sections)
            for h in (range(len(section.hunks)) if section.hunks else [None])
        ]

    def label(self, unit: tuple[int, int | None]) -> str:
        section = self.sections[unit[0]]
        if unit[1] is None:
            return f"{section.path} (whole file)"
        if any(line.startswith("new file mode") for line in section.header):
            return f"{section.path} (new file)"
        return f"{section.path} {section.hunks[unit[1]][0].split(' @@')[0]} @@"

    def text(self, units: list[tuple[int, int | None]], preamble: bool) -> str:
        """A patch of the given units only (new-side line numbers adjusted)."""
        lines = list(self.preamble) if preamble else []
        for s, section in enumerate(self.sections):
            chosen = {h for (us, h) in units if us == s}
            if not chosen:
                continue
            lines += section.header
            shift = 0  # lines the left-out hunks before this one added
            for h, hunk in enumerate(section.hunks):
                match = HUNK.match(hunk[0])
                assert match, hunk[0]
                a, b, c, d, rest = match.groups()
                if h not in chosen:
                    shift += int(d or 1) - int(b or 1)
                    continue
                new_start = int(c) - shift
                old = f"-{a}" + (f",{b}" if b is not None else "")
                new = f"+{new_start}" + (f",{d}" if d is not None else "")
                lines += [f"@@ {old} {new} @@{rest}", *hunk[1:]]
        return "\n".join(lines) + "\n"


def split(text: str) -> Diff:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first = next(
        (i for i, line in enumerate(lines) if line.startswith("diff --git ")),
        len(lines),
    )
    preamble = lines[:first]
    if "---" in preamble:  # drop the diffstat after the separator
        cut = len(preamble) - preamble[::-1].index("---")
        preamble = preamble[:cut]
    sections: list[Section] = []
    left = [0, 0]  # old and new lines the current hunk still has to show
    for line in lines[first:]:
        if line.startswith("diff --git "):
            path = line[len("diff --git ") :].split(" ", 1)[-1]
            sections.append(Section(path.split("/", 1)[-1], [line]))
            left = [0, 0]
        elif not sections:
            continue
        elif (match := HUNK.match(line)) and not _binary(sections[-1]):
            sections[-1].hunks.append([line])
            left = [int(match.group(2) or 1), int(match.group(4) or 1)]
        elif sections[-1].hunks and (any(left) or line.startswith("\\")):
            sections[-1].hunks[-1].append(line)
            tag = line[:1]
            if tag in (" ", ""):
                left = [left[0] - 1, left[1] - 1]
            elif tag == "-":
                left[0] -= 1
            elif tag == "+":
                left[1] -= 1
        elif not sections[-1].hunks:
            sections[-1].header.append(line)
        # else: after the last hunk of the last file (a signature): not part of it
    return Diff(preamble, sections)


def _binary(section: Section) -> bool:
    return any(
        line.startswith(("GIT binary patch", "Binary files "))
        for line in section.header
    )


@dataclass
class Absorption:
    absorbed: list[str]  # labels of the units the tree already has
    remaining: list[str]  # labels of the units it lacks
    units: list[tuple[int, int | None]] = field(default_factory=list)  # remaining

    @property
    def full(self) -> bool:
        return bool(self.absorbed) and not self.remaining

    @property
    def partial(self) -> bool:
        return bool(self.absorbed) and bool(self.remaining)


def _applies(tree: Path, text: str, *flags: str) -> bool:
    return (
        git(tree, "apply", "--check", *flags, "-", input=text, check=False).returncode
        == 0
    )


def absorption(tree: Path, text: str) -> tuple[Absorption, Diff]:
    """Which of the patch's units the tree (its working files) already has."""
    diff = split(text)
    units = diff.units()
    labels = [diff.label(u) for u in units]
    if _applies(tree, text, "--reverse"):
        return Absorption(labels, [], []), diff
    if _applies(tree, text):  # it applies forward: nothing of it is there yet
        return Absorption([], labels, units), diff
    found = Absorption([], [])
    for unit, label in zip(units, labels):
        if _applies(tree, diff.text([unit], preamble=False), "--reverse"):
            found.absorbed.append(label)
        else:
            found.remaining.append(label)
            found.units.append(unit)
    return found, diff


def remainder(diff: Diff, found: Absorption, note: str) -> str:
    """The patch with only the units the tree lacks; ``note`` goes after the
    "---" separator, where ``git am`` ignores it."""
    text = diff.text(found.units, preamble=True)
    if diff.preamble and diff.preamble[-1] == "---":
        head = "\n".join(diff.preamble)
        text = head + "\n" + note.rstrip("\n") + "\n\n" + text[len(head) + 1 :]
    return text
