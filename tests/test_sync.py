"""sync: the base plus the series as a git tree, and what happens when it cannot be."""

from __future__ import annotations

import pytest
from conftest import (
    BASE_FILES,
    DEFAULTS_CFG,
    commit_backoff_patch,
    PATCH_BACKOFF,
    PATCH_DOCS,
    PATCH_RETRIES,
    git,
)

from forkctl import config, tree
from forkctl.errors import ForkError

# Upstream changes a line that only the third patch's hunk covers.
CONFLICTING_BASE = DEFAULTS_CFG.replace("shutdown_grace = 5", "shutdown_grace = 10")


def test_conflicting_patch_names_patch_file_and_hunk(series_fork):
    fork = series_fork
    third = fork.series()[2]
    hunk = next(
        line for line in fork.patch_text(2).splitlines() if line.startswith("@@ ")
    )
    fork.rebase_onto(**{"demo/defaults.cfg": CONFLICTING_BASE})

    result = fork.run("sync")

    assert result.rc != 0
    assert f"{third} does not apply" in result.err
    assert f"demo/defaults.cfg: hunk {hunk}" in result.err
    # The tree stops at the last good patch, clean, with no `git am` in progress.
    assert fork.log() == [PATCH_RETRIES, PATCH_DOCS]
    assert git(fork.tree, "status", "--porcelain") == ""
    assert not (fork.tree / ".git" / "rebase-apply").exists()
    assert "shutdown_grace = 10" in (fork.tree / "demo" / "defaults.cfg").read_text()


def test_conflict_is_resolved_in_the_tree_and_exported(series_fork):
    """The rebase workflow: redo the failed patch by hand, export, sync again."""
    fork = series_fork
    names = fork.series()
    fork.rebase_onto(**{"demo/defaults.cfg": CONFLICTING_BASE})
    assert fork.run("sync").rc != 0

    commit_backoff_patch(fork)
    fork.ok("export")
    assert fork.series() == names
    assert " shutdown_grace = 10" in fork.patch_text(2)

    fork.ok("sync")
    assert fork.log() == [PATCH_RETRIES, PATCH_DOCS, PATCH_BACKOFF]
    fork.ok("check")


LOGO = BASE_FILES["docs/logo.bin"]


def test_conflicting_binary_patch_is_reported_by_git_am(series_fork):
    """Binary hunks get no line check: `git am` itself fails, and is aborted."""
    fork = series_fork
    fork.write("docs/logo.bin", LOGO[::-1])
    fork.commit("[Docs] Use the new logo in the documentation")
    fork.ok("export")
    binary = fork.series()[3]
    assert "GIT binary patch" in fork.patch_text(3)
    fork.rebase_onto(**{"docs/logo.bin": LOGO[1:]})

    result = fork.run("sync")

    assert result.rc != 0
    assert f"{binary} does not apply" in result.err
    assert "docs/logo.bin" in result.err
    assert fork.log() == [PATCH_RETRIES, PATCH_DOCS, PATCH_BACKOFF]
    assert not (fork.tree / ".git" / "rebase-apply").exists()
    assert git(fork.tree, "status", "--porcelain") == ""


def test_sync_refuses_to_discard_unexported_commits(series_fork):
    fork = series_fork
    fork.write("docs/more.md", "More.\n")
    fork.commit("[Docs] Add more documentation about the fork")

    result = fork.run("sync")
    assert result.rc != 0
    assert "were not exported" in result.err
    assert (fork.tree / "docs" / "more.md").is_file()

    fork.ok("sync", "--force")
    assert not (fork.tree / "docs" / "more.md").exists()
    assert fork.log() == [PATCH_RETRIES, PATCH_DOCS, PATCH_BACKOFF]


def test_sync_refuses_to_discard_uncommitted_changes(series_fork):
    fork = series_fork
    fork.replace("README.md", "tiny", "small")

    result = fork.run("sync")
    assert result.rc != 0
    assert "uncommitted changes" in result.err and "README.md" in result.err
    assert "small" in (fork.tree / "README.md").read_text()


def test_sync_reports_a_series_entry_without_a_file(series_fork):
    fork = series_fork
    (fork.patches / fork.series()[1]).unlink()
    result = fork.run("sync")
    assert result.rc != 0
    assert "listed in patches/series but not in patches/" in result.err
    assert fork.log() == [PATCH_RETRIES]


def test_sync_drops_the_sdist_egg_info(fork):
    fork.pin({**BASE_FILES, "demo.egg-info/PKG-INFO": "Version: 1.0\n"})
    fork.ok("sync")
    assert not (fork.tree / "demo.egg-info").exists()
    assert (fork.tree / "PKG-INFO").is_file()


def test_ensure_current_resyncs_only_when_patches_change(series_fork):
    fork = series_fork
    settings = config.load()
    marker = fork.tree / "untracked-marker"  # survives only if the tree is kept
    marker.write_text("x")
    (fork.tree / ".git" / "info" / "exclude").write_text("untracked-marker\n")

    tree.ensure_current(settings)
    assert marker.exists()

    names = fork.series()
    (fork.patches / "series").write_text("\n".join(names[:2]) + "\n")
    tree.ensure_current(settings)
    assert not marker.exists()
    assert fork.log() == [PATCH_RETRIES, PATCH_DOCS]


def test_ensure_current_never_discards_local_work(series_fork):
    fork = series_fork
    fork.write("docs/more.md", "More.\n")
    fork.commit("[Docs] Add more documentation about the fork")
    (fork.patches / "series").write_text(fork.series()[0] + "\n")
    with pytest.raises(ForkError, match="were not exported"):
        tree.ensure_current(config.load())
    assert (fork.tree / "docs" / "more.md").is_file()


def test_base_commit_tracks_every_file_of_the_sdist(fork):
    fork.pin({**BASE_FILES, ".gitignore": "*.json\n", "demo/table.json": "{}\n"})
    fork.ok("sync")
    assert "demo/table.json" in git(fork.tree, "ls-files").split()


def test_build_outputs_stay_out_of_the_base_commit(fork):
    files = {
        **BASE_FILES,
        ".gitignore": "_version.py\n",
        "demo/_version.py": "version = '1.0'\n",
    }
    fork.pin(files)
    config = fork.root / "fork.toml"
    config.write_text(
        config.read_text().replace(
            "[upstream]\n", '[upstream]\nbuild_outputs = ["demo/_version.py"]\n', 1
        )
    )
    fork.ok("sync")
    tracked = git(fork.tree, "ls-files").split()
    assert "demo/_version.py" not in tracked
    assert (fork.tree / "demo" / "_version.py").is_file()
    # A build rewriting it leaves the tree clean.
    (fork.tree / "demo" / "_version.py").write_text("version = '1.0+fork'\n")
    assert git(fork.tree, "status", "--porcelain").strip() == ""
