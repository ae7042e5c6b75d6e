"""test: which tests of the tree `forkctl test` runs."""

from __future__ import annotations

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
