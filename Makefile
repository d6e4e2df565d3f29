# sm120patch: set up, test, demo. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
CLI     = $(VENV)/bin/sm120patch
DEMO   ?= demo
DEMO_SGLANG ?= 0.5.9
DEMO_FLASHINFER ?= 0.6.1
DEMO_FLASHINFER_NEW ?= 0.6.17

.PHONY: venv test test-unit test-releases reliability lint demo docs bench triage-score clean

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.ready

## test: unit tests, then every recipe on every supported real release (downloaded from PyPI, cached)
test: venv
	$(PY) -m pytest -q -ra tests

test-unit: venv
	$(PY) -m pytest -q tests/unit

test-releases: venv
	$(PY) -m pytest -q -ra -m releases tests/integration

lint: venv
	$(VENV)/bin/ruff check sm120patch tests tools benchmarks
	$(VENV)/bin/ruff format --check sm120patch tools benchmarks
	$(PY) tools/check_tests.py

## reliability: kills, concurrency, hostile input and fuzz on real releases; renders docs/reliability.md
reliability: venv
	$(PY) -m pytest -q -ra tests/reliability
	$(PY) tools/reliability_report.py

## demo: fetch SGLang $(DEMO_SGLANG) (a git clone's layout) and FlashInfer $(DEMO_FLASHINFER) from PyPI,
## pre-flight for sm_120, show the dry-run diff, apply (the probe blocks the allreduce gate before writing it: that
## FlashInfer has no SM12x kernels for it), show status, roll back, and show the tree pristine again.
demo: venv
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(PY) tools/releases.py sglang $(DEMO_SGLANG) --layout git $(DEMO)/sglang
	$(PY) tools/releases.py flashinfer $(DEMO_FLASHINFER) $(DEMO)/flashinfer-$(DEMO_FLASHINFER)
	$(PY) tools/releases.py flashinfer $(DEMO_FLASHINFER_NEW) $(DEMO)/flashinfer-$(DEMO_FLASHINFER_NEW)
	@echo; echo "== sm120patch recipes"; $(CLI) recipes
	@echo; echo "== sm120patch preflight (no GPU here: --arch sm_120, FlashInfer $(DEMO_FLASHINFER))"
	-$(CLI) preflight $(DEMO)/sglang --arch sm_120 --flashinfer $(DEMO)/flashinfer-$(DEMO_FLASHINFER) --no-torch
	@echo; echo "== sm120patch plan: statuses and the dry-run diff (nothing written; exit 1: one recipe blocked)"
	-$(CLI) plan $(DEMO)/sglang --arch sm_120 --flashinfer $(DEMO)/flashinfer-$(DEMO_FLASHINFER)
	@echo; echo "== sm120patch apply against FlashInfer $(DEMO_FLASHINFER) (exit 1: the probe blocks one recipe before anything is written)"
	-$(CLI) apply $(DEMO)/sglang --arch sm_120 --flashinfer $(DEMO)/flashinfer-$(DEMO_FLASHINFER) --no-diff
	@echo; echo "== sm120patch apply against FlashInfer $(DEMO_FLASHINFER_NEW) (has SM12x trtllm_comm kernels)"
	$(CLI) apply $(DEMO)/sglang --arch sm_120 --flashinfer $(DEMO)/flashinfer-$(DEMO_FLASHINFER_NEW) --no-diff
	@echo; echo "== sm120patch status"; $(CLI) status $(DEMO)/sglang
	@echo; echo "== git status of the patched clone"; git -C $(DEMO)/sglang status --short
	@echo; echo "== sm120patch rollback"; $(CLI) rollback $(DEMO)/sglang
	@echo; echo "== git status after rollback (empty = pristine)"; git -C $(DEMO)/sglang status --short --ignored
	@test -z "$$(git -C $(DEMO)/sglang status --porcelain --ignored)" && echo "pristine: byte-identical to SGLang $(DEMO_SGLANG)"

## docs: regenerate the tables in docs/ from real releases
docs: venv
	$(PY) tools/matrix.py > docs/compatibility.md

## bench: measure plan/apply/rollback/preflight against their floors (see docs/performance.md)
bench: venv
	$(PY) benchmarks/bench.py --write-doc

## triage-score: run diagnose on the corpus of real crash excerpts; write recall/precision into docs/crashed.md
triage-score: venv
	$(PY) tools/triage_score.py --write-doc

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .ruff_cache *.egg-info
