# SPDX-License-Identifier: Apache-2.0
"""The Triton W4A16 MoE kernel's test cases, compiled for a CUDA GPU.

tests/kernels/moe/test_fused_moe_w4a16.py runs fused_moe_kernel_w4a16 under
TRITON_INTERPRET=1 on CPU: symmetric and zero-point int4, K tiles inside one
group and spanning several, SWAP_AB, SPLIT_NIBBLES, K not a multiple of the
tile (the scales followed by NaNs), expert parallelism. The interpreter does
not compile the kernel, so it cannot show a miscompiled constexpr branch or
a layout the GPU backend rejects. This runs the same cases (the test's own
run_case, unchanged: same data, same float64 reference, same tolerance) with
the kernel launched on the GPU: each argument is copied to the device with
its strides (so the NaN after each row of scales comes along) and the output
is copied back. float32 cases are held to the 16-bit cases' tolerance:
tl.dot multiplies float32 operands as TF32 on the GPU.

Not a test; it prints one line per case and exits non-zero if a case is out
of tolerance. Usage, with the fork's tree (its vllm/ and tests/) on
PYTHONPATH and no compiled vLLM libraries needed (int8_moe_gpu.py's
stand-ins)::

    python benchmarks/w4a16_cases_gpu.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_moe_gpu import _install_vllm_stand_ins  # noqa: E402


def to_device(t: torch.Tensor) -> torch.Tensor:
    """t on the GPU with the same sizes, strides and storage offset; for a
    view, the whole tensor it views comes along."""
    base = t if t._base is None else t._base
    return base.cuda().as_strided(t.size(), t.stride(), t.storage_offset())


def main() -> int:
    _install_vllm_stand_ins()
    from vllm.model_executor.layers.fused_moe import fused_moe_w4a16

    launch = fused_moe_w4a16.invoke_fused_moe_w4a16_kernel

    def launch_on_gpu(*args, **kwargs):
        # invoke_fused_moe_w4a16_kernel(A, B, C, ...) writes C in place.
        moved = [to_device(a) if isinstance(a, torch.Tensor) else a for a in args]
        launch(*moved, **kwargs)
        args[2].copy_(moved[2].cpu())

    fused_moe_w4a16.invoke_fused_moe_w4a16_kernel = launch_on_gpu
    from tests.kernels.moe import test_fused_moe_w4a16 as cases

    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    failed = 0
    for seed, case in enumerate(cases.CASES):
        r = cases.run_case(case, seed)
        if case[7] == "float32":
            # tl.dot takes float32 operands as TF32 on the GPU (its default
            # input precision, as for vLLM's other fused-MoE kernels); the
            # interpreter multiplies in float32. TF32 keeps the 16-bit
            # activations' tolerance.
            r["tolerance"] = 3e-3 * r["scale"] + 1e-5
        ok = r["scale"] > 0.05 and r["error"] <= r["tolerance"]
        if case[-1]:
            ok = ok and r["zero_rows"] > 0
        failed += not ok
        print(
            f"{'ok  ' if ok else 'FAIL'} {case}: error {r['error']:.3e} "
            f"(tolerance {r['tolerance']:.3e}, scale {r['scale']:.3f})",
            flush=True,
        )
    print(f"{len(cases.CASES) - failed} of {len(cases.CASES)} cases within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
