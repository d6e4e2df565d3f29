"""Every recipe on every SGLang release it claims, 0.5.5 to 0.5.23, downloaded from PyPI.

Per release, as an unpacked wheel and as a git clone: the status of each recipe;
the plan's diff applies with `git apply --check` to a pristine copy; after apply
every patched file compiles and each gate admits major 12 (evaluated on the AST)
while still refusing what it refused before; a second apply changes nothing;
rollback leaves the tree byte-identical (git status clean).
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.engine import tree as engine
from sm120patch.planning.plan import APPLICABLE, APPLIED, NOT_APPLICABLE, SATISFIED
from sm120patch.planning.targets import discover
from tests.conftest import fetch_or_skip, pristine_or_skip
from tests.integration import gates
from tools.releases import SGLANG_RELEASES

pytestmark = pytest.mark.releases

AR, AT, MOE = "sglang-allreduce-fusion-sm120", "sglang-autotune-flashinfer-cutlass", "sglang-moe-backend-sm120"
GPT = "sglang-gptoss-mxfp4-sm120"
DSA, FP4, GDN = "sglang-dsa-sparse-mla-sm120", "sglang-fp4-gemm-b12x-sm120", "sglang-gdn-prefill-sm120"
PCIE, GUARD = "sglang-pcie-ipc-allreduce-sm120", "sglang-autotune-moe-guard-sm120"
MHA = "sglang-gptoss-trtllm-mha-sm120"


def _n(v: str) -> int:
    return int(v.split(".")[2])


def expected(version: str) -> dict[str, str]:
    """Statuses per release, written by hand; test_the_status_table_is_what_each_release_s_source_says
    derives the autotune, MoE and GPT-OSS rows from each release's own source (docs/compatibility.md is
    the planner's output, never this table's oracle)."""
    n = _n(version)
    return {
        AR: APPLICABLE,
        AT: NOT_APPLICABLE if n <= 6 else APPLICABLE if n <= 12 else SATISFIED,
        MOE: APPLICABLE if n <= 12 else SATISFIED,
        GPT: APPLICABLE if n <= 9 else SATISFIED,
        # the frontier recipes (tests/integration/test_frontier_releases.py checks them in depth)
        DSA: APPLICABLE if n >= 17 else NOT_APPLICABLE,
        FP4: APPLICABLE if n >= 8 else NOT_APPLICABLE,
        GDN: APPLICABLE if n >= 19 else NOT_APPLICABLE,
        PCIE: APPLICABLE if n >= 21 else NOT_APPLICABLE,
        GUARD: APPLICABLE if n >= 17 else NOT_APPLICABLE,
        MHA: APPLICABLE if n >= 19 else NOT_APPLICABLE,
    }


def expected_ar_edits(version: str) -> dict[str, str]:
    """Which parts of the allreduce gate each release has, and in what state."""
    n = _n(version)
    return {
        "runtime-check": "changed",
        "backend-resolver": "changed" if n >= 14 else "missing",
        # 0.5.5/0.5.6 enable fusion inside an SM100-only block (no `sm90 or sm100` test);
        # 0.5.7 keyed it on is_blackwell_supported(), which already admits SM12x
        "server-args-auto-enable": "missing" if n <= 6 else "satisfied" if n == 7 else "changed",
        # the SM12x TP limit on every auto-enable that admits SM12x once widened: 0.5.5/0.5.6 turn
        # fusion on for GPT-OSS under is_blackwell_supported(), 0.5.7 for every listed model
        "auto-enable-tp-limit": "changed" if n <= 14 else "missing",
        "auto-enable-tp-limit-view": "missing" if n <= 14 else "changed",
    }


RUNTIME_FNS = {
    "apply_flashinfer_allreduce_fusion",
    "flashinfer_ar_fusion_applies",
    "_gather_hidden_states_and_residual",
}
RESOLVER_FNS = {"_resolve_backend"}
AUTO_FNS = {"_handle_model_specific_adjustments", "_flashinfer_allreduce_fusion_auto_enable"}
AUTOTUNE_FNS = {"_should_run_flashinfer_autotune", "should_run_flashinfer_autotune"}
MOE_FNS = {"_handle_moe_kernel_config", "_moe_runner_backend_quant_constraints"}
GPT_FNS = {"_handle_model_specific_adjustments", "_gpt_oss_overrides"}


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*.py")
        if ".git" not in p.parts
    }


@pytest.fixture(scope="module")
def recipes():
    return load_recipes()


def _files_with(root: Path, names: set[str], also: str = "") -> list[Path]:
    """The release's modules that define one of `names` (and mention `also`)."""
    out = []
    for p in sorted((root / "sglang").rglob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        if any(f"def {n}(" in text for n in names) and also in text and gates.functions(ast.parse(text), names):
            out.append(p)
    return out


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_the_status_table_is_what_each_release_s_source_says(version: str) -> None:
    """The oracle for expected()'s rows: each pristine release read with the release's own predicates
    (gates.py). Autotune: satisfied where the MoE backend list already holds flashinfer_cutlass, applicable
    where the list is there without it (commented out is without), not-applicable where there is no such
    list. MoE: satisfied where modelopt_fp4 on SM12x already picks flashinfer_cutlass. GPT-OSS: applicable
    where the first MXFP4 test still admits SM12x into flashinfer_mxfp4."""
    root = pristine_or_skip("sglang", version)
    holds = []
    for p in _files_with(root, AUTOTUNE_FNS):
        try:
            anchors = {"flashinfer_trtllm", "flashinfer_mxfp4"}
            holds.append(gates.list_holds(p, AUTOTUNE_FNS, anchors, "flashinfer_cutlass"))
        except AssertionError:  # the function is there, the list of MoE backends is not
            continue
    autotune = SATISFIED if True in holds else APPLICABLE if False in holds else NOT_APPLICABLE
    picks = [gates.moe_rule_picks(p, MOE_FNS, 12, "modelopt_fp4") for p in _files_with(root, MOE_FNS, "modelopt_fp4")]
    assert picks, "no MoE backend rule for modelopt_fp4 found"
    moe = SATISFIED if "flashinfer_cutlass" in picks else APPLICABLE
    mx = {"is_mxfp4_quant_format": True}
    gpt_files = _files_with(root, GPT_FNS, "flashinfer_mxfp4")
    first = [gates.if_tests_admit(p, GPT_FNS, "mxfp4", 12, **mx) for p in gpt_files]
    gptoss = APPLICABLE if any(r and r[0] for r in first) else SATISFIED
    table = expected(version)
    assert {AT: autotune, MOE: moe, GPT: gptoss} == {AT: table[AT], MOE: table[MOE], GPT: table[GPT]}


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_release_wheel_tree(version: str, tmp_path: Path, recipes) -> None:
    tree = fetch_or_skip("sglang", version, tmp_path / "tree")
    sm120 = parse_arch("sm_120")
    (target,) = discover(tree)
    assert target.version == version
    before = _hashes(tree)

    plans = {p.recipe.id: p for p in engine.make_plan(target, recipes, sm120)}
    assert {k: p.status for k, p in plans.items()} == expected(version)
    ar_edits = {e.name: e.outcome for e in plans[AR].edits}
    assert ar_edits == expected_ar_edits(version)
    for p in plans.values():
        if p.status == NOT_APPLICABLE:
            assert p.reason and not p.changes

    # the dry-run diff applies to a pristine copy, with git's own checker
    diff = "".join(p.diff() for p in plans.values())
    pristine = pristine_or_skip("sglang", version)
    check = subprocess.run(["git", "apply", "--check", "-"], cwd=pristine, input=diff.encode(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()

    # the gates shut SM12x out before
    pkg = target.package_dir
    runtime_files = [pkg.parent / f for f in plans[AR].edits[0].files] or [
        pkg.parent / p for p in plans[AR].files if "communicator" in p or "add_norm" in p
    ]
    shut = [c for f in runtime_files for c in gates.chains_admit(f, RUNTIME_FNS, 12)]
    assert shut and not any(shut), shut  # there is a gate, and it refuses major 12

    result = {p.recipe.id: p for p in engine.apply(target, recipes, sm120)}
    assert {k: p.status for k, p in result.items()} == {
        k: APPLIED if s == APPLICABLE else s for k, s in expected(version).items()
    }
    changed = sorted({rel for p in result.values() for rel in p.files})
    for rel in changed:
        compile((tree / rel).read_bytes(), rel, "exec")

    # allreduce: every arch test in the runtime check (and resolver / auto-enable where
    # present) now holds for major 12, still for 9 and 10, and still not for 8
    opened = 0
    for rel in plans[AR].files:
        path = tree / rel
        for fns in (RUNTIME_FNS, RESOLVER_FNS, AUTO_FNS):
            chains = gates.chains_admit(path, fns, 12)
            opened += len(chains)
            if chains:
                assert all(chains), f"{rel}: a gate still refuses major 12"
                assert all(gates.chains_admit(path, fns, 9)) and all(gates.chains_admit(path, fns, 10))
                assert not any(gates.chains_admit(path, fns, 8))
        if any(s in rel for s in ("communicator", "add_norm")):
            assert gates.module_binds(path, "_is_sm120_supported")
    assert opened, "no arch chain of the allreduce gate found after apply: nothing was checked"

    # autotune: the MoE backend list now holds flashinfer_cutlass
    if expected(version)[AT] != NOT_APPLICABLE:
        (rel,) = result[AT].files or plans[AT].edits[0].files
        assert gates.list_holds(
            tree / rel, AUTOTUNE_FNS, {"flashinfer_trtllm", "flashinfer_mxfp4"}, "flashinfer_cutlass"
        )

    # MoE: modelopt_fp4 on SM12x picks flashinfer_cutlass, never flashinfer_trtllm; SM100 untouched
    (rel,) = plans[MOE].files or plans[MOE].edits[0].files[:1]
    path = tree / rel
    assert gates.moe_rule_picks(path, MOE_FNS, 12, "modelopt_fp4") == "flashinfer_cutlass"
    assert gates.moe_rule_picks(path, MOE_FNS, 12, "modelopt_fp4", backend="triton") == "triton"
    assert gates.moe_rule_picks(path, MOE_FNS, 10, "modelopt_fp4") != "flashinfer_cutlass"

    # GPT-OSS MXFP4: the flashinfer_mxfp4 test no longer admits SM12x, still admits SM100
    (rel,) = result[GPT].files or plans[GPT].edits[0].files[:1]
    mx = {"is_mxfp4_quant_format": True}
    assert gates.if_tests_admit(tree / rel, GPT_FNS, "mxfp4", 10, **mx)[0] is True
    sm12x = gates.if_tests_admit(tree / rel, GPT_FNS, "mxfp4", 12, **mx)
    assert sm12x[0] is False  # the first MXFP4 test, the one that picks flashinfer_mxfp4 up to 0.5.9

    # idempotent: a second apply writes nothing
    after = _hashes(tree)
    again = engine.apply(target, recipes, sm120)
    assert all(p.status in (APPLIED, SATISFIED, NOT_APPLICABLE) for p in again)
    assert _hashes(tree) == after

    engine.rollback(target, recipes)
    assert _hashes(tree) == before
    assert not (tree / ".sm120patch").exists()


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_release_git_clone(version: str, tmp_path: Path, recipes) -> None:
    repo = fetch_or_skip("sglang", version, tmp_path / "repo", layout="git")
    sm120 = parse_arch("sm_120")
    (target,) = discover(repo)
    assert target.is_git and target.root == repo and target.version == version
    applied = engine.apply(target, recipes, sm120)
    assert any(p.status == APPLIED for p in applied)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert status and all(line.startswith(" M ") for line in status.splitlines()), status
    engine.rollback(target, recipes)
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=repo, capture_output=True, text=True)
    assert status.stdout == ""


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_other_archs_are_not_applicable(arch: str, recipes) -> None:
    tree = pristine_or_skip("sglang", "0.5.9")
    (target,) = discover(tree)
    plans = engine.make_plan(target, recipes, parse_arch(arch))
    assert plans and all(p.status == NOT_APPLICABLE and arch in p.reason for p in plans)


def _chains_on(path: Path, names: set[str], dev: gates.Device) -> list[bool]:
    """Each arch `or` chain of the named functions, evaluated with the release's own predicates on `dev`."""
    tree = ast.parse(path.read_bytes())
    root = gates.package_root(path)
    scope = gates.Scope(path, dev)
    return [bool(scope.eval(c)) for fn in gates.functions(tree, names) for c in gates.arch_chains(fn, root, tree)]


def test_sm121_the_allreduce_gate_opens_by_sglang_s_own_predicates(tmp_path: Path, recipes) -> None:
    """DGX Spark (SM121, compute capability 12.1): the expectation comes from SGLang 0.5.9's own
    predicates evaluated on a 12.1 device (tests/integration/gates.py), never from the sm_120 plan.
    Before, every arch chain of the runtime check refuses 12.1; after applying the sm_121 plan, every
    one admits 12.1 (and 9.0, 10.0, not 8.0), and the statuses are the release's (expected())."""
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "tree")
    (target,) = discover(tree)
    sm121, spark = parse_arch("sm_121"), gates.Device(12, 1)
    plans = {p.recipe.id: p for p in engine.make_plan(target, recipes, sm121)}
    assert {k: p.status for k, p in plans.items()} == expected("0.5.9")
    files = [tree / rel for rel in plans[AR].files if "communicator" in rel or "add_norm" in rel]
    before = [c for f in files for c in _chains_on(f, RUNTIME_FNS, spark)]
    assert before and not any(before)
    result = {p.recipe.id: p for p in engine.apply(target, recipes, sm121)}
    assert result[AR].status == APPLIED
    for f in files:
        after = _chains_on(f, RUNTIME_FNS, spark)
        assert after and all(after), f
        assert all(_chains_on(f, RUNTIME_FNS, gates.Device(9))) and all(_chains_on(f, RUNTIME_FNS, gates.Device(10)))
        assert not any(_chains_on(f, RUNTIME_FNS, gates.Device(8)))
    engine.rollback(target, recipes)
    assert not any(c for f in files for c in _chains_on(f, RUNTIME_FNS, spark))
