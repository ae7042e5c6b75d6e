"""The tiny GPT-OSS-style biased MoE with online FP8 on CPU vs its bf16 twin.

``tiny_checkpoint --scheme gpt-oss`` writes a bf16 GPT-OSS checkpoint (biased
experts, SwiGLU-OAI, attention biases and sinks) and its twin: the same
model with every weight online FP8 rounds (experts per expert, fused q/k/v
and o_proj per tensor) already rounded.  The checkpoint is run with
``quantization="fp8"`` (``--moe-backend auto``, eager) and compared with the
twin, greedy, on the suite's prompts, by the suite's rule
(``e2e_lib.judge``; stated in test_e2e_quantized_vs_twin.py).  The rule's
power on this model is shown without vLLM by
``tests/test_tiny_checkpoint_gptoss.py::test_rule_rejects_dropped_expert_biases``
(the same model with its expert biases dropped fails it by far).

Why vLLM's offline ``LLM`` API and not ``vllm serve``: on vLLM 0.19.1 the
API server of a gpt_oss model loads the harmony encoding (openai_harmony's
o200k_base.tiktoken vocabulary) at startup, which it downloads; offline it
stops with ``HarmonyError: error downloading or loading vocab file``.  The
engine itself does not need it.  Each model runs in its own interpreter
(this file as a script) so that the engine and its worker are gone when it
exits, whatever shutdown leaves behind; the records are e2e_lib.Generation,
so the rule is the one the served schemes are judged by.

Time: ~25-35 s per model on the 2-core dev box (mostly importing vLLM), so
about a minute for the module.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import e2e_lib as lib

SCHEME = "gpt-oss"
TIMEOUT_S = 300
# The engine settings of serve_demo.DEFAULT_SERVE_ARGS (eager: no compile).
ENGINE_ARGS: dict[str, object] = {
    "max_model_len": 512,
    "dtype": "bfloat16",
    "max_num_seqs": 16,
    "enforce_eager": True,
    "moe_backend": "auto",
    "seed": 0,
}


def _generations(records: list[dict]) -> list[lib.Generation]:
    return [
        lib.Generation(**{**r, "top": [[tuple(p) for p in pos] for pos in r["top"]]})
        for r in records
    ]


def run_offline(
    model: Path, *, log_name: str, quantization: str | None = None, twin_json=None
) -> dict:
    """Run this file as a script on ``model``: greedy generations (with
    top-2 logprobs), and, given the twin's generations, the greedy next
    token along the twin's path (e2e_lib.teacher_forced_argmax's result)."""
    lib.LOG_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        args = [sys.executable, __file__, str(model), str(out)]
        if quantization is not None:
            args += ["--quantization", quantization]
        if twin_json is not None:
            (Path(tmp) / "twin.json").write_text(json.dumps(twin_json))
            args += ["--twin", str(Path(tmp) / "twin.json")]
        log = lib.log_path(log_name)
        with log.open("w") as f:
            proc = subprocess.run(
                args,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=lib.serve_demo.server_env(),
                timeout=TIMEOUT_S,
                check=False,
            )
        if proc.returncode != 0:
            raise lib.ServerError(
                f"offline run of {model.name} failed (rc {proc.returncode}):\n"
                + lib.serve_demo.log_tail(log)
            )
        return json.loads(out.read_text())


def test_online_fp8_matches_twin(checkpoints) -> None:
    ckpt = checkpoints.scheme(SCHEME)
    assert ckpt.twin is not None
    twin_json = run_offline(ckpt.twin, log_name=f"offline-{ckpt.twin.name}")
    twin = _generations(twin_json["greedy"])
    quant_json = run_offline(
        ckpt.model,
        log_name=f"offline-{ckpt.model.name}-online-fp8",
        quantization="fp8",
        twin_json=twin_json["greedy"],
    )
    quant = _generations(quant_json["greedy"])
    verdict = lib.judge(quant, twin, quant_json["teacher_forced"])
    print(f"\n{SCHEME} online fp8 vs twin:\n{verdict.report()}")
    assert verdict.ok, verdict.report()


# --------------------------------------------------------------------------
# The worker (run as a script by run_offline).
# --------------------------------------------------------------------------


def _worker(argv: list[str]) -> None:
    import argparse

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--quantization")
    ap.add_argument("--twin")
    a = ap.parse_args(argv)

    llm = LLM(model=a.model, quantization=a.quantization, **ENGINE_ARGS)
    params = SamplingParams(
        temperature=0.0, max_tokens=lib.MAX_TOKENS, ignore_eos=True, logprobs=2
    )
    greedy = []
    for prompt, o in zip(lib.PROMPTS, llm.generate(list(lib.PROMPTS), params)):
        c = o.outputs[0]
        assert c.logprobs is not None
        top = [
            sorted(((t, lp.logprob) for t, lp in d.items()), key=lambda x: -x[1])
            for d in c.logprobs
        ]
        greedy.append(
            lib.Generation(
                prompt=prompt,
                prompt_ids=list(o.prompt_token_ids),
                text=c.text,
                token_ids=list(c.token_ids),
                top=top,
            )
        )
    result: dict[str, object] = {"greedy": [dataclasses.asdict(g) for g in greedy]}
    if a.twin is not None:
        twin = _generations(json.loads(Path(a.twin).read_text()))
        prefixes = [
            TokensPrompt(prompt_token_ids=g.prompt_ids + g.token_ids[:i])
            for g in twin
            for i in range(len(g.token_ids))
        ]
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        flat = [o.outputs[0].token_ids[0] for o in llm.generate(prefixes, one)]
        tf, k = [], 0
        for g in twin:
            tf.append(flat[k : k + len(g.token_ids)])
            k += len(g.token_ids)
        result["teacher_forced"] = tf
    Path(a.out).write_text(json.dumps(result))


if __name__ == "__main__":
    _worker(sys.argv[1:])
