"""The x86 kernel libraries of vLLM's CPU build that this machine can run.

vLLM's CPU build ships one kernel library per x86 ISA level (``_C_AVX2``,
``_C_AVX512``, ``_C`` for AVX512-BF16/AMX) and loads the most capable one the
CPU runs; the fork's ``VLLM_CPU_X86_KERNELS`` picks another.  An AVX512 CPU
also runs the AVX2 library, so tests run the fork's CPU paths under each
library this machine can run: ``make test`` runs the series' CPU tests under
the ones vLLM does not load by default, the e2e suite serves one model per MoE
scheme family under each.

The answer comes from vLLM's own platform code
(``CpuPlatform.x86_kernel_library_to_load``, ``has_amx_kernels``), asked in a
subprocess of the given interpreter (the fork's venv) so that the caller
does not load vLLM.

Usage::

    .venv/bin/python tools/x86_libraries.py            # every runnable one
    .venv/bin/python tools/x86_libraries.py --others   # all but the default
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

# Asks vLLM: for each VLLM_CPU_X86_KERNELS value, whether this CPU can load
# that library and, if so, whether its AMX kernels run here.
_PROBE = """
import json, os
from vllm.platforms import CpuArchEnum
from vllm.platforms.cpu import CpuPlatform as P
out = {}
if P.get_cpu_architecture() == CpuArchEnum.X86:
    for choice in ("avx2", "avx512", "avx512_bf16"):
        os.environ["VLLM_CPU_X86_KERNELS"] = choice
        try:
            P.x86_kernel_library_to_load()
        except RuntimeError:
            continue
        out[choice] = P.has_amx_kernels()
print("LIBRARIES " + json.dumps(out))
"""


def runnable(python: str = sys.executable) -> dict[str, bool]:
    """Library -> whether its AMX kernels run here, in vLLM's order of
    preference: the default (``auto``) is the last.  {} off x86."""
    proc = subprocess.run(
        [python, "-c", _PROBE], capture_output=True, text=True, check=True
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("LIBRARIES ")][-1]
    return json.loads(line[len("LIBRARIES ") :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--others",
        action="store_true",
        help="only the libraries vLLM does not load by default",
    )
    args = parser.parse_args(argv)
    names = list(runnable())
    print(" ".join(names[:-1] if args.others else names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
