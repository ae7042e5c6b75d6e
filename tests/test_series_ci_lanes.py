"""Every test module the series adds or changes is run by a CI step it adds.

`make test` runs the series' tests here, but upstream only runs what a step
of its Buildkite pipelines names: a test module that no step names would
never run in upstream's CI once the patches are merged.
"""

from __future__ import annotations

from conftest import REPO

from forkctl import config, patchfile, series


def _series_test_modules(fork) -> set[str]:
    found = set()
    for name in series.read(fork.series_file):
        for diff in patchfile.parse(fork.patches_dir / name).files:
            path = diff.new_path or ""
            base = path.rsplit("/", 1)[-1]
            if path.startswith("tests/") and base.startswith("test_") and (
                path.endswith(".py")
            ):
                found.add(path)
    return found


def _added_ci_lines(fork) -> str:
    lines = []
    for name in series.read(fork.series_file):
        text = (fork.patches_dir / name).read_text()
        in_ci = False
        for line in text.splitlines():
            if line.startswith("+++ "):
                in_ci = line.startswith("+++ b/.buildkite/")
            elif in_ci and line.startswith("+"):
                lines.append(line[1:])
    return "\n".join(lines)


def test_every_series_test_module_is_run_by_a_ci_step():
    fork = config.load(REPO)
    modules = _series_test_modules(fork)
    assert modules, "the series adds no test modules"
    ci = _added_ci_lines(fork)
    not_run = sorted(m for m in modules if m not in ci)
    assert not not_run, (
        "test modules the series adds or changes that no CI step of the "
        f"series runs (add them to .buildkite/hardware_tests/cpu.yaml): {not_run}"
    )
