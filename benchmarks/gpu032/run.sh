#!/bin/bash
# Run from the repository root on the GPU machine:
#   bash .device/gpu032/run.sh --smoke      # M=16, fp8_block only (reaches every stand-in)
#   bash .device/gpu032/run.sh              # full: 4 schemes x M=1,4,16,64,256,1024
# Extra args go to bench.py (e.g. --schemes int4_w4a16 bf16 --m 1 16).
# .device/ is git-ignored: the run tool must carry it (carry: [".device/gpu032"]).
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
