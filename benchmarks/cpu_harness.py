# SPDX-License-Identifier: Apache-2.0
"""What the CPU benchmark scripts share.

* ``cap_onednn_isa()``: with ``VLLM_CPU_X86_KERNELS=avx512`` or ``avx2`` the
  fork's kernels run as on a CPU without AMX, but bf16's dense layers (oneDNN,
  ``onednn_mm``) would still find AMX on an AMX machine and make bf16 look
  faster than it is on the CPUs those libraries are for. The cap sets
  oneDNN's ``ONEDNN_MAX_CPU_ISA`` to the library's ISA (AVX512_CORE_BF16,
  AVX2) unless it is set already; call it before oneDNN's first use (before
  starting a server, or at the top of an in-process benchmark).
* ``last_level_cache_bytes()`` and ``median_seconds()``: timing with the
  last-level cache evicted before each call, as a served model's layers do not
  fit in cache together, and the kernels of one table row called in turns;
  optionally with the code warmed again after the eviction (``rewarm``).
* ``describe_run()``, ``print_table_head()``, ``print_table_row()``: the
  machine line and the table of times and ratios to bf16 every script prints.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ONEDNN_ISA = {"avx512": "AVX512_CORE_BF16", "avx2": "AVX2"}


def cap_onednn_isa() -> str | None:
    """Cap oneDNN at the x86 kernel library's ISA; returns the cap in force."""
    cap = ONEDNN_ISA.get(os.environ.get("VLLM_CPU_X86_KERNELS", ""))
    if cap is not None:
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", cap)
    return os.environ.get("ONEDNN_MAX_CPU_ISA")


def last_level_cache_bytes() -> int:
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text.rstrip("KMG")) * units.get(text[-1], 1))
    return max(sizes, default=64 << 20)


def eviction_buffer(warm_cache: bool):
    """A buffer twice the last-level cache, or None with ``warm_cache``."""
    import torch

    if warm_cache:
        return None
    return torch.zeros(2 * last_level_cache_bytes() // 4, dtype=torch.int32)


def median_seconds(
    runs: dict[str, Callable[..., object]],
    inputs: Iterator[tuple],
    seconds: float,
    evict=None,
    rewarm: Callable[..., tuple | None] | None = None,
) -> dict[str, float]:
    """Median time of each ``runs[name](*args)``, the runs called in turns
    (one call each per round) for ``seconds`` per run (at least 5 rounds, after
    3 warm-up calls each), so that a drift of the machine (other tenants'
    memory traffic, clocks) reaches every run alike. Each call takes the next
    ``inputs`` and, when ``evict`` is given, the last-level cache is evicted
    first (not timed).

    The eviction also takes the code's, the interpreter's and the op
    dispatcher's state out of cache, which a served model's layer finds in
    cache (the layers before it ran the same code a moment earlier).
    ``rewarm(*args)``, when given, returns arguments for the same run that
    reach none of the weights ``args`` reach (or None when there are none):
    the run is called on them after the eviction, not timed, so that the timed
    call finds its weights in memory and the rest in cache."""
    for run in runs.values():
        for _ in range(3):
            run(*next(inputs))
    times: dict[str, list[float]] = {name: [] for name in runs}
    deadline = time.perf_counter() + seconds * len(runs)
    rounds = 0
    while time.perf_counter() < deadline or rounds < 5:
        for name, run in runs.items():
            args = next(inputs)
            if evict is not None:
                evict.add_(1)
                other = rewarm(*args) if rewarm is not None else None
                if other is not None:
                    run(*other)
            start = time.perf_counter()
            run(*args)
            times[name].append(time.perf_counter() - start)
        rounds += 1
    return {name: statistics.median(t) for name, t in times.items()}


def describe_run(what: str, warm_cache: bool, rewarm: bool = False) -> str:
    """One line: what is timed, threads, kernel library, oneDNN cap, cache."""
    import torch

    from vllm.platforms import current_platform

    library = getattr(current_platform, "x86_kernel_library", None)
    return (
        f"{what}, {torch.get_num_threads()} threads, kernel library {library}, "
        f"oneDNN ISA cap {os.environ.get('ONEDNN_MAX_CPU_ISA')}, "
        f"{'warm' if warm_cache else 'cold'} cache"
        f"{', code warmed again after each eviction' if rewarm and not warm_cache else ''}"
    )


def print_table_head(names: list[str]) -> None:
    print(f"{'M':>5} " + " ".join(f"{name + ' ms':>22}" for name in names))


def print_table_row(tokens: int, times: dict[str, float]) -> None:
    """Each kernel's time and bf16's time over it (times["bf16"] first)."""
    cells = [f"{t * 1e3:>10.3f} ({times['bf16'] / t:4.2f}x)" for t in times.values()]
    print(f"{tokens:>5} " + " ".join(f"{c:>22}" for c in cells), flush=True)
