"""status: one row per series entry, with subject, size and Upstream-Status;
then how many releases the base is behind and which Accepted trailers are due."""

from __future__ import annotations

from conftest import PATCH_BACKOFF, PATCH_DOCS, PATCH_RETRIES, PROJECT, SIGNED_OFF

from forkctl import releases, status

ORIGIN = "Origin: upstream, https://github.com/vllm-project/vllm/pull/4242"


def table(fork) -> list[str]:
    """The table: the lines before the first blank one."""
    lines = fork.ok("status").out.splitlines()
    return lines[: lines.index("")]


def footer(fork) -> list[str]:
    lines = fork.ok("status").out.splitlines()
    return lines[lines.index("") + 1 :]


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


def add_accepted(fork, subject: str, version: str) -> str:
    fork.write(f"docs/{version}.md", f"Accepted in {version}.\n")
    fork.commit(
        subject, trailers=(ORIGIN, SIGNED_OFF, f"Upstream-Status: Accepted {version}")
    )
    fork.ok("export")
    return fork.series()[-1]


def test_status_counts_the_releases_the_base_is_behind(series_fork, monkeypatch):
    fork = series_fork
    due = add_accepted(fork, "[Docs] Upstream took this page in 1.1", "1.1")
    later = add_accepted(fork, "[Docs] Upstream takes this page in 3.0", "3.0")
    asked = []

    def versions(project):
        asked.append(project)
        return ["0.9", "1.0", "1.1", "2.0"]

    monkeypatch.setattr(status, "index_versions", versions)

    lines = footer(fork)

    assert asked == [PROJECT]
    assert lines[0] == "base demo 1.0: 2 release(s) behind (1.1, 2.0); newest 2.0"
    assert lines[1].startswith("Accepted at or below 2.0, the newest release")
    assert lines[2:] == [f"  {due} (Accepted 1.1)"]
    assert later not in "\n".join(lines)

    monkeypatch.setattr(status, "index_versions", lambda project: ["0.9", "1.0"])
    assert footer(fork) == [
        "base demo 1.0: up to date (newest release 1.0)",
        "no patch has an Accepted trailer at or below 1.0",
    ]


def test_status_reads_the_releases_from_the_index(series_fork, tmp_path, monkeypatch):
    """Final releases from the file names of the project's index page."""
    page = tmp_path / "index" / PROJECT
    page.mkdir(parents=True)
    files = [
        "demo-1.0.tar.gz",
        "demo-1.1.tar.gz",
        "demo-2.0-py3-none-any.whl",
        "demo-2.1rc1.tar.gz",
        "demo_extra-9.0.tar.gz",
    ]
    (page / "index.html").write_text(
        "".join(f'<a href="../../files/{f}#sha256={"0" * 64}">{f}</a>\n' for f in files)
    )
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri() + "/")

    assert footer(series_fork)[0] == (
        "base demo 1.0: 2 release(s) behind (1.1, 2.0); newest 2.0"
    )


def test_status_without_an_index_says_unknown(series_fork):
    fork = series_fork
    due = add_accepted(fork, "[Docs] Upstream took this page in 1.1", "1.1")

    lines = footer(fork)  # the fixture's index is a folder that does not exist

    assert lines[0].startswith("base demo 1.0: releases behind: unknown (no index: ")
    assert lines[1:] == [
        "patches with Accepted trailers (the newest release unknown):",
        f"  {due} (Accepted 1.1)",
    ]


def test_releases_from_the_json_simple_api():
    listed = '{"meta": {"api-version": "1.1"}, "versions": ["1.0", "1.1rc1", "1.1"]}'
    assert releases.versions_in(listed, "demo") == {"1.0", "1.1rc1", "1.1"}
    files = '{"files": [{"filename": "demo-1.2.tar.gz"}, {"filename": "x-9.tar.gz"}]}'
    assert releases.versions_in(files, "demo") == {"1.2"}
    assert [
        v for v in ["1.1rc1", "1.1", "1.0.post1", "2.0.dev3"] if releases.is_release(v)
    ] == ["1.1", "1.0.post1"]
