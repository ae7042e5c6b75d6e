"""upstream PATCH: the patch as its contributor sends it to vLLM, signed off
under the DCO by a person instead of the fork's shared identity."""

from __future__ import annotations

import subprocess

from conftest import AUTHOR, PATCH_DOCS, PATCH_RETRIES

ADA = "Ada Lovelace <ada@example.org>"


def _git(cwd, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def test_the_contributor_signs_and_the_fork_trailers_go(series_fork, tmp_path):
    out = tmp_path / "out"
    result = series_fork.ok("upstream", "2", "--signoff", ADA, "--out", str(out))
    name = series_fork.series()[1]
    assert str(out / name) in result.out
    text = (out / name).read_text()
    original = series_fork.patch_text(1)
    assert f"From: {ADA}\n" in text and AUTHOR not in text
    assert "Upstream-Status" not in text and "Upstream-Status" in original
    assert text.count("Signed-off-by:") == 1
    # The diff is the patch's own.
    assert (
        text[text.index("\ndiff --git") :] == original[original.index("\ndiff --git") :]
    )

    # It applies on the base as a commit by the contributor, signed off by them.
    repo = series_fork.unpack_base(tmp_path / "upstream")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "base")
    _git(
        repo,
        "-c",
        "user.name=Ada Lovelace",
        "-c",
        "user.email=ada@example.org",
        "am",
        "-q",
        "-k",
        str(out / name),
    )
    assert _git(repo, "log", "-1", "--format=%an <%ae>%n%s").split("\n")[:2] == [
        ADA,
        PATCH_DOCS,
    ]
    message = _git(repo, "log", "-1", "--format=%B")
    assert message.rstrip().endswith(f"Signed-off-by: {ADA}")
    assert "Upstream-Status" not in message


def test_the_identity_comes_from_git_config(series_fork, tmp_path):
    _git(series_fork.root, "init", "-q")
    _git(series_fork.root, "config", "user.name", "Ada Lovelace")
    _git(series_fork.root, "config", "user.email", "ada@example.org")
    series_fork.ok("upstream", series_fork.series()[0], "--out", str(tmp_path))
    text = (tmp_path / series_fork.series()[0]).read_text()
    assert f"From: {ADA}\n" in text and f"Signed-off-by: {ADA}\n" in text
    assert PATCH_RETRIES in text


def test_no_identity_and_unknown_patches_are_refused(series_fork, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    _git(series_fork.root, "init", "-q")
    result = series_fork.run("upstream", "1")
    assert result.rc == 1 and "no git identity to sign off with" in result.err
    result = series_fork.run("upstream", "nope.patch", "--signoff", ADA)
    assert result.rc == 1 and "is not a patch of the series" in result.err
    result = series_fork.run("upstream", "1", "--signoff", "Ada")
    assert result.rc == 1 and "is not of the form 'Name <email>'" in result.err
