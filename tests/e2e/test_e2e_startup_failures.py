"""Servers that must refuse to start, and say why.

* An explicit MoE backend that cannot serve the model (``--moe-backend
  triton`` on CPU, for an FP8 checkpoint) stops ``vllm serve`` at start-up,
  non-zero, with the list of the kernels considered and why each was rejected
  ("Kernels considered:" ... "TRITON (TritonExperts): kernel does not support
  current device cpu").

* Broken checkpoints must fail at load with an error that names the tensor
  and the shape that was expected: a copy of a quantized checkpoint with one
  expert weight scale removed, and one with an expert's down_proj weight
  transposed.  Upstream vLLM loads both silently (the missing scale keeps
  the value it was created with; the transposed weight is copied into a
  corner of the expert's slot); the series' loader checks reject both,
  naming the layer's parameter, the expert and the shape expected.
"""

from __future__ import annotations

import re

import e2e_lib as lib
import pytest

EXPERT = "model.layers.0.mlp.experts.3.down_proj"


def _exit_code(message: str) -> int:
    m = re.search(r"vllm serve exited with (-?\d+) before it was ready", message)
    assert m, f"server did not exit before it was ready:\n{message}"
    return int(m.group(1))


def _start_expecting_failure(model, args, log_name: str) -> str:
    """Start the server; return the ServerError message.  Fails the test
    (AssertionError) if the server comes up."""
    served = False
    message = ""
    try:
        with lib.serve(model, args, log_name=log_name):
            served = True
    except lib.ServerError as e:
        message = str(e)
    assert not served, (
        f"vllm serve {model.name} {' '.join(args)} started and became healthy; "
        f"log: {lib.log_path(log_name)}"
    )
    assert _exit_code(message) != 0
    return message


# --------------------------------------------------------------------------
# Explicit backend that cannot serve
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["fp8-block"])
def test_explicit_triton_backend_is_rejected_at_startup(checkpoints, scheme) -> None:
    model = checkpoints.scheme(scheme).model
    log_name = f"reject-triton-{scheme}"
    message = _start_expecting_failure(model, ["--moe-backend", "triton"], log_name)
    log = lib.log_path(log_name).read_text(errors="replace")
    refusal = re.search(
        r"FP8 MoE backend TRITON does not support the deployment configuration"
        r".*Kernels considered:",
        log,
    )
    assert refusal, f"no refusal of the TRITON backend in the log:\n{message}"
    assert "TRITON (TritonExperts): kernel does not support current device cpu" in (
        log
    ), "no rejection reason for TritonExperts"
    # Fails at start-up, before any request could be served.
    assert "Application startup complete" not in log


# --------------------------------------------------------------------------
# Broken checkpoints
# --------------------------------------------------------------------------


def _shape_pattern(dims: tuple[int, ...]) -> re.Pattern[str]:
    """(256, 128), [256, 128], torch.Size([256, 128]); () / [] for scalars."""
    if not dims:
        return re.compile(r"\(\s*\)|\[\s*\]")
    inner = r"\s*,\s*".join(str(d) for d in dims)
    return re.compile(rf"[\[(]\s*{inner}\s*,?\s*[\])]")


# Checkpoint projection -> the fused parameter vLLM loads it into.
_FUSED = {"gate_proj": "w13", "up_proj": "w13", "down_proj": "w2"}


def _expert_tensor_pattern(tensor: str) -> re.Pattern[str]:
    """A log line that names a checkpoint expert tensor the way the loader
    sees it: the layer's fused parameter (``experts.3.down_proj.weight_scale_inv``
    -> ``experts[.routed_experts].w2_weight_scale_inv``) and the expert."""
    m = re.fullmatch(r"(.+\.experts)\.(\d+)\.(\w+)\.(\w+)", tensor)
    assert m, f"not an expert tensor name: {tensor}"
    prefix, expert, proj, suffix = m.groups()
    return re.compile(
        re.escape(prefix)
        + r"(?:\.routed_experts)?\."
        + re.escape(f"{_FUSED[proj]}_{suffix}")
        + rf"(?![\w.]).*\bexpert {expert}\b"
    )


def _assert_load_error_names(
    log_name: str, model, tensor: str, expected: tuple[int, ...]
) -> None:
    """Some log line names the checkpoint tensor ``tensor`` (its layer's
    parameter and its expert, exactly) and states the shape that was expected
    for it."""
    assert tensor not in str(model), "the model path must not contain the tensor name"
    log = lib.log_path(log_name).read_text(errors="replace")
    name = _expert_tensor_pattern(tensor)
    lines = [line for line in log.splitlines() if name.search(line)]
    assert lines, f"no line of the log names {tensor} ({lib.log_path(log_name)})"
    pattern = _shape_pattern(expected)
    assert any(pattern.search(line) for line in lines), (
        f"no line naming {tensor} states the expected shape {list(expected)}:\n"
        + "\n".join(lines[:5])
    )


@pytest.mark.parametrize("scheme", ["fp8-block", "fp8-tensor"])
def test_missing_expert_scale_fails_at_load(checkpoints, scheme) -> None:
    base = checkpoints.scheme(scheme).model
    shapes = {
        n: tuple(t.shape) for n, t in lib.tiny_checkpoint.load_tensors(base).items()
    }
    scales = [
        n
        for n in shapes
        if n.startswith(f"{EXPERT}.weight_scale")  # weight_scale or _inv
    ]
    assert len(scales) == 1, f"expected one weight scale for {EXPERT}: {scales}"
    (tensor,) = scales

    def drop(tensors: dict) -> None:
        del tensors[tensor]

    # Directory names must not contain the tensor name: the log repeats them.
    model = checkpoints.derive(
        f"bad-{scheme}-missing-expert-scale", base, drop, f"drop {tensor}"
    )
    log_name = f"bad-{scheme}-missing-scale"
    _start_expecting_failure(model, ["--moe-backend", "cpu"], log_name)
    _assert_load_error_names(log_name, model, tensor, shapes[tensor])


@pytest.mark.parametrize("scheme", ["fp8-block"])
def test_wrong_shape_expert_weight_fails_at_load(checkpoints, scheme) -> None:
    base = checkpoints.scheme(scheme).model
    tensor = f"{EXPERT}.weight"
    expected = tuple(lib.tiny_checkpoint.load_tensors(base)[tensor].shape)
    assert len(expected) == 2 and expected[0] != expected[1], expected

    def transpose(tensors: dict) -> None:
        tensors[tensor] = tensors[tensor].t().contiguous()

    model = checkpoints.derive(
        f"bad-{scheme}-transposed-expert-weight", base, transpose, f"transpose {tensor}"
    )
    log_name = f"bad-{scheme}-wrong-shape"
    _start_expecting_failure(model, ["--moe-backend", "cpu"], log_name)
    _assert_load_error_names(log_name, model, tensor, expected)
