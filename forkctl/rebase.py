"""rebase --onto VERSION: try the series on a newer upstream release and report.

The target's sdist is fetched through pip's index and verified (against the
pin in fork.toml ``[rebase.sdist]`` or ``--sha256``, else against the sha256
the index publishes, which is printed so that it can be pinned). It becomes
the base of a new tree, ``build/rebase-<version>/tree`` (``./tree`` and the
pins are left alone). The old base plus the series is fetched into the same
repository first, so that ``git am -3`` finds every blob the patches' full
``index`` lines name and can fall back to a three-way merge.

Each patch gets one outcome:

- ``absorbed``: its ``Upstream-Status: Accepted <v>`` has v <= the target, or
  the target already contains its change (it reverse-applies, or the merge
  leaves nothing to commit); it is skipped. Whether an ``Origin:`` pull
  request is merged cannot be checked offline: only the Accepted version and
  the target's content count;
- ``applies``: ``git am`` applies it (an offset is noted);
- ``applies with 3-way``: only ``git am -3`` applies it; lines it adds that
  now occur more often than in the patch's own result are noted, as a merge
  that kept both upstream's and the patch's copy of a change;
- ``conflicts``: the files the merge leaves conflicted, their conflict
  regions, and the patch's hunks whose lines are not in the target; it is
  skipped, so later patches are tried without it;
- ``applies but breaks``: it applies, but afterwards a file it touches does
  not byte-compile, ruff reports something new in it, a module of the package
  it touches stops importing (compared with the state before the patch), or
  a CI file it changes names a test file that does not exist.

The report is written as JSON and as a Markdown table. The tree is left at
the last good patch (``main``, with the trial of the whole series on branch
``rebase-trial``), and ``remaining.mbox`` holds the patches still to apply:
``git am -3 --keep --keep-cr ../remaining.mbox``, resolve, ``git am
--continue``; then ``FORK_TREE=build/rebase-<version>/tree forkctl export``
and pin the target in fork.toml.
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

from . import artifacts, patchfile, series
from .config import Artifact, Fork
from .errors import ForkError
from .git import BASE_IDENTITY, clean_env, git, out
from .tree import BASE_TAG, apply_series, commit_base, mark_synced, unpack_sdist

APPLIES = "applies"
THREE_WAY = "applies with 3-way"
CONFLICTS = "conflicts"
ABSORBED = "absorbed"
BREAKS = "applies but breaks"
OUTCOMES = (APPLIES, THREE_WAY, CONFLICTS, ABSORBED, BREAKS)
TRIAL_BRANCH = "rebase-trial"
OLD_SERIES = "refs/forkctl/old-series"
AM = ("am", "--keep", "--keep-cr", "--quiet")
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


@dataclass
class Report:
    base: str
    target: str
    sdist: str
    sha256: str
    sha256_source: str
    tree: str
    last_good: str | None
    remaining: list[str]
    notes: list[str]
    patches: list[PatchReport]

    def counts(self) -> dict[str, int]:
        counted = Counter(p.outcome for p in self.patches)
        return {outcome: counted.get(outcome, 0) for outcome in OUTCOMES}


def target_artifact(
    fork: Fork, version: str, pinned: str | None
) -> tuple[Artifact, str]:
    """The target's sdist with the sha256 to hold it to, and where that came from."""
    filename = fork.sdist.filename.replace(fork.version, version)
    if filename == fork.sdist.filename and version != fork.version:
        raise ForkError(
            f"cannot derive the {version} sdist's name from {fork.sdist.filename}"
        )
    unpinned = Artifact(fork.sdist.project, filename, "")
    if pinned:
        return Artifact(unpinned.project, filename, pinned.lower()), "--sha256 (pinned)"
    if version in fork.rebase_pins:
        return (
            Artifact(unpinned.project, filename, fork.rebase_pins[version]),
            "fork.toml [rebase.sdist] (pinned)",
        )
    if version == fork.version:
        return fork.sdist, "fork.toml [upstream.sdist] (pinned)"
    cached = fork.cache_dir / "downloads" / filename
    digest = artifacts.published_sha256(unpinned)
    print(
        f"{filename}: not pinned; the index publishes sha256 {digest}\n"
        f'  pin it in fork.toml:  [rebase.sdist]  "{version}" = "{digest}"',
        file=sys.stderr,
    )
    if cached.exists():
        artifacts.verify(cached, digest)
    return Artifact(
        unpinned.project, filename, digest
    ), "the sha256 the index publishes (not pinned yet)"


def _am_env() -> dict[str, str]:
    return clean_env(**{k: v for k, v in BASE_IDENTITY.items() if "COMMITTER" in k})


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
            text = (self.tree / path).read_text(errors="replace")
            for name in sorted(set(TEST_FILE.findall(text))):
                candidates = [self.tree / name, self.tree / "tests" / name]
                if not any(c.is_file() for c in candidates):
                    problems.append(f"{path} names {name}, which does not exist")
        return problems


def _conflict_regions(tree: Path, path: str) -> list[str]:
    target = tree / path
    if not target.is_file():
        return []
    starts = [
        str(n)
        for n, line in enumerate(target.read_text(errors="replace").split("\n"), 1)
        if line.startswith("<<<<<<< ")
    ]
    return [f"conflict markers at line(s) {', '.join(starts)}"] if starts else []


def _hunks_not_found(patch: patchfile.Patch, tree: Path) -> dict[str, list[str]]:
    """Per file, the patch's hunks whose old lines occur nowhere in the tree's file."""
    missing: dict[str, list[str]] = {}
    for diff in patch.files:
        if diff.old_path is None:
            if (tree / diff.path).exists():
                missing[diff.path] = ["new file, but the target already has it"]
            continue
        target = tree / diff.old_path
        if not target.is_file():
            missing[diff.old_path] = ["the target has no such file (moved or removed)"]
            continue
        if diff.binary:
            continue
        lines = target.read_text(errors="surrogateescape").split("\n")
        for hunk in diff.hunks:
            old, n = hunk.old_lines, len(hunk.old_lines)
            if not any(lines[i : i + n] == old for i in range(len(lines) - n + 1)):
                missing.setdefault(diff.old_path, []).append(
                    f"hunk {hunk.header.split(' @@')[0]} @@ not found"
                )
    return missing


def _duplicated_lines(tree: Path, old_commit: str, patch: patchfile.Patch) -> list[str]:
    """Lines a 3-way merge added that now occur more often than in the patch's own
    result: upstream made the same change elsewhere and the merge kept both."""
    notes = []
    for diff in patch.files:
        if not diff.new_path or diff.binary or not (tree / diff.new_path).is_file():
            continue
        theirs = git(tree, "show", f"{old_commit}:{diff.new_path}", check=False).stdout
        ours = (tree / diff.new_path).read_text(errors="replace")
        added = git(
            tree, "diff", "HEAD~1", "HEAD", "--", diff.new_path, check=False
        ).stdout
        lines = {
            line[1:].strip()
            for line in added.splitlines()
            if line.startswith("+") and not line.startswith("+++")
        }
        ours_count = Counter(line.strip() for line in ours.splitlines())
        theirs_count = Counter(line.strip() for line in theirs.splitlines())
        for line in sorted(lines):
            if len(line) < 12 or line.startswith("#"):
                continue
            if ours_count[line] > theirs_count[line]:
                notes.append(
                    f"{diff.new_path}: {line!r} occurs {ours_count[line]} times, "
                    f"{theirs_count[line]} in the patch's own result: check the merge "
                    "did not keep two copies of one change"
                )
    return notes


def _accepted_in(patch: patchfile.Patch, version: str) -> str | None:
    status = patch.upstream_status or ""
    if not status.startswith("Accepted "):
        return None
    accepted = patchfile._version_key(status.split(" ", 1)[1])
    target = patchfile._version_key(version)
    if accepted and target and accepted <= target:
        return status.split(" ", 1)[1]
    return None


def _try_patch(
    fork: Fork,
    tree: Path,
    path: Path,
    patch: patchfile.Patch,
    old_commit: str,
    checker: Checker,
    target: str,
) -> PatchReport:
    report = PatchReport(
        path.name,
        patch.subject,
        "",
        patch.upstream_status,
        patch.trailers.get("Origin", []),
    )
    if accepted := _accepted_in(patch, target):
        report.outcome = ABSORBED
        report.details.append(
            f"Upstream-Status Accepted {accepted}: {target} carries it "
            f"(Origin: {', '.join(report.origins) or 'none'}); skipped"
        )
        return report
    reverse = git(tree, "apply", "--check", "--reverse", str(path), check=False)
    if reverse.returncode == 0:
        report.outcome = ABSORBED
        report.details.append("the target already has its change (it reverse-applies)")
        return report
    ruff_before = checker.ruff_findings(
        sorted({d.old_path for d in patch.files if d.old_path})
    )
    head = out(tree, "rev-parse", "HEAD")
    env = _am_env()
    plain = git(tree, *AM, str(path), env=env, check=False)
    if plain.returncode == 0:
        report.outcome = APPLIES
    else:
        git(tree, "am", "--abort", env=env, check=False)
        merged = git(tree, *AM, "-3", str(path), env=env, check=False)
        if merged.returncode != 0:
            report.outcome = CONFLICTS
            unmerged = out(tree, "diff", "--name-only", "--diff-filter=U").split()
            conflicts: dict[str, list[str]] = {
                p: _conflict_regions(tree, p) for p in unmerged
            }
            git(tree, "am", "--abort", env=env, check=False)
            for p, hunks in _hunks_not_found(patch, tree).items():
                conflicts.setdefault(p, []).extend(hunks)
            if not conflicts:
                conflicts["?"] = [(merged.stderr or merged.stdout).strip()[-300:]]
            report.conflicts = dict(sorted(conflicts.items()))
            report.details.append("skipped: later patches are tried without it")
            return report
        if out(tree, "rev-parse", "HEAD") == head:
            report.outcome = ABSORBED
            report.details.append(
                "the target already has its change (the 3-way merge left nothing)"
            )
            return report
        report.outcome = THREE_WAY
        report.details += _duplicated_lines(tree, old_commit, patch)
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


def rebase(
    fork: Fork,
    version: str,
    sha256: str | None = None,
    report_prefix: Path | None = None,
    force: bool = False,
) -> Report:
    if version == fork.version:
        raise ForkError(f"the series is already on {version}")
    work = fork.root / "build" / f"rebase-{version}"
    tree = work / "tree"
    if tree.exists() and not force:
        raise ForkError(
            f"{tree} exists (a previous rebase, maybe with work in it); "
            "--force replaces it"
        )
    target, source = target_artifact(fork, version, sha256)
    new_sdist = artifacts.fetch(fork, target)
    old_sdist = artifacts.fetch(fork, fork.sdist)
    names = series.read(fork.series_file)
    for name in names:
        if not (fork.patches_dir / name).is_file():
            raise ForkError(f"{name}: listed in patches/series but not in patches/")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)

    # The old base and the series, for the blobs a three-way merge needs.
    with tempfile.TemporaryDirectory(prefix="old-", dir=work) as scratch:
        old = Path(scratch) / "src"
        unpack_sdist(old_sdist, old)
        commit_base(old, fork, f"vLLM {fork.version} (previous base)")
        apply_series(fork, old)
        unpack_sdist(new_sdist, tree)
        commit_base(
            tree,
            fork,
            f"vLLM {version} (rebase target)\n\nUnpacked from {target.filename}, "
            f"sha256 {target.sha256}.",
        )
        git(tree, "fetch", "-q", "--no-tags", str(old), f"main:{OLD_SERIES}")
    git(tree, "tag", BASE_TAG)
    old_commits = out(tree, "rev-list", "--reverse", OLD_SERIES).split()[1:]
    if len(old_commits) != len(names):
        raise ForkError("the series does not apply to its own base: run check")
    git(tree, "tag", "-f", "old-base", f"{OLD_SERIES}~{len(names)}")
    git(tree, "checkout", "-q", "-b", TRIAL_BRANCH)

    patches = [patchfile.parse(fork.patches_dir / n) for n in names]
    checker = Checker(fork, tree)
    checker.baseline(patches)
    notes = [
        "Absorbed means: `Upstream-Status: Accepted <v>` with v <= the target, or the "
        "target already has the patch's change. Whether an `Origin:` pull request "
        "is merged upstream is not checked (no GitHub access).",
        f"Imports ran with {checker.python} and PYTHONPATH=<new tree>; a failure "
        "counts only for a module that imported before the patch (or is new while "
        f"`import {checker.package}` worked at the target).",
    ]
    notes.append(
        f"{len(checker.imports)} modules the series touches were imported at the "
        f"target; {sum(e is not None for e in checker.imports.values())} failed there "
        "already (not counted against any patch)."
    )
    if checker.ruff:
        notes.append(
            f"ruff: {checker.ruff} with the target's settings; only findings a patch "
            "adds count."
        )
    if checker.imports.get(checker.package) is not None:
        notes.append(
            f"`import {checker.package}` fails at the target "
            f"({checker.imports[checker.package]}): new modules' imports prove little"
        )
    if not checker.ruff:
        notes.append("ruff: not run (no ruff in the venv or on PATH)")
    results: list[PatchReport] = []
    last_good: str | None = out(tree, "rev-parse", "HEAD")
    stopped = False
    remaining: list[str] = []
    for name, patch, old_commit in zip(names, patches, old_commits):
        path = fork.patches_dir / name
        report = _try_patch(fork, tree, path, patch, old_commit, checker, version)
        results.append(report)
        print(f"{report.outcome:>20}  {name}", file=sys.stderr)
        if report.outcome in (CONFLICTS, BREAKS):
            stopped = True
        if stopped and report.outcome != ABSORBED:
            remaining.append(name)
        elif not stopped and report.outcome != ABSORBED:
            last_good = out(tree, "rev-parse", "HEAD")
    git(tree, "checkout", "-q", "-B", "main", last_good or BASE_TAG)
    mark_synced(fork, tree)
    mbox = work / "remaining.mbox"
    mbox.write_text("".join((fork.patches_dir / n).read_text() for n in remaining))

    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(fork.root))
        except ValueError:
            return str(path)

    result = Report(
        base=fork.version,
        target=version,
        sdist=target.filename,
        sha256=target.sha256,
        sha256_source=source,
        tree=rel(tree),
        last_good=(
            None
            if last_good == out(tree, "rev-parse", BASE_TAG)
            else out(tree, "log", "-1", "--format=%s", last_good)
        ),
        remaining=remaining,
        notes=notes,
        patches=results,
    )
    prefix = report_prefix or work / "report"
    write_report(result, prefix)
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
        f"Made by `python3 -m forkctl rebase --onto {report.target}` from "
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
    lines += [
        "",
        "## Continuing",
        "",
        f"The tree `{report.tree}` is at the last good patch"
        + (f" ({report.last_good})" if report.last_good else " (the new base)")
        + f"; branch `{TRIAL_BRANCH}` has the whole trial. To go on:",
        "",
        "```bash",
        f"cd {report.tree}",
        "git am -3 --keep --keep-cr ../remaining.mbox   # resolve, git add, "
        "git am --continue",
        f"cd - && FORK_TREE={report.tree} python3 -m forkctl export",
        f"# then pin {report.sdist} in fork.toml [upstream] and [upstream.sdist]",
        "```",
        "",
    ]
    return "\n".join(lines)


def write_report(report: Report, prefix: Path) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_name(prefix.name + ".json").write_text(to_json(report))
    prefix.with_name(prefix.name + ".md").write_text(to_markdown(report))
