# sm120patch: set up, test, demo. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
CLI     = $(VENV)/bin/sm120patch
STEP    = tools/demo_step.sh
DEMO   ?= demo
DEMO_SGLANG ?= 0.5.9
DEMO_FLASHINFER ?= 0.6.3

.PHONY: venv test test-unit test-releases reliability lint demo docs bench bench-census triage-score clean

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.ready

## test: unit tests, then every recipe on every supported real release (downloaded from PyPI, cached).
## TEST_JOBS pytest-xdist workers, each taking whole files (module fixtures and caches stay per file):
## on a 2-core CI box the nvcc builds and the downloads then overlap the rest (README, "Development").
## Files go out in collection order, the `long` ones first (tests/conftest.py), not by test count.
TEST_JOBS ?= 2
test: venv
	$(PY) -m pytest -q -ra -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder tests

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
	@echo; echo "== 1. sm120patch recipes: the catalogue"; $(CLI) recipes
	@echo; echo "== 2. sm120patch preflight: SGLang $(DEMO_SGLANG) with the FlashInfer it pins, $(DEMO_FLASHINFER), for sm_120"
	@$(STEP) 1 "FlashInfer $(DEMO_FLASHINFER) alone has no SM12x kernels for the allreduce-fusion gate; its advice is the FlashInfer backport" -- \
	  $(CLI) preflight $(DEMO)/sglang --arch sm_120 --flashinfer $(DEMO)/flashinfer --no-torch
	@echo; echo "== 3. sm120patch plan SGLANG FLASHINFER --stat: the pair, each recipe's status, the files it would change"
	@$(STEP) 1 "the b12x FP4 recipe stays blocked, FlashInfer $(DEMO_FLASHINFER) has no b12x kernels; the rest can be applied" -- \
	  $(CLI) plan $(DEMO)/sglang $(DEMO)/flashinfer --arch sm_120 --stat
	@echo; echo "== 4. sm120patch apply SGLANG FLASHINFER: each recipe probed first, FlashInfer written first"
	@$(STEP) 1 "b12x stays blocked and is not written; everything else was probed and applied" -- \
	  $(CLI) apply $(DEMO)/sglang $(DEMO)/flashinfer --arch sm_120 --no-diff
	@echo; echo "== 5. sm120patch status"; $(CLI) status $(DEMO)/sglang $(DEMO)/flashinfer
	@echo; echo "== 6. git status of the patched clone"; git -C $(DEMO)/sglang status --short
	@echo; echo "== 7. sm120patch rollback FLASHINFER (the SGLang recipe proven on it goes first)"; $(CLI) rollback $(DEMO)/flashinfer
	@echo; echo "== 8. sm120patch rollback SGLANG (the rest)"; $(CLI) rollback $(DEMO)/sglang
	@echo; echo "== 9. after rollback (empty = pristine)"; git -C $(DEMO)/sglang status --short --ignored
	@test -z "$$(git -C $(DEMO)/sglang status --porcelain --ignored)" && echo "pristine: byte-identical to SGLang $(DEMO_SGLANG)"
	@$(PY) tools/releases.py --same flashinfer $(DEMO_FLASHINFER) $(DEMO)/flashinfer
	@echo; echo "The whole diff of step 3: $(CLI) plan $(DEMO)/sglang $(DEMO)/flashinfer --arch sm_120"

## docs: regenerate the tables in docs/ from real releases
docs: venv
	$(PY) tools/matrix.py > docs/compatibility.md

## bench: measure plan/apply/rollback/preflight against their floors (see docs/performance.md), and verify's client
## against a bare httpx loop (benchmarks/verify_overhead.py) and its server launches counted on the test server (benchmarks/verify_launches.py)
bench: venv
	$(PY) benchmarks/bench.py --write-doc
	$(PY) benchmarks/census_bench.py
	$(PY) benchmarks/triage_bench.py
	$(PY) benchmarks/verify_overhead.py
	$(PY) benchmarks/verify_launches.py
	$(PY) benchmarks/gates_bench.py

## bench-census: warm census of the cached environments (target: under 100 ms for an image's worth of files, issue 30's 844), against a stat-every-file floor
bench-census: venv
	$(PY) benchmarks/census_bench.py

## triage-score: run diagnose on the corpus of real crash excerpts; write recall/precision and fix useful into docs/crashed.md
triage-score: venv
	$(PY) tools/triage_score.py --write-doc
	$(PY) tools/fix_score.py --write-doc

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .ruff_cache *.egg-info
