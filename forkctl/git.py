"""git, run with no user or system configuration so that output is the same everywhere."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .errors import ForkError

BASE_IDENTITY = {
    "GIT_AUTHOR_NAME": "vLLM fork",
    "GIT_AUTHOR_EMAIL": "fork@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "vLLM fork",
    "GIT_COMMITTER_EMAIL": "fork@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        LC_ALL="C",
        TZ="UTC",
    )
    env.update(extra)
    return env


def git(
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=env or clean_env(),
        input=input,
        text=True,
        capture_output=True,
    )
    if check and proc.returncode != 0:
        raise ForkError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stderr.strip()}")
    return proc


def out(cwd: Path, *args: str) -> str:
    return git(cwd, *args).stdout.strip()
