"""The build's pure parts: versions, requirements, compiled-library install.

Creating the venv and pip installing are exercised by `make test` itself;
these tests cover the decisions the build makes, on the synthetic fork.
"""

from __future__ import annotations

import zipfile

import pytest

from forkctl import build, config
from forkctl.errors import ForkError
from tests.conftest import sha256


def _write_wheel(path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return sha256(path)


def _pin_wheel(fork, target: str, members: dict[str, bytes]):
    wheel = fork.downloads / f"demo-{target}.whl"
    digest = _write_wheel(wheel, members)
    text = (fork.root / "fork.toml").read_text()
    text += (
        f'\n[wheels.{target}x]\nproject = "demo"\n'
        f'filename = "{wheel.name}"\nsha256 = "{digest}"\n'
    )
    (fork.root / "fork.toml").write_text(text)
    loaded = config.load(fork.root)
    return loaded, loaded.wheels[f"{target}x"]


def test_version_names_target_and_series(series_fork):
    fork = config.load(series_fork.root)
    cpu = build.fork_version(fork, "cpu")
    cuda = build.fork_version(fork, "cuda")
    assert cpu.startswith("1.0+cpu.fork.") and "cpu" not in cuda
    assert cpu.split(".")[-1] == cuda.split(".")[-1]
    # Another series, another version.
    (series_fork.patches / "series").write_text(
        "\n".join(series_fork.series()[:-1]) + "\n"
    )
    assert build.fork_version(fork, "cpu") != cpu


def test_requirements_take_torch_from_the_pin(tmp_path):
    reqs = tmp_path / "requirements"
    reqs.mkdir()
    (reqs / "common.txt").write_text("numpy\nregex # comment\n")
    (reqs / "cpu.txt").write_text(
        "-r common.txt\ntorch==2.10.0+cpu; platform_machine == 'x86_64'\n"
        "torchaudio\nintel-openmp==2024.2.1\ntorchcodec >= 0.14\n"
        "triton @ https://example.invalid/triton-3.8.0+cpu.whl ; "
        'platform_machine == "x86_64"\n'
    )
    (reqs / "test.txt").write_text("pytest==8.3.5\n    # via -r test.in\n")
    fork = config.Fork(
        root=tmp_path,
        version="1.0",
        sdist=config.Artifact("demo", "demo.tar.gz", "0" * 64),
        wheels={},
        torch_version="2.10.0",
        tools={"ruff": "0.14.0"},
        test_requirements=("pytest",),
    )
    wanted = build.requirements(fork, tmp_path, "cpu")
    assert wanted[0] == "torch==2.10.0"
    assert (
        "numpy" in wanted and "regex" in wanted and "intel-openmp==2024.2.1" in wanted
    )
    assert not any(
        r.startswith(("torch==2.10.0+cpu", "torchaudio", "torchcodec")) for r in wanted
    )
    # A file off the index is taken from the index by its project's name.
    assert 'triton; platform_machine == "x86_64"' in wanted
    assert "ruff==0.14.0" in wanted and "pytest==8.3.5" in wanted
    with pytest.raises(ForkError, match="pins no version for tblib"):
        build.locked_versions(fork, tmp_path, ("tblib",))


def test_compiled_libraries_come_from_the_pinned_wheel(series_fork, tmp_path):
    fork, wheel = _pin_wheel(
        series_fork,
        "cpu",
        {
            "demo/_C.abi3.so": b"\x7fELF compiled",
            "demo/__init__.py": b"# the wheel's copy must not replace the tree's\n",
            "demo/generated.py": b"# only in the wheel\n",
            "demo-1.0.dist-info/METADATA": b"Name: demo\n",
        },
    )
    fork = config.Fork(**{**fork.__dict__, "wheels": {"cpu": wheel}})
    series_fork.ok("sync")
    tree = series_fork.tree
    original_init = (tree / "demo" / "__init__.py").read_bytes()
    venv = tmp_path / "venv"
    venv.mkdir()
    stamps = build.Stamps(venv)
    build.install_compiled_libraries(fork, tree, "cpu", stamps)
    assert (tree / "demo" / "_C.abi3.so").read_bytes() == b"\x7fELF compiled"
    assert (tree / "demo" / "generated.py").is_file()
    assert (tree / "demo" / "__init__.py").read_bytes() == original_init
    assert not (tree / "demo-1.0.dist-info").exists()
    assert stamps.get("libraries")["files"] == ["demo/_C.abi3.so", "demo/generated.py"]

    # A tampered wheel is refused before anything is extracted.
    (tree / "demo" / "_C.abi3.so").unlink()
    with zipfile.ZipFile(series_fork.downloads / "demo-cpu.whl", "a") as zf:
        zf.writestr("demo/extra.so", b"evil")
    with pytest.raises(ForkError, match="sha256 mismatch for demo-cpu.whl"):
        build.install_compiled_libraries(fork, tree, "cpu", stamps)
    assert not (tree / "demo" / "extra.so").exists()
