"""The FlashInfer recipe on every FlashInfer an SGLang release pins, plus 0.6.16 and 0.7.4, from PyPI.

Per release, as an unpacked wheel: the recipe's status (applicable up to 0.6.16, satisfied from
0.6.17, where upstream's PR 3903 landed); the plan's diff applies with `git apply --check` to a
pristine copy; after apply the patched files say what 0.6.17 says in every place the fix touches
(the oracle is 0.6.17's own files, read here, never the recipe); a second apply writes nothing;
rollback leaves every file byte-identical.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.engine import tree as engine
from sm120patch.planning.plan import APPLICABLE, APPLIED, NOT_APPLICABLE, SATISFIED, plan
from sm120patch.planning.targets import discover
from tests.conftest import fetch_or_skip, pristine_or_skip
from tools.releases import FLASHINFER_RELEASES

pytestmark = pytest.mark.releases

RID = "flashinfer-trtllm-comm-sm120"
FIXED = "0.6.17"  # the first release with upstream's fix
EDITS = ("jit-gate", "kernel-bodies", "cluster-clamp", "lamport-pointers")
COMM = "flashinfer/jit/comm.py"
UTILS = "flashinfer/data/include/flashinfer/utils.cuh"
AR = "flashinfer/data/include/flashinfer/comm/trtllm_allreduce.cuh"
FUSION = "flashinfer/data/include/flashinfer/comm/trtllm_allreduce_fusion.cuh"
MOE = "flashinfer/data/include/flashinfer/comm/trtllm_moe_allreduce_fusion.cuh"
CU = "flashinfer/data/csrc/trtllm_allreduce.cu"
FIX_FILES = (COMM, UTILS, AR, FUSION, MOE, CU)
GUARD_FIXED = "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))"


def expected(version: str) -> str:
    return APPLICABLE if Version(version) < Version(FIXED) else SATISFIED


# --- facts read from a tree: what the fix touches, normalised ---------------------------------------------


def majors(tree: Path) -> list[int]:
    """`supported_major_versions` that gen_trtllm_comm_module passes, read with ast."""
    for fn in ast.walk(ast.parse((tree / COMM).read_bytes())):
        if isinstance(fn, ast.FunctionDef) and fn.name == "gen_trtllm_comm_module":
            for kw in (n for n in ast.walk(fn) if isinstance(n, ast.keyword)):
                if kw.arg == "supported_major_versions":
                    return ast.literal_eval(kw.value)
    raise AssertionError(f"{tree / COMM}: no supported_major_versions in gen_trtllm_comm_module")


def statements(tree: Path, rel: str, needle: str) -> list[str]:
    """The C statements of a file that mention `needle`, whitespace collapsed."""
    flat = re.sub(r"\s+", " ", (tree / rel).read_text(encoding="utf-8"))
    return [s.strip() for s in re.split(r"(?<=[;{}])", flat) if needle in s]


def helper(tree: Path) -> str:
    """The body of utils.cuh's GetMaxClusterSize, whitespace collapsed ('' when absent)."""
    m = re.search(r"inline int GetMaxClusterSize\(.*?\n}\n", (tree / UTILS).read_text(encoding="utf-8"), re.S)
    return re.sub(r"\s+", " ", m.group()) if m else ""


def facts(tree: Path) -> dict[str, object]:
    ar = (tree / AR).read_text(encoding="utf-8")
    comm_sources = [tree / rel for rel in (AR, FUSION, MOE, CU)]
    return {
        "majors": majors(tree),
        "guards_below_1200": sum(p.read_text(encoding="utf-8").count("__CUDA_ARCH__ < 1200") for p in comm_sources),
        "guards_from_900": ar.count(GUARD_FIXED),
        "helper": helper(tree),
        "clamps": {rel: statements(tree, rel, "max_cluster_size") for rel in (AR, FUSION, MOE)},
        # a launch that sets the cluster to 8 outright (0.6.0-0.6.3's FP4 tuning caps it at 8
        # after the clamp, `if (cluster_size > 8) cluster_size = 8;`, as 0.6.17's FP4 tuning does)
        "fixed_cluster_of_8": sum(
            s in ("cluster_size = 8;", "int cluster_size = 8;")
            for rel in (FUSION, MOE)
            for s in statements(tree, rel, "cluster_size")
        ),
        "lamport_writes": statements(tree, CU, "lamport_peer_comm_buffer_ptrs["),
        "tp_size_check": statements(tree, CU, "cannot exceed MAX_RANKS_PER_NODE"),
    }


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and ".sm120patch" not in p.parts
    }


def _stats(root: Path) -> dict[str, tuple[int, int, int]]:
    """Cheap 'nothing was written' for big trees (0.7.x unpack to 700 MB): inode, size, mtime of every file."""
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(root).as_posix()] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def recipes():
    return load_recipes(package="flashinfer")


@pytest.fixture(scope="module")
def oracle() -> dict[str, object]:
    """What FlashInfer 0.6.17 itself says in every place the fix touches."""
    f = facts(pristine_or_skip("flashinfer", FIXED))
    assert f["majors"] == [9, 10, 12] and f["guards_below_1200"] == 0 and f["helper"]
    assert all(f["clamps"].values()) and f["tp_size_check"] and f["fixed_cluster_of_8"] == 0  # type: ignore[union-attr]
    return f


def test_releases_cover_every_pin_before_the_fix() -> None:
    before = [v for v in FLASHINFER_RELEASES if Version(v) < Version(FIXED)]
    assert before == [
        "0.5.0", "0.5.3", "0.6.1", "0.6.3", "0.6.7.post2", "0.6.8.post1",
        "0.6.11.post1", "0.6.12", "0.6.14", "0.6.15.post1", "0.6.16",
    ]  # fmt: skip
    assert {FIXED, "0.7.4"} <= set(FLASHINFER_RELEASES)


@pytest.mark.parametrize("version", FLASHINFER_RELEASES)
def test_release_wheel_tree(version: str, tmp_path: Path, recipes, oracle) -> None:
    tree = fetch_or_skip("flashinfer", version, tmp_path / "tree")
    sm120 = parse_arch("sm_120")
    (target,) = discover(tree, "flashinfer")
    assert target.version == version

    (p,) = engine.make_plan(target, recipes, sm120)
    assert p.recipe.id == RID
    assert p.status == expected(version), p.reason
    outcome = "changed" if p.status == APPLICABLE else "satisfied"
    assert [(e.name, e.outcome) for e in p.edits] == [(name, outcome) for name in EDITS]

    if p.status == SATISFIED:
        stats = _stats(tree)
        assert not p.changes
        again = engine.apply(target, recipes, sm120)
        assert [x.status for x in again] == [SATISFIED]
        assert _stats(tree) == stats and not (tree / ".sm120patch").exists()
        return

    before = _hashes(tree)
    assert p.files == sorted(FIX_FILES)
    unpatched = facts(tree)
    assert unpatched["majors"] == [9, 10] and unpatched["guards_below_1200"] == 13
    assert not unpatched["helper"] and unpatched["fixed_cluster_of_8"] == 3

    # the dry-run diff applies to a pristine copy, with git's own checker
    pristine = pristine_or_skip("flashinfer", version)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(pristine.parent)}
    check = subprocess.run(
        ["git", "apply", "--check", "-"], cwd=pristine, input=p.diff().encode(), capture_output=True, env=env
    )
    assert check.returncode == 0, check.stderr.decode()

    (done,) = engine.apply(target, recipes, sm120)
    assert done.status == APPLIED, done.reason
    compile((tree / COMM).read_bytes(), COMM, "exec")
    # in every place the fix touches, the patched release now says what 0.6.17 says
    assert facts(tree) == oracle
    if version == "0.6.16":  # upstream's fix changed nothing else in these files
        fixed = pristine_or_skip("flashinfer", FIXED)
        assert {rel: (tree / rel).read_bytes() for rel in FIX_FILES if rel != COMM} == {
            rel: (fixed / rel).read_bytes() for rel in FIX_FILES if rel != COMM
        }

    # idempotent: a second apply writes nothing, and the patched tree plans as satisfied
    after = _hashes(tree)
    assert [x.status for x in engine.apply(target, recipes, sm120)] == [APPLIED]
    assert _hashes(tree) == after
    (fresh,) = plan(target, recipes, sm120)
    assert fresh.status == SATISFIED and not fresh.changes

    engine.rollback(target, recipes)
    assert _hashes(tree) == before
    assert not (tree / ".sm120patch").exists()


# The releases between the pinned ones (0.5.0 ... 0.6.16.post4): the same one variant of each diff fits them all
BETWEEN = [
    "0.5.1", "0.5.2", "0.6.0", "0.6.2", "0.6.4", "0.6.5", "0.6.6", "0.6.7", "0.6.7.post1", "0.6.7.post3",
    "0.6.8", "0.6.9", "0.6.10", "0.6.10.post1", "0.6.11", "0.6.11.post2", "0.6.11.post3", "0.6.13",
    "0.6.15", "0.6.16.post1", "0.6.16.post2", "0.6.16.post3", "0.6.16.post4",
]  # fmt: skip


@pytest.mark.parametrize("version", BETWEEN)
def test_release_between_the_pins(version: str, tmp_path: Path, recipes, oracle) -> None:
    tree = fetch_or_skip("flashinfer", version, tmp_path / "tree")
    sm120 = parse_arch("sm_120")
    (target,) = discover(tree, "flashinfer")
    before = {rel: (tree / rel).read_bytes() for rel in FIX_FILES}
    (done,) = engine.apply(target, recipes, sm120)
    assert done.status == APPLIED and done.files == sorted(FIX_FILES), done.reason
    assert facts(tree) == oracle
    engine.rollback(target, recipes)
    assert {rel: (tree / rel).read_bytes() for rel in FIX_FILES} == before


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_other_archs_are_not_applicable(arch: str, recipes) -> None:
    (target,) = discover(pristine_or_skip("flashinfer", "0.6.1"), "flashinfer")
    (p,) = engine.make_plan(target, recipes, parse_arch(arch))
    assert p.status == NOT_APPLICABLE and arch in p.reason and not p.changes


def test_sm121_patched_says_what_the_fixed_release_says_and_admits_major_12(tmp_path: Path, recipes, oracle) -> None:
    """DGX Spark (SM121, compute capability 12.1). FlashInfer's own rule decides: the JIT module builds
    for a GPU whose major is in `supported_major_versions`. Before, 0.6.1 passes [9, 10] (no 12.1);
    after applying the sm_121 plan, the patched release passes a list holding 12 and, in every place the
    fix touches, says what 0.6.17 says (read from 0.6.17, never from the sm_120 plan)."""
    tree = fetch_or_skip("flashinfer", "0.6.1", tmp_path / "tree")
    (target,) = discover(tree, "flashinfer")
    sm121 = parse_arch("sm_121")
    assert 12 not in majors(tree)
    (p,) = engine.make_plan(target, recipes, sm121)
    assert p.status == APPLICABLE, p.reason
    (done,) = engine.apply(target, recipes, sm121)
    assert done.status == APPLIED and done.files == sorted(FIX_FILES), done.reason
    assert 12 in majors(tree) and facts(tree) == oracle
    engine.rollback(target, recipes)
    assert 12 not in majors(tree)


def test_plan_names_a_cached_build_that_would_shadow_the_patch(tmp_path: Path) -> None:
    """A trtllm_comm JIT build left from before the patch (its build.ninja lacks SM12x, and 0.6.1 never
    rewrites it) is named in the plan with the command that moves it aside; after that, no warning."""
    tree = fetch_or_skip("flashinfer", "0.6.1", tmp_path / "tree")
    home = tmp_path / "home"
    build = home / ".cache" / "flashinfer" / "0.6.1" / "120f" / "cached_ops" / "trtllm_comm"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text("cuda_cflags = -gencode=arch=compute_90a,code=sm_90a\n")
    (build / "trtllm_comm.so").write_bytes(b"\x7fELF")
    (build / ".ninja_deps").write_bytes(b"")
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(home)}

    def plan_text() -> str:
        argv = ["plan", str(tree), "--arch", "sm_120", "--probe", "none", "--no-diff"]
        out = subprocess.run([sys.executable, "-m", "sm120patch", *argv], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout

    text = plan_text()
    assert f"WARNING: {build} would be used instead of the patched sources" in text
    assert "build.ninja has no compute_12x gencode" in text
    mv = text.split("`")[3]  # the first backquoted span is FlashInfer's own `if not self.is_ninja_generated`
    assert mv.startswith("mv ") and mv.endswith(".sm120patch-aside")
    subprocess.run(mv, shell=True, check=True)
    assert "WARNING" not in plan_text() and not build.exists()
