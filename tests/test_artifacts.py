"""Artifacts are used only when they match the sha256 pinned in fork.toml."""

from __future__ import annotations

import pytest
from conftest import SDIST, git, sha256


def tamper(path) -> None:
    """Change one byte in the middle of the file."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("verb", ["sync", "check"])
def test_tampered_cached_sdist_is_rejected(fork, verb):
    pinned = sha256(fork.sdist)
    tamper(fork.sdist)
    actual = sha256(fork.sdist)
    assert actual != pinned

    result = fork.run(verb)

    assert result.rc != 0
    assert SDIST in result.err
    assert f"expected {pinned}" in result.err
    assert f"actual   {actual}" in result.err
    assert not fork.tree.exists()


def test_tampered_sdist_leaves_an_existing_tree_alone(series_fork):
    """A bad artifact fails the sync before the working tree is thrown away."""
    fork = series_fork
    fork.ok("sync")
    head = git(fork.tree, "rev-parse", "HEAD")
    tamper(fork.sdist)

    result = fork.run("sync")

    assert result.rc != 0 and "sha256 mismatch" in result.err
    assert git(fork.tree, "rev-parse", "HEAD") == head
    assert (fork.tree / "docs" / "fork.md").is_file()


def local_index(tmp_path, monkeypatch, artifact) -> None:
    """A file:// simple index that serves `artifact` as project `demo`."""
    files = tmp_path / "index-files"
    files.mkdir()
    (files / artifact.name).write_bytes(artifact.read_bytes())
    page = tmp_path / "index" / "demo"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<html><body><a href="../../index-files/{artifact.name}#sha256=0">'
        f"{artifact.name}</a></body></html>\n"
    )
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri() + "/")


def test_missing_artifact_is_fetched_from_the_configured_index(
    fork, tmp_path, monkeypatch
):
    original = fork.sdist.read_bytes()
    local_index(tmp_path, monkeypatch, fork.sdist)
    fork.sdist.unlink()

    fork.ok("sync")

    assert fork.sdist.read_bytes() == original
    assert (fork.tree / "demo" / "defaults.cfg").is_file()


def test_tampered_download_is_discarded(fork, tmp_path, monkeypatch):
    pinned = sha256(fork.sdist)
    tamper(fork.sdist)
    local_index(tmp_path, monkeypatch, fork.sdist)
    actual = sha256(fork.sdist)
    fork.sdist.unlink()

    result = fork.run("sync")

    assert result.rc != 0
    assert f"sha256 mismatch for {SDIST} downloaded from the index" in result.err
    assert pinned in result.err and actual in result.err
    assert list(fork.downloads.iterdir()) == []  # neither the file nor a .part


def test_artifact_on_no_index_is_reported(fork):
    fork.sdist.unlink()
    result = fork.run("sync")
    assert result.rc != 0
    assert f"{SDIST} not found on any configured index" in result.err
