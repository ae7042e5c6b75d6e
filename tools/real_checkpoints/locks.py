"""Lock files (every package ``==`` pinned, with sha256 hashes) and the
tool venvs installed from them.

A lock file is a pip requirements file that ``pip install
--require-hashes -r`` accepts: one requirement per logical line
(backslash continuations allowed), ``name==version`` followed by one or
more ``--hash=sha256:...``; comments and blank lines are allowed, other
options are not.  ``parse_lock`` enforces this so a lock that pip would
half-accept (an unpinned or unhashed line) fails before any install.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCKS = HERE / "locks"
TORCH_VERSION = "2.13.0"

_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")


class LockError(ValueError):
    pass


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]

    def line(self) -> str:
        hashes = " ".join(f"--hash=sha256:{h}" for h in self.hashes)
        return f"{self.name}=={self.version} {hashes}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, where: str = "lock") -> list[Pin]:
    """The pins of a lock file; LockError on anything not pinned and hashed."""
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not pending:
            start = no
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            logical.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        raise LockError(f"{where}:{start}: continuation at end of file")
    pins: list[Pin] = []
    seen: set[str] = set()
    for no, line in logical:
        words = line.split()
        m = _REQ.match(words[0])
        if not m:
            raise LockError(f"{where}:{no}: not a name==version pin: {words[0]!r}")
        hashes = []
        for w in words[1:]:
            h = _HASH.match(w)
            if not h:
                raise LockError(f"{where}:{no}: unexpected {w!r} (only --hash=sha256:)")
            hashes.append(h.group(1))
        if not hashes:
            raise LockError(f"{where}:{no}: {words[0]} has no --hash=sha256:")
        name = normalize(m.group(1))
        if name in seen:
            raise LockError(f"{where}:{no}: {name} pinned twice")
        seen.add(name)
        pins.append(Pin(name, m.group(3), tuple(hashes)))
    return pins


def lock_path(tool: str) -> Path:
    return LOCKS / f"{tool}.txt"


def read_lock(tool: str) -> list[Pin]:
    path = lock_path(tool)
    return parse_lock(path.read_text(), str(path))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def lock_from_report(report: dict, header: str) -> str:
    """A lock file from ``pip install --report`` (one resolved install).

    Hashes are those pip reports for what it downloaded; for files it took
    from a local directory (torch's CPU wheel) it reports none, so the file
    is hashed here.
    """
    pins: list[Pin] = []
    for item in report["install"]:
        meta, info = item["metadata"], item["download_info"]
        url = info["url"]
        hashes = dict(info.get("archive_info", {}).get("hashes", {}))
        digest = hashes.get("sha256")
        if digest is None:
            parsed = urllib.parse.urlparse(url)
            if parsed.scheme != "file":
                raise LockError(f"{meta['name']}: no sha256 in the report for {url}")
            digest = file_sha256(Path(urllib.request.url2pathname(parsed.path)))
        # A local version label (torch's "+cpu") stays out of the pin: pip
        # matches "==2.13.0" against 2.13.0+cpu, and the hash fixes the file.
        version = meta["version"].split("+", 1)[0]
        pins.append(Pin(normalize(meta["name"]), version, (digest,)))
    pins.sort(key=lambda p: p.name)
    body = "\n".join(p.line() for p in pins)
    return f"{header.rstrip()}\n{body}\n"


def lock_digest(tool: str) -> str:
    return hashlib.sha256(lock_path(tool).read_bytes()).hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(tool: str, venv: Path, log=print) -> Path:
    """The venv of ``tool`` at ``venv``, (re)built from its lock when the
    lock changed; returns its python.

    torch goes in first and alone (its pin and hash from the lock), so pip
    takes the CPU wheel on this machine's disk and nothing can swap it for a
    CUDA build (``--no-deps``: its dependencies are in the lock); then the
    whole lock with ``--require-hashes``.
    """
    digest = lock_digest(tool)
    stamp = venv / ".lock-sha256"
    if stamp.exists() and stamp.read_text().strip() == digest:
        return venv_python(venv)
    pins = read_lock(tool)
    torch = [p for p in pins if p.name == "torch"]
    if [p.version for p in torch] != [TORCH_VERSION]:
        raise LockError(f"{lock_path(tool)}: torch must be pinned =={TORCH_VERSION}")
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    py = str(venv_python(venv))
    pip = [py, "-m", "pip", "install", "--require-hashes", "--no-input"]
    torch_req = venv / ".torch-req.txt"
    torch_req.write_text(torch[0].line() + "\n")
    # torch alone (its dependencies come with the lock below).
    subprocess.run([*pip, "--no-deps", "-r", str(torch_req)], check=True)
    subprocess.run([*pip, "-r", str(lock_path(tool))], check=True)
    subprocess.run([py, "-m", "pip", "check"], check=True)
    seconds = time.monotonic() - t0
    (venv / ".install.json").write_text(
        json.dumps({"tool": tool, "seconds": round(seconds, 1)}) + "\n"
    )
    stamp.write_text(digest + "\n")
    log(f"{tool}: venv {venv} installed in {seconds:.0f} s")
    return venv_python(venv)


def resolve_lock(tool: str, requirement: str, log=print) -> str:
    """Resolve ``torch==TORCH_VERSION`` + ``requirement`` with pip (a dry
    run in a throwaway venv: nothing is installed) and return the lock file
    text.  torch is held at TORCH_VERSION by a constraint, so the resolver
    cannot move it (or pull a CUDA build) for the tool's sake."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"lock-{tool}-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run(
            ["python3", "-m", "venv", "--without-pip", str(venv)], check=True
        )
        constraint = Path(tmp) / "constraints.txt"
        constraint.write_text(f"torch=={TORCH_VERSION}\n")
        report = Path(tmp) / "report.json"
        env = dict(os.environ)
        env["PIP_CONSTRAINT"] = " ".join(
            filter(None, [env.get("PIP_CONSTRAINT", ""), str(constraint)])
        )
        # The venv has no pip of its own; run the caller's pip against it.
        subprocess.run(
            [
                "python3",
                "-m",
                "pip",
                "--python",
                str(venv_python(venv)),
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                f"torch=={TORCH_VERSION}",
                requirement,
            ],
            check=True,
            env=env,
        )
        header = (
            f"# Lock of {requirement} (+ torch=={TORCH_VERSION}, the CPU build).\n"
            "# Written by `python tools/real_checkpoints lock "
            f"{tool}`; install with pip install --require-hashes -r."
        )
        return lock_from_report(json.loads(report.read_text()), header)
