"""sync turns patches/ into commits; export turns them back, byte for byte."""

from __future__ import annotations

from conftest import (
    FORK_MD,
    PATCH_BACKOFF,
    PATCH_DOCS,
    PATCH_RETRIES,
    SIGNED_OFF,
    git,
)


def test_sync_then_export_without_edits_leaves_patches_byte_identical(series_fork):
    fork = series_fork
    # The series is what the test claims: a new file, and a file changed twice.
    assert "new file mode" in fork.patch_text(1)
    assert "+++ b/docs/fork.md" in fork.patch_text(1)
    assert "+++ b/demo/defaults.cfg" in fork.patch_text(0)
    assert "+++ b/demo/defaults.cfg" in fork.patch_text(2)
    assert " max_retries = 5" in fork.patch_text(2)  # context from patch 1
    before = fork.snapshot()

    fork.ok("sync")  # replaces the tree: base + the series through `git am`
    assert fork.log() == [PATCH_RETRIES, PATCH_DOCS, PATCH_BACKOFF]
    fork.ok("export")

    after = fork.snapshot()
    assert sorted(after) == sorted(before)
    for name in before:
        assert after[name] == before[name], f"export changed {name}"


def test_sync_into_a_fresh_tree_is_reproducible(series_fork, monkeypatch, tmp_path):
    """Fixed committer identity and date: the same series gives the same commits."""
    fork = series_fork
    fork.ok("sync")
    head = git(fork.tree, "rev-parse", "HEAD").strip()
    monkeypatch.setenv("FORK_TREE", str(tmp_path / "other-tree"))
    fork.ok("sync")
    assert git(tmp_path / "other-tree", "rev-parse", "HEAD").strip() == head


def test_sync_reproduces_content_author_and_trailers(series_fork):
    fork = series_fork
    fork.ok("sync")
    assert (fork.tree / "docs" / "fork.md").read_text() == FORK_MD
    cfg = (fork.tree / "demo" / "defaults.cfg").read_text()
    assert "max_retries = 5\nretry_backoff = 0.5\n" in cfg
    assert "timeout = 60\n" in cfg
    author = git(fork.tree, "log", "-1", "--format=%an <%ae> %aI").strip()
    assert author == "Zoë Developer <zoe@example.com> 2025-03-04T05:06:07+01:00"
    message = git(fork.tree, "log", "-1", "--format=%B").strip()
    assert message.startswith(PATCH_BACKOFF + "\n\n")
    assert message.endswith(f"{SIGNED_OFF}\nUpstream-Status: Pending")


def test_export_follows_edits_in_the_tree(series_fork):
    """Amending one commit rewrites that patch only; dropping one removes its file."""
    fork = series_fork
    before = fork.snapshot()
    names = fork.series()

    git(fork.tree, "rebase", "-q", "--onto", "HEAD~2", "HEAD~1")  # drop the docs patch
    fork.replace("demo/defaults.cfg", "timeout = 60", "timeout = 90")
    git(fork.tree, "commit", "-q", "-a", "--amend", "--no-edit")
    fork.ok("export")

    after = fork.snapshot()
    assert fork.series() == [names[0], names[2]]
    assert names[1] not in after
    assert after[names[0]] == before[names[0]]
    assert after[names[2]] != before[names[2]]
    assert "+timeout = 90" in after[names[2]].decode()
    # The series file keeps its comment header.
    assert after["series"].decode().startswith("# ")
