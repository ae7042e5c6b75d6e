"""CI files: the schema of vLLM's step files, and `check` validating them.

The step files of every line's base come from its pinned sdist (fetched and
verified as `forkctl build` does); check-jsonschema is the one `build` installs
into the repository's .venv.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from forkctl import artifacts, ci_schema, config

CHECK_JSONSCHEMA = REPO / ".venv" / "bin" / ci_schema.TOOL
SCHEMA = json.loads(ci_schema.STEP_SCHEMA.read_text())

needs_tool = pytest.mark.skipif(
    not CHECK_JSONSCHEMA.is_file(),
    reason="no check-jsonschema in the repository's .venv (python3 -m forkctl build)",
)


def _base_step_files() -> dict[str, dict[str, str]]:
    """The step files of every line's base (main and lines/*), by version and
    path, read from the pinned sdists (fetched and verified)."""
    found: dict[str, dict[str, str]] = {}
    for line in (None, *config.lines(REPO)):
        fork = config.load(REPO, line)
        files = found.setdefault(fork.version, {})
        with tarfile.open(artifacts.fetch(fork, fork.sdist)) as tar:
            for member in tar.getmembers():
                path = member.name.partition("/")[2]
                data = tar.extractfile(member) if member.isfile() else None
                if data and ci_schema.step_files([path]):
                    files[path] = data.read().decode()
    return found


@pytest.fixture(scope="module")
def bases() -> dict[str, dict[str, str]]:
    found = _base_step_files()
    for version, files in found.items():
        assert len(files) > 30, (version, sorted(files))
    return found


@pytest.fixture(scope="module")
def base_files(bases) -> dict[str, str]:
    """The main line's base's step files."""
    return bases[config.load(REPO).version]


def _write(root: Path, files: dict[str, str]) -> list[str]:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return sorted(files)


def _validate(root: Path, files: dict[str, str], schema=None) -> dict[str, list[str]]:
    schema = schema or ("--schemafile", str(ci_schema.STEP_SCHEMA))
    return ci_schema.validate(CHECK_JSONSCHEMA, schema, root, _write(root, files))


@needs_tool
def test_every_base_step_file_validates(bases, tmp_path):
    for version, files in bases.items():
        assert _validate(tmp_path / version, files) == {}, version


@needs_tool
def test_buildkite_schema_rejects_the_base_step_files(base_files, tmp_path):
    """Why the step files need a schema of their own."""
    cpu = ".buildkite/hardware_tests/cpu.yaml"
    found = _validate(tmp_path, {cpu: base_files[cpu]}, ci_schema.BUILDKITE)
    assert cpu in found


def _used_keys(base_files: dict[str, str]) -> tuple[set, set, set]:
    top, step, mirror = set(), set(), set()
    for text in base_files.values():
        data = yaml.safe_load(text) or {}
        top |= set(data)
        for s in data.get("steps", []):
            step |= set(s)
            for m in (s.get("mirror") or {}).values():
                mirror |= set(m)
    return top, step, mirror


def test_schema_has_exactly_the_keys_the_bases_use(bases):
    top, step, mirror = _used_keys(
        {
            f"{v}:{path}": text
            for v, files in bases.items()
            for path, text in files.items()
        }
    )
    defs = SCHEMA["$defs"]
    mirrored = defs["step"]["properties"]["mirror"]["additionalProperties"]
    assert set(SCHEMA["properties"]) == top
    assert set(defs["step"]["properties"]) == step
    assert set(mirrored["properties"]) == mirror
    for where in (SCHEMA, defs["step"], mirrored):
        assert where["additionalProperties"] is False
    for name, prop in defs["step"]["properties"].items():
        described = prop.get("description") or defs.get(name, {}).get("description")
        assert described, f"step key {name!r} has no description"


GOOD = """\
group: Intel
steps:
  - label: XPU test
    device: intel_gpu
    timeout_in_minutes: 30
    source_file_dependencies: [vllm/]
    commands:
      - pytest -v -s tests/kernels/moe/test_xpu_moe.py
"""


# (line in GOOD, its bad version, what check-jsonschema says)
BAD = {
    "misspelled-step-key": (
        "    device: intel_gpu\n",
        "    devcie: intel_gpu\n",
        "'devcie' was unexpected",
    ),
    "wrong-type": (
        "    timeout_in_minutes: 30\n",
        "    timeout_in_minutes: '30'\n",
        "'30' is not of type 'integer'",
    ),
    "misspelled-top-key": ("group: Intel\n", "grup: Intel\n", "'grup' was unexpected"),
    "string-for-list": (
        "    source_file_dependencies: [vllm/]\n",
        "    source_file_dependencies: vllm/\n",
        "'vllm/' is not of type 'array'",
    ),
}


@needs_tool
def test_bad_steps_are_rejected(tmp_path):
    files = {".buildkite/intel_jobs/good.yaml": GOOD}
    for name, (line, bad, _) in BAD.items():
        assert line in GOOD
        files[f".buildkite/intel_jobs/{name}.yaml"] = GOOD.replace(line, bad)
    found = _validate(tmp_path, files)
    assert ".buildkite/intel_jobs/good.yaml" not in found
    for name, (_, _, expected) in BAD.items():
        errors = found.get(f".buildkite/intel_jobs/{name}.yaml", [])
        assert any(expected in e for e in errors), (name, found)


@needs_tool
def test_the_forks_pipeline_is_a_valid_buildkite_pipeline(tmp_path):
    path = ".buildkite/pipeline.yml"
    text = (REPO / path).read_text()
    assert ci_schema.validate(CHECK_JSONSCHEMA, ci_schema.BUILDKITE, REPO, [path]) == {}
    data = yaml.safe_load(text)
    labels = {s["label"]: s for s in data["steps"]}
    commands = {
        label: " ".join(s.get("commands") or [s.get("command", "")])
        for label, s in labels.items()
    }
    assert any("forkctl check" in c for c in commands.values())
    test = next(s for s in data["steps"] if s.get("command") == "make test")
    assert test["timeout_in_minutes"] == 90 and test["agents"]["queue"] == "cpu"
    gpu = next(s for s in data["steps"] if s["agents"]["queue"] == "gpu")
    gpu_commands = " ".join(gpu["commands"])
    bench = "benchmarks/gpu_moe/bench.py"
    assert bench in gpu_commands and (REPO / bench).is_file()
    assert gpu["artifact_paths"]
    # Buildkite's schema catches a misspelled step key in the same file.
    bad = text.replace("    agents:\n      queue: gpu", "    agent:\n      queue: gpu")
    assert bad != text
    found = _validate(tmp_path, {path: bad}, ci_schema.BUILDKITE)
    assert path in found


# -- check ---------------------------------------------------------------------

CPU_LANE = ".buildkite/hardware_tests/cpu.yaml"
LANE = """\
steps:
- label: CPU-Kernel Tests
  depends_on: []
  device: intel_cpu
  no_plugin: true
  commands:
  - pytest -x -v -s tests/kernels/test_onednn.py
"""
STEP_PATCH = "[CI/Build] Run the quantized MoE tests in the CPU lane"


@pytest.fixture
def ci_fork(fork, monkeypatch, tmp_path):
    """The synthetic fork on a base with a CPU lane, the repository's .venv."""
    if not CHECK_JSONSCHEMA.is_file():
        pytest.skip("no check-jsonschema in the repository's .venv")
    from conftest import BASE_FILES

    fork.pin({**BASE_FILES, CPU_LANE: LANE})
    fork.venv.symlink_to(REPO / ".venv")
    fork.ok("sync")
    return fork


def _add_step(fork, extra: str = "") -> None:
    fork.write(
        CPU_LANE,
        LANE
        + "- label: CPU-Quantized MoE Tests\n"
        + "  device: intel_cpu\n"
        + extra
        + "  commands:\n  - pytest -x -v -s tests/kernels/moe/test_cpu_fp8_moe.py\n",
    )
    fork.commit(STEP_PATCH)
    fork.ok("export")


def test_check_passes_a_valid_step_file(ci_fork):
    _add_step(ci_fork, "  timeout_in_minutes: 20\n")
    result = ci_fork.run("check")
    assert result.rc == 0, result.text


def test_check_fails_on_a_touched_step_file_with_a_bad_key(ci_fork):
    _add_step(ci_fork, "  soft_fial: true\n")
    result = ci_fork.run("check")
    assert result.rc == 1, result.text
    name = ci_fork.series()[-1]
    assert (
        f"problem: {name}: {CPU_LANE}: vLLM CI step file: $.steps[1]: "
        "Additional properties are not allowed ('soft_fial' was unexpected)"
    ) in result.out


def test_check_fails_on_a_bad_pipeline_of_the_fork(ci_fork):
    (ci_fork.root / ".buildkite").mkdir()
    (ci_fork.root / ".buildkite" / "pipeline.yml").write_text(
        "steps:\n  - label: test\n    command: make test\n    timeout_in_minutes: ninety\n"
    )
    result = ci_fork.run("check")
    assert result.rc == 1, result.text
    assert (
        "problem: fork's .buildkite/pipeline.yml: Buildkite pipeline: $.steps[0]"
        in (result.out)
    )


def test_check_without_check_jsonschema_is_a_problem(fork):
    from conftest import BASE_FILES

    fork.pin({**BASE_FILES, CPU_LANE: LANE})
    fork.ok("sync")
    _add_step(fork)
    result = fork.run("check")
    assert result.rc == 1
    assert f"check-jsonschema not found in {fork.venv}" in result.out
