"""real_checkpoints' pure-Python parts: lock files and cache keys.

No tool runs here (that needs the tool venvs and minutes); these check that
a lock pip would half-accept is refused, that the cache key moves with
each thing a written checkpoint depends on, and that the registry is whole.

Run with the fork's venv: ``.venv/bin/python -m pytest -q tests/test_real_checkpoints.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from real_checkpoints import cache, locks  # noqa: E402
from real_checkpoints.formats import FORMATS, TOOLS as TOOL_TABLE  # noqa: E402

H1 = "a" * 64
H2 = "b" * 64


def test_lock_parses_pins_with_hashes() -> None:
    text = (
        "# comment\n\n"
        f"torch==2.13.0 --hash=sha256:{H1}\n"
        f"Compressed_Tensors==0.19.0 \\\n    --hash=sha256:{H1} \\\n"
        f"    --hash=sha256:{H2}\n"
    )
    pins = locks.parse_lock(text)
    assert [(p.name, p.version) for p in pins] == [
        ("torch", "2.13.0"),
        ("compressed-tensors", "0.19.0"),
    ]
    assert pins[1].hashes == (H1, H2)
    # What we write reads back.
    assert locks.parse_lock("\n".join(p.line() for p in pins)) == pins


@pytest.mark.parametrize(
    "line, why",
    [
        ("torch==2.13.0", "no --hash"),
        (f"torch>=2.13 --hash=sha256:{H1}", "not a name==version"),
        (f"torch --hash=sha256:{H1}", "not a name==version"),
        (f"torch==2.13.0 --hash=md5:{H1[:32]}", "unexpected"),
        (f"torch==2.13.0 --hash=sha256:{H1[:40]}", "unexpected"),
        (f"torch==2.13.0 --no-deps --hash=sha256:{H1}", "unexpected"),
        (f"-r other.txt --hash=sha256:{H1}", "not a name==version"),
    ],
)
def test_lock_rejects_unpinned_or_unhashed(line: str, why: str) -> None:
    text = f"numpy==2.4.6 --hash=sha256:{H2}\n{line}\n"
    with pytest.raises(locks.LockError, match=why) as info:
        locks.parse_lock(text, "x.txt")
    assert "x.txt:2:" in str(info.value)


def test_lock_rejects_a_package_twice() -> None:
    text = f"numpy==2.4.6 --hash=sha256:{H1}\nNumPy==2.4.6 --hash=sha256:{H2}\n"
    with pytest.raises(locks.LockError, match="twice"):
        locks.parse_lock(text)


def test_lock_from_report_hashes_local_files(tmp_path: Path) -> None:
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    report = {
        "install": [
            {
                "metadata": {"name": "torch", "version": "2.13.0+cpu"},
                "download_info": {"url": wheel.as_uri(), "archive_info": {}},
            },
            {
                "metadata": {"name": "Accelerate", "version": "1.15.0"},
                "download_info": {
                    "url": "https://files.example/accelerate.whl",
                    "archive_info": {"hashes": {"sha256": H1}},
                },
            },
        ]
    }
    pins = locks.parse_lock(locks.lock_from_report(report, "# header"))
    assert [(p.name, p.version) for p in pins] == [
        ("accelerate", "1.15.0"),
        ("torch", "2.13.0"),
    ]
    assert pins[1].hashes == (locks.file_sha256(wheel),)


def test_committed_locks_are_complete() -> None:
    for name, tool in TOOL_TABLE.items():
        pins = {p.name: p.version for p in locks.read_lock(name)}
        assert pins.get("torch") == locks.TORCH_VERSION, name
        assert pins.get(locks.normalize(tool.package)) == tool.version, name


def _key(
    fmt: str = "llmc-w4a16", lock: str = H1, recipe: str = H1, base: str = H1
) -> str:
    return cache.cache_key(FORMATS[fmt], lock, recipe, base)


def test_cache_key_moves_with_each_input() -> None:
    key = _key()
    assert key == _key()
    assert _key(lock=H2) != key
    assert _key(recipe=H2) != key
    assert _key(base=H2) != key
    assert _key(fmt="llmc-w8a16") != key


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_base_digest_sees_every_file_but_the_stamp(tmp_path: Path) -> None:
    base = _write(tmp_path / "b", {"config.json": b"{}", "model.safetensors": b"w"})
    digest = cache.dir_digest(base)
    (base / cache.STAMP).write_text("{}")
    assert cache.dir_digest(base) == digest
    (base / "model.safetensors").write_bytes(b"W")
    assert cache.dir_digest(base) != digest
    (base / "model.safetensors").write_bytes(b"w")
    (base / "tokenizer.json").write_bytes(b"")
    assert cache.dir_digest(base) != digest


def test_lock_and_recipe_digests_follow_their_files(tmp_path, monkeypatch) -> None:
    tool = FORMATS["ar-gptq"].tool
    recipes = _write(tmp_path / "recipes", {f"{tool.name}.py": b"a", "_calib.py": b"c"})
    lockdir = _write(tmp_path / "locks", {f"{tool.name}.txt": b"l"})
    monkeypatch.setattr(cache, "RECIPES", recipes)
    monkeypatch.setattr(locks, "LOCKS", lockdir)
    recipe, lock = cache.recipe_digest(tool), locks.lock_digest(tool.name)
    (recipes / "_calib.py").write_bytes(b"C")  # a shared helper counts too
    assert cache.recipe_digest(tool) != recipe
    (lockdir / f"{tool.name}.txt").write_bytes(b"L")
    assert locks.lock_digest(tool.name) != lock


def test_ensure_reuses_a_stamped_dir_and_rebuilds_a_stale_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_CACHE", str(tmp_path))
    base = _write(tmp_path / "real-checkpoints" / "base-bf16", {"config.json": b"{}"})
    monkeypatch.setattr(cache, "ensure_base", lambda log=print: base)
    fmt = FORMATS["llmc-w8a16"]
    key = cache.cache_key(
        fmt,
        locks.lock_digest(fmt.tool.name),
        cache.recipe_digest(fmt.tool),
        cache.dir_digest(base),
    )
    out = _write(cache.format_dir(fmt), {"config.json": b"{}"})
    cache._publish(out, out.with_name("x"), {"key": key})
    out.with_name("x").rename(out)
    assert cache.ensure(fmt.name) == (out, base)

    # A stale stamp must run the tool; stop at the venv to show it would.
    (out / cache.STAMP).write_text('{"key": "old"}')

    class Ran(Exception):
        pass

    def no_venv(*a, **k):
        raise Ran

    monkeypatch.setattr(locks, "ensure_venv", no_venv)
    with pytest.raises(Ran):
        cache.ensure(fmt.name)


def test_registry() -> None:
    for f in FORMATS.values():
        assert (cache.RECIPES / f"{f.tool.name}.py").exists(), f.name
        assert locks.lock_path(f.tool.name).exists(), f.name
    assert {f.tool.name for f in FORMATS.values()} == set(TOOL_TABLE)
