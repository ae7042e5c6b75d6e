"""test: which tests of the tree `forkctl test` runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import BASE_FILES

from forkctl import config, testing
from forkctl.errors import ForkError

BASE_TEST = """\
def test_upstream_one():
    assert True


class TestUpstream:
    def test_upstream_two(self):
        assert True
"""


def _series(fork) -> None:
    fork.pin({**BASE_FILES, "tests/test_base.py": BASE_TEST})
    fork.ok("sync")
    fork.replace(
        "tests/test_base.py",
        "class TestUpstream:\n",
        "def test_fork_function():\n    assert True\n\n\n"
        "class TestUpstream:\n    def test_fork_method(self):\n        assert True\n\n",
    )
    fork.write("tests/test_fork.py", "def test_new_file():\n    assert True\n")
    fork.commit("[Core] A change with its tests")
    fork.write("tests/test_fork.py", "def test_new_file():\n    assert 1\n")
    fork.commit("[Core] A later change to the new test file")
    fork.ok("export")


def test_whole_files_by_default(fork):
    _series(fork)
    loaded = config.load(fork.root)
    assert loaded.test_scope == "files"
    assert testing.series_tests(loaded) == ["tests/test_base.py", "tests/test_fork.py"]


def test_added_scope_runs_only_the_added_tests_of_upstream_files(fork):
    _series(fork)
    toml = fork.root / "fork.toml"
    toml.write_text(toml.read_text() + '\n[test]\nscope = "added"\n')
    assert testing.series_tests(config.load(fork.root)) == [
        "tests/test_base.py::test_fork_function",
        "tests/test_base.py::TestUpstream::test_fork_method",
        "tests/test_fork.py",
    ]


def test_added_scope_runs_the_upstream_tests_the_series_changes(fork):
    """The head run picks tests by the rule of `--each`: an upstream test
    whose body or decorator a patch changes runs, not only added ones; a
    module changed only outside its tests is named."""
    helper = (
        "def helper():\n    return 1\n\n\ndef test_helper():\n    assert helper()\n"
    )
    fork.pin(
        {**BASE_FILES, "tests/test_base.py": BASE_TEST, "tests/test_help.py": helper}
    )
    fork.ok("sync")
    fork.replace(
        "tests/test_base.py", "one():\n    assert True", "one():\n    assert 1"
    )
    fork.replace("tests/test_help.py", "return 1", "return 2")
    fork.commit("[Core] A change to an upstream test and a test helper")
    fork.ok("export")
    toml = fork.root / "fork.toml"
    toml.write_text(toml.read_text() + '\n[test]\nscope = "added"\n')
    loaded = config.load(fork.root)
    assert testing.series_selection(loaded) == (
        ["tests/test_base.py::test_upstream_one"],
        ["tests/test_help.py"],
    )
    # patches/ changed since the tree was made: refused, not run stale
    (fork.root / "patches" / "series").write_text("")
    with pytest.raises(ForkError, match="not synced"):
        testing.series_tests(loaded)


def test_an_unknown_scope_is_refused(fork):
    toml = fork.root / "fork.toml"
    toml.write_text(toml.read_text() + '\n[test]\nscope = "some"\n')
    result = fork.run("status")
    assert result.rc == 1 and "[test] scope must be 'files' or 'added'" in result.err


def _pytest(tmp_path, args: list[str], wanted: list[str] | None = None):
    """pytest in tmp_path, with the plugin of `forkctl test` selecting
    ``wanted`` (without it when None)."""
    plugin = [] if wanted is None else ["-p", "forkctl_select"]
    env = {
        **os.environ,
        "FORKCTL_TESTS": "\n".join(wanted or []),
        "PYTHONPATH": str(testing.PLUGIN_DIR),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider"]
        + plugin
        + args,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_plugin_keeps_only_the_named_tests_of_the_base_modules(tmp_path):
    (tmp_path / "test_base.py").write_text(
        BASE_TEST + "\n\nimport pytest\n\n\n@pytest.mark.parametrize('x', [1, 2])\n"
        "def test_fork_param(x):\n    assert x\n"
    )
    (tmp_path / "test_fork.py").write_text("def test_new_file():\n    assert True\n")
    # a module of the base that skips itself at import (e.g. without AMX)
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\npytest.skip('needs AMX', allow_module_level=True)\n\n\n"
        "def test_fork_skipped():\n    assert False\n"
    )
    modules = ["test_base.py", "test_skips.py", "test_fork.py"]
    wanted = [
        "test_base.py::TestUpstream::test_upstream_two",
        "test_base.py::test_fork_param",
        "test_skips.py::test_fork_skipped",
    ]
    result = _pytest(tmp_path, modules, wanted)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = {
        line.split(" ")[0] for line in result.stdout.splitlines() if " PASSED" in line
    }
    assert passed == {
        "test_base.py::TestUpstream::test_upstream_two",
        "test_base.py::test_fork_param[1]",
        "test_base.py::test_fork_param[2]",
        "test_fork.py::test_new_file",
    }
    # test_upstream_one is left out; the module that skips itself says so
    assert "1 skipped, 1 deselected" in result.stdout
    # Given as node ids instead, the module that skips itself fails to collect.
    plain = _pytest(tmp_path, wanted)
    assert (
        plain.returncode == 4 and "found no collectors" in plain.stdout + plain.stderr
    )


def test_run_tests_gives_pytest_the_modules_and_the_plugin_the_node_ids(
    fork, monkeypatch
):
    _series(fork)
    toml = fork.root / "fork.toml"
    toml.write_text(toml.read_text() + '\n[test]\nscope = "added"\n')
    python = fork.root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.delenv("FORK_VENV", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    calls = []
    real_run = subprocess.run

    def run(cmd, cwd, env, **kwargs):
        if cmd[0] == "git":  # picking the tests reads the tree's history
            return real_run(cmd, cwd=cwd, env=env, **kwargs)
        calls.append((cmd, env))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(testing.subprocess, "run", run)
    assert testing.run_tests(config.load(fork.root), ["-k", "fork"]) == 0
    [(cmd, env)] = calls
    assert cmd[cmd.index("forkctl_select") - 1] == "-p"
    assert cmd[-4:] == ["tests/test_base.py", "tests/test_fork.py", "-k", "fork"]
    assert env["FORKCTL_TESTS"].splitlines() == [
        "tests/test_base.py::test_fork_function",
        "tests/test_base.py::TestUpstream::test_fork_method",
    ]
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(testing.PLUGIN_DIR),
        "/elsewhere",
    ]


def _venv_with_pytest(fork) -> None:
    """FORK_VENV's python runs this interpreter (which has pytest)."""
    python = fork.venv / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)


def test_each_runs_a_patchs_tests_at_its_own_commit(fork):
    """A test that passes only with a later patch fails --each (and not the
    run at the series' head); the worktree is gone afterwards."""
    _venv_with_pytest(fork)
    fork.ok("sync")
    fork.write("demo/feature.py", "VALUE = 1\n")
    fork.write(
        "tests/test_feature.py",
        "from demo.feature import VALUE\n\n\n"
        "def test_feature():\n    assert VALUE == 2\n",
    )
    fork.commit("[Core] A feature whose test needs the next patch")
    fork.write("demo/feature.py", "VALUE = 2\n")
    fork.write("tests/test_later.py", "def test_later():\n    assert True\n")
    fork.commit("[Core] The fix the first patch's test relies on")
    fork.ok("export")

    loaded = config.load(fork.root)
    assert testing.run_tests(loaded, []) == 0
    result = fork.run("test", "--each")
    assert result.rc == 1
    first, second = fork.series()
    assert f"{first} (pytest exit status 1)" in result.err
    assert second not in result.err.split("at their own commit:", 1)[1]
    assert not (fork.root / "build" / "each-patch").exists()


def test_each_passes_when_every_patch_passes_alone(fork):
    _venv_with_pytest(fork)
    _series(fork)
    result = fork.run("test", "--each")
    assert result.rc == 0, result.text
    assert "none of whose tests ran" not in result.err
    # one pytest run per patch, each naming only that patch's tests
    assert result.err.count("== ") == 2
    assert "<3 tests named>" in result.err and "<1 tests named>" in result.err


def test_changed_tests_are_the_tests_whose_lines_a_commit_touches(tmp_path):
    from forkctl.git import git

    before = """\
import pytest


def helper():
    return 1


@pytest.mark.parametrize("x", [1])
def test_param(x):
    assert x


def test_same():
    assert True


def test_shortened():
    x = 1
    assert x


def test_removed():
    assert True


class TestGroup:
    def test_old(self):
        assert True
"""
    after = (
        before.replace("[1])\ndef test_param", "[1, 2])\ndef test_param")
        .replace("    return 1\n", "    return 2\n")
        .replace("def test_removed():\n    assert True\n\n\n", "")
        .replace("    x = 1\n    assert x\n", "    assert x\n")
        + "\n    def test_new(self):\n        assert True\n"
    )
    git(tmp_path, "init", "-q")
    (tmp_path / "tests").mkdir()
    test_file = tmp_path / "tests" / "test_x.py"
    test_file.write_text(before)
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    test_file.write_text(after)
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "b")
    commit = testing.out(tmp_path, "rev-parse", "HEAD")
    # the decorator's change, the test that lost a line and the new method;
    # not the helper's callers, not the unchanged test, not the removed one
    changed = testing._changed_tests(tmp_path, f"{commit}~1", commit, "tests/test_x.py")
    assert changed == [
        "tests/test_x.py::test_param",
        "tests/test_x.py::test_shortened",
        "tests/test_x.py::TestGroup::test_new",
    ]


def test_each_lists_a_patch_whose_tests_skip_themselves_here(fork):
    """A module that skips itself at import (e.g. without AMX) runs nothing:
    named, not a failure."""
    _venv_with_pytest(fork)
    fork.ok("sync")
    fork.write(
        "tests/test_amx.py",
        "import pytest\n\npytest.skip('needs AMX', allow_module_level=True)\n\n\n"
        "def test_amx():\n    assert False\n",
    )
    fork.commit("[Core] A change whose test needs AMX")
    fork.ok("export")
    result = fork.run("test", "--each")
    assert result.rc == 0, result.text
    [name] = fork.series()
    assert f"none of whose tests ran here (skipped at import):\n  {name}" in result.err


def test_each_fails_a_patch_none_of_whose_tests_is_collected(fork):
    _venv_with_pytest(fork)
    _series(fork)
    result = fork.run("test", "--each", "--", "-k", "no_such_test")
    assert result.rc == 1
    first, second = fork.series()
    assert f"{first} (pytest collected none of its tests)" in result.err
    assert f"{second} (pytest collected none of its tests)" in result.err


def test_each_refuses_a_tree_with_unexported_commits(fork):
    _venv_with_pytest(fork)
    _series(fork)
    fork.write("tests/test_fork.py", "def test_new_file():\n    assert 2\n")
    fork.commit("[Core] Not exported yet")
    result = fork.run("test", "--each")
    assert result.rc == 1 and "not exported" in result.err
