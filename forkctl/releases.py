"""Upstream's releases, as the package index pip is configured for lists them.

The project's page of each configured index is read through the simple API
(JSON where the index serves it, else the HTML page), and the versions taken
from its ``versions`` key or its file names. Releases are final versions only
(no pre-, dev or local versions).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request

from . import artifacts
from .errors import ForkError

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
RELEASE = re.compile(r"^\d+(?:\.\d+)*(?:\.post\d+)?$")
SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tgz")


class NoIndex(ForkError):
    """No configured index could be read."""


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def is_release(version: str) -> bool:
    return bool(RELEASE.match(version))


def version_of(filename: str, project: str) -> str | None:
    """The version in an sdist's or wheel's file name, if it is the project's."""
    name = urllib.parse.unquote(filename)
    if name.endswith(".whl"):
        parts = name[: -len(".whl")].split("-")
        stem, version = parts[0], parts[1] if len(parts) > 1 else ""
    else:
        suffix = next((s for s in SDIST_SUFFIXES if name.endswith(s)), None)
        if suffix is None or "-" not in name:
            return None
        stem, _, version = name[: -len(suffix)].rpartition("-")
    if artifacts._normalize(stem) != artifacts._normalize(project):
        return None
    return version or None


def versions_in(body: str, project: str) -> set[str]:
    """The versions an index page (JSON or HTML) lists for the project."""
    if body.lstrip().startswith("{"):
        data = json.loads(body)
        if data.get("versions"):
            return {str(v) for v in data["versions"]}
        names = [f.get("filename", "") for f in data.get("files", [])]
    else:
        parser = artifacts._Links()
        parser.feed(body)
        names = [
            urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1] for href in parser.hrefs
        ]
    return {v for n in names if (v := version_of(n, project))}


def index_versions(project: str, timeout: float = 20) -> list[str]:
    """The project's releases on the configured indexes, oldest first."""
    config = artifacts._pip_config()
    context = artifacts._ssl_context(config)
    found: set[str] = set()
    errors = []
    reached = False
    for index in artifacts.index_urls(config):
        page = f"{index.rstrip('/')}/{artifacts._normalize(project)}/"
        url = page + "index.html" if page.startswith("file:") else page
        request = urllib.request.Request(url, headers={"Accept": ACCEPT})
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=context
            ) as response:
                body = response.read().decode("utf-8", "replace")
        except (OSError, ValueError) as e:
            errors.append(f"{page}: {e}")
            continue
        reached = True
        found |= versions_in(body, project)
    if not reached:
        raise NoIndex("; ".join(errors) or "no index configured")
    return sorted((v for v in found if is_release(v)), key=release_key)
