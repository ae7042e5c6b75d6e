"""A tiny synthetic fork for forkctl's own tests.

Nothing here touches the network or the real repository. The "upstream" is a
handful of small files packed as ``demo-1.0.tar.gz`` with one top-level
folder, like an sdist; fork.toml pins its real sha256 and the tarball is put
straight into ``$FORK_CACHE/downloads``. forkctl runs in-process through
``forkctl.__main__.main`` with FORK_ROOT, FORK_TREE, FORK_CACHE and FORK_VENV
pointing into tmp_path.

The standard series (fixture ``series_fork``) has three patches:

1. PATCH_RETRIES changes ``demo/defaults.cfg``;
2. PATCH_DOCS adds the new file ``docs/fork.md``;
3. PATCH_BACKOFF changes ``demo/defaults.cfg`` again, with context that
   includes the line patch 1 changed (so it only applies after it).

The patches touch no Python file, so `check` needs no ruff for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from forkctl.__main__ import main  # noqa: E402

PROJECT = "demo"
VERSION = "1.0"
SDIST = f"{PROJECT}-{VERSION}.tar.gz"

DEFAULTS_CFG = """\
# Defaults for the demo engine.
[engine]
name = demo
workers = 4
max_retries = 3
queue_size = 128
log_level = info
batch_size = 16
timeout = 30
prefetch = 2
shutdown_grace = 5

[cache]
enabled = true
size_mb = 512
eviction = lru
"""

BASE_FILES = {
    "PKG-INFO": f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {VERSION}\n",
    "pyproject.toml": f"""\
[project]
name = "{PROJECT}"
version = "{VERSION}"
requires-python = ">=3.9"

[tool.ruff]
line-length = 88

[tool.ruff.lint]
select = ["E", "F", "I"]
""",
    "README.md": "# demo\n\nA tiny engine that stands in for upstream in forkctl's tests.\n",
    "demo/__init__.py": '"""The demo engine."""\n\n__version__ = "1.0"\n',
    "demo/engine.py": '''\
"""Runs jobs with the settings from defaults.cfg."""

import configparser
from pathlib import Path


def load_settings() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(Path(__file__).with_name("defaults.cfg"))
    return parser
''',
    "demo/defaults.cfg": DEFAULTS_CFG,
    "docs/usage.md": "# Usage\n\nRun `demo` with a config file.\n",
    # Binary: a patch to it is a "GIT binary patch", with no lines to check.
    "docs/logo.bin": bytes(range(256)) * 4,
}

AUTHOR = "Zoë Developer <zoe@example.com>"
SIGNED_OFF = f"Signed-off-by: {AUTHOR}"
PENDING = "Upstream-Status: Pending"
SUBMITTED = "Upstream-Status: Submitted https://github.com/vllm-project/vllm/pull/12345"
BODY = (
    "The engine gives up too early on flaky remote workers. This makes the\n"
    "behaviour configurable so that deployments can tune it without patching."
)

PATCH_RETRIES = "[Core] Make the retry limit large enough for remote workers"
PATCH_DOCS = "[Docs] Describe the configuration knobs the fork changes"
# Longer than a mail header line: format-patch folds it, status must unfold it.
PATCH_BACKOFF = (
    "[Core] Add a retry backoff and raise the default timeout for slow remote workers"
)
FORK_MD = "# The fork\n\nThe fork raises `max_retries` and adds `retry_backoff`.\n"

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Zoë Developer",
    "GIT_AUTHOR_EMAIL": "zoe@example.com",
    "GIT_AUTHOR_DATE": "2025-03-04T05:06:07+0100",
    "GIT_COMMITTER_NAME": "Zoë Developer",
    "GIT_COMMITTER_EMAIL": "zoe@example.com",
    "GIT_COMMITTER_DATE": "2025-03-04T05:06:07+0100",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_sdist(
    dest: Path, files: dict[str, str | bytes], top: str = f"{PROJECT}-{VERSION}"
) -> Path:
    """Pack files as dest (a .tar.gz) under the single folder `top`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        dirs = {top}
        for name in sorted(files):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join([top, *parts[:i]]))
        for name in sorted(dirs):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, text in sorted(files.items()):
            data = text if isinstance(text, bytes) else text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return dest


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C.UTF-8")
    env.update(GIT_IDENTITY)
    return env


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@dataclass
class SyntheticFork:
    root: Path
    tree: Path
    cache: Path
    venv: Path

    @property
    def downloads(self) -> Path:
        return self.cache / "downloads"

    @property
    def sdist(self) -> Path:
        return self.downloads / SDIST

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    # -- the base -----------------------------------------------------------

    def pin(self, files: dict[str, str | bytes] | None = None) -> str:
        """Pack `files` (default BASE_FILES) as the cached sdist; pin it in fork.toml."""
        make_sdist(self.sdist, BASE_FILES if files is None else files)
        digest = sha256(self.sdist)
        dummy = self.root / "dummy.whl"
        dummy.write_bytes(b"not a wheel")
        wheel_sha = sha256(dummy)
        (self.root / "fork.toml").write_text(
            f"""\
[upstream]
project = "{PROJECT}"
version = "{VERSION}"

[upstream.sdist]
project = "{PROJECT}"
filename = "{SDIST}"
sha256 = "{digest}"

[wheels.cpu]
project = "{PROJECT}"
filename = "{PROJECT}-{VERSION}-py3-none-any.whl"
sha256 = "{wheel_sha}"

[torch]
version = "0.0-test"

[tools]
ruff = "0.14.0"
"""
        )
        return digest

    def rebase_onto(self, **changed: str | bytes) -> None:
        """A new upstream: BASE_FILES with some files replaced, repinned."""
        self.pin({**BASE_FILES, **changed})

    # -- running forkctl ----------------------------------------------------

    def run(self, *argv: str) -> Result:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(argv))
        return Result(rc, out.getvalue(), err.getvalue())

    def ok(self, *argv: str) -> Result:
        result = self.run(*argv)
        assert result.rc == 0, f"forkctl {' '.join(argv)} failed:\n{result.text}"
        return result

    # -- making patches -----------------------------------------------------

    def write(self, path: str, content: str | bytes) -> None:
        target = self.tree / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)

    def replace(self, path: str, old: str, new: str) -> None:
        target = self.tree / path
        text = target.read_text()
        assert old in text, f"{old!r} not in {path}"
        target.write_text(text.replace(old, new, 1))

    def commit(
        self,
        subject: str,
        body: str = BODY,
        trailers: tuple[str, ...] = (SIGNED_OFF, PENDING),
    ) -> None:
        """Commit everything changed in the tree, PR style."""
        message = subject + "\n\n" + body
        if trailers:
            message += "\n\n" + "\n".join(trailers)
        git(self.tree, "add", "-A")
        git(self.tree, "commit", "-q", "--no-verify", "-m", message)

    # -- looking at the result ----------------------------------------------

    def series(self) -> list[str]:
        lines = (self.patches / "series").read_text().splitlines()
        return [line for line in lines if line and not line.startswith("#")]

    def patch_text(self, index: int) -> str:
        return (self.patches / self.series()[index]).read_text()

    def snapshot(self) -> dict[str, bytes]:
        """Every file in patches/, by name, as bytes."""
        return {p.name: p.read_bytes() for p in sorted(self.patches.iterdir())}

    def log(self) -> list[str]:
        """Subjects of the tree's commits after the base, oldest first."""
        out = git(self.tree, "log", "--reverse", "--format=%s", "base..HEAD")
        return out.splitlines()

    def unpack_base(self, dest: Path) -> Path:
        """The pinned base, unpacked (as check sees it) for cross-checks."""
        with tarfile.open(self.sdist) as tar:
            tar.extractall(dest, filter="data")
        return dest / f"{PROJECT}-{VERSION}"


@pytest.fixture
def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SyntheticFork:
    """A fork repository pinned to the synthetic base, with an empty series."""
    root = tmp_path / "repo"
    (root / "patches").mkdir(parents=True)
    f = SyntheticFork(
        root=root,
        tree=tmp_path / "tree",
        cache=tmp_path / "cache",
        venv=tmp_path / "venv",  # no ruff in it unless a test puts one there
    )
    f.pin()
    monkeypatch.chdir(root)
    monkeypatch.setenv("FORK_ROOT", str(root))
    monkeypatch.setenv("FORK_TREE", str(f.tree))
    monkeypatch.setenv("FORK_CACHE", str(f.cache))
    monkeypatch.setenv("FORK_VENV", str(f.venv))
    # Should anything try to download, it finds an empty local index, not the network.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri() + "/")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return f


def commit_backoff_patch(fork: SyntheticFork) -> None:
    """The third standard patch; it edits lines the first patch changed."""
    fork.replace(
        "demo/defaults.cfg",
        "max_retries = 5\n",
        "max_retries = 5\nretry_backoff = 0.5\n",
    )
    fork.replace("demo/defaults.cfg", "timeout = 30", "timeout = 60")
    fork.commit(PATCH_BACKOFF)


@pytest.fixture
def series_fork(fork: SyntheticFork) -> SyntheticFork:
    """The synthetic fork with the standard three-patch series exported and synced."""
    fork.ok("sync")
    fork.replace("demo/defaults.cfg", "max_retries = 3", "max_retries = 5")
    fork.commit(PATCH_RETRIES)
    fork.write("docs/fork.md", FORK_MD)
    fork.commit(
        PATCH_DOCS,
        body="Users of the fork need to know which defaults differ from upstream\n"
        "and why, so this adds a short page next to the usage guide.",
        trailers=(SIGNED_OFF, SUBMITTED),
    )
    commit_backoff_patch(fork)
    fork.ok("export")
    assert len(fork.series()) == 3
    return fork


def find_ruff() -> str | None:
    """A ruff binary for the ruff test: on PATH, or in the repository's venv."""
    venv_ruff = REPO / ".venv" / "bin" / "ruff"
    return shutil.which("ruff") or (str(venv_ruff) if venv_ruff.is_file() else None)
