# The two commands the README promises, plus the patch workflow's verbs.
PYTHON ?= python3
VENV_PY := .venv/bin/python
MODELS := build/models

# Lines kept beside the main one, each in lines/VERSION/ with its own pins and
# series (`python3 -m forkctl --line VERSION VERB`): 0.19.1, frozen.
LINES := $(notdir $(wildcard lines/*))

.PHONY: serve test build sync export check status

## serve: build the fork for CPU if needed, make the tiny FP8 (128x128 block) MoE
## checkpoint if missing, serve it with the CPU FP8 MoE backend, query it once
serve: build
	@test -f $(MODELS)/tiny-fp8-block/config.json || \
	  $(VENV_PY) tools/tiny_checkpoint --out $(MODELS)/tiny-fp8-block --scheme fp8-block
	$(VENV_PY) tools/serve_demo.py --model $(MODELS)/tiny-fp8-block \
	  --quantization fp8 --moe-backend cpu

## test: the tool's own tests and the e2e suite, the series check, the series'
## tests in the tree (the CPU ones again under every other x86 kernel library
## this machine runs, except upstream's int8 MoE grid: 288 cases, 3.5 minutes
## under the default library, run there only; the series' own int8 tests, of
## one shape, run under each), then every other line's check (with the main
## venv's hook tools: every line pins the same versions)
UPSTREAM_INT8_GRID = tests/kernels/moe/test_cpu_fused_moe.py::test_cpu_fused_moe_int8[
test: build
	$(VENV_PY) -m pytest -q -p no:cacheprovider tests
	$(PYTHON) -m forkctl check
	$(PYTHON) -m forkctl test
	@libraries=$$($(VENV_PY) tools/x86_libraries.py --others) || exit 1; \
	for library in $$libraries; do \
	  echo "+ VLLM_CPU_X86_KERNELS=$$library forkctl test -- -k cpu --deselect '$(UPSTREAM_INT8_GRID)'"; \
	  VLLM_CPU_X86_KERNELS=$$library $(PYTHON) -m forkctl test -- -k cpu \
	    --deselect '$(UPSTREAM_INT8_GRID)' || exit 1; \
	done
	@for line in $(LINES); do \
	  echo "+ forkctl --line $$line check"; \
	  FORK_VENV=$(CURDIR)/.venv $(PYTHON) -m forkctl --line $$line check || exit 1; \
	done

build:
	$(PYTHON) -m forkctl build

sync export check status:
	$(PYTHON) -m forkctl $@
