"""ModelOpt recipe: post-training quantization with a preset config
(``FP8_DEFAULT_CFG``: per-tensor FP8 weights and static activation scales;
``MXFP8_DEFAULT_CFG``), exported with ``export_hf_checkpoint``.

Run by the modelopt venv's python:
``modelopt.py --scheme FP8_DEFAULT_CFG --base BF16_DIR --out DIR --work TMP``.
The calibration loop runs the model over the shared random-id set on CPU.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_calib", HERE / "_calib.py")
calib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calib)

import modelopt.torch.quantization as mtq  # noqa: E402
import torch  # noqa: E402
from modelopt.torch.export import export_hf_checkpoint  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

SCHEMES = ["FP8_DEFAULT_CFG", "MXFP8_DEFAULT_CFG"]


def main() -> None:
    args = calib.parse_args(SCHEMES)
    calib.seed_everything()
    base = calib.base_copy(args.base, args.work)
    calib.drop_unimportable_transformers_aliases()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = calib.calibration_ids(calib.vocab_size(base))

    def forward_loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for i in range(ids.shape[0]):
                m(ids[i : i + 1])

    config = copy.deepcopy(getattr(mtq, args.scheme))
    model = mtq.quantize(model, config, forward_loop)
    mtq.print_quant_summary(model)
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=str(args.out))
    tokenizer.save_pretrained(str(args.out))


if __name__ == "__main__":
    main()
