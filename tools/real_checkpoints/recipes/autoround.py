"""auto-round recipe: W4A16 (4-bit, group 128) exported as auto_gptq or
auto_awq.

Run by the autoround venv's python:
``autoround.py --scheme auto_gptq --base BF16_DIR --out DIR --work TMP``.
``iters=0`` is auto-round's RTN mode (no sign-gradient tuning) to keep the
run short; the calibration set is still passed for what RTN mode uses it
for.  GPTQ export is symmetric (what GPTQ kernels expect), AWQ export
asymmetric (AutoAWQ's zero-point layout).  Group 128 divides every
quantized input width of the tiny model (256 and 128).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_calib", HERE / "_calib.py")
calib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calib)

import torch  # noqa: E402
from auto_round import AutoRound  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

SCHEMES = ["auto_gptq", "auto_awq"]
GROUP_SIZE = 128


def main() -> None:
    args = calib.parse_args(SCHEMES)
    calib.seed_everything()
    base = calib.base_copy(args.base, args.work)
    calib.drop_unimportable_transformers_aliases()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = calib.calibration_ids(calib.vocab_size(base))
    rounder = AutoRound(
        model,
        tokenizer=tokenizer,
        scheme="W4A16",
        bits=4,
        group_size=GROUP_SIZE,
        sym=args.scheme == "auto_gptq",
        iters=0,
        dataset=[ids[i : i + 1] for i in range(ids.shape[0])],
        nsamples=ids.shape[0],
        seqlen=ids.shape[1],
        seed=calib.SEED,
        device_map="cpu",
    )
    rounder.quantize_and_save(str(args.out), format=args.scheme)
    # auto-round writes into a subdirectory named after the model and the
    # scheme (here ``base-w4g128/``); the checkpoint is that directory.
    subdirs = [p for p in args.out.iterdir() if (p / "config.json").exists()]
    if not (args.out / "config.json").exists() and len(subdirs) == 1:
        for item in subdirs[0].iterdir():
            item.rename(args.out / item.name)
        subdirs[0].rmdir()


if __name__ == "__main__":
    main()
