"""test: run the tests the series adds or changes, inside the tree, on CPU."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from xml.etree import ElementTree

from . import series
from . import tree as tree_module
from .config import Fork
from .errors import ForkError
from .git import git, out


PLUGIN_DIR = Path(__file__).parent / "pytest_plugins"

HUNK_NEW_LINES = re.compile(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", re.M)


def series_tests(fork: Fork) -> list[str]:
    """Test modules under the tree's tests/ that the series (the tree's
    commits over the base) adds or modifies; with [test] scope = "added", in
    modules the base already has, the test functions whose lines the series
    adds or changes instead: the rule by which `--each` picks a patch's."""
    return series_selection(fork)[0]


def series_selection(fork: Fork) -> tuple[list[str], list[str]]:
    """series_tests(), and the upstream modules the series changes without
    changing a test function (a helper, a fixture, a constant): none of their
    tests is selected."""
    tree = _synced_tree(fork)
    base = tree_module.BASE_TAG
    selected: list[str] = []
    untested: list[str] = []
    for path, created in _touched_test_modules(tree, base, "HEAD"):
        if fork.test_scope == "added" and not created:
            tests = _changed_tests(tree, base, "HEAD", path)
            selected += tests
            if not tests:
                untested.append(path)
        else:
            selected.append(path)
    return selected, untested


def _synced_tree(fork: Fork) -> Path:
    """The tree, if it was made from (or exported to) patches/ as they are."""
    tree = fork.tree_dir
    stamp = tree / ".git" / tree_module.SERIES_STAMP
    if not stamp.exists() or stamp.read_text() != tree_module.series_digest(fork):
        raise ForkError("the tree is not synced with patches/: run `forkctl sync`")
    return tree


def cache_env(fork: Fork) -> dict[str, str]:
    cache = fork.root / "build" / "cache"
    return {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "HF_HUB_OFFLINE": "1",
    }


def run_tests(fork: Fork, extra: list[str]) -> int:
    tests, untested = series_selection(fork)
    if untested:
        print(
            "test modules the series changes outside any test function "
            "(none of their tests runs):\n  " + "\n  ".join(untested),
            file=sys.stderr,
        )
    if not tests:
        raise ForkError(
            "the series adds or changes no tests under tests/: nothing to run"
        )
    code = _pytest(fork, tests, extra, fork.tree_dir, [])
    if code == 5:
        raise ForkError("pytest collected no tests from the series' test files")
    return code


def _pytest(
    fork: Fork, tests: list[str], extra: list[str], cwd: Path, pythonpath: list[str]
) -> int:
    python = fork.venv_dir / "bin" / "python"
    if not python.exists():
        raise ForkError(f"no venv at {fork.venv_dir}: run `forkctl build` first")
    # Modules named by node ids run only those tests, selected by the plugin
    # (see pytest_plugins/forkctl_select.py) rather than given as node ids.
    node_ids = [test for test in tests if "::" in test]
    modules = list(dict.fromkeys(test.split("::", 1)[0] for test in tests))
    env = {
        **os.environ,
        **cache_env(fork),
        "FORKCTL_TESTS": "\n".join(node_ids),
        "PYTHONPATH": os.pathsep.join(
            [*pythonpath, str(PLUGIN_DIR)]
            + list(filter(None, [os.environ.get("PYTHONPATH")]))
        ),
    }
    cmd = [
        str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "forkctl_select", *modules, *extra,
    ]  # fmt: skip
    print(
        f"+ FORKCTL_TESTS=<{len(node_ids)} tests named> " + " ".join(cmd),
        file=sys.stderr,
    )
    return subprocess.run(cmd, cwd=cwd, env=env).returncode


def run_each(fork: Fork, extra: list[str]) -> int:
    """Each patch's own tests at the tree's commit of that patch, so that a
    patch's tests pass without the patches after it: the test functions of
    tests/ whose lines (decorators included) the commit adds or changes. It
    runs in a worktree of the tree under build/, with the tree's compiled
    libraries and build outputs linked in (the series head's: a patch's C++
    is tested as the head builds it)."""
    names = series.read(fork.series_file)
    tree = _synced_tree(fork)
    if reason := tree_module.local_work(tree):
        raise ForkError(f"{reason}; its commits would be tested as the patches")
    commits = out(tree, "rev-list", "--reverse", f"{tree_module.BASE_TAG}..HEAD")
    commits_list = commits.split()
    if len(commits_list) != len(names):
        raise ForkError(
            f"the tree has {len(commits_list)} commits over the base and "
            f"patches/series lists {len(names)} patches: export or sync first"
        )
    work = fork.root / "build" / "each-patch"
    git(tree, "worktree", "remove", "--force", str(work), check=False)
    shutil.rmtree(work, ignore_errors=True)
    git(tree, "worktree", "prune")
    git(tree, "worktree", "add", "--quiet", "--detach", str(work), commits_list[0])
    failed: list[str] = []
    not_run: list[str] = []
    untested: list[str] = []
    try:
        _link_build_outputs(fork, tree, work)
        for name, commit in zip(names, commits_list):
            git(work, "checkout", "--quiet", "--detach", commit)
            modules = [p for p, _ in _touched_test_modules(work, f"{commit}~1", commit)]
            tests = [
                test
                for path in modules
                for test in _changed_tests(work, f"{commit}~1", commit, path)
            ]
            if not tests:
                if modules:
                    untested.append(name)
                continue
            print(f"== {name}: {len(tests)} tests at {commit[:12]}", file=sys.stderr)
            report = work / ".forkctl-each.xml"
            report.unlink(missing_ok=True)
            code = _pytest(
                fork, tests, [*extra, f"--junitxml={report}"], work, [str(work)]
            )
            if code == 5 and _skipped(report):
                # a module that skips itself at import (e.g. without AMX)
                not_run.append(name)
            elif code == 5:
                failed.append(f"{name} (pytest collected none of its tests)")
            elif code != 0:
                failed.append(f"{name} (pytest exit status {code})")
    finally:
        git(tree, "worktree", "remove", "--force", str(work), check=False)
    for what, patches in (
        ("whose test changes touch no test function", untested),
        ("none of whose tests ran here (skipped at import)", not_run),
    ):
        if patches:
            print(f"patches {what}:\n  " + "\n  ".join(patches), file=sys.stderr)
    if failed:
        print(
            "patches whose tests do not pass at their own commit:\n  "
            + "\n  ".join(failed),
            file=sys.stderr,
        )
        return 1
    return 0


def _skipped(report: Path) -> bool:
    """Whether pytest's JUnit report counts a skip (as a module that skips
    itself at import gives, where no test is collected)."""
    if not report.exists():
        return False
    suites = ElementTree.parse(report).getroot().iter("testsuite")
    return any(int(suite.get("skipped", "0")) > 0 for suite in suites)


def _touched_test_modules(repo: Path, old: str, new: str) -> list[tuple[str, bool]]:
    """The test modules under tests/ that revision ``new`` adds or modifies
    against ``old``, each with whether it adds it (a renamed one as added)."""
    lines = out(
        repo, "diff", "--name-status", "--no-renames", "--diff-filter=AM",
        old, new, "--", "tests/",
    ).splitlines()  # fmt: skip
    modules = []
    for line in lines:
        status, path = line.split("\t", 1)
        if PurePosixPath(path).name.startswith("test_") and path.endswith(".py"):
            modules.append((path, status == "A"))
    return modules


def _changed_tests(repo: Path, old: str, new: str, path: str) -> list[str]:
    """Node ids of the test functions and test methods of ``path`` (as of
    revision ``new``) with lines that ``new`` adds or changes against
    ``old``, or around lines it removes (decorators count as the
    function's)."""
    diff = out(repo, "diff", "--no-renames", "-U0", old, new, "--", path)
    changed: set[int] = set()
    for match in HUNK_NEW_LINES.finditer(diff):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        # a removal (count 0) falls between lines start and start + 1
        changed.update(range(start, start + (count or 2)))

    def touched(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        return any(
            first <= line <= (node.end_lineno or node.lineno) for line in changed
        )

    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    ids = []
    source = git(repo, "show", f"{new}:{path}").stdout
    for node in ast.parse(source).body:
        if isinstance(node, functions) and node.name.startswith("test"):
            if touched(node):
                ids.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            ids += [
                f"{path}::{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, functions)
                and item.name.startswith("test")
                and touched(item)
            ]
    return ids


def _link_build_outputs(fork: Fork, tree: Path, work: Path) -> None:
    """Link the tree's compiled libraries (the *.so files git ignores) and the
    files the build writes into the worktree."""
    ignored = out(
        tree, "ls-files", "--others", "--ignored", "--exclude-standard"
    ).splitlines()
    for path in [p for p in ignored if p.endswith(".so")] + list(fork.build_outputs):
        source, target = tree / path, work / path
        if source.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
