"""End-to-end tests: the fork's `vllm serve` on tiny checkpoints, on CPU.

Run with the fork's venv (``make test`` does)::

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/e2e

``tools/`` is put on sys.path so the tests use the ``tiny_checkpoint`` package
(the checkpoints) and ``serve_demo.running_server`` (start / wait / always stop)
directly; ``e2e_lib`` holds the shared helpers.  Checkpoints are generated
once into the cache under ``build/e2e/models`` and reused while valid; server
logs go to ``build/e2e/logs``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parents[1] / "tools"
# Appended, not prepended: nothing here may shadow tests/conftest.py.
for p in (TOOLS, HERE):
    if str(p) not in sys.path:
        sys.path.append(str(p))

import e2e_lib  # noqa: E402


class CheckpointCache:
    """Session view of the on-disk cache (build/e2e/models)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._schemes: dict[str, e2e_lib.Checkpoint] = {}

    def scheme(self, name: str) -> e2e_lib.Checkpoint:
        if name not in self._schemes:
            self._schemes[name] = e2e_lib.ensure_scheme(name, self.root)
        return self._schemes[name]

    def derive(
        self, name: str, base: Path, mutate, description: str, base_key=None
    ) -> Path:
        return e2e_lib.derive_checkpoint(
            name, base, mutate, description, self.root, base_key
        )


@pytest.fixture(scope="session")
def checkpoints() -> CheckpointCache:
    return CheckpointCache(e2e_lib.MODEL_CACHE)
