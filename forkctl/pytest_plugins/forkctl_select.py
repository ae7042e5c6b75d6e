"""pytest plugin of `forkctl test`: of the modules named in FORKCTL_TESTS (one
node id a line), keep only the tests named there.

The series adds tests to modules the base already has; pytest is given those
modules and this plugin deselects the rest of them. Given the node ids
instead, pytest fails with "found no collectors" where such a module skips
itself at import (an upstream module that needs AMX, on a CPU without it);
this way that module reports its skip.
"""

from __future__ import annotations

import os


def pytest_collection_modifyitems(config, items) -> None:
    wanted = {line for line in os.environ.get("FORKCTL_TESTS", "").splitlines() if line}
    if not wanted:
        return
    modules = {node_id.split("::", 1)[0] for node_id in wanted}
    keep, drop = [], []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        test = item.nodeid.split("[", 1)[0]  # without its parameters
        (drop if module in modules and test not in wanted else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
