"""--line VERSION: the verbs work on a line kept in lines/VERSION/, which has its
own fork.toml, patches/, tree and venv, beside the main line at the root."""

from __future__ import annotations

import shutil

from conftest import PATCH_RETRIES


def test_a_line_has_its_own_pins_series_and_tree(series_fork, monkeypatch):
    # Keep the main line's standard series as the line "1.0"; the main line
    # goes on with the first patch only.
    line = series_fork.root / "lines" / "1.0"
    line.mkdir(parents=True)
    shutil.copy(series_fork.root / "fork.toml", line / "fork.toml")
    shutil.copytree(series_fork.patches, line / "patches")
    first = series_fork.series()[0]
    (series_fork.patches / "series").write_text(first + "\n")
    for path in series_fork.patches.glob("*.patch"):
        if path.name != first:
            path.unlink()
    monkeypatch.delenv("FORK_TREE")
    monkeypatch.delenv("FORK_VENV")

    def patch_rows(out: str) -> list[str]:
        # the table's rows; status also says how far the base is behind
        return [row for row in out.splitlines()[2:] if ".patch" in row]

    main_rows = patch_rows(series_fork.ok("status").out)
    line_rows = patch_rows(series_fork.ok("--line", "1.0", "status").out)
    assert len(main_rows) == 1 and len(line_rows) == 3
    assert "series ok: 3 patches" in series_fork.ok("--line", "1.0", "check").out
    assert "series ok: 1 patches" in series_fork.ok("check").out

    series_fork.ok("--line", "1.0", "sync")
    series_fork.ok("sync")
    line_log = (line / "tree" / "demo" / "defaults.cfg").read_text()
    main_log = (series_fork.root / "tree" / "demo" / "defaults.cfg").read_text()
    assert "retry_backoff = 0.5" in line_log and "retry_backoff" not in main_log
    assert "max_retries = 5" in main_log
    assert PATCH_RETRIES in series_fork.ok("--line", "1.0", "status").out


def test_an_unknown_line_names_the_lines_there_are(series_fork):
    (series_fork.root / "lines" / "1.0").mkdir(parents=True)
    shutil.copy(series_fork.root / "fork.toml", series_fork.root / "lines" / "1.0")
    result = series_fork.run("--line", "0.9", "status")
    assert result.rc == 1
    assert "no line '0.9'" in result.err and "(lines: 1.0)" in result.err
