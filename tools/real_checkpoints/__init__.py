"""Tiny Qwen3-MoE checkpoints written by the real quantization tools.

Why: ``tools/tiny_checkpoint`` writes every format itself, from its reading
of each tool's layout.  The e2e suite must also serve what the tools
themselves write -- llm-compressor (compressed-tensors), auto-round (GPTQ
and AWQ exports) and NVIDIA ModelOpt (Hugging Face export) -- so that a
layout detail the hand-written formats miss shows up in the fork's tests.

How: the tiny bf16 model of tiny_checkpoint (``--scheme bf16``, default
shape, seed 0) is the input of every tool and the bf16 twin served beside
each result.  Each tool lives in its own venv under
``~/.cache/vllm-fork/tools/<tool>-<version>/``, installed with
``pip install --require-hashes`` from ``locks/<tool>.txt`` (torch is the
CPU build on this machine's disk, installed first), and runs its recipe
``recipes/<tool>.py`` there.  Results are cached under
``~/.cache/vllm-fork/real-checkpoints/<tool>-<version>/<format>/``, keyed by
the lock, the recipe and the base checkpoint's digest.

Usage::

    python tools/real_checkpoints list
    python tools/real_checkpoints build llmc-fp8-dynamic ar-gptq   # or: all
    python tools/real_checkpoints summary DIR
    python tools/real_checkpoints lock llmcompressor   # re-resolve a lock

From Python (the e2e tests, with ``tools/`` on sys.path)::

    import real_checkpoints
    model_dir, twin_dir = real_checkpoints.ensure("llmc-w4a16")
    real_checkpoints.FORMATS["llmc-w4a16"].quantization  # "compressed-tensors"

Layout: ``formats`` (tools and formats), ``locks`` (lock files, venvs),
``cache`` (base, keys, ``ensure``), ``summary`` (layout report), ``cli``;
``recipes/`` run inside the tool venvs and import nothing from here.
"""

from __future__ import annotations

from .cache import ensure, ensure_base
from .formats import FORMATS, TOOLS, Format, Tool

__all__ = ["FORMATS", "TOOLS", "Format", "Tool", "ensure", "ensure_base"]
