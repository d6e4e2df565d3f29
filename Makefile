# sm120patch: set up, test, demo. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
CLI     = $(VENV)/bin/sm120patch
DEMO   ?= demo
DEMO_SGLANG ?= 0.5.9
DEMO_FLASHINFER ?= 0.6.3

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

## demo: SGLang $(DEMO_SGLANG) (a git clone's layout) and the FlashInfer it pins, $(DEMO_FLASHINFER), from PyPI.
## Pre-flight for sm_120 (no GPU here): the allreduce-fusion gate is blocked, that FlashInfer has no SM12x
## kernels for it. Plan the pair: the FlashInfer backport recipe comes first, and the SGLang probe judges the
## patched FlashInfer, so the gate can open. Apply the pair, show status, roll back the FlashInfer tree (which
## takes the SGLang recipe proven on it back first), and show both trees byte-identical to the releases again.
demo: venv
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(PY) tools/releases.py sglang $(DEMO_SGLANG) --layout git $(DEMO)/sglang
	$(PY) tools/releases.py flashinfer $(DEMO_FLASHINFER) $(DEMO)/flashinfer
	@echo; echo "== sm120patch recipes"; $(CLI) recipes
	@echo; echo "== sm120patch preflight: SGLang $(DEMO_SGLANG) with its pinned FlashInfer $(DEMO_FLASHINFER) (exit 1: a gate is blocked)"
	-$(CLI) preflight $(DEMO)/sglang --arch sm_120 --flashinfer $(DEMO)/flashinfer --no-torch
	@echo; echo "== sm120patch plan SGLANG FLASHINFER: the pair, statuses and the dry-run diff (nothing written;"
	@echo "   exit 1: the b12x FP4 recipe stays blocked, FlashInfer $(DEMO_FLASHINFER) has no b12x kernels)"
	-$(CLI) plan $(DEMO)/sglang $(DEMO)/flashinfer --arch sm_120
	@echo; echo "== sm120patch apply SGLANG FLASHINFER: each recipe probed first, FlashInfer written first (exit 1: b12x)"
	-$(CLI) apply $(DEMO)/sglang $(DEMO)/flashinfer --arch sm_120 --no-diff
	@echo; echo "== sm120patch status"; $(CLI) status $(DEMO)/sglang $(DEMO)/flashinfer
	@echo; echo "== git status of the patched clone"; git -C $(DEMO)/sglang status --short
	@echo; echo "== sm120patch rollback FLASHINFER (its dependents first)"; $(CLI) rollback $(DEMO)/flashinfer
	@echo; echo "== sm120patch rollback SGLANG (the rest)"; $(CLI) rollback $(DEMO)/sglang
	@echo; echo "== after rollback (empty = pristine)"; git -C $(DEMO)/sglang status --short --ignored
	@test -z "$$(git -C $(DEMO)/sglang status --porcelain --ignored)" && echo "pristine: byte-identical to SGLang $(DEMO_SGLANG)"
	@$(PY) tools/releases.py --same flashinfer $(DEMO_FLASHINFER) $(DEMO)/flashinfer

## docs: regenerate the tables in docs/ from real releases
docs: venv
	$(PY) tools/matrix.py > docs/compatibility.md

## bench: measure plan/apply/rollback/preflight against their floors (see docs/performance.md), and verify's client
## against a bare httpx loop (benchmarks/verify_overhead.py)
bench: venv
	$(PY) benchmarks/bench.py --write-doc
	$(PY) benchmarks/verify_overhead.py

## triage-score: run diagnose on the corpus of real crash excerpts; write recall/precision into docs/crashed.md
triage-score: venv
	$(PY) tools/triage_score.py --write-doc

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .ruff_cache *.egg-info
