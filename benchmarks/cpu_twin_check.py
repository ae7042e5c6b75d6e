"""A quantized checkpoint against its bf16 twin, greedy, in process on CPU;
prints where their tokens part and which MoE GEMV kernels ran.

Not a test (random-weight MoE models part where two candidates nearly tie,
often through a router's near-tied expert choice); it shows how far the two
agree at any shape, e.g. the real-width one (tools/tiny_checkpoint --shape
qwen3-30b-a3b-2l), and whether a batch's prefill took the grouped MoE GEMV.

Usage::

    .venv/bin/python benchmarks/cpu_twin_check.py \\
        build/models/qwen3-30b-a3b-2l-fp8-tensor [TOKENS [PROMPTS]]

With PROMPTS 2 the batch's prefill is 9 tokens: the FP8 linear layers' GEMV
in two calls (more than GEMV_MAX_ROWS tokens).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The capital of France is",
    "Chess players think",
    # About 90 tokens: with the others, a prefill step of about 100 tokens,
    # which a real-width layer runs through the grouped MoE GEMV.
    "Write tiny Qwen3-MoE checkpoints in real on-disk formats, fully offline. "
    "Why: end-to-end tests of the fork (serving, quantized MoE kernels on "
    "CPU) need a model that loads through exactly the same code paths",
]


def run(model: str, tokens: int, prompts: int) -> dict:
    """In a child process: greedy tokens and logprobs of PROMPTS."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm.model_executor.layers.fused_moe.experts import (
        cpu_fp8_moe,
        cpu_int8_moe,
        cpu_moe_gemv,
    )

    calls: collections.Counter[str] = collections.Counter()
    group_pairs, moe_gemv = cpu_moe_gemv.group_pairs, cpu_moe_gemv.moe_gemv

    def counting_group_pairs(*args, **kwargs):
        calls["grouped pairs"] += 1
        return group_pairs(*args, **kwargs)

    def counting_moe_gemv(*args, **kwargs):
        out = moe_gemv(*args, **kwargs)
        calls["moe_gemv" if out is not None else "moe_gemv declined"] += 1
        return out

    cpu_moe_gemv.group_pairs = counting_group_pairs
    from vllm.model_executor.kernels.linear.scaled_mm import cpu as cpu_linear
    from vllm.model_executor.layers.quantization.utils import cpu_fp8_gemv

    linear_gemv = cpu_fp8_gemv.fp8_linear_gemv

    def counting_linear_gemv(x, *args, **kwargs):
        out = linear_gemv(x, *args, **kwargs)
        if out is not None:
            rows = x.numel() // x.shape[-1]
            calls[f"linear GEMV, {'up to' if rows <= 8 else 'over'} 8 rows"] += 1
        return out

    # The block-FP8 and MXFP8 linears import it when called.
    cpu_fp8_gemv.fp8_linear_gemv = counting_linear_gemv
    cpu_linear.fp8_linear_gemv = counting_linear_gemv
    for caller in (cpu_fp8_moe, cpu_int8_moe):
        if getattr(caller, "moe_gemv", None) is moe_gemv:
            caller.moe_gemv = counting_moe_gemv
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        max_model_len=512,
        max_num_seqs=16,
        dtype="bfloat16",
        moe_backend="cpu",
    )
    params = SamplingParams(max_tokens=tokens, temperature=0, logprobs=2)
    outs = llm.generate(PROMPTS[:prompts], params, use_tqdm=False)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [
                {t: lp.logprob for t, lp in step.items()}
                for step in o.outputs[0].logprobs
            ]
            for o in outs
        ],
        "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
        "calls": dict(calls),
    }


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        result = run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    quantized = Path(sys.argv[1])
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    prompts = int(sys.argv[3]) if len(sys.argv) > 3 else len(PROMPTS)
    twin = quantized.with_name(quantized.name + "-bf16twin")
    results = []
    for model in (quantized, twin):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                str(model),
                str(tokens),
                str(prompts),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    q, t = results
    print(f"{quantized.name} against {twin.name}, {tokens} greedy tokens")
    print(f"MoE GEMV calls, quantized: {q['calls']}")
    for i, prompt_tokens in enumerate(q["prompt_tokens"]):
        qt, tt = q["tokens"][i], t["tokens"][i]
        part = next((j for j in range(len(qt)) if qt[j] != tt[j]), None)
        shared = range(part if part is not None else len(qt))
        diff = max(
            (abs(q["logprobs"][i][j][str(qt[j])] - t["logprobs"][i][j][str(tt[j])])
             for j in shared),
            default=0.0,
        )  # fmt: skip
        where = "never" if part is None else f"at token {part}"
        print(
            f"prompt {i} ({prompt_tokens} tokens): parts {where}; shared tokens' "
            f"logprobs differ by at most {diff:.3f}"
        )
        if part is not None:
            print(f"  quantized top-2 there: {q['logprobs'][i][part]}")
            print(f"  twin top-2 there:      {t['logprobs'][i][part]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
