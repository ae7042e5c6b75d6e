"""rebase --onto: the series on a newer synthetic upstream, an outcome per patch."""

from __future__ import annotations

import json

import pytest
from conftest import (
    BASE_FILES,
    DEFAULTS_CFG,
    FORK_MD,
    PATCH_DOCS,
    PATCH_RETRIES,
    PROJECT,
    SIGNED_OFF,
    git,
    make_sdist,
    sha256,
)

TARGET = "2.0"
TARGET_SDIST = f"{PROJECT}-{TARGET}.tar.gz"
UTIL = (
    '"""Helpers."""\n\n\ndef retry_delay(attempt: int) -> float:\n'
    "    return 0.5 * attempt\n"
)
PATCH_TIMEOUT = "[Core] Raise the default timeout for slow remote workers"
PATCH_README = "[Docs] Call the demo engine small rather than tiny"
PATCH_CACHE = "[Core] Double the default cache for larger models"
PATCH_ENGINE = "[Core] Back off between retries of a remote worker"

OUTCOMES = {
    PATCH_DOCS: "applies",
    PATCH_RETRIES: "applies with 3-way",
    PATCH_TIMEOUT: "conflicts",
    PATCH_README: "absorbed",
    PATCH_CACHE: "absorbed",
    PATCH_ENGINE: "applies but breaks",
}

# Upstream 2.0: `name` (context of the retries patch) and `timeout` (the line
# the timeout patch changes) differ, it made the cache and README changes
# itself, and it moved demo/util.py to demo/timing.py.
TARGET_FILES = {
    **BASE_FILES,
    "demo/defaults.cfg": DEFAULTS_CFG.replace("name = demo", "name = demo2")
    .replace("timeout = 30", "timeout = 45")
    .replace("size_mb = 512", "size_mb = 1024"),
    "README.md": BASE_FILES["README.md"].replace("tiny", "small"),
    "demo/timing.py": UTIL,
}


@pytest.fixture
def rebase_fork(fork):
    """Six patches on 1.0 (one per outcome) and the 2.0 sdist in the cache."""
    fork.pin({**BASE_FILES, "demo/util.py": UTIL})
    fork.ok("sync")
    fork.write("docs/fork.md", FORK_MD)
    fork.commit(PATCH_DOCS)
    fork.replace("demo/defaults.cfg", "max_retries = 3", "max_retries = 5")
    fork.commit(PATCH_RETRIES)
    fork.replace("demo/defaults.cfg", "timeout = 30", "timeout = 60")
    fork.commit(PATCH_TIMEOUT)
    fork.replace("README.md", "tiny", "small")
    fork.commit(
        PATCH_README,
        trailers=(
            "Origin: upstream, https://github.com/vllm-project/vllm/pull/777",
            SIGNED_OFF,
            f"Upstream-Status: Accepted {TARGET}",
        ),
    )
    fork.replace("demo/defaults.cfg", "size_mb = 512", "size_mb = 1024")
    fork.commit(PATCH_CACHE)
    fork.replace(
        "demo/engine.py",
        "from pathlib import Path\n",
        "from pathlib import Path\n\nfrom demo.util import retry_delay\n",
    )
    fork.write(
        "demo/engine.py",
        (fork.tree / "demo/engine.py").read_text()
        + "\n\ndef backoff(attempt: int) -> float:\n    return retry_delay(attempt)\n",
    )
    fork.commit(PATCH_ENGINE)
    fork.ok("export")
    assert len(fork.series()) == 6
    target = make_sdist(
        fork.downloads / TARGET_SDIST, TARGET_FILES, top=f"{PROJECT}-{TARGET}"
    )
    fork.target_sha = sha256(target)
    return fork


def load_report(fork, prefix="build/rebase-2.0/report"):
    return json.loads((fork.root / f"{prefix}.json").read_text())


def test_each_patch_gets_its_outcome(rebase_fork):
    fork = rebase_fork
    synced = git(fork.tree, "rev-parse", "HEAD")

    result = fork.run("rebase", "--onto", TARGET, "--sha256", fork.target_sha)

    assert result.rc == 2, result.text
    report = load_report(fork)
    by_subject = {p["subject"]: p for p in report["patches"]}
    assert {s: p["outcome"] for s, p in by_subject.items()} == OUTCOMES
    assert report["counts"] == {
        "applies": 1,
        "applies with 3-way": 1,
        "conflicts": 1,
        "absorbed": 2,
        "applies but breaks": 1,
    }
    conflict = by_subject[PATCH_TIMEOUT]["conflicts"]
    assert list(conflict) == ["demo/defaults.cfg"]
    assert any(
        "conflict markers at line(s) 9" in c for c in conflict["demo/defaults.cfg"]
    )
    assert any(
        c.startswith("hunk @@ -6,7 +6,7 @@") for c in conflict["demo/defaults.cfg"]
    )
    accepted = " ".join(by_subject[PATCH_README]["details"])
    assert "Accepted 2.0" in accepted and "pull/777" in accepted
    assert "already has its change" in " ".join(by_subject[PATCH_CACHE]["details"])
    broken = by_subject[PATCH_ENGINE]["details"]
    assert any(
        d.startswith("import demo.engine: ModuleNotFoundError") and "demo.util" in d
        for d in broken
    ), broken
    assert "demo/engine.py imports demo.util, which the tree does not have" in broken

    # The table says the same.
    table = (fork.root / "build/rebase-2.0/report.md").read_text()
    for name, p in zip(fork.series(), report["patches"]):
        assert f"| `{name}` | {p['outcome']} |" in table

    # The new tree: at the last good patch, clean, on 2.0; ./tree is untouched.
    tree = fork.root / "build/rebase-2.0/tree"
    log = git(tree, "log", "--reverse", "--format=%s", "base..main").splitlines()
    assert log == [PATCH_DOCS, PATCH_RETRIES]
    assert git(tree, "status", "--porcelain") == ""
    assert "vLLM 2.0" in git(tree, "log", "-1", "--format=%s", "base")
    assert "name = demo2" in (tree / "demo/defaults.cfg").read_text()
    trial = git(tree, "log", "--reverse", "--format=%s", "base..rebase-trial")
    assert trial.splitlines() == [PATCH_DOCS, PATCH_RETRIES, PATCH_ENGINE]
    assert git(fork.tree, "rev-parse", "HEAD") == synced
    assert 'version = "1.0"' in (fork.root / "fork.toml").read_text()
    mbox = (fork.root / "build/rebase-2.0/remaining.mbox").read_text()
    assert PATCH_TIMEOUT in mbox and PATCH_ENGINE in mbox
    assert PATCH_README not in mbox and PATCH_DOCS not in mbox


def test_the_left_tree_is_resolved_and_exported(rebase_fork, monkeypatch):
    """Continuing from the report: git am -3 the rest, resolve, export."""
    fork = rebase_fork
    assert fork.run("rebase", "--onto", TARGET, "--sha256", fork.target_sha).rc == 2
    tree = fork.root / "build/rebase-2.0/tree"
    with pytest.raises(AssertionError):
        git(tree, "am", "-3", "--keep", "--keep-cr", "../remaining.mbox")
    cfg = (tree / "demo/defaults.cfg").read_text()
    assert "<<<<<<<" in cfg
    resolved = TARGET_FILES["demo/defaults.cfg"].replace("timeout = 45", "timeout = 60")
    (tree / "demo/defaults.cfg").write_text(
        resolved.replace("max_retries = 3", "max_retries = 5")
    )
    git(tree, "add", "demo/defaults.cfg")
    git(tree, "am", "--continue")  # the engine patch applies; fixing it is a new commit
    log = git(tree, "log", "--reverse", "--format=%s", "base..HEAD").splitlines()
    assert log == [PATCH_DOCS, PATCH_RETRIES, PATCH_TIMEOUT, PATCH_ENGINE]

    monkeypatch.setenv("FORK_TREE", str(tree))
    fork.ok("export")
    assert len(fork.series()) == 4
    assert "-timeout = 45\n+timeout = 60" in fork.patch_text(2)


def test_target_hash_from_fork_toml_and_a_wrong_pin(rebase_fork):
    fork = rebase_fork
    wrong = "0" * 64
    result = fork.run("rebase", "--onto", TARGET, "--sha256", wrong)
    assert result.rc == 1
    assert f"sha256 mismatch for {TARGET_SDIST}" in result.err
    assert not (fork.root / "build/rebase-2.0").exists()

    config = fork.root / "fork.toml"
    config.write_text(
        config.read_text() + f'\n[rebase.sdist]\n"{TARGET}" = "{fork.target_sha}"\n'
    )
    result = fork.run("rebase", "--onto", TARGET, "--report", "docs/rebase")
    assert result.rc == 2, result.text
    report = load_report(fork, "docs/rebase")
    assert report["sha256"] == fork.target_sha
    assert report["sha256_source"].startswith("fork.toml [rebase.sdist]")
    assert (fork.root / "docs/rebase.md").is_file()

    result = fork.run("rebase", "--onto", TARGET)
    assert result.rc == 1 and "--force replaces it" in result.err


def test_unpinned_target_uses_and_prints_the_index_hash(
    rebase_fork, tmp_path, monkeypatch
):
    fork = rebase_fork
    files = tmp_path / "index-files"
    files.mkdir()
    (files / TARGET_SDIST).write_bytes((fork.downloads / TARGET_SDIST).read_bytes())
    (fork.downloads / TARGET_SDIST).unlink()
    page = tmp_path / "index" / PROJECT
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<a href="../../index-files/{TARGET_SDIST}#sha256={fork.target_sha}">x</a>\n'
    )
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri() + "/")

    result = fork.run("rebase", "--onto", TARGET)

    assert result.rc == 2, result.text
    assert f'"{TARGET}" = "{fork.target_sha}"' in result.err
    assert load_report(fork)["sha256_source"].endswith("(not pinned yet)")
    assert sha256(fork.downloads / TARGET_SDIST) == fork.target_sha


def test_three_way_merge_that_keeps_two_copies_is_noted(fork):
    """Upstream added the patch's line elsewhere: the merge keeps both, silently."""
    fork.ok("sync")
    fork.replace(
        "demo/defaults.cfg", "prefetch = 2\n", "prefetch = 2\nfast_path = on\n"
    )
    fork.commit("[Core] Turn on the fast path by default")
    fork.ok("export")
    target = DEFAULTS_CFG.replace("name = demo\n", "name = demo\nfast_path = on\n")
    target = target.replace("batch_size = 16", "batch_size = 32")
    files = {**BASE_FILES, "demo/defaults.cfg": target}
    sdist = make_sdist(fork.downloads / TARGET_SDIST, files, top=f"{PROJECT}-2.0")

    result = fork.run("rebase", "--onto", TARGET, "--sha256", sha256(sdist))

    assert result.rc == 0, result.text
    (patch,) = load_report(fork)["patches"]
    assert patch["outcome"] == "applies with 3-way"
    assert any(
        "'fast_path = on' occurs 2 times, 1 in the patch's own result" in d
        for d in patch["details"]
    ), patch["details"]
