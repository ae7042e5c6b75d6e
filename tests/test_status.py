"""status: one row per series entry, with subject, size and Upstream-Status."""

from __future__ import annotations

from conftest import PATCH_BACKOFF, PATCH_DOCS, PATCH_RETRIES, SIGNED_OFF


def table(fork) -> list[str]:
    return fork.ok("status").out.splitlines()


def test_status_lists_each_patch_with_subject_and_upstream_status(series_fork):
    lines = table(series_fork)
    names = series_fork.series()
    header, rule, *rows = lines
    assert header.split() == ["patch", "subject", "files", "lines", "upstream"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert len(rows) == 3

    expected = [
        (names[0], PATCH_RETRIES, "1", "+1/-1", "Pending"),
        (
            names[1],
            PATCH_DOCS,
            "1",
            "+3/-0",
            "Submitted https://github.com/vllm-project/vllm/pull/12345",
        ),
        # The subject format-patch folded over two header lines, unfolded.
        (names[2], PATCH_BACKOFF, "1", "+2/-1", "Pending"),
    ]
    for row, (name, subject, files, changed, upstream) in zip(rows, expected):
        assert row.startswith(name + " ")
        assert f" {subject} " in row
        assert f" {files} " in row and f" {changed} " in row
        assert row.endswith(" " + upstream)


def test_status_columns_line_up(series_fork):
    header, rule, *rows = table(series_fork)
    subject_col = header.index("subject")
    upstream_col = header.index("upstream")
    for row in rows:
        assert row[subject_col - 1] == " " and row[subject_col] == "["
        assert (
            row[upstream_col - 1] == " "
            and row[upstream_col : upstream_col + 1].isalpha()
        )


def test_status_marks_missing_patches_and_absent_status(series_fork):
    fork = series_fork
    fork.write("docs/extra.md", "Extra.\n")
    fork.commit("[Docs] Explain the naïve batching defaults", trailers=(SIGNED_OFF,))
    fork.ok("export")
    with (fork.patches / "series").open("a") as f:
        f.write("ghost.patch\n")

    *_, unstated, ghost = table(fork)
    assert "[Docs] Explain the naïve batching defaults" in unstated
    assert unstated.endswith("(none)")
    assert ghost.startswith("ghost.patch ") and "(missing)" in ghost
