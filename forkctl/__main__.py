"""python3 -m forkctl VERB: the fork's patch-series workflow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import (
    build,
    check,
    config,
    export,
    rebase,
    status,
    testing,
    tree,
    trial,
    upstream,
)
from .errors import ForkError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forkctl", description=__doc__)
    parser.add_argument(
        "--line",
        metavar="VERSION",
        help="work on the line kept in lines/VERSION/ instead of the main line",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser(
        "sync", help="materialize ./tree: pinned base + patches/series"
    )
    p.add_argument(
        "--force", action="store_true", help="discard local work in the tree"
    )
    verbs.add_parser("export", help="write the tree's commits back to patches/")
    verbs.add_parser("check", help="validate headers, series, exact application, ruff")
    p = verbs.add_parser("build", help="install the tree as `vllm` in .venv")
    p.add_argument("--target", choices=build.TARGETS, default="cpu")
    verbs.add_parser("status", help="a table of the series")
    p = verbs.add_parser("test", help="run the series' tests inside the tree")
    p.add_argument(
        "--each",
        action="store_true",
        help="each patch's own tests at its own commit of the tree",
    )
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    verbs.add_parser("version", help="print the version string the build installs")
    p = verbs.add_parser(
        "rebase",
        help="move the series onto a newer upstream release, stopping at conflicts",
    )
    p.add_argument("--onto", metavar="VERSION", help="upstream release")
    step = p.add_mutually_exclusive_group()
    step.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="take the resolved tree as the current patch and go on",
    )
    step.add_argument(
        "--skip", action="store_true", help="drop the current patch and go on"
    )
    step.add_argument(
        "--abort",
        action="store_true",
        help="remove the rebase's tree and state (the old line stays as it is)",
    )
    step.add_argument(
        "--dry-run",
        action="store_true",
        help="only report an outcome per patch, in a trial tree of its own",
    )
    p.add_argument("--reason", help="with --skip: why the patch is dropped")
    p.add_argument(
        "--sha256", help="the target sdist's sha256 (default: fork.toml [rebase.sdist])"
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="PREFIX",
        help="with --dry-run: write PREFIX.json and PREFIX.md "
        "(default: build/rebase-VERSION/report)",
    )
    p.add_argument(
        "--force", action="store_true", help="start again over a rebase in progress"
    )
    p = verbs.add_parser(
        "upstream",
        help="write a patch as its contributor sends it upstream (DCO sign-off)",
    )
    p.add_argument("patch", help="file name in patches/series, or its position")
    p.add_argument(
        "--signoff",
        metavar="'NAME <EMAIL>'",
        help="the contributor (default: git config user.name and user.email)",
    )
    p.add_argument(
        "--out", type=Path, help="folder to write it to (default: build/upstream)"
    )
    args = parser.parse_args(argv)

    try:
        fork = config.load(line=args.line)
        if args.verb == "sync":
            tree.sync(fork, force=args.force)
        elif args.verb == "export":
            names = export.export(fork)
            print(f"exported {len(names)} patches to {fork.patches_dir}")
        elif args.verb == "check":
            return check.report(fork)
        elif args.verb == "build":
            build.build(fork, args.target)
        elif args.verb == "status":
            print(status.render(fork))
        elif args.verb == "test":
            if args.each:
                return testing.run_each(fork, args.pytest_args)
            return testing.run_tests(fork, args.pytest_args)
        elif args.verb == "version":
            print(build.fork_version(fork, "cpu"))
        elif args.verb == "upstream":
            path = upstream.for_upstream(fork, args.patch, args.signoff, args.out)
            print(f"{path}: `git am -k` it on upstream main and open the pull request")
        elif args.verb == "rebase":
            return _rebase(fork, args, parser)
    except ForkError as e:
        print(f"forkctl {args.verb}: {e}", file=sys.stderr)
        return 1
    return 0


def _rebase(
    fork: config.Fork, args: argparse.Namespace, parser: argparse.ArgumentParser
) -> int:
    if args.reason is not None and not args.skip:
        parser.error("--reason goes with --skip")
    if args.report is not None and not args.dry_run:
        parser.error("--report goes with --dry-run")
    if args.resume:
        return rebase.resume(fork, args.onto)
    if args.skip:
        return rebase.skip(fork, args.reason, args.onto)
    if args.abort:
        target = rebase.abort(fork, args.onto)
        print(f"rebase onto {target} aborted: ./tree, patches/ and fork.toml as before")
        return 0
    if not args.onto:
        parser.error("--onto VERSION is needed (or --continue, --skip, --abort)")
    if not args.dry_run:
        return rebase.start(fork, args.onto, args.sha256, force=args.force)
    result = trial.dry_run(fork, args.onto, args.sha256, args.report)
    counts = result.counts()
    print(
        f"{len(result.patches)} patches onto {args.onto}: "
        + ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    )
    print(f"the trial: {result.tree}")
    if counts[trial.CONFLICTS] or counts[trial.BREAKS]:
        print(
            f"{counts[trial.CONFLICTS] + counts[trial.BREAKS]} patch(es) to work on: "
            "see the report"
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
