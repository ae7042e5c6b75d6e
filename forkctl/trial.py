"""rebase --onto VERSION --dry-run: try the series on a newer release; report.

The target becomes the base of a tree of its own, ``build/rebase-<version>/
trial`` (replaced at each dry run; ``./tree``, the pins and a rebase in
progress are left alone), prepared as for the real rebase (forkctl.rebase).
Each patch gets one outcome:

- ``absorbed``: the target already has its whole change (every hunk applies
  in reverse, or the three-way merge leaves nothing). ``Upstream-Status:
  Accepted <v>`` alone never makes a patch absorbed: one whose content the
  target lacks is tried like any other, and its details say the trailer is
  wrong. Of a partly absorbed patch, what remains is written as the patch to
  carry, ``<report>-carry/<patch>``;
- ``applies``: ``git am`` applies it (an offset is noted);
- ``applies with 3-way``: only ``git am -3`` applies it; lines it adds that
  now occur more often than in the patch's own result are noted, as a merge
  that kept both upstream's and the patch's copy of a change;
- ``conflicts``: the files the merge leaves conflicted, their conflict
  regions, and the patch's hunks whose lines are not in the target;
- ``applies but breaks``: it applies, but afterwards a file it touches does
  not byte-compile, ruff reports something new in it, a module of the package
  it touches stops importing (compared with the state before the patch), or
  a CI file it changes names a test file that does not exist.

Cascade-free: each patch is tried on the target plus the patches before it as
the trial carries them. A patch that conflicts is carried with each conflicted
region taken from the patch's side (``git merge-file --theirs`` on the merge's
three versions), so a later patch is not reported as conflicting only because
an earlier one is missing. Its own outcome stays ``conflicts``; the real
rebase stops there for a resolution by hand.

The report is written as JSON and as a Markdown table, with paths relative to
the repository and no machine paths (home, temporary or venv folders).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import absorbed, patchfile, rebase
from .config import Fork
from .errors import ForkError
from .git import clean_env, git, out

APPLIES = rebase.APPLIES
THREE_WAY = rebase.THREE_WAY
CONFLICTS = "conflicts"
ABSORBED = "absorbed"
BREAKS = "applies but breaks"
OUTCOMES = (APPLIES, THREE_WAY, CONFLICTS, ABSORBED, BREAKS)
AM = rebase.AM
# A test file named in a CI file (pytest arguments, source_file_dependencies).
TEST_FILE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*test_\w+\.py)\b")
IMPORT_SCRIPT = """\
import importlib, json, sys
result = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        result[name] = None
    except BaseException as e:
        result[name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
print("FORKCTL-IMPORTS " + json.dumps(result))
"""


@dataclass
class PatchReport:
    name: str
    subject: str
    outcome: str
    upstream_status: str | None
    origins: list[str]
    details: list[str] = field(default_factory=list)
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    carry: str | None = None  # what remains of a partly absorbed patch


@dataclass
class Report:
    base: str
    target: str
    sdist: str
    sha256: str
    sha256_source: str
    tree: str
    stops_at: str | None  # the first patch `rebase --onto` will stop at
    notes: list[str]
    patches: list[PatchReport]

    def counts(self) -> dict[str, int]:
        counted = Counter(p.outcome for p in self.patches)
        return {outcome: counted.get(outcome, 0) for outcome in OUTCOMES}


def _python(fork: Fork) -> str:
    venv_python = fork.venv_dir / "bin" / "python"
    return str(venv_python) if venv_python.is_file() else sys.executable


def _ruff(fork: Fork) -> str | None:
    venv_ruff = fork.venv_dir / "bin" / "ruff"
    return str(venv_ruff) if venv_ruff.is_file() else shutil.which("ruff")


class Checker:
    """What `applies but breaks` looks at, before and after each patch."""

    def __init__(self, fork: Fork, tree: Path) -> None:
        self.fork = fork
        self.tree = tree
        self.package = re.sub(r"[-.]+", "_", fork.project).lower()
        self.python = _python(fork)
        self.ruff = _ruff(fork)
        self.imports: dict[str, str | None] = {}  # last known result per module

    def module(self, path: str) -> str | None:
        """The dotted name of a .py file inside the project's package, if any."""
        parts = path[: -len(".py")].split("/") if path.endswith(".py") else []
        if not parts or parts[0] != self.package:
            return None
        for i in range(1, len(parts)):
            if not (self.tree / "/".join(parts[:i]) / "__init__.py").is_file():
                return None
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    def run_imports(self, modules: list[str]) -> dict[str, str | None]:
        if not modules:
            return {}
        env = {
            **os.environ,
            "PYTHONPATH": str(self.tree),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.pop("PYTHONHOME", None)
        try:
            proc = subprocess.run(
                [self.python, "-c", IMPORT_SCRIPT, *modules],
                cwd=self.tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        except subprocess.TimeoutExpired:
            return dict.fromkeys(modules, "the import timed out after 600 s")
        for line in proc.stdout.splitlines():
            if line.startswith("FORKCTL-IMPORTS "):
                return json.loads(line[len("FORKCTL-IMPORTS ") :])
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return dict.fromkeys(modules, f"the import process died: {tail[0]}")

    def baseline(self, patches: list[patchfile.Patch]) -> None:
        modules = {self.package}
        for patch in patches:
            for diff in patch.files:
                name = self.module(diff.path)
                if name and (self.tree / diff.path).is_file():
                    modules.add(name)
        self.imports.update(self.run_imports(sorted(modules)))

    def ruff_findings(self, paths: list[str]) -> Counter[tuple[str, str, str]]:
        files = [p for p in paths if p.endswith(".py") and (self.tree / p).is_file()]
        if not self.ruff or not files:
            return Counter()
        proc = subprocess.run(
            [self.ruff, "check", "--no-cache", "--output-format=json", "--", *files],
            cwd=self.tree,
            capture_output=True,
            text=True,
        )
        try:
            found = json.loads(proc.stdout or "[]")
        except json.JSONDecodeError:
            return Counter({("", "ruff", (proc.stderr or proc.stdout).strip()): 1})
        return Counter(
            (
                os.path.relpath(d["filename"], self.tree),
                d.get("code") or "",
                d.get("message", ""),
            )
            for d in found
        )

    def problems(
        self, patch: patchfile.Patch, ruff_before: Counter[tuple[str, str, str]]
    ) -> list[str]:
        problems = []
        touched = sorted({d.new_path for d in patch.files if d.new_path})
        for path in touched:
            if not path.endswith(".py") or not (self.tree / path).is_file():
                continue
            try:
                compile((self.tree / path).read_bytes(), path, "exec")
            except SyntaxError as e:
                problems.append(f"{path}:{e.lineno}: does not compile: {e.msg}")
        if self.ruff:
            new = self.ruff_findings(touched) - ruff_before
            for (path, code, message), _ in sorted(new.items()):
                problems.append(f"{path}: ruff {code} {message}")
        existed = dict(self.imports)
        modules = sorted(
            {m for p in touched if (self.tree / p).is_file() and (m := self.module(p))}
        )
        results = self.run_imports(modules)
        self.imports.update(results)
        package_imports = existed.get(self.package, "unknown") is None
        for name, error in results.items():
            if error is None:
                continue
            before = existed.get(name, "new")
            if before is None or (before == "new" and package_imports):
                problems.append(f"import {name}: {error}")
        problems += self.missing_test_files(patch)
        for path in touched:
            for name in sorted(self.missing_imports(path)):
                problems.append(f"{path} imports {name}, which the tree does not have")
        return problems

    def missing_imports(self, path: str) -> set[str]:
        """Modules of the project's package a .py file imports that have no file
        (tests too, which the import check does not import)."""
        if not path.endswith(".py") or not (self.tree / path).is_file():
            return set()
        try:
            syntax = ast.parse((self.tree / path).read_bytes())
        except SyntaxError:
            return set()
        names = set()
        for node in ast.walk(syntax):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        missing = set()
        for name in names:
            parts = name.split(".")
            if parts[0] != self.package:
                continue
            base = self.tree.joinpath(*parts)
            if not (base.with_suffix(".py").is_file() or base.is_dir()):
                missing.add(name)
        return missing

    def missing_test_files(self, patch: patchfile.Patch) -> list[str]:
        """CI files the patch changes that name test files the tree lacks."""
        problems = []
        for diff in patch.files:
            path = diff.new_path or ""
            if not path.startswith((".buildkite/", ".github/")):
                continue
            if not (self.tree / path).is_file():
                # e.g. a CI file the target moved, left out by a conflict
                problems.append(f"{path}, which the patch changes, is not in the tree")
                continue
            text = (self.tree / path).read_text(errors="replace")
            for name in sorted(set(TEST_FILE.findall(text))):
                candidates = [self.tree / name, self.tree / "tests" / name]
                if not any(c.is_file() for c in candidates):
                    problems.append(f"{path} names {name}, which does not exist")
        return problems


def _blob(tree: Path, sha: str) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "blob", sha],
        cwd=tree,
        env=clean_env(),
        capture_output=True,
        check=True,
    ).stdout


def _take_the_patch_side(tree: Path) -> str:
    """Finish a conflicted ``git am -3`` with every conflicted region taken from
    the patch, so that the trial carries the patch; what was done, as a detail."""
    env = rebase.am_env()
    stages: dict[str, dict[int, str]] = {}
    for entry in filter(None, git(tree, "ls-files", "-u", "-z").stdout.split("\0")):
        info, path = entry.split("\t", 1)
        _, sha, stage = info.split()
        stages.setdefault(path, {})[int(stage)] = sha
    if not stages:
        git(tree, "am", "--abort", env=env, check=False)
        return "the merge left no file to resolve: later patches are tried without it"
    for path, found in sorted(stages.items()):
        target = tree / path
        if 3 not in found:  # the patch deletes the file
            target.unlink(missing_ok=True)
            git(tree, "rm", "-q", "--cached", "--", path)
            continue
        theirs = _blob(tree, found[3])
        merged = theirs
        if 2 in found:
            with tempfile.TemporaryDirectory(prefix="merge-") as scratch:
                files = [Path(scratch) / n for n in ("ours", "base", "theirs")]
                files[0].write_bytes(_blob(tree, found[2]))
                files[1].write_bytes(_blob(tree, found[1]) if 1 in found else b"")
                files[2].write_bytes(theirs)
                proc = subprocess.run(
                    ["git", "merge-file", "-p", "--theirs", *map(str, files)],
                    env=clean_env(),
                    capture_output=True,
                )
                if proc.returncode == 0:
                    merged = proc.stdout
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(merged)
    git(tree, "add", "-A", env=env)
    if git(tree, "am", "--continue", env=env, check=False).returncode != 0:
        git(tree, "am", "--abort", env=env, check=False)
        return "could not be carried: later patches are tried without it"
    return (
        "the trial carries it with each conflicted region taken from the patch, "
        "so later patches are tried with it"
    )


def _try_patch(
    fork: Fork,
    tree: Path,
    path: Path,
    patch: patchfile.Patch,
    old_commit: str,
    checker: Checker,
    target: str,
    carry_dir: Path,
) -> PatchReport:
    report = PatchReport(
        path.name,
        patch.subject,
        "",
        patch.upstream_status,
        patch.trailers.get("Origin", []),
    )
    found, diff = absorbed.absorption(tree, path.read_text(encoding="utf-8"))
    if found.full:
        report.outcome = ABSORBED
        report.details.append(rebase.absorbed_reason(patch, found, target))
        return report
    report.details += rebase.content_notes(patch, found, target)
    if found.partial:
        carry_dir.mkdir(parents=True, exist_ok=True)
        carry = carry_dir / path.name
        carry.write_text(
            absorbed.remainder(
                diff,
                found,
                f"What remains of this patch on {target}, which already has: "
                + "; ".join(found.absorbed),
            )
        )
        report.carry = rebase.rel(fork, carry)
        report.details.append(f"the patch to carry: {report.carry}")
    ruff_before = checker.ruff_findings(
        sorted({d.old_path for d in patch.files if d.old_path})
    )
    head = out(tree, "rev-parse", "HEAD")
    env = rebase.am_env()
    plain = git(tree, *AM, str(path), env=env, check=False)
    if plain.returncode == 0:
        report.outcome = APPLIES
    else:
        git(tree, "am", "--abort", env=env, check=False)
        missing = rebase.hunks_not_found(patch, tree)
        merged = git(tree, *AM, "-3", str(path), env=env, check=False)
        if merged.returncode != 0:
            report.outcome = CONFLICTS
            conflicts: dict[str, list[str]] = {
                p: rebase.conflict_regions(tree, p) for p in rebase.unmerged(tree)
            }
            for p, hunks in missing.items():
                conflicts.setdefault(p, []).extend(hunks)
            if not conflicts:
                conflicts["?"] = [(merged.stderr or merged.stdout).strip()[-300:]]
            report.conflicts = dict(sorted(conflicts.items()))
            report.details.append(_take_the_patch_side(tree))
            return report
        if out(tree, "rev-parse", "HEAD") == head:
            report.outcome = ABSORBED
            report.details.append(
                "the target already has its change (the 3-way merge left nothing)"
            )
            return report
        report.outcome = THREE_WAY
        report.details += rebase.duplicated_lines(tree, old_commit, patch)
    if report.outcome == APPLIES:
        report.details += _offsets(patch, tree, head)
    if problems := checker.problems(patch, ruff_before):
        report.details = [f"after {report.outcome}", *problems, *report.details]
        report.outcome = BREAKS
    return report


def _offsets(patch: patchfile.Patch, tree: Path, parent: str) -> list[str]:
    """Files where a hunk applied only at an offset (read from git at the parent:
    a scratch copy of a large tree would cost more)."""
    notes = []
    for diff in patch.files:
        if diff.old_path is None or diff.binary:
            continue
        text = git(tree, "show", f"{parent}:{diff.old_path}", check=False).stdout
        lines = text.split("\n")
        moved = 0
        for hunk in diff.hunks:
            start = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
            if lines[start : start + len(hunk.old_lines)] != hunk.old_lines:
                moved += 1
        if moved:
            notes.append(
                f"{diff.old_path}: {moved} of {len(diff.hunks)} hunk(s) at an offset"
            )
    return notes


def _describe(fork: Fork, program: str | None, what: str) -> str:
    """A program named without the machine's paths."""
    if program is None:
        return f"no {what}"
    path = Path(program)
    for folder, name in ((fork.root, None), (fork.venv_dir, "$FORK_VENV")):
        try:
            inside = path.relative_to(folder)
        except ValueError:
            continue
        return f"{name}/{inside}" if name else str(inside)
    if program == sys.executable:
        return f"the {what} running forkctl"
    return f"{path.name} from PATH"


def dry_run(
    fork: Fork,
    version: str,
    sha256: str | None = None,
    report_prefix: Path | None = None,
) -> Report:
    if version == fork.version:
        raise ForkError(f"the series is already on {version}")
    work = rebase.work_dir(fork, version)
    tree = work / "trial"
    target, source = rebase.target_artifact(fork, version, sha256)
    names = rebase.series_names(fork)
    if tree.exists():
        shutil.rmtree(tree)
    old_commits = rebase.prepare(fork, version, target, tree)
    prefix = report_prefix or work / "report"
    carry_dir = prefix.with_name(prefix.name + "-carry")
    if carry_dir.exists():
        shutil.rmtree(carry_dir)

    patches = [patchfile.parse(fork.patches_dir / n) for n in names]
    checker = Checker(fork, tree)
    checker.baseline(patches)
    notes = [
        "Absorbed means the target already has the patch's change (its hunks "
        "apply in reverse, or a 3-way merge leaves nothing): an `Upstream-Status: "
        "Accepted` trailer alone never counts. Whether an `Origin:` pull request "
        "is merged upstream is not checked (no GitHub access).",
        "Cascade-free: each patch is tried on the target plus the patches before "
        "it; a patch that conflicts is carried with its side of every conflicted "
        "region, so later patches are not tried without it.",
        f"Imports ran with {_describe(fork, checker.python, 'python')} and "
        "PYTHONPATH=<the trial tree>; a failure counts only for a module that "
        "imported before the patch (or is new while "
        f"`import {checker.package}` worked at the target).",
        f"{len(checker.imports)} modules the series touches were imported at the "
        f"target; {sum(e is not None for e in checker.imports.values())} failed "
        "there already (not counted against any patch).",
    ]
    if checker.ruff:
        notes.append(
            f"ruff: {_describe(fork, checker.ruff, 'ruff')} with the target's "
            "settings; only findings a patch adds count."
        )
    else:
        notes.append("ruff: not run (no ruff in the venv or on PATH)")
    if checker.imports.get(checker.package) is not None:
        notes.append(
            f"`import {checker.package}` fails at the target "
            f"({checker.imports[checker.package]}): new modules' imports prove little"
        )
    results: list[PatchReport] = []
    for name, patch, old_commit in zip(names, patches, old_commits):
        path = fork.patches_dir / name
        report = _try_patch(
            fork, tree, path, patch, old_commit, checker, version, carry_dir
        )
        results.append(report)
        print(f"{report.outcome:>20}  {name}", file=sys.stderr)
    result = Report(
        base=fork.version,
        target=version,
        sdist=target.filename,
        sha256=target.sha256,
        sha256_source=source,
        tree=rebase.rel(fork, tree),
        stops_at=next((p.name for p in results if p.outcome == CONFLICTS), None),
        notes=notes,
        patches=results,
    )
    write_report(result, prefix, fork)
    return result


def to_json(report: Report) -> str:
    data = asdict(report)
    data["counts"] = report.counts()
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: Report) -> str:
    counts = ", ".join(f"{n} {outcome}" for outcome, n in report.counts().items())
    lines = [
        f"# Rebase of the series from vLLM {report.base} onto {report.target}",
        "",
        f"Made by `python3 -m forkctl rebase --onto {report.target} --dry-run` from "
        f"`{report.sdist}` (sha256 `{report.sha256}`, verified against "
        f"{report.sha256_source}).",
        "",
        f"**{len(report.patches)} patches: {counts}.**",
        "",
        "| # | patch | outcome | details |",
        "| --- | --- | --- | --- |",
    ]
    for n, p in enumerate(report.patches, 1):
        details = list(p.details)
        for path, hunks in p.conflicts.items():
            details.append(f"`{path}`: " + "; ".join(hunks or ["conflicted"]))
        lines.append(
            f"| {n} | `{p.name}` | {p.outcome} | "
            + _cell("<br>".join(details) or "")
            + " |"
        )
    lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    stop = (
        f"stops at `{report.stops_at}`, the first patch that conflicts"
        if report.stops_at
        else "should not stop: no patch conflicts"
    )
    lines += [
        "",
        "## Moving",
        "",
        f"The trial is in `{report.tree}`. The move itself, "
        f"`python3 -m forkctl rebase --onto {report.target}`, applies the series "
        f"patch by patch and {stop}; then:",
        "",
        "```bash",
        "python3 -m forkctl rebase --continue             # after resolving the tree",
        "python3 -m forkctl rebase --skip --reason 'WHY'  # or: drop the patch",
        "python3 -m forkctl rebase --abort                # or: keep the old line",
        "```",
        "",
    ]
    return "\n".join(lines)


def write_report(report: Report, prefix: Path, fork: Fork) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_name(prefix.name + ".json").write_text(
        rebase.portable(to_json(report), fork)
    )
    prefix.with_name(prefix.name + ".md").write_text(
        rebase.portable(to_markdown(report), fork)
    )
