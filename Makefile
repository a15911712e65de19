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
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
