"""Command line of tiny_checkpoint (``python tools/tiny_checkpoint ...``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __doc__ as package_doc
from .common import SHAPES
from .schemes import FORMATS, MODELS, generate
from .verify import hf_crosscheck, verify


def _scheme_help() -> str:
    unserved = sorted(n for n, f in FORMATS.items() if not f.served)
    return (
        "checkpoint format; not served by the fork yet (written and verified "
        f"only): {', '.join(unserved)}; whole bf16 models for online "
        f"quantization, with their twin: {', '.join(sorted(MODELS))}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tiny_checkpoint", description=(package_doc or "").splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="checkpoint directory to write")
    parser.add_argument(
        "--scheme",
        choices=sorted([*FORMATS, *MODELS]),
        default="bf16",
        help=_scheme_help(),
    )
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help="model dimensions (default: tiny; see common.SHAPES)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--twin",
        type=Path,
        help="where quantized schemes write the dequantized bf16 twin "
        "(default: OUT-bf16twin)",
    )
    parser.add_argument(
        "--shards", type=int, default=1, help="number of safetensors shards"
    )
    parser.add_argument(
        "--separate-fused-scales",
        action="store_true",
        help="fp8-tensor: one weight_scale per q/k/v and gate/up shard, as "
        "AutoFP8 writes (vLLM then requantizes; the twin is no longer exact)",
    )
    parser.add_argument(
        "--verify",
        type=Path,
        nargs="?",
        const=True,
        help="check a written checkpoint (default: the one just written)",
    )
    parser.add_argument(
        "--hf-check",
        action="store_true",
        help="with --verify, also load the bf16 weights with transformers",
    )
    args = parser.parse_args(argv)
    if args.out is None and not isinstance(args.verify, Path):
        parser.error("--out or --verify DIR is required")
    if args.shape and args.scheme in MODELS:
        parser.error(f"--shape: {args.scheme} has a shape of its own")

    to_verify: Path | None = args.verify if isinstance(args.verify, Path) else None
    if args.out is not None:
        written = generate(
            args.out,
            args.scheme,
            args.seed,
            args.twin,
            args.shards,
            not args.separate_fused_scales,
            SHAPES[args.shape] if args.shape else None,
        )
        for path in written:
            print(f"wrote {path}")
        if args.verify is True:
            to_verify = args.out

    if to_verify is None:
        return 0
    print(f"verifying {to_verify}")
    problems = verify(to_verify, args.twin)
    if not problems and args.hf_check:
        cfg = json.loads((to_verify / "config.json").read_text())
        bf16_dir = to_verify
        if "quantization_config" in cfg or cfg.get("model_type") == "gpt_oss":
            bf16_dir = args.twin or to_verify.with_name(to_verify.name + "-bf16twin")
        problems = hf_crosscheck(bf16_dir)
    for p in problems:
        print(f"  PROBLEM: {p}", file=sys.stderr)
    print("verify: " + ("FAILED" if problems else "ok"))
    return 1 if problems else 0
