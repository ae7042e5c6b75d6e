# The two commands the README promises, plus the patch workflow's verbs.
PYTHON ?= python3
VENV_PY := .venv/bin/python
MODELS := build/models

.PHONY: serve test build sync export check status

## serve: build the fork for CPU if needed, make the tiny FP8 (128x128 block) MoE
## checkpoint if missing, serve it with the CPU FP8 MoE backend, query it once
serve: build
	@test -f $(MODELS)/tiny-fp8-block/config.json || \
	  $(VENV_PY) tools/tiny_checkpoint --out $(MODELS)/tiny-fp8-block --scheme fp8-block
	$(VENV_PY) tools/serve_demo.py --model $(MODELS)/tiny-fp8-block \
	  --quantization fp8 --moe-backend cpu

## test: the tool's own tests, the series check, then the series' tests in the tree
test: build
	$(VENV_PY) -m pytest -q -p no:cacheprovider tests
	$(PYTHON) -m forkctl check
	$(PYTHON) -m forkctl test

build:
	$(PYTHON) -m forkctl build

sync export check status:
	$(PYTHON) -m forkctl $@
