"""test: which tests of the tree `forkctl test` runs."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import BASE_FILES

from forkctl import config, testing

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

    def run(cmd, cwd, env):
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
