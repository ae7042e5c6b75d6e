"""CI files, validated with check-jsonschema (installed into .venv by `build`).

vLLM's step files (.buildkite/test_areas/*.yaml, hardware_tests/*.yaml,
intel_jobs/*.yaml, ...) are not Buildkite pipelines: they are the input of
vLLM's pipeline generator, with keys of its own (device, no_plugin,
source_file_dependencies, ...), so Buildkite's schema rejects even the base's
files. The series' step files are validated against the fork's schema of that
format (schemas/vllm-ci-steps.schema.json: the keys the base's files use,
nothing else). Raw Buildkite pipelines, which `buildkite-agent pipeline
upload` reads as they are (the fork's own .buildkite/pipeline.yml, upstream's
release pipeline), are validated against the Buildkite schema that
check-jsonschema bundles (vendor.buildkite).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from .config import Fork

TOOL = "check-jsonschema"
STEP_SCHEMA = Path(__file__).resolve().parent / "schemas" / "vllm-ci-steps.schema.json"
BUILDKITE = ("--builtin-schema", "vendor.buildkite")
# The generator's inputs: the job directories of ci_config*.yaml, the AMD
# pipeline's steps and the deprecated single-file pipeline.
STEP_FILE = re.compile(
    r"^\.buildkite/(test-pipeline\.yaml|test-amd\.yaml|"
    r"(hardware_tests|intel_jobs|test_areas|image_build)/[^/]+\.ya?ml)$"
)
# Upstream's pipelines that are uploaded to Buildkite as they are.
RAW_PIPELINE = re.compile(r"^\.buildkite/release-pipeline\.yaml$")
# The fork repository's own pipelines.
OWN_PIPELINES = (".buildkite/*.yml", ".buildkite/*.yaml")
MESSAGE_LIMIT = 300


def step_files(files: list[str]) -> list[str]:
    return [f for f in files if STEP_FILE.match(f)]


def raw_pipelines(files: list[str]) -> list[str]:
    return [f for f in files if RAW_PIPELINE.match(f)]


def own_pipelines(fork: Fork) -> list[str]:
    found = {p for pattern in OWN_PIPELINES for p in fork.root.glob(pattern)}
    return sorted(p.relative_to(fork.root).as_posix() for p in found if p.is_file())


def validate(
    binary: Path, schema: tuple[str, ...], cwd: Path, files: list[str]
) -> dict[str, list[str]]:
    """Problems per file (empty when all are valid)."""
    proc = subprocess.run(
        [str(binary), *schema, "--output-format", "json", *files],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        if proc.returncode == 0:
            return {}
        detail = (proc.stdout + proc.stderr).strip()[-2000:]
        return {f: [f"{TOOL} failed (exit {proc.returncode}): {detail}"] for f in files}
    found: dict[str, list[str]] = {}
    for error in report.get("errors", []):
        # Under anyOf/oneOf (Buildkite's step types) the deepest match is the
        # most specific complaint.
        best = error.get("best_deep_match") or error.get("best_match") or error
        message = str(best.get("message", ""))
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 3] + "..."
        where = error.get("path", "$")
        if best.get("path", where) != where:
            where = f"{where} ({best['path']})"
        found.setdefault(error["filename"], []).append(f"{where}: {message}")
    for error in report.get("parse_errors", []):
        found.setdefault(error.get("filename", "?"), []).append(
            f"cannot be parsed: {error.get('message', '')}"
        )
    if proc.returncode != 0 and not found:
        detail = (proc.stdout + proc.stderr).strip()[-2000:]
        return {f: [f"{TOOL} failed (exit {proc.returncode}): {detail}"] for f in files}
    return found


def run(
    fork: Fork, root: Path, files: list[str], patch_of: Callable[[str], str]
) -> list[str]:
    """Validate the step files and raw pipelines among `files` (under root),
    and the fork's own pipelines; each problem names the patch (patch_of) or
    the fork's file."""
    steps = step_files(files)
    raw = raw_pipelines(files)
    own = own_pipelines(fork)
    if not (steps or raw or own):
        return []
    binary = fork.venv_dir / "bin" / TOOL
    if not binary.is_file():
        pin = fork.tools.get(TOOL, "")
        return [
            f"{TOOL} not found in {fork.venv_dir}: run `python3 -m forkctl build` "
            f"(fork.toml [tools] {TOOL} = {pin!r}); it validates "
            + ", ".join(steps + raw + own)
        ]
    problems = []
    jobs = [
        (steps, ("--schemafile", str(STEP_SCHEMA)), root, "vLLM CI step file"),
        (raw, BUILDKITE, root, "Buildkite pipeline"),
    ]
    for paths, schema, cwd, kind in jobs:
        if not paths:
            continue
        for path, errors in validate(binary, schema, cwd, paths).items():
            problems += [f"{patch_of(path)}: {path}: {kind}: {e}" for e in errors]
    if own:
        for path, errors in validate(binary, BUILDKITE, fork.root, own).items():
            problems += [f"fork's {path}: Buildkite pipeline: {e}" for e in errors]
    print(
        f"note: {TOOL} validated {len(steps)} vLLM CI step file(s) of the series "
        f"and {len(raw) + len(own)} Buildkite pipeline(s)"
    )
    return problems
