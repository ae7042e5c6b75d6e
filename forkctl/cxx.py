"""cxx: build the C++ the series changes into the wheel's x86 kernel libraries.

The x86 CPU wheel ships three kernel libraries (vllm/_C.abi3.so, AVX512-BF16
and AMX; _C_AVX512; _C_AVX2), each built from a source list in upstream's
cmake/cpu_extension.cmake. Rebuilding them whole needs oneDNN's sources and
most of an hour on 2 cores, so the build compiles only what the series
touches:

* the sources of a library's list (as the tree's CMake file has it) that the
  series adds or changes, or that include a header it adds or changes;
* a generated file registering the ops those sources implement, read from the
  tree's torch_bindings.cpp: an op the wheel's library lacks is defined, an op
  it has gets the new kernel (same schema only);

and links them, with the library's own flags, into a library of the same name
that loads the wheel's one (kept beside it as NAME.wheel.so) first. vLLM's
`import vllm._C_AVX2` then registers upstream's ops and the series' ones.

Objects are cached by the hash of what they are built from in the fork's cache
directory, so a fresh clone on a machine that built them before links only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .config import Fork
from .errors import ForkError
from .git import out
from .tree import BASE_TAG

CSRC = "csrc/cpu"
BINDINGS = "csrc/cpu/torch_bindings.cpp"
CMAKE = "cmake/cpu_extension.cmake"
# upstream's CXX_COMPILE_FLAGS for x86 (cmake/cpu_extension.cmake)
COMMON_FLAGS = [
    "-std=c++20",
    "-O3",
    "-fPIC",
    "-fopenmp",
    "-DVLLM_CPU_EXTENSION",
    "-DTORCH_EXTENSION_NAME=_C",
    "-mf16c",
]
AVX512 = ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq"]


@dataclass(frozen=True)
class Library:
    name: str  # file stem in vllm/
    sources: tuple[str, ...]  # CMake lists whose union it is built from
    flags: tuple[str, ...]


LIBRARIES = (
    Library(
        "_C",
        ("VLLM_EXT_SRC_AVX512", "VLLM_EXT_SRC_SGL"),
        (
            *AVX512,
            "-mamx-bf16",
            "-mamx-tile",
            "-mavx512bf16",
            "-mavx512vnni",
            "-DCPU_CAPABILITY_AMXBF16",
        ),
    ),
    Library("_C_AVX512", ("VLLM_EXT_SRC_AVX512",), tuple(AVX512)),
    Library("_C_AVX2", ("VLLM_EXT_SRC_AVX2",), ("-mavx2",)),
)


def cmake_list(cmake_text: str, name: str) -> list[str]:
    match = re.search(rf"set\(\s*{name}\s+(.*?)\)", cmake_text, re.S)
    if not match:
        raise ForkError(f"{CMAKE} sets no {name}")
    return re.findall(r'"([^"]+)"', match.group(1))


def changed_files(tree: Path) -> list[str]:
    listing = out(tree, "diff", "--name-only", BASE_TAG, "HEAD", "--", CSRC)
    return [line for line in listing.splitlines() if line]


def _includes(tree: Path, path: str) -> set[str]:
    """The tree's files `path` includes with #include "...": next to it, or
    under csrc/."""
    found = set()
    text = (tree / path).read_text(errors="replace")
    for inc in re.findall(r'#include\s+"([^"]+)"', text):
        for candidate in (Path(path).parent / inc, Path("csrc") / inc):
            if (tree / candidate).is_file():
                found.add(candidate.as_posix())
                break
    return found


def include_closure(tree: Path, source: str) -> set[str]:
    """`source` and every file of the tree it includes, transitively."""
    seen, todo = set(), [source]
    while todo:
        path = todo.pop()
        if path in seen or not (tree / path).is_file():
            continue
        seen.add(path)
        todo.extend(_includes(tree, path))
    return seen


def touched_sources(tree: Path, candidates: list[str], changed: set[str]) -> list[str]:
    """The candidates the series changes or that include (transitively) a changed file."""
    return [s for s in candidates if include_closure(tree, s) & changed]


@dataclass(frozen=True)
class Op:
    name: str
    schema: str
    function: str
    declaration: str


def _c_strings(text: str) -> str:
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', text))


def registered_ops(bindings: str) -> list[Op]:
    """Every op torch_bindings.cpp defines and implements for CPU."""
    schemas = {}
    for match in re.finditer(r"ops\.def\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)", bindings):
        schema = _c_strings(match.group(1))
        schemas[schema.split("(", 1)[0].strip()] = schema
    ops = []
    for name, function in re.findall(
        r'ops\.impl\(\s*"(\w+)",\s*torch::kCPU,\s*&(\w+)\s*\)', bindings
    ):
        decl = re.search(
            rf"^(?:[\w:<>,]+[ \t]+)+{function}\s*\([^;{{]*\);", bindings, re.M
        )
        if name in schemas and decl:
            ops.append(Op(name, schemas[name], function, decl.group(0)))
    return ops


def defines(source_text: str, function: str) -> bool:
    return bool(
        re.search(
            rf"^(?:[\w:<>,]+[ \t]+)+{function}\s*\([^;{{]*\)\s*\{{", source_text, re.M
        )
    )


def registration(ops: list[Op], wheel_library: bytes) -> str:
    """C++ registering `ops`: defined when the wheel's library lacks them."""
    lines = [
        "// Generated by forkctl: the series' ops, registered beside the",
        "// wheel's library this one loads.",
        "#include <torch/all.h>",
        "#include <torch/library.h>",
        "",
        *(op.declaration for op in ops),
        "",
    ]
    new, replaced = [], []
    for op in ops:
        if op.schema.encode() in wheel_library:
            replaced.append(op)
        elif f"\0{op.name}(".encode() in wheel_library:
            raise ForkError(
                f"the series changes the schema of op {op.name}; the fork's "
                "build can add ops and replace kernels, not change an op the "
                "wheel's library defines"
            )
        else:
            new.append(op)
    if new:
        lines.append("TORCH_LIBRARY_FRAGMENT(_C, ops) {")
        for op in new:
            lines.append(f'  ops.def("{op.schema}");')
            lines.append(f'  ops.impl("{op.name}", torch::kCPU, &{op.function});')
        lines.append("}")
    if replaced:
        lines.append("TORCH_LIBRARY_IMPL(_C, CPU, ops) {")
        for op in replaced:
            lines.append(f'  ops.impl("{op.name}", &{op.function});')
        lines.append("}")
    return "\n".join(lines) + "\n"


def _torch_paths(python: str) -> tuple[list[str], str, str, str]:
    probe = (
        "import torch, os\n"
        "from torch.utils.cpp_extension import include_paths\n"
        "print(os.pathsep.join(include_paths()))\n"
        "print(os.path.join(os.path.dirname(torch.__file__), 'lib'))\n"
        "print(int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__)\n"
    )
    lines = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    abi, version = lines[2].split()
    return (
        lines[0].split(os.pathsep),
        lines[1],
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        version,
    )


def _compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX", "g++")
    version = subprocess.run(
        [cxx, "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]
    return cxx, version


class Compiler:
    def __init__(self, fork: Fork, tree: Path) -> None:
        python = str(fork.venv_dir / "bin" / "python")
        includes, self.torch_lib, abi, torch_version = _torch_paths(python)
        self.cxx, cxx_version = _compiler()
        self.base_flags = [*COMMON_FLAGS, abi, f"-I{tree / 'csrc'}"]
        self.base_flags += [f"-I{p}" for p in includes]
        self.objects = fork.cache_dir / "objects"
        self.tree = tree
        self.salt = "\n".join([cxx_version, torch_version])

    def object_for(self, source: Path, flags: list[str]) -> tuple[Path, list[str]]:
        digest = hashlib.sha256()
        digest.update(self.salt.encode())
        digest.update("\0".join(flags).encode())
        if source.is_relative_to(self.tree):
            relative = source.relative_to(self.tree).as_posix()
            for path in sorted(include_closure(self.tree, relative)):
                digest.update(path.encode())
                digest.update((self.tree / path).read_bytes())
        else:  # the generated registration
            digest.update(source.read_bytes())
        obj = self.objects / f"{digest.hexdigest()[:32]}.o"
        cmd = [self.cxx, *self.base_flags, *flags, "-c", str(source), "-o"]
        return obj, cmd

    def compile_all(self, jobs: list[tuple[Path, list[str]]]) -> None:
        todo = [(obj, cmd) for obj, cmd in jobs if not obj.exists()]
        if not todo:
            return
        self.objects.mkdir(parents=True, exist_ok=True)

        def run(job: tuple[Path, list[str]]) -> str | None:
            obj, cmd = job
            tmp = obj.with_suffix(f".{os.getpid()}.tmp")
            proc = subprocess.run([*cmd, str(tmp)], capture_output=True, text=True)
            if proc.returncode != 0:
                return f"{' '.join(cmd)} {tmp}\n{proc.stderr[-6000:]}"
            os.replace(tmp, obj)
            return None

        print(f"compiling {len(todo)} object(s) of the series' C++", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            errors = [e for e in pool.map(run, todo) if e]
        if errors:
            raise ForkError("compiling the series' C++ failed:\n" + errors[0])

    def link(self, output: Path, objects: list[Path], wheel_library: Path) -> None:
        tmp = output.with_suffix(".tmp")
        cmd = [
            self.cxx,
            "-shared",
            "-o",
            str(tmp),
            *map(str, objects),
            f"-L{wheel_library.parent}",
            f"-l:{wheel_library.name}",
            "-Wl,-rpath,$ORIGIN",
            f"-L{self.torch_lib}",
            "-ltorch",
            "-ltorch_cpu",
            "-lc10",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ForkError(f"linking {output.name} failed:\n{proc.stderr[-6000:]}")
        os.replace(tmp, output)


def plan(tree: Path) -> dict[str, list[str]]:
    """The sources the series touches, by library."""
    changed = set(changed_files(tree))
    if not changed:
        return {}
    cmake_text = (tree / CMAKE).read_text()
    result = {}
    for library in LIBRARIES:
        candidates = []
        for name in library.sources:
            candidates += [s for s in cmake_list(cmake_text, name) if s != BINDINGS]
        sources = touched_sources(tree, sorted(set(candidates)), changed)
        if sources:
            result[library.name] = sources
    return result


def build_libraries(fork: Fork, tree: Path, wheel_path: Path) -> dict[str, list[str]]:
    """Compile and link the series' C++ into the tree's x86 libraries.

    Returns the sources built, by library. Libraries the series does not touch
    are the wheel's as they are.
    """
    wanted = plan(tree)
    package = tree / "vllm"
    with zipfile.ZipFile(wheel_path) as zf:
        names = set(zf.namelist())
        for library in LIBRARIES:
            member = f"vllm/{library.name}.abi3.so"
            if member not in names:
                continue
            target = package / f"{library.name}.abi3.so"
            kept = package / f"{library.name}.wheel.so"
            if library.name not in wanted:
                kept.unlink(missing_ok=True)
                with zf.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                continue
            with zf.open(member) as src, open(kept, "wb") as dst:
                shutil.copyfileobj(src, dst)
    if not wanted:
        return {}

    compiler = Compiler(fork, tree)
    bindings = (tree / BINDINGS).read_text()
    ops = registered_ops(bindings)
    generated = fork.cache_dir / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    jobs, link_plan = [], []
    for library in LIBRARIES:
        if library.name not in wanted:
            continue
        flags = list(library.flags)
        texts = [(tree / s).read_text(errors="replace") for s in wanted[library.name]]
        mine = [op for op in ops if any(defines(t, op.function) for t in texts)]
        kept = package / f"{library.name}.wheel.so"
        stub = registration(mine, kept.read_bytes())
        stub_path = generated / (
            hashlib.sha256(stub.encode()).hexdigest()[:32] + ".cpp"
        )
        stub_path.write_text(stub)
        objects = []
        for source in [*(tree / s for s in wanted[library.name]), stub_path]:
            obj, cmd = compiler.object_for(source, flags)
            jobs.append((obj, cmd))
            objects.append(obj)
        link_plan.append((package / f"{library.name}.abi3.so", objects, kept))
    compiler.compile_all(jobs)
    for output, objects, kept in link_plan:
        compiler.link(output, objects, kept)
    return wanted


def digest(fork: Fork, tree: Path, wheel_sha256: str) -> str:
    """What the libraries are built from: changes when a rebuild is due."""
    wanted = plan(tree)
    h = hashlib.sha256(wheel_sha256.encode())
    h.update(repr(sorted(wanted.items())).encode())
    h.update(repr(LIBRARIES).encode())
    h.update(repr(COMMON_FLAGS).encode())
    sources = {s for built in wanted.values() for s in built}
    for path in sorted(set().union(*(include_closure(tree, s) for s in sources))):
        h.update(path.encode())
        h.update((tree / path).read_bytes())
    if wanted:
        h.update((tree / BINDINGS).read_bytes())
    return h.hexdigest()
