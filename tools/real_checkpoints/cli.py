"""Command line of real_checkpoints (``python tools/real_checkpoints ...``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from . import __doc__ as package_doc
from . import cache, locks
from .formats import FORMATS, TOOLS
from .summary import summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="real_checkpoints", description=(package_doc or "").splitlines()[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the formats, their tools and vLLM methods")
    p_lock = sub.add_parser("lock", help="resolve and write locks/<tool>.txt")
    p_lock.add_argument("tools", nargs="+", choices=sorted(TOOLS))
    p_venv = sub.add_parser("venv", help="install the tools' venvs from their locks")
    p_venv.add_argument("tools", nargs="+", choices=sorted(TOOLS))
    p_build = sub.add_parser("build", help="write formats (cached) and print dirs")
    p_build.add_argument("formats", nargs="+", help=f"'all' or of {sorted(FORMATS)}")
    p_build.add_argument("--keep-going", action="store_true")
    p_build.add_argument("--summary", action="store_true")
    p_sum = sub.add_parser("summary", help="describe a checkpoint's layout")
    p_sum.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)

    if args.cmd == "list":
        for f in FORMATS.values():
            print(
                f"{f.name:18} {f.tool.requirement:28} {f.scheme:18} "
                f"{f.quantization:20} {f.description}"
            )
        return 0
    if args.cmd == "lock":
        for name in args.tools:
            text = locks.resolve_lock(name, TOOLS[name].requirement)
            locks.parse_lock(text, name)  # what we write must read back
            locks.lock_path(name).write_text(text)
            print(f"wrote {locks.lock_path(name)} ({text.count('--hash=')} pins)")
        return 0
    if args.cmd == "venv":
        for name in args.tools:
            py = locks.ensure_venv(name, cache.venv_dir(TOOLS[name]))
            info = Path(py).parents[1] / ".install.json"
            print(f"{name}: {py} {info.read_text().strip()}")
        return 0
    if args.cmd == "summary":
        base = cache.ensure_base()
        for d in args.dirs:
            print(summarize(d, base))
        return 0

    names = list(FORMATS) if args.formats == ["all"] else args.formats
    unknown = [n for n in names if n not in FORMATS]
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {sorted(FORMATS)}")
    failed = []
    for name in names:
        t0 = time.monotonic()
        try:
            model_dir, twin_dir = cache.ensure(name)
        except (subprocess.CalledProcessError, RuntimeError) as e:
            print(
                f"{name}: FAILED after {time.monotonic() - t0:.0f} s: {e}",
                file=sys.stderr,
            )
            failed.append(name)
            if not args.keep_going:
                return 1
            continue
        stamp = cache.read_stamp(model_dir) or {}
        print(
            f"{name}: {model_dir} (twin {twin_dir}; written in "
            f"{stamp.get('seconds')} s)"
        )
        if args.summary:
            print(summarize(model_dir, twin_dir))
    if failed:
        print("failed: " + json.dumps(failed), file=sys.stderr)
    return 1 if failed else 0
