"""check: headers, the series file and exact application, all reported at once."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import DEFAULTS_CFG, PENDING, SIGNED_OFF

GOOD_SUBJECT = "[Docs] Add a troubleshooting page for the fork"


def problems(result) -> list[str]:
    return [line for line in result.out.splitlines() if line.startswith("problem: ")]


def assert_reports(result, *expected: str) -> None:
    """check failed, and each expected text is in some reported problem."""
    assert result.rc == 1, result.text
    found = problems(result)
    assert f"{len(found)} problem(s) in the series" in result.out
    for text in expected:
        assert any(text in p for p in found), f"{text!r} not reported in:\n{result.out}"


def add_patch(fork, subject=GOOD_SUBJECT, trailers=(SIGNED_OFF, PENDING), **kw) -> str:
    """Commit a new docs file on top of the series, export; the new patch's name."""
    fork.write("docs/troubleshooting.md", "# Troubleshooting\n\nRaise max_retries.\n")
    fork.commit(subject, trailers=trailers, **kw)
    fork.ok("export")
    return fork.series()[-1]


def test_good_series_passes(series_fork):
    result = series_fork.run("check")
    assert result.rc == 0, result.text
    assert problems(result) == []
    assert "series ok: 3 patches" in result.out


# -- the patch headers ---------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"trailers": (PENDING,)}, "no Signed-off-by: trailer"),
        ({"trailers": (SIGNED_OFF,)}, "no Upstream-Status: trailer"),
        (
            {"trailers": (SIGNED_OFF, "Upstream-Status: Maybe later")},
            "Upstream-Status 'Maybe later' is not one of",
        ),
        (
            {"trailers": (SIGNED_OFF, "Upstream-Status: Submitted")},  # no link
            "Upstream-Status 'Submitted' is not one of",
        ),
        (
            {"subject": "Add a troubleshooting page for the fork"},
            "is not PR-style",
        ),
        ({"subject": "[Docs]Add a troubleshooting page"}, "is not PR-style"),
        ({"body": "Docs."}, "the description does not say why the patch exists"),
    ],
    ids=[
        "no-signoff",
        "no-upstream-status",
        "invalid-upstream-status",
        "submitted-without-link",
        "no-tag",
        "no-space-after-tag",
        "no-description",
    ],
)
def test_bad_header_is_reported(series_fork, change, expected):
    name = add_patch(series_fork, **change)
    result = series_fork.run("check")
    assert_reports(result, f"problem: {name}: ")
    assert_reports(result, expected)
    assert len(problems(result)) == 1, result.out


ORIGIN = "Origin: upstream, https://github.com/vllm-project/vllm/pull/23456"
ORIGIN_2 = "Origin: upstream, https://github.com/vllm-project/vllm/pull/34567"


@pytest.mark.parametrize(
    "trailers",
    [
        (SIGNED_OFF, "Upstream-Status: Not-needed"),
        (ORIGIN, SIGNED_OFF, "Upstream-Status: Accepted v1.1.0"),
        (ORIGIN, ORIGIN_2, SIGNED_OFF, "Upstream-Status: Accepted 1.0.1"),
        (ORIGIN, SIGNED_OFF, PENDING),  # merged upstream, in no release yet
        (
            SIGNED_OFF,
            "Upstream-Status: Submitted https://github.com/vllm-project/vllm/pull/12345",
        ),
    ],
    ids=["not-needed", "accepted", "accepted-two-origins", "pending", "submitted"],
)
def test_other_valid_upstream_statuses_pass(series_fork, trailers):
    add_patch(series_fork, trailers=trailers)
    result = series_fork.run("check")
    assert result.rc == 0, result.text


@pytest.mark.parametrize(
    ("trailers", "expected"),
    [
        (
            (SIGNED_OFF, "Upstream-Status: Accepted v1.1.0"),
            "Upstream-Status 'Accepted v1.1.0' needs an 'Origin: upstream, ",
        ),
        (
            (ORIGIN, SIGNED_OFF, "Upstream-Status: Accepted 1.0"),
            "the base 1.0 already carries it",
        ),
        (
            (
                "Origin: upstream, https://github.com/vllm-project/vllm/issues/1",
                SIGNED_OFF,
                PENDING,
            ),
            "Origin 'upstream, https://github.com/vllm-project/vllm/issues/1' is not of the form",
        ),
        (
            (
                "Origin: https://github.com/vllm-project/vllm/pull/23456",
                SIGNED_OFF,
                PENDING,
            ),
            "is not of the form",
        ),
        ((ORIGIN, ORIGIN, SIGNED_OFF, PENDING), "is given 2 times"),
        (
            (ORIGIN, SIGNED_OFF, "Upstream-Status: Not-needed"),
            "'Not-needed' contradicts Origin",
        ),
    ],
    ids=[
        "accepted-without-origin",
        "accepted-by-the-base",
        "origin-not-a-pr",
        "origin-without-upstream",
        "duplicate-origin",
        "not-needed-with-origin",
    ],
)
def test_bad_origin_is_reported(series_fork, trailers, expected):
    name = add_patch(series_fork, trailers=trailers)
    result = series_fork.run("check")
    assert_reports(result, f"problem: {name}: ")
    assert_reports(result, expected)
    assert len(problems(result)) == 1, result.out


def test_non_ascii_subject_is_read_decoded(series_fork):
    """format-patch RFC 2047-encodes a non-ASCII Subject: header."""
    name = add_patch(series_fork, subject="[Docs] Explain the naïve batching defaults")
    assert "Subject: =?UTF-8?q?" in (series_fork.patches / name).read_text()
    result = series_fork.run("check")
    assert result.rc == 0, result.text


# -- the series file -----------------------------------------------------------


def test_patch_file_not_in_series(series_fork):
    first = series_fork.series()[0]
    shutil.copy(series_fork.patches / first, series_fork.patches / "stray.patch")
    assert_reports(
        series_fork.run("check"), "patches/stray.patch: not listed in patches/series"
    )


def test_series_entry_without_file(series_fork):
    with (series_fork.patches / "series").open("a") as f:
        f.write("ghost.patch\n")
    assert_reports(
        series_fork.run("check"),
        "patches/series: ghost.patch is listed but not in patches/",
    )


def test_duplicate_series_entry(series_fork):
    second = series_fork.series()[1]
    with (series_fork.patches / "series").open("a") as f:
        f.write(second + "\n")
    assert_reports(
        series_fork.run("check"), f"patches/series: {second} is listed 2 times"
    )


# -- exact application ---------------------------------------------------------


def apply_with_patch(base, patch_file) -> str:
    """What GNU patch says about applying patch_file to base (it allows offset and fuzz)."""
    proc = subprocess.run(
        ["patch", "--dry-run", "-p1", "-F2", "-i", str(patch_file)],
        cwd=base,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def git_apply_ok(base, patch_file) -> bool:
    proc = subprocess.run(
        ["git", "apply", "--check", str(patch_file)], cwd=base, capture_output=True
    )
    return proc.returncode == 0


def test_patch_that_needs_an_offset_after_a_base_change(series_fork, tmp_path):
    fork = series_fork
    first = fork.series()[0]
    header = "# Copyright the demo authors.\n# SPDX-License-Identifier: Apache-2.0\n\n"
    fork.rebase_onto(**{"demo/defaults.cfg": header + DEFAULTS_CFG})
    # The premise: tools that allow an offset still apply it.
    base = fork.unpack_base(tmp_path / "unpacked")
    assert git_apply_ok(base, fork.patches / first)
    if shutil.which("patch"):
        assert "offset 3 lines" in apply_with_patch(base, fork.patches / first)

    assert_reports(
        fork.run("check"),
        f"{first}: demo/defaults.cfg: hunk @@ -2,7 +2,7 @@ does not match the file at line 2",
        f"{first}: later patches were checked without it",
    )


def test_patch_that_needs_an_offset_after_a_header_edit(series_fork):
    fork = series_fork
    first = fork.patches / fork.series()[0]
    text = first.read_text()
    assert "@@ -2,7 +2,7 @@" in text
    first.write_text(text.replace("@@ -2,7 +2,7 @@", "@@ -4,7 +4,7 @@"))
    assert_reports(
        fork.run("check"), f"{first.name}: demo/defaults.cfg: hunk @@ -4,7 +4,7 @@"
    )


def test_patch_that_needs_fuzz(series_fork, tmp_path):
    fork = series_fork
    first = fork.patches / fork.series()[0]
    text = first.read_text()
    assert "\n [engine]\n" in text  # the hunk's first context line
    first.write_text(text.replace("\n [engine]\n", "\n [engine-settings]\n"))
    base = fork.unpack_base(tmp_path / "unpacked")
    assert not git_apply_ok(base, first)  # git apply does no fuzz ...
    if shutil.which("patch"):  # ... but patch does
        assert "with fuzz 1" in apply_with_patch(base, first)

    assert_reports(
        fork.run("check"),
        f"{first.name}: demo/defaults.cfg: hunk @@ -2,7 +2,7 @@ does not match",
    )


def test_binary_patch_that_does_not_apply(series_fork):
    fork = series_fork
    logo = fork.tree / "docs" / "logo.bin"
    fork.write("docs/logo.bin", logo.read_bytes()[::-1])
    fork.commit("[Docs] Use the new logo in the documentation")
    fork.ok("export")
    binary = fork.series()[3]
    fork.rebase_onto(**{"docs/logo.bin": b"another logo\0"})
    assert_reports(fork.run("check"), f"{binary}: git apply failed:", "docs/logo.bin")


def test_every_problem_is_reported_in_one_run(series_fork):
    fork = series_fork
    unsigned = add_patch(fork, trailers=(PENDING,))
    names = fork.series()
    first = fork.patches / names[0]
    first.write_text(first.read_text().replace("@@ -2,7 +2,7 @@", "@@ -3,7 +3,7 @@"))
    shutil.copy(first, fork.patches / "stray.patch")
    with (fork.patches / "series").open("a") as f:
        f.write(f"ghost.patch\n{names[1]}\n")

    assert_reports(
        fork.run("check"),
        "patches/series: ghost.patch is listed but not in patches/",
        f"patches/series: {names[1]} is listed 2 times",
        "patches/stray.patch: not listed in patches/series",
        f"{unsigned}: no Signed-off-by: trailer",
        f"{names[0]}: demo/defaults.cfg: hunk @@ -3,7 +3,7 @@ does not match",
    )
