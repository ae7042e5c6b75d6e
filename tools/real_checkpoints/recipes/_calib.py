"""Helpers every recipe shares; imported by path from a recipe running
inside a tool's venv (so: standard library + torch only, nothing of the
fork).

Calibration data: there is no hub access, so each recipe calibrates on
``N_SAMPLES`` sequences of ``SEQ_LEN`` token ids drawn uniformly from the
checkpoint's vocabulary with a fixed seed.  Random ids exercise every
expert (the router of a random-weight model spreads them) and make the
calibration set a function of the seed and the vocabulary size only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

SEED = 0
N_SAMPLES = 16
SEQ_LEN = 64


def parse_args(schemes: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheme", required=True, choices=schemes)
    parser.add_argument("--base", type=Path, required=True, help="bf16 checkpoint")
    parser.add_argument("--out", type=Path, required=True, help="directory to write")
    parser.add_argument(
        "--work", type=Path, required=True, help="scratch directory (the base's copy)"
    )
    return parser.parse_args()


def seed_everything(seed: int = SEED) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def base_copy(base: Path, work: Path, edits: dict[str, object] | None = None) -> Path:
    """A copy of the bf16 base for the tool to load, with ``edits`` merged
    into its config.json (what a tool's transformers needs; the served twin
    stays as written)."""
    dst = work / "base"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(base, dst, ignore=shutil.ignore_patterns(".real-checkpoint.json"))
    if edits:
        cfg_path = dst / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(edits)
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def vocab_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def calibration_ids(
    vocab: int, n: int = N_SAMPLES, seq_len: int = SEQ_LEN
) -> torch.Tensor:
    """[n, seq_len] int64 token ids, uniform over the vocabulary, seed SEED."""
    gen = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (n, seq_len), generator=gen, dtype=torch.long)


def drop_unimportable_transformers_aliases() -> list[str]:
    """Take transformers' backward-compatibility alias modules whose target
    cannot be imported here out of sys.modules; returns their names.

    transformers 5 registers ``models.*.image_processing_*_fast`` aliases
    whose ``dir()`` imports torchvision.  ``transformers.monkey_patching.
    apply_patches`` (which llm-compressor's MoE linearization enters around
    ``from_pretrained``) calls ``dir()`` on every transformers module and
    dies with ModuleNotFoundError when torchvision is absent, as in these
    CPU venvs.  Nothing here needs an image processor.
    """
    import sys

    dropped = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers") or module is None:
            continue
        try:
            dir(module)
        except ImportError:
            del sys.modules[name]
            dropped.append(name)
    return dropped
