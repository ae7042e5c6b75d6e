"""Helpers shared by the end-to-end tests (imported by conftest and tests).

Everything here builds on the repository's own tools instead of
re-implementing them: the ``tools/tiny_checkpoint`` package writes the checkpoints and
``tools/serve_demo.py``'s ``running_server`` starts ``vllm serve`` on
127.0.0.1, waits (bounded) for /health and always stops it.

Checkpoints live in a cache under ``build/e2e/models`` and are reused across
sessions while they are still valid: a ``.stamp.json`` in each records what
produced it (scheme, seed and a sha256 over tiny_checkpoint's sources, or the base
checkpoint's key and the mutation for derived ones) and the size of every
file; any difference regenerates it.  Writes go to a temporary directory that
is renamed into place, so an interrupted run never leaves a half-written
checkpoint behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import serve_demo  # noqa: E402
import tiny_checkpoint  # noqa: E402
import x86_libraries  # noqa: E402
from serve_demo import ServerError  # noqa: E402

__all__ = ["ServerError"]  # re-exported for the tests

E2E_ROOT = serve_demo.BUILD_DIR / "e2e"
MODEL_CACHE = E2E_ROOT / "models"
LOG_DIR = E2E_ROOT / "logs"
SEED = 0
STAMP = ".stamp.json"
READY_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0

# Fixed prompt set for the greedy comparisons (8 prompts, 16 new tokens each).
PROMPTS: tuple[str, ...] = (
    "The capital of Italy is",
    "In the garden we planted",
    "The library was quiet except for",
    "Doctors and nurses work",
    "The sailors raised the anchor",
    "Chess players think",
    "Astronomers use giant telescopes to",
    "The football match began",
)
MAX_TOKENS = 16


# --------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    model: Path
    twin: Path | None  # dequantized bf16 twin; None for unquantized schemes


def generator_digest() -> str:
    return tiny_checkpoint.source_digest()


def _file_sizes(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(d.iterdir()) if p.name != STAMP}


def _write_stamp(d: Path, key: dict[str, object]) -> None:
    stamp = {"key": key, "files": _file_sizes(d)}
    (d / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def _stamp_key(d: Path) -> object:
    """The key a valid cached checkpoint was made with, else None."""
    try:
        stamp = json.loads((d / STAMP).read_text())
        if _file_sizes(d) != stamp["files"]:
            return None
        return stamp["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_scheme(scheme: str, cache: Path = MODEL_CACHE) -> Checkpoint:
    """The cached checkpoint of ``scheme`` (and its twin), generated if needed.

    ``scheme``: a served scheme (tiny_checkpoint.SCHEMES) or a whole model
    (tiny_checkpoint.MODELS, e.g. ``gpt-oss``)."""
    known = [*tiny_checkpoint.SCHEMES, *tiny_checkpoint.MODELS]
    if scheme not in known:
        raise KeyError(
            f"{scheme!r} is not a served tiny_checkpoint scheme or model "
            f"(known: {sorted(known)})"
        )
    model = cache / f"tiny-{scheme}"
    twin = cache / f"tiny-{scheme}-bf16twin"
    key = {"scheme": scheme, "seed": SEED, "generator": generator_digest()}
    if _stamp_key(model) == key:
        if _stamp_key(twin) == {**key, "role": "twin"}:
            return Checkpoint(model, twin)
        if not twin.exists():
            return Checkpoint(model, None)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".tmp-{scheme}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        written = tiny_checkpoint.generate(
            tmp / "model", scheme, SEED, tmp / "twin", shards=1
        )
        has_twin = len(written) > 1
        _write_stamp(tmp / "model", key)
        if has_twin:
            _write_stamp(tmp / "twin", {**key, "role": "twin"})
        for src, dst in ((tmp / "model", model), (tmp / "twin", twin)):
            shutil.rmtree(dst, ignore_errors=True)
            if src.exists():
                src.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Checkpoint(model, twin if has_twin else None)


def derive_checkpoint(
    name: str,
    base: Path,
    mutate: Callable[[dict], None],
    description: str,
    cache: Path = MODEL_CACHE,
    base_key: object | None = None,
) -> Path:
    """A copy of checkpoint ``base`` whose tensors ``mutate`` edits in place.

    Cached like ensure_scheme; ``description`` is part of the cache key and
    must change whenever ``mutate`` does.  ``base_key``: what identifies a
    base kept outside this cache (default: its stamp here).
    """
    from safetensors.torch import save_file

    if base_key is None:
        base_key = _stamp_key(base)
    if base_key is None:
        raise RuntimeError(f"{base} is not a valid cached checkpoint")
    out = cache / name
    key = {"base": base.name, "base_key": base_key, "mutation": description}
    if _stamp_key(out) == key:
        return out
    if (base / "model.safetensors.index.json").exists():
        raise NotImplementedError("derive_checkpoint handles one-shard bases only")
    tensors = tiny_checkpoint.load_tensors(base)
    mutate(tensors)
    tmp = cache / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for f in base.iterdir():
            if f.suffix != ".safetensors" and f.name != STAMP:
                shutil.copy2(f, tmp / f.name)
        save_file(
            {k: v.contiguous() for k, v in sorted(tensors.items())},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        _write_stamp(tmp, key)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def swap_experts_0_1(tensors: dict) -> None:
    """Swap experts 0 and 1 (every tensor of theirs: weights and scales) in
    every layer: a deliberately wrong model for the twin rule."""
    layers = {int(n.split(".")[2]) for n in tensors if n.startswith("model.layers.")}
    for layer in sorted(layers):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            a = f"model.layers.{layer}.mlp.experts.0.{proj}."
            b = f"model.layers.{layer}.mlp.experts.1.{proj}."
            for name in [n for n in tensors if n.startswith(a)]:
                other = b + name[len(a) :]
                tensors[name], tensors[other] = tensors[other], tensors[name]


def quantized_schemes() -> list[str]:
    """Every served scheme (tiny_checkpoint.SCHEMES) except the bf16 baseline.

    Formats the fork cannot serve yet (``FORMATS[name].served`` False) are
    not in SCHEMES, so no e2e test tries them."""
    return [s for s in tiny_checkpoint.SCHEMES if s != "bf16"]


# --------------------------------------------------------------------------
# Servers and requests
# --------------------------------------------------------------------------


@functools.cache
def x86_kernel_libraries() -> dict[str, bool]:
    """tools/x86_libraries.py: the x86 kernel libraries this machine runs,
    each with whether its AMX kernels run here; vLLM loads the last one."""
    return x86_libraries.runnable()


def log_path(name: str) -> Path:
    return LOG_DIR / f"{name}.log"


@contextlib.contextmanager
def serve(
    model: Path,
    args: Sequence[str] = (),
    *,
    log_name: str,
    compiled: bool = False,
    env: Mapping[str, str] | None = None,
    library: str | None = None,
) -> Iterator[str]:
    """``vllm serve MODEL ARGS`` via serve_demo.running_server; yields the /v1
    URL.  serve_demo's DEFAULT_SERVE_ARGS (which include --enforce-eager) come
    first; with compiled=True its COMPILED_SERVE_ARGS, without
    --enforce-eager: the model is compiled, as ``vllm serve`` does by
    default.  ``env`` is added to the server's environment; ``library``
    (one of x86_kernel_libraries()) sets
    VLLM_CPU_X86_KERNELS.  The log goes to build/e2e/logs/LOG_NAME.log."""
    if library is not None:
        env = {**(env or {}), "VLLM_CPU_X86_KERNELS": library}
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    defaults = (
        serve_demo.COMPILED_SERVE_ARGS if compiled else serve_demo.DEFAULT_SERVE_ARGS
    )
    with serve_demo.running_server(
        model,
        list(args),
        log_path=log_path(log_name),
        ready_timeout_s=READY_TIMEOUT_S,
        default_args=defaults,
        env=None if env is None else {**os.environ, **env},
    ) as base_url:
        yield base_url


def client(base_url: str, timeout_s: float = REQUEST_TIMEOUT_S):  # openai.OpenAI
    import httpx
    from openai import OpenAI

    return OpenAI(
        base_url=base_url,
        api_key="EMPTY",
        timeout=timeout_s,
        max_retries=0,
        http_client=httpx.Client(trust_env=False, timeout=timeout_s),
    )


def served_model(base_url: str) -> str:
    return client(base_url).models.list().data[0].id


def _token_id(token: str) -> int:
    m = re.fullmatch(r"token_id:(\d+)", token)
    if m is None:
        raise ValueError(f"expected 'token_id:N', got {token!r}")
    return int(m.group(1))


@dataclass
class Generation:
    prompt: str
    prompt_ids: list[int]
    text: str
    token_ids: list[int]
    # Per generated position, best first: [(token_id, logprob), ...]; empty
    # unless logprobs were requested.
    top: list[list[tuple[int, float]]] = field(default_factory=list)

    def gap(self, i: int) -> float:
        """Top-1 minus top-2 logprob at generated position i."""
        (_, a), (_, b) = self.top[i][:2]
        return a - b


def greedy(
    base_url: str,
    prompts: Sequence[str] = PROMPTS,
    max_tokens: int = MAX_TOKENS,
    logprobs: int | None = None,
) -> list[Generation]:
    """Greedy completions of all prompts in one request (ignore_eos, so every
    completion has exactly max_tokens tokens), optionally with top logprobs."""
    extra: dict[str, object] = {"ignore_eos": True, "return_token_ids": True}
    if logprobs is not None:
        extra["return_tokens_as_token_ids"] = True
    resp = client(base_url).completions.create(
        model=served_model(base_url),
        prompt=list(prompts),
        max_tokens=max_tokens,
        temperature=0.0,
        logprobs=logprobs,
        extra_body=extra,
    )
    out: dict[int, Generation] = {}
    for choice in resp.choices:
        extra_fields = choice.model_extra or {}
        ids = list(extra_fields["token_ids"])
        top: list[list[tuple[int, float]]] = []
        if logprobs is not None:
            lp = choice.logprobs
            assert lp is not None and lp.tokens and lp.top_logprobs
            assert [_token_id(t) for t in lp.tokens] == ids
            top = [
                sorted(((_token_id(t), v) for t, v in d.items()), key=lambda x: -x[1])
                for d in lp.top_logprobs
            ]
        out[choice.index] = Generation(
            prompt=prompts[choice.index],
            prompt_ids=list(extra_fields["prompt_token_ids"]),
            text=choice.text,
            token_ids=ids,
            top=top,
        )
    assert sorted(out) == list(range(len(prompts))), "missing choices"
    return [out[i] for i in range(len(prompts))]


def teacher_forced_argmax(
    base_url: str, reference: Sequence[Generation]
) -> list[list[int]]:
    """The server's greedy next token at every generated position of
    ``reference`` when fed the reference's own prefix (prompt + reference
    tokens so far): result[p][i] is what it would emit instead of
    reference[p].token_ids[i].  One request of max_tokens=1 completions, no
    logprobs."""
    prefixes = [
        g.prompt_ids + g.token_ids[:i]
        for g in reference
        for i in range(len(g.token_ids))
    ]
    resp = client(base_url).completions.create(
        model=served_model(base_url),
        prompt=prefixes,
        max_tokens=1,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    flat: dict[int, int] = {}
    for choice in resp.choices:
        (tok,) = (choice.model_extra or {})["token_ids"]
        flat[choice.index] = int(tok)
    assert sorted(flat) == list(range(len(prefixes))), "missing choices"
    out: list[list[int]] = []
    k = 0
    for g in reference:
        out.append([flat[k + i] for i in range(len(g.token_ids))])
        k += len(g.token_ids)
    return out


# --------------------------------------------------------------------------
# Tolerance rule (stated and justified in test_e2e_quantized_vs_twin.py)
# --------------------------------------------------------------------------

# Twin's top-1 minus top-2 logprob (nats) below which a disagreement is a
# near-tie that numerics may flip.
GAP_THRESHOLD = 1.5
# Teacher-forced disagreements allowed, as a fraction of all positions.
MAX_FLIP_FRACTION = 0.125


@dataclass
class Verdict:
    violations: list[str]
    lines: list[str]  # human-readable details
    divergent_prompts: int
    flips: list[tuple[int, int, float]]  # (prompt index, position, twin gap)
    positions: int

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        return "\n".join([*self.lines, *(f"VIOLATION: {v}" for v in self.violations)])


def judge(
    quant: Sequence[Generation],
    twin: Sequence[Generation],
    quant_tf: Sequence[Sequence[int]],
    gap_threshold: float = GAP_THRESHOLD,
    max_flip_fraction: float = MAX_FLIP_FRACTION,
) -> Verdict:
    """Apply the tolerance rule.  ``twin`` must carry top-2 logprobs;
    ``quant_tf`` is teacher_forced_argmax(quantized server, twin)."""
    violations: list[str] = []
    lines: list[str] = []
    divergent = 0
    flips: list[tuple[int, int, float]] = []
    positions = 0
    for p, (q, t, tf) in enumerate(zip(quant, twin, quant_tf, strict=True)):
        if q.prompt_ids != t.prompt_ids:
            violations.append(f"{q.prompt!r}: prompts tokenized differently")
            continue
        if len(q.token_ids) != len(t.token_ids):
            violations.append(
                f"{q.prompt!r}: {len(q.token_ids)} tokens vs twin's {len(t.token_ids)}"
            )
            continue
        # (A) free-running greedy: identical up to the first divergence,
        # which must fall on a near-tie of the twin.
        first = next(
            (i for i, (a, b) in enumerate(zip(q.token_ids, t.token_ids)) if a != b),
            None,
        )
        if first is None:
            lines.append(f"{q.prompt!r}: identical")
        else:
            divergent += 1
            gap = t.gap(first)
            lines.append(
                f"{q.prompt!r}: first divergence at token {first}, twin top-2 gap "
                f"{gap:.4f}\n    quantized: {q.text!r}\n    twin:      {t.text!r}"
            )
            if gap >= gap_threshold:
                violations.append(
                    f"{q.prompt!r}: free-running output diverges at token {first} "
                    f"where the twin's top-2 gap is {gap:.4f} >= {gap_threshold}"
                )
        # (B) teacher-forced along the twin's path.
        for i, (a, b) in enumerate(zip(tf, t.token_ids, strict=True)):
            positions += 1
            if a == b:
                continue
            gap = t.gap(i)
            flips.append((p, i, gap))
            if gap >= gap_threshold:
                violations.append(
                    f"{q.prompt!r}: on the twin's path, position {i}: quantized "
                    f"argmax {a} != twin's {b} although the twin's top-2 gap is "
                    f"{gap:.4f} >= {gap_threshold}"
                )
    allowed = int(max_flip_fraction * positions)
    lines.append(
        f"free-running: {divergent}/{len(twin)} prompts diverge; teacher-forced: "
        f"{len(flips)}/{positions} positions disagree (allowed {allowed}), twin "
        f"gaps there {sorted(round(g, 4) for _, _, g in flips)}"
    )
    if len(flips) > allowed:
        violations.append(
            f"teacher-forced disagreements {len(flips)}/{positions} > {allowed} "
            f"({max_flip_fraction:.1%})"
        )
    return Verdict(violations, lines, divergent, flips, positions)
