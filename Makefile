# The two commands the README promises, plus the patch workflow's verbs.
PYTHON ?= python3
VENV_PY := .venv/bin/python
MODELS := build/models

# Lines kept beside the main one, each in lines/VERSION/ with its own pins and
# series (`python3 -m forkctl --line VERSION VERB`).
LINES := $(notdir $(wildcard lines/*))
# The line the main line moves to once it passes everything the main line does.
# `make test-next` builds it and runs its series' tests (about 20 minutes on 2
# cores; CI's 90 minutes on this project's 2-core machines do not hold both).
NEXT_LINE := 0.32.0

.PHONY: serve test build sync export check status test-next

## serve: build the fork for CPU if needed, make the tiny FP8 (128x128 block) MoE
## checkpoint if missing, serve it with the CPU FP8 MoE backend, query it once
serve: build
	@test -f $(MODELS)/tiny-fp8-block/config.json || \
	  $(VENV_PY) tools/tiny_checkpoint --out $(MODELS)/tiny-fp8-block --scheme fp8-block
	$(VENV_PY) tools/serve_demo.py --model $(MODELS)/tiny-fp8-block \
	  --quantization fp8 --moe-backend cpu

## test: the tool's own tests, the series check, the series' tests in the tree,
## then every other line's check (with the main venv's hook tools: every line
## pins the same versions)
test: build
	$(VENV_PY) -m pytest -q -p no:cacheprovider tests
	$(PYTHON) -m forkctl check
	$(PYTHON) -m forkctl test
	@for line in $(LINES); do \
	  echo "+ forkctl --line $$line check"; \
	  FORK_VENV=$(CURDIR)/.venv $(PYTHON) -m forkctl --line $$line check || exit 1; \
	done

## test-next: build the next line (lines/$(NEXT_LINE)) and run its series' tests
test-next:
	$(PYTHON) -m forkctl --line $(NEXT_LINE) build
	$(PYTHON) -m forkctl --line $(NEXT_LINE) test

build:
	$(PYTHON) -m forkctl build

sync export check status:
	$(PYTHON) -m forkctl $@
