"""The pins in fork.toml and the places the tool reads and writes."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ForkError


@dataclass(frozen=True)
class Artifact:
    project: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Fork:
    root: Path
    version: str
    sdist: Artifact
    wheels: dict[str, Artifact]
    torch_version: str
    tools: dict[str, str]
    # Upstream's CI lock file, whose versions fork.toml's [constraints] hold.
    ci_lock: str = "requirements/test.txt"
    ci_lock_pins: tuple[str, ...] = ()
    test_requirements: tuple[str, ...] = ()
    # `test` runs the whole of each test file the series changes ("files"), or,
    # in files the base already has, only the test functions whose lines the
    # series adds or changes ("added").
    test_scope: str = "files"
    build_outputs: tuple[str, ...] = ()
    # sha256 of upstream sdists `rebase --onto` targets, by version.
    rebase_pins: dict[str, str] = field(default_factory=dict)
    # The targets' wheel sha256 by wheel name and version, and torch by version,
    # for the pins a finished rebase moves.
    rebase_wheels: dict[str, dict[str, str]] = field(default_factory=dict)
    rebase_torch: dict[str, str] = field(default_factory=dict)

    @property
    def project(self) -> str:
        return self.sdist.project

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches_dir / "series"

    @property
    def tree_dir(self) -> Path:
        return Path(os.environ.get("FORK_TREE", self.root / "tree"))

    @property
    def venv_dir(self) -> Path:
        return Path(os.environ.get("FORK_VENV", self.root / ".venv"))

    @property
    def cache_dir(self) -> Path:
        """Downloads live outside the repository so a fresh clone reuses them."""
        if explicit := os.environ.get("FORK_CACHE"):
            return Path(explicit)
        xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(xdg) / "vllm-fork"


def _test_scope(scope: str) -> str:
    if scope not in ("files", "added"):
        raise ForkError(
            f"fork.toml: [test] scope must be 'files' or 'added', not {scope!r}"
        )
    return scope


def _artifact(table: dict, where: str) -> Artifact:
    try:
        return Artifact(table["project"], table["filename"], table["sha256"].lower())
    except KeyError as e:
        raise ForkError(f"fork.toml: [{where}] lacks {e.args[0]!r}") from None


LINES_DIR = "lines"


def lines(root: Path) -> list[str]:
    """The maintained lines besides the main one: folders of lines/ with a fork.toml."""
    found = (root / LINES_DIR).glob("*/fork.toml")
    return sorted((p.parent.name for p in found), key=_version_key)


def _version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+-]", version))


def load(root: Path | None = None, line: str | None = None) -> Fork:
    """The main line (fork.toml and patches/ at the root), or with ``line`` the
    line kept in lines/LINE/, which has its own fork.toml, patches/, tree and venv."""
    root = Path(root or os.environ.get("FORK_ROOT") or Path.cwd()).resolve()
    if line is not None:
        if not (root / LINES_DIR / line / "fork.toml").is_file():
            known = ", ".join(lines(root)) or "none"
            raise ForkError(f"no line {line!r} in {root / LINES_DIR} (lines: {known})")
        root = root / LINES_DIR / line
    path = root / "fork.toml"
    if not path.is_file():
        raise ForkError(f"{path} not found: run forkctl from the repository root")
    with path.open("rb") as f:
        data = tomllib.load(f)
    upstream = data["upstream"]
    return Fork(
        root=root,
        version=upstream["version"],
        sdist=_artifact(upstream["sdist"], "upstream.sdist"),
        wheels={
            name: _artifact(t, f"wheels.{name}") for name, t in data["wheels"].items()
        },
        torch_version=data["torch"]["version"],
        tools=dict(data.get("tools", {})),
        ci_lock=data.get("constraints", {}).get("ci_lock", "requirements/test.txt"),
        ci_lock_pins=tuple(data.get("constraints", {}).get("from_ci_lock", ())),
        test_requirements=tuple(data.get("test", {}).get("from_ci_lock", ())),
        test_scope=_test_scope(data.get("test", {}).get("scope", "files")),
        build_outputs=tuple(upstream.get("build_outputs", ())),
        rebase_pins={
            str(version): str(digest).lower()
            for version, digest in data.get("rebase", {}).get("sdist", {}).items()
        },
        rebase_wheels={
            str(name): {str(v): str(d).lower() for v, d in pins.items()}
            for name, pins in data.get("rebase", {}).get("wheels", {}).items()
        },
        rebase_torch={
            str(v): str(t) for v, t in data.get("rebase", {}).get("torch", {}).items()
        },
    )
