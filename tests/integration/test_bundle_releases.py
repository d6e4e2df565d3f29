"""Bundles on real releases: SGLang 0.5.9 with its pinned FlashInfer 0.6.3, and 0.5.23 with 0.7.2,
as an unpacked wheel (site-packages) and as a git clone (python/sglang/, FlashInfer beside it).

The oracles are the releases themselves and what each recipe sets out to do, read from the source
(never `sm120patch apply`, the code under test's other half): a fresh copy patched with `git apply`
of the series differs from the release's own bytes in exactly the files the manifest declares, and
in those files the gates do what the recipes say, evaluated with the release's own predicates
(tests/integration/gates.py, the checks of test_sglang_releases.py): the allreduce-fusion chains
admit major 12 and still 9 and 10, not 8; the autotune list holds flashinfer_cutlass; modelopt_fp4
on SM12x picks flashinfer_cutlass; the GPT-OSS MXFP4 test no longer admits SM12x; the FlashInfer
backport says what 0.6.17 says (test_flashinfer_releases.py's facts). The frontier recipes' intent
is test_frontier_releases.py's; here their files must compile. `git am`, `patch -p1` and `apply
--bundle` must then give those same bytes; `rollback` the release back byte for byte; a node check
must pass on the patched copy and fail, naming the recipe and the rollback command, once the
FlashInfer under it is swapped or a file its proof read is edited.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import fetch_or_skip, needs_tool, pristine_or_skip
from tests.integration import gates
from tests.integration.test_flashinfer_releases import FIXED, facts
from tests.integration.test_sglang_releases import AUTO_FNS, AUTOTUNE_FNS, GPT_FNS, MOE_FNS, RESOLVER_FNS, RUNTIME_FNS

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
AR = "sglang-allreduce-fusion-sm120"
AUTOTUNE = "sglang-autotune-flashinfer-cutlass"
GPTOSS = "sglang-gptoss-mxfp4-sm120"
MOE = "sglang-moe-backend-sm120"
FIX = "flashinfer-trtllm-comm-sm120"
FP4 = "sglang-fp4-gemm-b12x-sm120"
FRONTIER = [
    "sglang-autotune-moe-guard-sm120",
    "sglang-dsa-sparse-mla-sm120",
    FP4,
    "sglang-gdn-prefill-sm120",
    "sglang-gptoss-trtllm-mha-sm120",
    "sglang-pcie-ipc-allreduce-sm120",
]
# what the catalogue exports for sm_120 at the static rung. On 0.5.9 + 0.6.3 the FlashInfer backport
# goes first (0.6.3 gates trtllm_comm to [9, 10]) and the allreduce fusion after it; FlashInfer 0.6.3
# has no b12x kernels; the other frontier gates do not exist in 0.5.9. On 0.5.23 + 0.7.2 FlashInfer
# needs no backport and the older SGLang recipes are upstream already.
EXPECTED = {
    ("0.5.9", "0.6.3"): (
        [FIX, AR, AUTOTUNE, GPTOSS, MOE],
        {FP4: "blocked", **{r: "not-applicable" for r in FRONTIER if r != FP4}},
    ),
    ("0.5.23", "0.7.2"): (
        [AR, *FRONTIER],
        {FIX: "satisfied", AUTOTUNE: "satisfied", GPTOSS: "satisfied", MOE: "satisfied"},
    ),
}
CASES = [(sg, fi, layout) for (sg, fi) in EXPECTED for layout in ("wheel", "git")]


@pytest.fixture(autouse=True)
def _private_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


def sm(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600, cwd=cwd)


@dataclass
class Copy:
    """One fresh copy of the release pair, in a layout."""

    layout: str
    root: Path  # the site-packages, or the SGLang clone
    fi: Path  # the folder holding flashinfer/: the site-packages itself, or a tree beside the clone

    @property
    def sglang_parent(self) -> Path:
        return self.root / "python" if self.layout == "git" else self.root

    @property
    def paths(self) -> list[Path]:
        return [self.root] if self.layout == "wheel" else [self.root, self.fi]

    def hashes(self) -> dict[str, str]:
        """sha256 of every file of both packages (and the clone's other files), by path."""
        out = {}
        for base in dict.fromkeys([self.root, self.fi]):
            for p in sorted(base.rglob("*")):
                rel = p.relative_to(base)
                if rel.parts[0] in (".git", ".sm120patch") or "__pycache__" in rel.parts or not p.is_file():
                    continue
                out[f"{base.name}/{rel.as_posix()}"] = hashlib.sha256(p.read_bytes()).hexdigest()
        return out


def fresh(tmp_path: Path, name: str, sglang: str, fi: str, layout: str) -> Copy:
    dest = tmp_path / name
    if layout == "wheel":
        fetch_or_skip("sglang", sglang, dest / "site")
        fetch_or_skip("flashinfer", fi, dest / "site")  # both packages in one site-packages
        return Copy(layout, dest / "site", dest / "site")
    fetch_or_skip("sglang", sglang, dest / "sglang", layout="git")
    fetch_or_skip("flashinfer", fi, dest / "flashinfer")
    return Copy(layout, dest / "sglang", dest / "flashinfer")


def swap_flashinfer(c: Copy, version: str, tmp_path: Path) -> Path:
    """A `pip install flashinfer-python==version` under the copy; returns the FlashInfer folder."""
    if c.layout == "git":  # a clone runs against whichever FlashInfer the interpreter imports
        return fetch_or_skip("flashinfer", version, tmp_path / f"fi-{version}")
    shutil.rmtree(c.fi / "flashinfer")
    for info in c.fi.glob("flashinfer_python-*.dist-info"):
        shutil.rmtree(info)
    new = pristine_or_skip("flashinfer", version)
    for item in [new / "flashinfer", *new.glob("flashinfer_python-*.dist-info")]:
        shutil.copytree(item, c.fi / item.name, copy_function=os.link)
    return c.fi


def replace_text(path: Path, old: str, new: str) -> None:
    """Edit a file of a copy without writing through its hard link into the release cache."""
    text = path.read_text()
    assert old in text
    path.unlink()
    path.write_text(text.replace(old, new))


def apply_series_with(
    tool: list[str],
    bundle: Path,
    where: dict[str, Path],
    stdin: bool = False,
    sglang_args: tuple[str, ...] | list[str] = (),
    only: str | None = None,
) -> None:
    """Each patch of the series (of package `only`, if given), in order, from the folder that
    holds its package (`where`); SGLang's in a clone get `sglang_args` (--directory=python)."""
    recipes = json.loads((bundle / "manifest.json").read_text())["recipes"]
    package = {x["patch"]: x["package"] for x in recipes if x.get("patch")}
    for name in (bundle / "series").read_text().split():
        patch, pkg = bundle / name, package[name]
        if only and pkg != only:
            continue
        args = [*tool, *(sglang_args if pkg == "sglang" else ())]
        if stdin:
            with patch.open("rb") as f:
                r = subprocess.run(args, stdin=f, cwd=where[pkg], capture_output=True, timeout=120)
        else:
            r = subprocess.run([*args, str(patch)], cwd=where[pkg], capture_output=True, timeout=120)
        assert r.returncode == 0, (name, r.stdout, r.stderr)


def intent_problems(c: Copy, files: dict[str, list[str]]) -> list[str]:
    """What each exported recipe sets out to do, checked in its files of a patched copy with the
    release's own code (paths as the manifest gives them, relative to the package's parent)."""
    problems = []
    sg = c.sglang_parent

    def each(rid: str) -> list[Path]:
        return [sg / f for f in files.get(rid, []) if f.startswith("sglang/")]

    for fs in files.values():
        for f in fs:
            base = sg if f.startswith("sglang/") else c.fi
            if f.endswith(".py"):
                compile((base / f).read_bytes(), f, "exec")
    if AR in files:
        seen = 0
        for path in each(AR):
            for fns in (RUNTIME_FNS, RESOLVER_FNS, AUTO_FNS):
                chains = gates.chains_admit(path, fns, 12)
                seen += len(chains)
                if not all(chains) or not all(gates.chains_admit(path, fns, 9) + gates.chains_admit(path, fns, 10)):
                    problems.append(f"{AR}: {path.name}: a gate refuses 12, 9 or 10")
                if any(gates.chains_admit(path, fns, 8)):
                    problems.append(f"{AR}: {path.name}: a gate now admits 8")
        if not seen:
            problems.append(f"{AR}: no arch chain found in {files[AR]}")
    if AUTOTUNE in files:
        (path,) = each(AUTOTUNE)
        if not gates.list_holds(path, AUTOTUNE_FNS, {"flashinfer_trtllm", "flashinfer_mxfp4"}, "flashinfer_cutlass"):
            problems.append(f"{AUTOTUNE}: the autotune list lacks flashinfer_cutlass")
    if MOE in files:
        path = each(MOE)[0]
        if gates.moe_rule_picks(path, MOE_FNS, 12, "modelopt_fp4") != "flashinfer_cutlass":
            problems.append(f"{MOE}: modelopt_fp4 on SM12x does not pick flashinfer_cutlass")
    if GPTOSS in files:
        path = each(GPTOSS)[0]
        mx = {"is_mxfp4_quant_format": True}
        if gates.if_tests_admit(path, GPT_FNS, "mxfp4", 12, **mx)[0] is not False:
            problems.append(f"{GPTOSS}: the MXFP4 test still admits SM12x")
    if FIX in files and facts(c.fi) != facts(pristine_or_skip("flashinfer", FIXED)):
        problems.append(f"{FIX}: the patched FlashInfer does not say what {FIXED} says")
    return problems


@pytest.mark.parametrize(("sglang", "fi", "layout"), CASES)
def test_bundle_on_real_releases(tmp_path: Path, sglang: str, fi: str, layout: str) -> None:
    exported, others = EXPECTED[(sglang, fi)]
    src = fresh(tmp_path, "src", sglang, fi, layout)
    pristine = src.hashes()
    bundle = tmp_path / "bundle"
    r = sm("export", *src.paths, "--arch", "sm_120", "--probe", "static", "-o", bundle, "--json")
    assert r.returncode == (1 if "blocked" in others.values() else 0), r.stderr
    assert src.hashes() == pristine and not (src.root / ".sm120patch").exists()  # nothing written
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [(t["package"], t["version"]) for t in manifest["targets"]] == [("flashinfer", fi), ("sglang", sglang)]
    status = {x["id"]: x["status"] for x in manifest["recipes"]}
    assert [i for i, s in status.items() if s == "exported"] == exported
    assert {i: s for i, s in status.items() if s != "exported"} == others
    series = (bundle / "series").read_text().split()
    assert series == [f"{n:04d}-{rid}.patch" for n, rid in enumerate(exported, 1)]

    # git apply of the series, from the folder that holds the package, on a fresh copy; checked against
    # the release's bytes and the recipes' intent, then the reference for every other way of applying it
    by_git = fresh(tmp_path, "by-git", sglang, fi, layout)
    if layout == "git":  # inside a clone: from its root, with --directory (git apply in python/ would skip)
        where = {"sglang": by_git.root, "flashinfer": by_git.fi}
        apply_series_with(["git", "apply"], bundle, where, sglang_args=["--directory=python"])
    else:
        apply_series_with(["git", "apply"], bundle, {"sglang": by_git.sglang_parent, "flashinfer": by_git.fi})
    expected = by_git.hashes()
    changed = sorted(k for k in expected if expected[k] != pristine[k])
    assert changed and set(expected) == set(pristine), "the bundle changes nothing, or adds/removes files"
    files = {x["id"]: [f["path"] for f in x["files"]] for x in manifest["recipes"] if x["status"] == "exported"}
    declared = {f for fs in files.values() for f in fs}
    assert {k.split("/", 1)[1].removeprefix("python/") for k in changed} == declared
    assert intent_problems(by_git, files) == []

    if layout == "git":
        by_am = fresh(tmp_path, "by-am", sglang, fi, layout)  # git am: one commit per SGLang recipe
        sg_series = [p for p in series if "-sglang-" in p]
        apply_series_with(["git", "apply"], bundle, {"flashinfer": by_am.fi}, only="flashinfer")
        am = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q", "--directory=python"]
        r = subprocess.run([*am, *[str(bundle / p) for p in sg_series]], cwd=by_am.root, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert by_am.hashes() == expected
        log = subprocess.run(["git", "log", "--format=%s"], cwd=by_am.root, capture_output=True, text=True).stdout
        assert len(log.splitlines()) == 1 + len(sg_series)
    # patch -p1 is a promised oracle (README: a bundle applies without sm120patch): missing, it fails in CI
    needs_tool("patch", "a bundle must apply with patch -p1")
    by_patch = fresh(tmp_path, "by-patch", sglang, fi, layout)
    tool = ["patch", "-p1", "--quiet", "--no-backup-if-mismatch"]
    apply_series_with(tool, bundle, {"sglang": by_patch.sglang_parent, "flashinfer": by_patch.fi}, True)
    assert by_patch.hashes() == expected

    # apply --bundle goes through the journal and the probe; rollback gives the release back
    node = fresh(tmp_path, "node", sglang, fi, layout)
    r = sm("apply", "--bundle", bundle, *node.paths, "--arch", "sm_120", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["bundle"]["bytes_match"] and {x["status"] for x in out["recipes"]} == {"applied"}
    assert node.hashes() == expected
    fi_flag = ["--flashinfer", node.fi] if layout == "git" else []
    r = sm("preflight", "--bundle", bundle, node.root, *fi_flag, "--arch", "sm_120", "--json")
    assert r.returncode == 0, r.stdout
    assert {x["id"]: x["state"] for x in json.loads(r.stdout)["recipes"]} == {
        **{i: "ok" for i in exported},
        **{i: "not-exported" for i in others},
    }
    assert sm("rollback", *node.paths).returncode == 0
    assert node.hashes() == pristine
    if layout == "git":
        porcelain = subprocess.run(
            ["git", "status", "--porcelain", "--ignored"], cwd=node.root, capture_output=True, text=True
        ).stdout
        assert porcelain == ""


def test_the_node_check_fails_when_the_flashinfer_under_the_image_changes(tmp_path: Path) -> None:
    """0.5.23 + 0.7.2: the image opened allreduce fusion; a node whose FlashInfer is 0.6.16
    (trtllm_comm gated to [9, 10]) cannot run it."""
    for layout in ("wheel", "git"):
        src = fresh(tmp_path / layout, "src", "0.5.23", "0.7.2", layout)
        bundle = tmp_path / layout / "bundle"
        assert sm("export", *src.paths, "--arch", "sm_120", "--probe", "static", "-o", bundle).returncode == 0
        node = fresh(tmp_path / layout, "node", "0.5.23", "0.7.2", layout)
        assert sm("apply", "--bundle", bundle, *node.paths, "--arch", "sm_120").returncode == 0
        swapped = swap_flashinfer(node, "0.6.16", tmp_path / layout)
        r = sm("preflight", "--bundle", bundle, node.root, "--flashinfer", swapped, "--arch", "sm_120", "--json")
        assert r.returncode == 1, r.stdout
        report = json.loads(r.stdout)
        (ar,) = [x for x in report["recipes"] if x["id"] == AR]
        assert ar["state"] == "mismatch" and "[9, 10]" in ar["reason"] and "0.7.2 -> 0.6.16" in ar["reason"]
        assert ar["rollback"] == f"sm120patch rollback {node.root.resolve()} --recipe {AR}"
        assert report["flashinfer"]["version"] == "0.6.16"
        if layout == "wheel":  # the site-packages' own FlashInfer is another release than the bundle's
            assert any("flashinfer 0.6.16" in p and "0.7.2" in p for p in report["problems"])
            human = sm("preflight", "--bundle", bundle, node.root, "--arch", "sm_120")
            assert human.returncode == 1 and f"--recipe {AR}" in human.stdout and "node MISMATCH" in human.stdout
        # the command it prints works
        cmd = ar["rollback"].split()
        assert subprocess.run([*CLI, *cmd[1:]], capture_output=True, timeout=300).returncode == 0


def test_the_node_check_fails_when_a_file_the_proof_read_is_edited(tmp_path: Path) -> None:
    """0.5.9 + 0.6.3: the MoE recipes' proof read flashinfer/jit/fused_moe.py; a node whose copy
    gates the SM120 CUTLASS MoE to another major cannot run them."""
    src = fresh(tmp_path, "src", "0.5.9", "0.6.3", "wheel")
    bundle = tmp_path / "bundle"
    assert sm("export", src.root, "--arch", "sm_120", "--probe", "static", "-o", bundle).returncode == 1
    node = fresh(tmp_path, "node", "0.5.9", "0.6.3", "wheel")
    assert sm("apply", "--bundle", bundle, node.root, "--arch", "sm_120").returncode == 0
    gate = "supported_major_versions="
    replace_text(node.fi / "flashinfer/jit/fused_moe.py", f"{gate}[12]", f"{gate}[10]")
    r = sm("preflight", "--bundle", bundle, node.root, "--arch", "sm_120", "--json")
    assert r.returncode == 1
    checks = {x["id"]: x for x in json.loads(r.stdout)["recipes"]}
    for rid in (AUTOTUNE, MOE):
        assert checks[rid]["state"] == "mismatch", checks[rid]
        assert "changed since the probe: jit/fused_moe.py" in checks[rid]["reason"]
        assert checks[rid]["rollback"] == f"sm120patch rollback {node.root.resolve()} --recipe {rid}"
    assert checks[GPTOSS]["state"] == "ok" and checks[AR]["state"] == "ok" and checks[FP4]["state"] == "not-exported"
    # another GPU: the recipes are for SM12x
    r = sm("preflight", "--bundle", bundle, node.root, "--arch", "sm_100", "--json")
    assert r.returncode == 1 and all(
        "this node has sm_100" in x["reason"] for x in json.loads(r.stdout)["recipes"] if x["state"] != "not-exported"
    )


def test_the_bundle_does_not_depend_on_the_layout_it_was_made_from(tmp_path: Path) -> None:
    """Paths are relative to the package's parent: a wheel and a clone of one release give the
    same bundle, byte for byte, and two exports of it are identical; that bundle's patches name
    paths under the package and apply to the releases as PyPI ships them (git apply --check)."""
    bundles = []
    for n, layout in enumerate(("wheel", "git", "wheel")):
        c = fresh(tmp_path, f"c{n}", "0.5.23", "0.7.2", layout)
        out = tmp_path / f"bundle{n}"
        assert sm("export", *c.paths, "--arch", "sm_120", "--probe", "static", "-o", out).returncode == 0
        bundles.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert bundles[0] == bundles[1] == bundles[2]
    # and the shared bundle is right for either layout, by the releases themselves: every path a patch
    # touches is relative to the package's parent, and each patch applies to the release as PyPI has it
    recipes = json.loads(bundles[0]["manifest.json"])["recipes"]
    package = {x["patch"]: x["package"] for x in recipes if x.get("patch")}
    roots = {"sglang": pristine_or_skip("sglang", "0.5.23"), "flashinfer": pristine_or_skip("flashinfer", "0.7.2")}
    series = bundles[0]["series"].decode().split()
    assert series
    for name in series:
        text = bundles[0][name].decode()
        paths = [line.split()[2] for line in text.splitlines() if line.startswith("diff --git ")]
        assert paths and all(p.startswith(f"a/{package[name]}/") for p in paths), (name, paths)
        root = roots[package[name]]
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent)}
        check = subprocess.run(
            ["git", "apply", "--check", "-"], cwd=root, input=bundles[0][name], capture_output=True, env=env
        )
        assert check.returncode == 0, (name, check.stderr.decode())


def test_apply_bundle_refuses_another_release(tmp_path: Path) -> None:
    src = fresh(tmp_path, "src", "0.5.23", "0.7.2", "wheel")
    bundle = tmp_path / "bundle"
    assert sm("export", src.root, "--arch", "sm_120", "--probe", "static", "-o", bundle).returncode == 0
    other = fresh(tmp_path, "other", "0.5.22", "0.7.2", "wheel")
    before = other.hashes()
    r = sm("apply", "--bundle", bundle, other.root, "--arch", "sm_120")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "sglang 0.5.22, but the bundle" in r.stderr and "0.5.23" in r.stderr
    assert other.hashes() == before and not (other.root / ".sm120patch").exists()
