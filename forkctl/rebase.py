"""rebase: move the series onto a newer upstream release, patch by patch.

``rebase --onto VERSION`` unpacks the target's sdist (verified against
``--sha256``, fork.toml ``[rebase.sdist]``, or else the sha256 the index
publishes, printed to be pinned) as the base of ``build/rebase-VERSION/tree``,
fetches the old base plus the series into it (the blobs ``git am -3`` needs),
and applies the series in order:

- a patch whose whole change the target already has (every hunk applies in
  reverse, the files it creates exist with its content, or the three-way merge
  leaves nothing) is dropped as absorbed, with the reason recorded;
  ``Upstream-Status: Accepted <v>`` alone never drops one: a patch it calls
  accepted whose content is not in the target is kept, and said so. A partly
  absorbed patch is applied with ``-3``: its commit carries what remains;
- the others are applied with ``git am``, else ``git am -3``;
- at the first patch that does not apply it stops, with the conflict in place
  in the tree (``git am`` in progress) and the state in
  ``build/rebase-VERSION/state.json`` (target, patches done, the current one,
  the skipped ones with reasons; no machine paths).

Then ``rebase --continue`` takes the resolved tree as that patch (its own
message and author) and goes on; ``rebase --skip [--reason TEXT]`` drops it;
``rebase --abort`` removes the tree and the state (``./tree``, ``patches/`` and
fork.toml are not touched before the end). At the end the series is exported
to ``patches/``, fork.toml's pins move to the target (the sdist always; a wheel
or torch only where ``[rebase.wheels.NAME]`` or ``[rebase.torch]`` pins the
target's: the rest is listed as left to move) and ``check`` runs.

``rebase --onto VERSION --dry-run`` (forkctl.trial) only reports: an outcome
per patch, in a tree of its own, without stopping.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from . import absorbed, artifacts, check, config, export, patchfile, pins, series
from .config import Artifact, Fork
from .errors import ForkError
from .git import BASE_IDENTITY, clean_env, git, out
from .tree import BASE_TAG, apply_series, commit_base, unpack_sdist

OLD_SERIES = "refs/forkctl/old-series"
AM = ("am", "--keep", "--keep-cr", "--quiet")
STATE = "state.json"
APPLIES = "applies"
THREE_WAY = "applies with 3-way"
RESOLVED = "resolved by hand"


def work_dir(fork: Fork, version: str) -> Path:
    return fork.root / "build" / f"rebase-{version}"


def rel(fork: Fork, path: Path) -> str:
    try:
        return str(path.relative_to(fork.root))
    except ValueError:
        return str(path)


def portable(text: str, fork: Fork) -> str:
    """The text without the machine's paths: the repository's own become
    relative, the venv's and cache's named by their variables, home as ~."""
    home = str(Path.home())
    places = [
        (str(fork.root) + "/", ""),
        (str(fork.root), "."),
        (str(fork.venv_dir), "$FORK_VENV"),
        (str(fork.cache_dir), "$FORK_CACHE"),
        (sys.executable, "python3"),
        (tempfile.gettempdir() + "/", "$TMPDIR/"),
    ]
    if len(home) > 1:
        places.append((home, "~"))
    for path, name in sorted(places, key=lambda p: -len(p[0])):
        text = text.replace(path, name)
    return text


def target_artifact(
    fork: Fork, version: str, pinned: str | None
) -> tuple[Artifact, str]:
    """The target's sdist with the sha256 to hold it to, and where that came from."""
    filename = fork.sdist.filename.replace(fork.version, version)
    if filename == fork.sdist.filename and version != fork.version:
        raise ForkError(
            f"cannot derive the {version} sdist's name from {fork.sdist.filename}"
        )
    unpinned = Artifact(fork.sdist.project, filename, "")
    if pinned:
        return Artifact(unpinned.project, filename, pinned.lower()), "--sha256 (pinned)"
    if version in fork.rebase_pins:
        return (
            Artifact(unpinned.project, filename, fork.rebase_pins[version]),
            "fork.toml [rebase.sdist] (pinned)",
        )
    if version == fork.version:
        return fork.sdist, "fork.toml [upstream.sdist] (pinned)"
    cached = fork.cache_dir / "downloads" / filename
    digest = artifacts.published_sha256(unpinned)
    print(
        f"{filename}: not pinned; the index publishes sha256 {digest}\n"
        f'  pin it in fork.toml:  [rebase.sdist]  "{version}" = "{digest}"',
        file=sys.stderr,
    )
    if cached.exists():
        artifacts.verify(cached, digest)
    return Artifact(
        unpinned.project, filename, digest
    ), "the sha256 the index publishes (not pinned yet)"


def am_env() -> dict[str, str]:
    return clean_env(**{k: v for k, v in BASE_IDENTITY.items() if "COMMITTER" in k})


def series_names(fork: Fork) -> list[str]:
    names = series.read(fork.series_file)
    for name in names:
        if not (fork.patches_dir / name).is_file():
            raise ForkError(f"{name}: listed in patches/series but not in patches/")
    return names


def prepare(fork: Fork, version: str, target: Artifact, tree: Path) -> list[str]:
    """The target as the base (tag ``base``) of a new tree at ``tree``, with the
    old base plus the series fetched into it; the old series' commits, in order."""
    names = series_names(fork)
    new_sdist = artifacts.fetch(fork, target)
    old_sdist = artifacts.fetch(fork, fork.sdist)
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="old-", dir=tree.parent) as scratch:
        old = Path(scratch) / "src"
        unpack_sdist(old_sdist, old)
        commit_base(old, fork, f"vLLM {fork.version} (previous base)")
        apply_series(fork, old)
        unpack_sdist(new_sdist, tree)
        commit_base(
            tree,
            fork,
            f"vLLM {version} (rebase target)\n\nUnpacked from {target.filename}, "
            f"sha256 {target.sha256}.",
        )
        git(tree, "fetch", "-q", "--no-tags", str(old), f"main:{OLD_SERIES}")
    git(tree, "tag", BASE_TAG)
    old_commits = old_series(tree)
    if len(old_commits) != len(names):
        raise ForkError("the series does not apply to its own base: run check")
    git(tree, "tag", "-f", "old-base", f"{OLD_SERIES}~{len(names)}")
    return old_commits


def old_series(tree: Path) -> list[str]:
    return out(tree, "rev-list", "--reverse", OLD_SERIES).split()[1:]


def accepted_in(patch: patchfile.Patch, version: str) -> str | None:
    """The version of an ``Upstream-Status: Accepted <v>`` with v <= version."""
    status = patch.upstream_status or ""
    if not status.startswith("Accepted "):
        return None
    accepted = patchfile._version_key(status.split(" ", 1)[1])
    target = patchfile._version_key(version)
    if accepted and target and accepted <= target:
        return status.split(" ", 1)[1]
    return None


def content_notes(
    patch: patchfile.Patch, found: absorbed.Absorption, version: str
) -> list[str]:
    """What the trailer and the content say, for a patch that is not absorbed."""
    notes = []
    if accepted := accepted_in(patch, version):
        notes.append(
            f"Upstream-Status says Accepted {accepted}, but {version} lacks "
            f"{len(found.remaining)} of {len(found.remaining) + len(found.absorbed)} "
            "of its hunks: kept; correct the trailer (Origin: "
            + (", ".join(patch.trailers.get("Origin", [])) or "none")
            + ")"
        )
    if found.partial:
        notes.append(
            f"partly absorbed: {version} already has "
            + "; ".join(found.absorbed)
            + " (what remains: "
            + "; ".join(found.remaining)
            + ")"
        )
    return notes


def absorbed_reason(
    patch: patchfile.Patch, found: absorbed.Absorption, version: str
) -> str:
    reason = (
        f"absorbed: {version} already has its change (every hunk applies in reverse)"
    )
    if accepted := accepted_in(patch, version):
        reason += f"; Upstream-Status Accepted {accepted} agrees"
    return reason


def conflict_regions(tree: Path, path: str) -> list[str]:
    target = tree / path
    if not target.is_file():
        return []
    starts = [
        str(n)
        for n, line in enumerate(target.read_text(errors="replace").split("\n"), 1)
        if line.startswith("<<<<<<< ")
    ]
    return [f"conflict markers at line(s) {', '.join(starts)}"] if starts else []


def has_markers(path: Path) -> bool:
    if not path.is_file():
        return False
    lines = path.read_text(errors="replace").split("\n")
    return any(line.startswith(("<<<<<<< ", ">>>>>>> ")) for line in lines)


def hunks_not_found(patch: patchfile.Patch, tree: Path) -> dict[str, list[str]]:
    """Per file, the patch's hunks whose old lines occur nowhere in the tree's file."""
    missing: dict[str, list[str]] = {}
    for diff in patch.files:
        if diff.old_path is None:
            if (tree / diff.path).exists():
                missing[diff.path] = ["new file, but the target already has it"]
            continue
        target = tree / diff.old_path
        if not target.is_file():
            missing[diff.old_path] = ["the target has no such file (moved or removed)"]
            continue
        if diff.binary:
            continue
        lines = target.read_text(errors="surrogateescape").split("\n")
        for hunk in diff.hunks:
            old, n = hunk.old_lines, len(hunk.old_lines)
            if not any(lines[i : i + n] == old for i in range(len(lines) - n + 1)):
                missing.setdefault(diff.old_path, []).append(
                    f"hunk {hunk.header.split(' @@')[0]} @@ not found"
                )
    return missing


def unmerged(tree: Path) -> list[str]:
    return sorted(set(out(tree, "diff", "--name-only", "--diff-filter=U").split()))


def duplicated_lines(tree: Path, old_commit: str, patch: patchfile.Patch) -> list[str]:
    """Lines a 3-way merge added that now occur more often than in the patch's own
    result: upstream made the same change elsewhere and the merge kept both."""
    notes = []
    for diff in patch.files:
        if not diff.new_path or diff.binary or not (tree / diff.new_path).is_file():
            continue
        theirs = git(tree, "show", f"{old_commit}:{diff.new_path}", check=False).stdout
        ours = (tree / diff.new_path).read_text(errors="replace")
        added = git(
            tree, "diff", "HEAD~1", "HEAD", "--", diff.new_path, check=False
        ).stdout
        lines = {
            line[1:].strip()
            for line in added.splitlines()
            if line.startswith("+") and not line.startswith("+++")
        }
        ours_count = Counter(line.strip() for line in ours.splitlines())
        theirs_count = Counter(line.strip() for line in theirs.splitlines())
        for line in sorted(lines):
            if len(line) < 12 or line.startswith("#"):
                continue
            if ours_count[line] > theirs_count[line]:
                notes.append(
                    f"{diff.new_path}: {line!r} occurs {ours_count[line]} times, "
                    f"{theirs_count[line]} in the patch's own result: check the merge "
                    "did not keep two copies of one change"
                )
    return notes


# -- the state of a rebase in progress ------------------------------------------


def save(work: Path, state: dict) -> None:
    (work / STATE).write_text(json.dumps(state, indent=2, ensure_ascii=False) + "\n")


def load(fork: Fork, version: str | None) -> tuple[Path, dict]:
    """The rebase in progress (onto ``version``, or the only one)."""
    if version:
        paths = [work_dir(fork, version) / STATE]
    else:
        paths = sorted((fork.root / "build").glob(f"rebase-*/{STATE}"))
    found = []
    for path in paths:
        if path.is_file():
            state = json.loads(path.read_text())
            if not state.get("finished"):
                found.append((path.parent, state))
    if not found:
        raise ForkError(
            "no rebase in progress (`forkctl rebase --onto VERSION` starts one)"
        )
    if len(found) > 1:
        targets = ", ".join(state["target"] for _, state in found)
        raise ForkError(f"rebases in progress onto {targets}: name one with --onto")
    return found[0]


def am_in_progress(tree: Path) -> bool:
    return (tree / ".git" / "rebase-apply").exists()


# -- the verbs --------------------------------------------------------------------


def start(
    fork: Fork, version: str, sha256: str | None = None, force: bool = False
) -> int:
    if version == fork.version:
        raise ForkError(f"the series is already on {version}")
    work = work_dir(fork, version)
    tree = work / "tree"
    if (tree.exists() or (work / STATE).exists()) and not force:
        raise ForkError(
            f"{rel(fork, tree)} exists (a rebase onto {version} in progress or left "
            "over): --continue, --skip or --abort it, or --force to start again"
        )
    target, source = target_artifact(fork, version, sha256)
    series_names(fork)
    for path in (tree, work / "patches"):
        if path.exists():
            shutil.rmtree(path)
    (work / STATE).unlink(missing_ok=True)
    prepare(fork, version, target, tree)
    # The series as it was at the start: patches/ is not touched until the end.
    names = series_names(fork)
    (work / "patches").mkdir()
    for name in names:
        shutil.copy2(fork.patches_dir / name, work / "patches" / name)
    state = {
        "base": fork.version,
        "target": version,
        "sdist": {
            "filename": target.filename,
            "sha256": target.sha256,
            "verified_against": source,
        },
        "series": names,
        "done": [],
        "current": None,
        "skipped": [],
        "todo": list(names),
    }
    save(work, state)
    return advance(fork, work, state)


def advance(fork: Fork, work: Path, state: dict) -> int:
    """Apply the patches still to do; stop at one that does not apply."""
    tree = work / "tree"
    version = state["target"]
    old = dict(zip(state["series"], old_series(tree)))
    env = am_env()
    while state["todo"]:
        name = state["todo"][0]
        path = work / "patches" / name
        patch = patchfile.parse(path)
        entry = {"patch": name, "subject": patch.subject}
        found, _ = absorbed.absorption(tree, path.read_text(encoding="utf-8"))
        if found.full:
            entry["reason"] = absorbed_reason(patch, found, version)
            state["skipped"].append(entry)
            state["todo"].pop(0)
            save(work, state)
            print(f"{'absorbed':>20}  {name}", file=sys.stderr)
            continue
        notes = content_notes(patch, found, version)
        head = out(tree, "rev-parse", "HEAD")
        how = APPLIES
        if git(tree, *AM, str(path), env=env, check=False).returncode != 0:
            git(tree, "am", "--abort", env=env, check=False)
            missing = hunks_not_found(patch, tree)
            how = THREE_WAY
            merged = git(tree, *AM, "-3", str(path), env=env, check=False)
            if merged.returncode != 0:
                conflicts = {p: conflict_regions(tree, p) for p in unmerged(tree)}
                for p, hunks in missing.items():
                    conflicts.setdefault(p, []).extend(hunks)
                if not conflicts:
                    message = (merged.stderr or merged.stdout).strip()[-300:]
                    conflicts["?"] = [portable(message, fork)]
                state["todo"].pop(0)
                state["current"] = {
                    **entry,
                    "position": state["series"].index(name) + 1,
                    "conflicts": dict(sorted(conflicts.items())),
                    "notes": notes,
                    "head": head,
                }
                save(work, state)
                print(stopped(fork, work, state))
                return 2
            if out(tree, "rev-parse", "HEAD") == head:
                entry["reason"] = (
                    f"absorbed: {version} already has its change (the 3-way merge "
                    "left nothing to commit)"
                )
                state["skipped"].append(entry)
                state["todo"].pop(0)
                save(work, state)
                print(f"{'absorbed':>20}  {name}", file=sys.stderr)
                continue
            notes += duplicated_lines(tree, old[name], patch)
        state["done"].append({**entry, "how": how, "notes": notes})
        state["todo"].pop(0)
        save(work, state)
        print(f"{how:>20}  {name}", file=sys.stderr)
        for note in notes:
            print(f"{'':>20}  note: {note}", file=sys.stderr)
    return finish(fork, work, state)


def stopped(fork: Fork, work: Path, state: dict) -> str:
    current = state["current"]
    tree = rel(fork, work / "tree")
    lines = [
        f"stopped at patch {current['position']} of {len(state['series'])}, "
        f"{current['patch']}: {current['subject']}",
    ]
    for path, found in current["conflicts"].items():
        lines.append(f"  {path}: " + "; ".join(found or ["conflicted"]))
    for note in current["notes"]:
        lines.append(f"  note: {note}")
    lines += [
        f"The conflict is in place in {tree}. Resolve it there, then:",
        "  python3 -m forkctl rebase --continue               # the tree is the patch",
        "  python3 -m forkctl rebase --skip --reason 'WHY'    # drop the patch",
        "  python3 -m forkctl rebase --abort                  # keep the old line",
    ]
    return "\n".join(lines)


def resume(fork: Fork, version: str | None = None) -> int:
    """--continue: the resolved tree is the current patch."""
    work, state = load(fork, version)
    current = state["current"]
    if current is None:  # interrupted between two patches
        return advance(fork, work, state)
    tree = work / "tree"
    if am_in_progress(tree):
        left = sorted(
            p for p in {*current["conflicts"], *unmerged(tree)} if has_markers(tree / p)
        )
        if left:
            raise ForkError(
                "conflict markers are left in " + ", ".join(left) + ": resolve them "
                "(or --skip the patch)"
            )
        env = am_env()
        git(tree, "add", "-A", env=env)
        done = git(tree, "am", "--continue", env=env, check=False)
        if done.returncode != 0:
            if "No changes" in done.stdout + done.stderr:
                raise ForkError(
                    "the resolved tree does not change anything: if the target has "
                    "the patch's change, `forkctl rebase --skip --reason '...'`"
                )
            raise ForkError(
                "git am --continue failed:\n" + (done.stderr or done.stdout).strip()
            )
    elif out(tree, "rev-parse", "HEAD") == current["head"]:
        raise ForkError(
            "no `git am` is in progress in the tree and it has no new commit: "
            "nothing to take as the patch (--skip or --abort)"
        )
    # else the resolution was committed by hand (git am --continue): take it
    notes = current["notes"] + [f"resolved: {', '.join(current['conflicts'])}"]
    state["done"].append(
        {
            "patch": current["patch"],
            "subject": current["subject"],
            "how": RESOLVED,
            "notes": notes,
        }
    )
    state["current"] = None
    save(work, state)
    print(f"{RESOLVED:>20}  {current['patch']}", file=sys.stderr)
    return advance(fork, work, state)


def skip(fork: Fork, reason: str | None, version: str | None = None) -> int:
    """--skip: drop the current patch, with the reason, and go on."""
    work, state = load(fork, version)
    current = state["current"]
    if current is None:
        raise ForkError("not stopped at a patch: nothing to skip")
    tree = work / "tree"
    env = am_env()
    if am_in_progress(tree):
        git(tree, "am", "--skip", env=env, check=False)
    if am_in_progress(tree):
        git(tree, "am", "--abort", env=env, check=False)
    git(tree, "reset", "-q", "--hard", current["head"], env=env)
    state["skipped"].append(
        {
            "patch": current["patch"],
            "subject": current["subject"],
            "reason": reason or "skipped by hand (no reason given)",
        }
    )
    state["current"] = None
    save(work, state)
    print(f"{'skipped':>20}  {current['patch']}", file=sys.stderr)
    return advance(fork, work, state)


def abort(fork: Fork, version: str | None = None) -> str:
    """--abort: remove the rebase's tree and state; the old line was never touched."""
    work, state = load(fork, version)
    for path in (work / "tree", work / "patches"):
        if path.exists():
            shutil.rmtree(path)
    (work / STATE).unlink()
    if not any(work.iterdir()):
        work.rmdir()
    return state["target"]


def finish(fork: Fork, work: Path, state: dict) -> int:
    """Export the series, move the pins, run check."""
    version = state["target"]
    names = export.export(fork, work / "tree")
    sdist = Artifact(
        fork.sdist.project, **{k: state["sdist"][k] for k in ("filename", "sha256")}
    )
    moved, left = pins.move(fork, version, sdist)
    state.update(finished=True, exported=names, pins_moved=moved, pins_left=left)
    save(work, state)
    print(summary(state))
    return check.report(config.load(fork.root), version)


def summary(state: dict) -> str:
    lines = [
        f"rebased from {state['base']} onto {state['target']}: "
        f"{len(state['exported'])} patches exported to patches/, "
        f"{len(state['skipped'])} dropped",
    ]
    for entry in state["done"]:
        lines.append(f"  {entry['how']:>18}  {entry['patch']}")
        lines += [f"  {'':>18}  note: {note}" for note in entry["notes"]]
    for entry in state["skipped"]:
        lines.append(f"  {'dropped':>18}  {entry['patch']}: {entry['reason']}")
    lines.append("pins moved in fork.toml: " + ", ".join(state["pins_moved"]))
    if state["pins_left"]:
        lines.append("left to move by hand:")
        lines += [f"  {pin}" for pin in state["pins_left"]]
    lines.append("`forkctl sync` puts ./tree on the new base")
    return "\n".join(lines)
