"""rebase --onto: the series on a newer synthetic upstream.

The dry run reports an outcome per patch; the move applies patch by patch,
stops at a conflict, and goes on with --continue or --skip (or --abort).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import (
    BASE_FILES,
    BODY,
    DEFAULTS_CFG,
    FORK_MD,
    PATCH_BACKOFF,
    PATCH_DOCS,
    PATCH_RETRIES,
    PENDING,
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


WORK = "build/rebase-2.0"


def load_report(fork, prefix=f"{WORK}/report"):
    return json.loads((fork.root / f"{prefix}.json").read_text())


def load_state(fork):
    return json.loads((fork.root / WORK / "state.json").read_text())


def names(entries):
    return [e["patch"] for e in entries]


def dry_run(fork, *args):
    return fork.run("rebase", "--onto", TARGET, "--dry-run", *args)


def assert_no_machine_paths(fork, *paths):
    home = str(Path.home())
    for path in paths:
        text = path.read_text()
        assert str(fork.root.parent) not in text, path
        assert sys.executable not in text, path
        assert home == "/" or home not in text, path


# -- the dry run ------------------------------------------------------------------


def test_each_patch_gets_its_outcome(rebase_fork):
    fork = rebase_fork
    synced = git(fork.tree, "rev-parse", "HEAD")

    result = dry_run(fork, "--sha256", fork.target_sha)

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
    assert report["stops_at"] == fork.series()[2]
    # Absorbed by content; the trailer only agrees.
    readme = " ".join(by_subject[PATCH_README]["details"])
    assert "already has its change" in readme and "Accepted 2.0 agrees" in readme
    assert "already has its change" in " ".join(by_subject[PATCH_CACHE]["details"])
    broken = by_subject[PATCH_ENGINE]["details"]
    assert any(
        d.startswith("import demo.engine: ModuleNotFoundError") and "demo.util" in d
        for d in broken
    ), broken
    assert "demo/engine.py imports demo.util, which the tree does not have" in broken

    # The table says the same.
    table = fork.root / WORK / "report.md"
    for name, p in zip(fork.series(), report["patches"]):
        assert f"| `{name}` | {p['outcome']} |" in table.read_text()
    assert_no_machine_paths(fork, table, fork.root / WORK / "report.json")

    # The trial: on 2.0, carrying every patch that is not absorbed (the
    # conflicting one with its side of the conflict); ./tree is untouched.
    trial = fork.root / WORK / "trial"
    log = git(trial, "log", "--reverse", "--format=%s", "base..HEAD").splitlines()
    assert log == [PATCH_DOCS, PATCH_RETRIES, PATCH_TIMEOUT, PATCH_ENGINE]
    assert git(trial, "status", "--porcelain") == ""
    assert "vLLM 2.0" in git(trial, "log", "-1", "--format=%s", "base")
    cfg = (trial / "demo/defaults.cfg").read_text()
    assert "name = demo2" in cfg and "timeout = 60" in cfg and "<<<<" not in cfg
    assert git(fork.tree, "rev-parse", "HEAD") == synced
    assert 'version = "1.0"' in (fork.root / "fork.toml").read_text()
    assert not (fork.root / WORK / "tree").exists()


def test_dry_run_is_cascade_free(series_fork):
    """Upstream changed the line the first patch changes, and the third patch's
    context holds the first patch's line: it is tried with the first patch."""
    fork = series_fork
    files = {
        **BASE_FILES,
        "demo/defaults.cfg": DEFAULTS_CFG.replace("max_retries = 3", "max_retries = 4"),
    }
    sdist = make_sdist(fork.downloads / TARGET_SDIST, files, top=f"{PROJECT}-2.0")

    result = dry_run(fork, "--sha256", sha256(sdist))

    assert result.rc == 2, result.text
    outcomes = {p["subject"]: p["outcome"] for p in load_report(fork)["patches"]}
    assert outcomes == {
        PATCH_RETRIES: "conflicts",
        PATCH_DOCS: "applies",
        PATCH_BACKOFF: "applies",
    }
    trial = fork.root / WORK / "trial"
    cfg = (trial / "demo/defaults.cfg").read_text()
    assert "max_retries = 5\nretry_backoff = 0.5\n" in cfg


def test_target_hash_from_fork_toml_and_a_wrong_pin(rebase_fork):
    fork = rebase_fork
    wrong = "0" * 64
    result = dry_run(fork, "--sha256", wrong)
    assert result.rc == 1
    assert f"sha256 mismatch for {TARGET_SDIST}" in result.err
    assert not (fork.root / WORK).exists()

    config = fork.root / "fork.toml"
    config.write_text(
        config.read_text() + f'\n[rebase.sdist]\n"{TARGET}" = "{fork.target_sha}"\n'
    )
    result = dry_run(fork, "--report", "docs/rebase")
    assert result.rc == 2, result.text
    report = load_report(fork, "docs/rebase")
    assert report["sha256"] == fork.target_sha
    assert report["sha256_source"].startswith("fork.toml [rebase.sdist]")
    assert (fork.root / "docs/rebase.md").is_file()

    # The move takes the pin too; a second one waits for the first.
    assert fork.run("rebase", "--onto", TARGET).rc == 2
    result = fork.run("rebase", "--onto", TARGET)
    assert result.rc == 1 and "--force to start again" in result.err
    assert dry_run(fork).rc == 2  # a dry run beside it is fine
    assert load_state(fork)["current"]["subject"] == PATCH_TIMEOUT


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

    result = dry_run(fork)

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

    result = dry_run(fork, "--sha256", sha256(sdist))

    assert result.rc == 0, result.text
    (patch,) = load_report(fork)["patches"]
    assert patch["outcome"] == "applies with 3-way"
    assert any(
        "'fast_path = on' occurs 2 times, 1 in the patch's own result" in d
        for d in patch["details"]
    ), patch["details"]


# -- the move: stop, resolve, continue; skip; abort -----------------------------------


def test_move_stops_at_a_conflict_and_continues_from_the_resolution(rebase_fork):
    fork = rebase_fork
    synced = git(fork.tree, "rev-parse", "HEAD")
    patches = fork.snapshot()
    pins = (fork.root / "fork.toml").read_text()
    series = fork.series()

    result = fork.run("rebase", "--onto", TARGET, "--sha256", fork.target_sha)

    assert result.rc == 2, result.text
    assert f"stopped at patch 3 of 6, {series[2]}: {PATCH_TIMEOUT}" in result.out
    state = load_state(fork)
    assert state["target"] == TARGET and state["base"] == "1.0"
    assert names(state["done"]) == series[:2]
    assert [d["how"] for d in state["done"]] == ["applies", "applies with 3-way"]
    assert state["current"]["patch"] == series[2]
    assert list(state["current"]["conflicts"]) == ["demo/defaults.cfg"]
    assert state["skipped"] == [] and state["todo"] == series[3:]
    assert_no_machine_paths(fork, fork.root / WORK / "state.json")
    tree = fork.root / WORK / "tree"
    cfg = tree / "demo/defaults.cfg"
    assert "<<<<<<<" in cfg.read_text()
    # Nothing of the old line moved.
    assert git(fork.tree, "rev-parse", "HEAD") == synced
    assert fork.snapshot() == patches
    assert (fork.root / "fork.toml").read_text() == pins

    result = fork.run("rebase", "--continue")
    assert result.rc == 1
    assert "conflict markers are left in demo/defaults.cfg" in result.err

    resolved = TARGET_FILES["demo/defaults.cfg"].replace("timeout = 45", "timeout = 60")
    cfg.write_text(resolved.replace("max_retries = 3", "max_retries = 5"))
    result = fork.run("rebase", "--continue")

    assert result.rc == 0, result.text
    assert "series ok: 4 patches on 2.0" in result.out
    assert [fork.patch_text(i).split("\n")[3] for i in range(4)] == [
        f"Subject: {s}" for s in (PATCH_DOCS, PATCH_RETRIES, PATCH_TIMEOUT)
    ] + ["Subject: [Core] Back off between retries of a remote worker"]
    timeout = fork.patch_text(2)
    assert "-timeout = 45\n+timeout = 60" in timeout
    assert BODY.splitlines()[0] in timeout and PENDING in timeout
    assert "Zo=C3=AB Developer" in timeout or "Zoë Developer" in timeout
    state = load_state(fork)
    assert state["finished"] is True
    assert names(state["done"]) == [series[i] for i in (0, 1, 2, 5)]
    assert state["done"][2]["how"] == "resolved by hand"
    reasons = {e["patch"]: e["reason"] for e in state["skipped"]}
    assert list(reasons) == [series[3], series[4]]
    assert all(r.startswith("absorbed: 2.0 already has") for r in reasons.values())
    assert "Accepted 2.0 agrees" in reasons[series[3]]
    # The pins: the sdist moved; the wheel and torch are named, not guessed.
    toml = (fork.root / "fork.toml").read_text()
    assert 'version = "2.0"' in toml and f'filename = "{TARGET_SDIST}"' in toml
    assert f'sha256 = "{fork.target_sha}"' in toml
    assert 'filename = "demo-1.0-py3-none-any.whl"' in toml
    assert 'version = "0.0-test"' in toml
    assert "left to move by hand:" in result.out
    assert "wheels.cpu: still demo-1.0-py3-none-any.whl" in result.out
    assert "torch: still 0.0-test" in result.out

    assert fork.run("rebase", "--continue").rc == 1  # nothing in progress
    fork.ok("sync")  # ./tree moves when asked
    assert fork.log() == [PATCH_DOCS, PATCH_RETRIES, PATCH_TIMEOUT, PATCH_ENGINE]


def test_skip_drops_the_patch_with_its_reason_and_pins_what_is_known(rebase_fork):
    fork = rebase_fork
    wheel = "a" * 64
    config = fork.root / "fork.toml"
    config.write_text(
        config.read_text()
        + f'\n[rebase.wheels.cpu]\n"{TARGET}" = "{wheel}"\n'
        + f'\n[rebase.torch]\n"{TARGET}" = "2.0-test"\n'
    )
    assert fork.run("rebase", "--onto", TARGET, "--sha256", fork.target_sha).rc == 2

    result = fork.run("rebase", "--skip", "--reason", "upstream's 45 s is enough")

    assert result.rc == 0, result.text
    assert [fork.patch_text(i).split("\n")[3] for i in range(3)] == [
        f"Subject: {s}" for s in (PATCH_DOCS, PATCH_RETRIES, PATCH_ENGINE)
    ]
    skipped = load_state(fork)["skipped"]
    assert skipped[0] == {
        "patch": names(skipped)[0],
        "subject": PATCH_TIMEOUT,
        "reason": "upstream's 45 s is enough",
    }
    assert len(skipped) == 3
    assert f"dropped  {skipped[0]['patch']}: upstream's 45 s is enough" in result.out
    toml = config.read_text()
    assert 'filename = "demo-2.0-py3-none-any.whl"' in toml
    assert f'sha256 = "{wheel}"' in toml and 'version = "2.0-test"' in toml
    assert "left to move" not in result.out
    # The pins moved: `sync` builds the tree on the target.
    fork.ok("sync")
    assert "timeout = 45" in (fork.tree / "demo/defaults.cfg").read_text()


def test_abort_leaves_the_old_line_as_it_was(rebase_fork):
    fork = rebase_fork
    synced = git(fork.tree, "rev-parse", "HEAD")
    patches = fork.snapshot()
    pins = (fork.root / "fork.toml").read_text()
    assert fork.run("rebase", "--onto", TARGET, "--sha256", fork.target_sha).rc == 2
    assert (fork.root / WORK / "tree").is_dir()

    result = fork.run("rebase", "--abort")

    assert result.rc == 0, result.text
    assert not (fork.root / WORK).exists()
    assert git(fork.tree, "rev-parse", "HEAD") == synced
    assert git(fork.tree, "status", "--porcelain") == ""
    assert fork.snapshot() == patches
    assert (fork.root / "fork.toml").read_text() == pins
    result = fork.run("rebase", "--continue")
    assert result.rc == 1 and "no rebase in progress" in result.err
    assert fork.run("rebase", "--onto", TARGET, "--sha256", fork.target_sha).rc == 2


# -- absorbed means the content is upstream -------------------------------------------

PATCH_PARTLY = "[Core] More workers and an LFU cache by default"
PATCH_CLAIMED = "[Core] A deeper queue for bursts of requests"


def target_with(fork, cfg: str) -> str:
    """A 2.0 sdist whose defaults.cfg is cfg; its sha256."""
    files = {**BASE_FILES, "demo/defaults.cfg": cfg}
    return sha256(make_sdist(fork.downloads / TARGET_SDIST, files, top="demo-2.0"))


def test_partly_absorbed_patch_carries_what_remains(fork, tmp_path):
    fork.ok("sync")
    fork.replace("demo/defaults.cfg", "workers = 4", "workers = 8")
    fork.replace("demo/defaults.cfg", "eviction = lru", "eviction = lfu")
    fork.commit(PATCH_PARTLY)
    fork.ok("export")
    (name,) = fork.series()
    target_cfg = DEFAULTS_CFG.replace("workers = 4", "workers = 8")
    digest = target_with(fork, target_cfg)

    result = dry_run(fork, "--sha256", digest)

    assert result.rc == 0, result.text
    (patch,) = load_report(fork)["patches"]
    assert patch["outcome"] == "applies with 3-way"
    details = " ".join(patch["details"])
    assert "partly absorbed: 2.0 already has demo/defaults.cfg @@ -1,7 +1,7 @@" in (
        details
    )
    assert patch["carry"] == f"{WORK}/report-carry/{name}"
    carry = (fork.root / patch["carry"]).read_text()
    assert "+eviction = lfu" in carry and "+workers = 8" not in carry
    assert f"Subject: {PATCH_PARTLY}" in carry
    # It is a patch for the target: git am takes it with its message.
    target = tmp_path / "target"
    for path, content in {**BASE_FILES, "demo/defaults.cfg": target_cfg}.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        data = content if isinstance(content, bytes) else content.encode()
        (target / path).write_bytes(data)
    git(target, "init", "-q")
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "2.0")
    git(target, "am", "--keep", str(fork.root / patch["carry"]))
    assert git(target, "log", "-1", "--format=%s") == PATCH_PARTLY + "\n"
    assert (target / "demo/defaults.cfg").read_text() == target_cfg.replace(
        "eviction = lru", "eviction = lfu"
    )

    # The move carries the same: the exported patch holds what remains only.
    result = fork.run("rebase", "--onto", TARGET, "--sha256", digest)
    assert result.rc == 0, result.text
    assert "partly absorbed" in result.out
    text = fork.patch_text(0)
    assert "+eviction = lfu" in text and "workers = 8" not in text.split("---")[-1]


def test_accepted_trailer_without_the_content_keeps_the_patch(fork):
    fork.ok("sync")
    fork.replace("demo/defaults.cfg", "queue_size = 128", "queue_size = 256")
    fork.commit(
        PATCH_CLAIMED,
        trailers=(
            "Origin: upstream, https://github.com/vllm-project/vllm/pull/888",
            SIGNED_OFF,
            f"Upstream-Status: Accepted {TARGET}",
        ),
    )
    fork.ok("export")
    (name,) = fork.series()
    digest = target_with(
        fork, DEFAULTS_CFG.replace("eviction = lru", "eviction = fifo")
    )

    result = dry_run(fork, "--sha256", digest)

    assert result.rc == 0, result.text
    (patch,) = load_report(fork)["patches"]
    assert patch["outcome"] == "applies"
    claim = "Upstream-Status says Accepted 2.0, but 2.0 lacks 1 of 1 of its hunks: kept"
    assert any(d.startswith(claim) for d in patch["details"]), patch["details"]

    # The move keeps it too, and check then asks for the trailer to be fixed.
    result = fork.run("rebase", "--onto", TARGET, "--sha256", digest)
    assert result.rc == 1, result.text
    assert claim in result.out
    assert fork.series() == [name]
    assert "+queue_size = 256" in fork.patch_text(0)
    assert "correct the trailer" in result.out


def test_hunks_of_a_new_file_count_only_with_its_content(fork):
    """A file the patch creates is absorbed when the target has it, as it is."""
    fork.ok("sync")
    fork.write("docs/fork.md", FORK_MD)
    fork.commit(PATCH_DOCS)
    fork.ok("export")
    files = {**BASE_FILES, "docs/fork.md": FORK_MD + "More.\n"}
    sdist = make_sdist(fork.downloads / TARGET_SDIST, files, top="demo-2.0")
    assert dry_run(fork, "--sha256", sha256(sdist)).rc == 2
    assert load_report(fork)["patches"][0]["outcome"] == "conflicts"

    files["docs/fork.md"] = FORK_MD
    sdist = make_sdist(fork.downloads / TARGET_SDIST, files, top="demo-2.0")
    assert dry_run(fork, "--sha256", sha256(sdist)).rc == 0
    assert load_report(fork)["patches"][0]["outcome"] == "absorbed"


def test_trial_reports_a_changed_ci_file_the_target_lacks(tmp_path):
    """A CI file the patch changes but the target moved (a conflict left it
    out of the trial) is reported, and the files that exist are still read."""
    from types import SimpleNamespace

    from forkctl.trial import Checker

    (tmp_path / ".buildkite").mkdir()
    (tmp_path / ".buildkite" / "kept.yaml").write_text("pytest -v tests/test_gone.py\n")
    checker = Checker.__new__(Checker)
    checker.tree = tmp_path
    patch = SimpleNamespace(
        files=[
            SimpleNamespace(new_path=".buildkite/moved.yaml"),
            SimpleNamespace(new_path=".buildkite/kept.yaml"),
        ]
    )
    assert checker.missing_test_files(patch) == [
        ".buildkite/moved.yaml, which the patch changes, is not in the tree",
        ".buildkite/kept.yaml names tests/test_gone.py, which does not exist",
    ]
