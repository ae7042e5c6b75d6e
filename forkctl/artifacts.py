"""Fetch pinned artifacts through the package index pip is configured for.

No registry host is named here: the index URLs come from pip's own
configuration (``pip config list``, which includes PIP_* variables), and
without one, from pip's built-in default. Every file, fresh or cached, is
checked against its pinned sha256 before it is handed out.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from .config import Artifact, Fork
from .errors import ForkError

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ForkError(
            f"sha256 mismatch for {path.name} ({path}):\n"
            f"  expected {expected}\n"
            f"  actual   {actual}\n"
            "The file is not the pinned artifact. Delete it to fetch it again, "
            "or fix the pin in fork.toml if the change is intended."
        )


def _pip_config() -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
    )
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("'\"")
    return values


def _pick(config: dict[str, str], option: str) -> str | None:
    # pip's precedence: environment, then site, user and global files.
    for scope in (":env:", "site", "user", "global"):
        if (value := config.get(f"{scope}.{option}")) is not None:
            return value
    return None


def index_urls(config: dict[str, str]) -> list[str]:
    primary = _pick(config, "index-url")
    if primary is None:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from pip._internal.models.index import PyPI; print(PyPI.simple_url)",
            ],
            capture_output=True,
            text=True,
        )
        primary = proc.stdout.strip() or None
    urls = [primary] if primary else []
    extra = _pick(config, "extra-index-url")
    if extra:
        urls.extend(shlex.split(extra))
    if not urls:
        raise ForkError("pip has no package index configured; set PIP_INDEX_URL")
    return urls


def _ssl_context(config: dict[str, str]) -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or _pick(config, "cert")
    return ssl.create_default_context(cafile=cafile or None)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _open(url: str, context: ssl.SSLContext, timeout: float = 120):
    if url.startswith("file:") and url.endswith("/"):
        url += "index.html"
    return urllib.request.urlopen(url, timeout=timeout, context=context)


def _normalize(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def find_link(artifact: Artifact, config: dict[str, str]) -> tuple[str, str | None]:
    """The artifact's URL on the first index that lists it, and the sha256 that
    index publishes for it (the link's ``#sha256=`` fragment), if it does."""
    context = _ssl_context(config)
    tried = []
    for index in index_urls(config):
        page = f"{index.rstrip('/')}/{_normalize(artifact.project)}/"
        try:
            with _open(page, context) as response:
                html = response.read().decode("utf-8", "replace")
        except OSError as e:
            tried.append(f"{page}: {e}")
            continue
        parser = _Links()
        parser.feed(html)
        for href in parser.hrefs:
            url = urllib.parse.urljoin(page, href)
            name = urllib.parse.unquote(
                urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]
            )
            if name == artifact.filename:
                fragment = urllib.parse.urlsplit(url).fragment
                algo, _, digest = fragment.partition("=")
                published = digest.lower() if algo == "sha256" and digest else None
                return url.split("#", 1)[0], published
        tried.append(f"{page}: no file named {artifact.filename}")
    raise ForkError(
        f"{artifact.filename} not found on any configured index:\n  "
        + "\n  ".join(tried)
    )


def find_url(artifact: Artifact, config: dict[str, str]) -> str:
    return find_link(artifact, config)[0]


def published_sha256(artifact: Artifact) -> str:
    """The sha256 the configured index publishes for an artifact not pinned yet."""
    _, digest = find_link(artifact, _pip_config())
    if not digest or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ForkError(
            f"the index publishes no sha256 for {artifact.filename}: "
            "pin one (fork.toml [rebase.sdist] or --sha256)"
        )
    return digest


def fetch(fork: Fork, artifact: Artifact) -> Path:
    """Return the verified local copy of an artifact, downloading it if needed."""
    dest_dir = fork.cache_dir / "downloads"
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / artifact.filename
    if dest.exists():
        verify(dest, artifact.sha256)
        return dest
    config = _pip_config()
    url = find_url(artifact, config)
    part = dest.with_name(dest.name + ".part")
    print(f"fetching {artifact.filename}", file=sys.stderr)
    digest = hashlib.sha256()
    with (
        _open(url, _ssl_context(config), timeout=600) as response,
        part.open("wb") as f,
    ):
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            f.write(chunk)
    if digest.hexdigest() != artifact.sha256:
        part.unlink()
        raise ForkError(
            f"sha256 mismatch for {artifact.filename} downloaded from the index:\n"
            f"  expected {artifact.sha256}\n"
            f"  actual   {digest.hexdigest()}\n"
            "The download was discarded."
        )
    part.rename(dest)
    return dest
