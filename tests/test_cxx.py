"""forkctl.cxx: which C++ the series touches, and how its ops are registered."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from forkctl import cxx
from forkctl.errors import ForkError

BINDINGS = """
void old_op(torch::Tensor& out, const torch::Tensor& x);

void new_op(torch::Tensor& out, const torch::Tensor& x,
            const std::optional<torch::Tensor>& bias, const int64_t n);

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("old_op(Tensor(a0!) out, Tensor x) -> ()");
  ops.impl("old_op", torch::kCPU, &old_op);
#if defined(__x86_64__)
  ops.def(
      "new_op(Tensor(a0!) out, Tensor x, "
      "Tensor? bias, int n) -> ()");
  ops.impl("new_op", torch::kCPU, &new_op);
#endif
}
"""


def test_registered_ops_read_schema_and_declaration():
    ops = {op.name: op for op in cxx.registered_ops(BINDINGS)}
    assert set(ops) == {"old_op", "new_op"}
    assert ops["new_op"].schema == (
        "new_op(Tensor(a0!) out, Tensor x, Tensor? bias, int n) -> ()"
    )
    assert ops["new_op"].declaration.startswith("void new_op(torch::Tensor& out")
    assert ops["new_op"].declaration.endswith("const int64_t n);")


def test_defines_finds_definitions_not_declarations():
    source = "void new_op(torch::Tensor& out,\n    const torch::Tensor& x) {\n}\n"
    assert cxx.defines(source, "new_op")
    assert not cxx.defines("void new_op(torch::Tensor& out);\n", "new_op")
    assert not cxx.defines(source, "old_op")


def test_registration_defines_new_ops_and_replaces_kernels_of_existing_ones():
    ops = {op.name: op for op in cxx.registered_ops(BINDINGS)}
    wheel = b"\0" + ops["old_op"].schema.encode() + b"\0"
    stub = cxx.registration([ops["old_op"], ops["new_op"]], wheel)
    assert 'TORCH_LIBRARY_FRAGMENT(_C, ops) {\n  ops.def("new_op(' in stub
    assert 'TORCH_LIBRARY_IMPL(_C, CPU, ops) {\n  ops.impl("old_op", &old_op);' in stub
    assert ops["new_op"].declaration in stub


def test_registration_refuses_a_changed_schema():
    ops = {op.name: op for op in cxx.registered_ops(BINDINGS)}
    wheel = b"\0old_op(Tensor x) -> Tensor\0"
    with pytest.raises(ForkError, match="changes the schema of op old_op"):
        cxx.registration([ops["old_op"]], wheel)


def test_cmake_list():
    text = 'set(SRC_A\n    "a.cpp"\n    # note\n    "b.cpp")\nset(SRC_B "c.cpp")\n'
    assert cxx.cmake_list(text, "SRC_A") == ["a.cpp", "b.cpp"]
    assert cxx.cmake_list(text, "SRC_B") == ["c.cpp"]
    with pytest.raises(ForkError):
        cxx.cmake_list(text, "SRC_C")


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)


def test_plan_takes_changed_sources_and_their_includers(tmp_path: Path):
    tree = tmp_path
    cpu = tree / "csrc" / "cpu"
    (cpu / "micro_gemm").mkdir(parents=True)
    (tree / "cmake").mkdir()
    (tree / "cmake" / "cpu_extension.cmake").write_text(
        'set(VLLM_EXT_SRC_AVX512\n  "csrc/cpu/a.cpp"\n  "csrc/cpu/b.cpp"\n'
        '  "csrc/cpu/torch_bindings.cpp")\n'
        'set(VLLM_EXT_SRC_SGL\n  "csrc/cpu/sgl.cpp")\n'
        'set(VLLM_EXT_SRC_AVX2\n  "csrc/cpu/a.cpp")\n'
    )
    (cpu / "a.cpp").write_text('#include "cpu/micro_gemm/gemm.hpp"\n')
    (cpu / "b.cpp").write_text('#include "cpu/other.hpp"\n')
    (cpu / "sgl.cpp").write_text("\n")
    (cpu / "other.hpp").write_text("\n")
    (cpu / "micro_gemm" / "gemm.hpp").write_text('#include "impl.hpp"\n')
    (cpu / "micro_gemm" / "impl.hpp").write_text("// v1\n")
    (cpu / "torch_bindings.cpp").write_text("\n")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    _git(tree, "tag", "base")
    assert cxx.plan(tree) == {}

    # a header two includes deep, and the bindings, change
    (cpu / "micro_gemm" / "impl.hpp").write_text("// v2\n")
    (cpu / "torch_bindings.cpp").write_text("// new op\n")
    _git(tree, "add", "-A")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "patch")
    assert cxx.plan(tree) == {
        "_C": ["csrc/cpu/a.cpp"],
        "_C_AVX512": ["csrc/cpu/a.cpp"],
        "_C_AVX2": ["csrc/cpu/a.cpp"],
    }
    assert cxx.include_closure(tree, "csrc/cpu/a.cpp") == {
        "csrc/cpu/a.cpp",
        "csrc/cpu/micro_gemm/gemm.hpp",
        "csrc/cpu/micro_gemm/impl.hpp",
    }
