#!/bin/bash
# One Qwen3-30B-A3B MoE layer on one GPU without network access (the lent GPU
# machine): bf16 vs int8 W8A8, FP8 block and int4 W4A16 through the tree's
# oracles. Beside this script it needs the tree's vllm/ packed without
# compiled libraries and the cp312 wheels of wheels.txt, both git-ignored:
#   tar cJf benchmarks/gpu_moe/vllm.tar.xz --exclude='*.so' -C tree vllm
#   pip download --no-deps --python-version 3.12 --only-binary=:all: \
#     -d benchmarks/gpu_moe/wheels $(sed 's/-\([0-9]\)/==\1/' benchmarks/gpu_moe/wheels.txt)
# Then, on the GPU machine, from the repository root:
#   bash benchmarks/gpu_moe/run.sh --smoke   # M=16, fp8_block only (reaches every stand-in)
#   bash benchmarks/gpu_moe/run.sh           # full: 4 schemes x M=1,4,16,64,256,1024
# Extra args go to bench.py (e.g. --schemes int4_w4a16 bf16 --m 1 16). With
# network access, `forkctl build --target cuda` and bench.py alone do the same
# (.buildkite/pipeline.yml).
set -e
cd "$(dirname "$0")"
mkdir -p /tmp/deps
python -m pip install -q --no-index --no-deps --target /tmp/deps wheels/*.whl
mkdir -p /tmp/v && tar xJf vllm.tar.xz -C /tmp/v
# Platform detection (and vllm.triton_utils) read the installed "vllm"
# distribution's version: declare the unpacked tree as a CUDA build.
mkdir -p /tmp/deps/vllm-0.32.0.dist-info
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n' > /tmp/deps/vllm-0.32.0.dist-info/METADATA
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
PYTHONPATH=/tmp/v:/tmp/deps python bench.py --out "$OUT/bench032.json" "$@"
