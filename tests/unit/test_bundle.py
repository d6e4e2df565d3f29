"""Bundles on small fake trees: export, the format, strict reading, apply --bundle, preflight --bundle.

The oracles are never the bundle code itself: bytes are compared with what `sm120patch apply`
writes on another copy and with what `git apply` / `git am` (git itself) make of the patches.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from sm120patch.bundle.format import BundleError
from sm120patch.bundle.read import read
from tests.unit.fi_fakes import make_tree
from tests.unit.sglang_fakes import ALL_IDS, ALLREDUCE, AUTOTUNE, GIT_ENV, MOE, git, snapshot
from tests.unit.test_cli import Run, assert_one_line_error
from tests.unit.test_transaction import BACKPORT, FIX, RECIPE

FUSED_MOE = """
def _flags(supported_major_versions):
    return supported_major_versions


def gen_cutlass_fused_moe_sm120_module():
    return _flags(supported_major_versions={majors})
"""
NO_PROBE_DIFFS = ("--arch", "sm_120", "--probe", "static")


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-home"))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("SM120PATCH_DEBUG", raising=False)


def recipes_dir(root: Path, with_backport: bool = False) -> Path:
    from sm120patch.catalogue.recipes import default_recipe_dir

    (root / "sglang").mkdir(parents=True)
    shutil.copy(default_recipe_dir() / "kernels.toml", root)
    for rid in ALL_IDS:
        shutil.copy(default_recipe_dir() / "sglang" / f"{rid}.toml", root / "sglang")
    if with_backport:
        (root / "flashinfer").mkdir()
        (root / "flashinfer" / f"{FIX}.toml").write_text(RECIPE)
        (root / "flashinfer" / f"{FIX}.diff").write_text(BACKPORT)
    return root


@pytest.fixture
def catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = recipes_dir(tmp_path / "recipes")
    monkeypatch.setenv("SM120PATCH_RECIPES", str(d))
    return d


@pytest.fixture
def with_backport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = recipes_dir(tmp_path / "recipes-fi", with_backport=True)
    monkeypatch.setenv("SM120PATCH_RECIPES", str(d))
    return d


def install_flashinfer(site: Path, gate: str = "[9, 10, 12]", version: str = "0.6.17", moe: str = "[12]") -> None:
    """A fake FlashInfer beside the fake SGLang (what `pip install flashinfer-python==X` leaves)."""
    shutil.rmtree(site / "flashinfer", ignore_errors=True)
    for info in site.glob("flashinfer_python-*.dist-info"):
        shutil.rmtree(info)
    make_tree(site, gate=gate, version=version)
    (site / "flashinfer" / "jit" / "fused_moe.py").write_text(FUSED_MOE.format(majors=moe))


def make_site(root: Path, sglang: str = "0.5.9", **fi: str) -> Path:
    from tests.unit.sglang_fakes import make_sglang

    make_sglang(root, sglang)
    install_flashinfer(root, **fi)
    return root


@pytest.fixture
def sm(capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    from sm120patch.cli import main

    def run(*args: object) -> Run:
        capsys.readouterr()
        with pytest.raises(SystemExit) as ei:
            main([str(a) for a in args])
        out, err = capsys.readouterr()
        code = ei.value.code
        return Run(code if isinstance(code, int) else (0 if code is None else 1), out, err)

    return run


def export(sm, tree: Path, out: Path, *extra: object) -> Run:  # noqa: ANN001
    return sm("export", tree, *NO_PROBE_DIFFS, "-o", out, "--json", *extra)


def git_apply_series(bundle: Path, parent: Path, *flags: str) -> None:
    """What a Dockerfile without sm120patch does: each patch of `series`, in order, with git."""
    for name in (bundle / "series").read_text().split():
        r = subprocess.run(
            ["git", "apply", *flags, str(bundle / name)], cwd=parent, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr


# --- export and the format -----------------------------------------------------------------------


def test_export_writes_nothing_and_round_trips(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    site = make_site(tmp_path / "site")
    before = snapshot(site)
    r = export(sm, site, tmp_path / "bundle")
    assert r.code == 0, r.err
    assert snapshot(site) == before and not (site / ".sm120patch").exists()
    b = read(tmp_path / "bundle")
    assert b.arch == ["sm_120"] and b.probe_level == "static"
    assert [(t.package, t.version) for t in b.targets] == [("flashinfer", "0.6.17"), ("sglang", "0.5.9")]
    assert [r.id for r in b.exported] == [ALLREDUCE, AUTOTUNE, MOE]
    assert b.series == [f"{i:04d}-{rid}.patch" for i, rid in enumerate([ALLREDUCE, AUTOTUNE, MOE], 1)]
    assert (tmp_path / "bundle" / "series").read_text().split() == b.series
    # the JSON printed is the manifest (plus where it was written)
    printed = r.json()
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert printed.pop("bundle") == str(tmp_path / "bundle") and printed == manifest
    ar = next(x for x in manifest["recipes"] if x["id"] == ALLREDUCE)
    assert ar["status"] == "exported" and ar["needs"] == ["flashinfer:trtllm_comm"]
    assert {f["path"] for f in ar["files"]} == {"sglang/srt/layers/communicator.py", "sglang/srt/server_args.py"}
    (v,) = ar["evidence"]["verdicts"]
    assert (v["result"], v["rung"], v["arch"]) == ("pass", "static", "sm_120")
    assert v["evidence"]["flashinfer"] == {"version": "0.6.17"} and "jit/comm.py" in v["evidence"]["files"]
    assert str(tmp_path) not in (tmp_path / "bundle" / "manifest.json").read_text()  # no machine paths
    # the digests are sha256 hex of the patch file and of the release's bytes (hashlib as the oracle)
    for x in manifest["recipes"]:
        if x["patch"]:
            assert x["patch_sha256"] == hashlib.sha256((tmp_path / "bundle" / x["patch"]).read_bytes()).hexdigest()
    assert {f["path"]: f["before"] for f in ar["files"]} == {
        f["path"]: hashlib.sha256((site / f["path"]).read_bytes()).hexdigest() for f in ar["files"]
    }


def test_patch_is_git_format_patch_with_why_release_and_proof(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    site = make_site(tmp_path / "site")
    assert export(sm, site, tmp_path / "bundle").code == 0
    text = (tmp_path / "bundle" / f"0001-{ALLREDUCE}.patch").read_text()
    lines = text.splitlines()
    assert lines[0].endswith(" Mon Sep 17 00:00:00 2001") and len(lines[0].split()[1]) == 40
    assert lines[1].startswith("From: ") and lines[2] == "Date: Thu, 1 Jan 1970 00:00:00 +0000"
    assert lines[3] == "Subject: [PATCH 1/3] Let FlashInfer allreduce+RMSNorm fusion run on SM12x"
    assert "FlashInfer builds the trtllm_comm kernels" in text  # the recipe's why
    assert "Made from: sglang 0.5.9" in text and "Apply from: the folder that holds sglang/" in text
    assert "git apply --directory=python" in text
    assert "Probe: kernels proven at the static rung (asked: static); FlashInfer 0.6.17" in text
    assert "\n---\n sglang/srt/layers/communicator.py |" in text and "\n-- \nsm120patch " in text


def test_git_apply_and_git_am_give_the_bytes_apply_gives(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    bundle = tmp_path / "bundle"
    assert export(sm, make_site(tmp_path / "src"), bundle).code == 0
    by_tool = make_site(tmp_path / "by-tool")
    assert sm("apply", by_tool, *NO_PROBE_DIFFS).code == 0
    by_git = make_site(tmp_path / "by-git")
    git_apply_series(bundle, by_git)
    expect = {k: v for k, v in snapshot(by_tool).items()}
    assert snapshot(by_git) == expect
    # git am in a clone (python/sglang), from the clone's root
    clone = tmp_path / "clone"
    make_site(clone / "python")
    git(clone, "init", "-q", "-b", "main")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "release")
    git(clone, "am", "-q", "--directory=python", *[str(bundle / n) for n in read(bundle).series])
    subjects = git(clone, "log", "--format=%s", "-4").splitlines()
    assert subjects[3] == "release" and subjects[2] == "Let FlashInfer allreduce+RMSNorm fusion run on SM12x"
    assert {k.removeprefix("python/"): v for k, v in snapshot(clone).items()} == expect


def test_two_exports_of_the_same_release_are_byte_identical(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    one, two = tmp_path / "one", tmp_path / "two"
    assert export(sm, make_site(tmp_path / "a"), one).code == 0
    assert export(sm, make_site(tmp_path / "b"), two).code == 0
    assert snapshot(one) == snapshot(two) and len(snapshot(one)) == 5


def test_source_date_epoch_sets_the_date(sm, catalogue: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    assert export(sm, make_site(tmp_path / "a"), tmp_path / "b").code == 0
    assert "Date: Thu, 1 Jan 2026 00:00:00 +0000" in (tmp_path / "b" / f"0001-{ALLREDUCE}.patch").read_text()


def test_blocked_recipe_is_listed_not_exported_the_rest_chain_without_it(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    site = make_site(tmp_path / "site", gate="[9, 10]", version="0.6.16")
    r = export(sm, site, tmp_path / "bundle")
    assert r.code == 1  # written, but a recipe was blocked
    b = read(tmp_path / "bundle")
    status = {x.id: x.status for x in b.recipes}
    assert status == {ALLREDUCE: "blocked", AUTOTUNE: "exported", MOE: "exported"}
    ar = next(x for x in b.recipes if x.id == ALLREDUCE)
    assert ar.patch is None and ar.files == [] and "[9, 10]" in ar.reason
    assert ar.evidence is not None and ar.evidence["verdicts"][0]["result"] == "fail"
    assert b.series == [f"0001-{AUTOTUNE}.patch", f"0002-{MOE}.patch"]
    # server_args.py is edited by the blocked recipe and by MOE: MOE's patch starts from the release
    other = make_site(tmp_path / "other", gate="[9, 10]", version="0.6.16")
    git_apply_series(tmp_path / "bundle", other)
    by_tool = make_site(tmp_path / "by-tool", gate="[9, 10]", version="0.6.16")
    assert sm("apply", by_tool, *NO_PROBE_DIFFS).code == 1
    assert snapshot(other) == snapshot(by_tool)


def test_flashinfer_patches_come_first(sm, with_backport: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """A FlashInfer recipe in the same bundle: its patch first, paths under flashinfer/, and the
    SGLang recipe it unblocks is exported because its probe judged the patched FlashInfer."""
    site = make_site(tmp_path / "site", gate="[9, 10]", version="0.6.3")
    r = export(sm, site, tmp_path / "bundle")
    assert r.code == 0, r.out
    b = read(tmp_path / "bundle")
    assert b.series[0] == f"0001-{FIX}.patch" and [x.package for x in b.exported][0] == "flashinfer"
    assert b.flashinfer == {"version": "0.6.3", "patched_by": [FIX]}
    fix = b.exported[0]
    assert [f.path for f in fix.files] == ["flashinfer/jit/comm.py"]
    assert ALLREDUCE in [x.id for x in b.exported]
    by_git = make_site(tmp_path / "by-git", gate="[9, 10]", version="0.6.3")
    git_apply_series(tmp_path / "bundle", by_git)
    by_tool = make_site(tmp_path / "by-tool", gate="[9, 10]", version="0.6.3")
    assert sm("apply", by_tool, *NO_PROBE_DIFFS).code == 0
    assert snapshot(by_git) == {k: v for k, v in snapshot(by_tool).items()}
    # apply --bundle: FlashInfer written first, the SGLang recipe recorded as its dependent
    node = make_site(tmp_path / "node", gate="[9, 10]", version="0.6.3")
    r = sm("apply", "--bundle", tmp_path / "bundle", node, "--arch", "sm_120", "--json")
    assert r.code == 0, r.out
    assert snapshot(node) == snapshot(by_tool)
    journal = json.loads((node / ".sm120patch" / "journal.json").read_text())
    assert journal["applied"][0]["id"] == FIX and journal["applied"][0]["dependents"][0]["id"] == ALLREDUCE
    assert sm("preflight", "--bundle", tmp_path / "bundle", node, "--arch", "sm_120").code == 0


def test_export_refuses_a_tree_already_patched(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    site = make_site(tmp_path / "site")
    assert sm("apply", site, *NO_PROBE_DIFFS).code == 0
    r = export(sm, site, tmp_path / "bundle")
    assert_one_line_error(r, 2, "rollback")
    assert not (tmp_path / "bundle").exists()


def test_output_folder_is_never_overwritten_without_force(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    site = make_site(tmp_path / "site")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert_one_line_error(export(sm, site, busy), 2, "not empty")
    assert export(sm, site, tmp_path / "bundle").code == 0
    assert_one_line_error(export(sm, site, tmp_path / "bundle"), 2, "--force")
    assert export(sm, site, tmp_path / "bundle", "--force").code == 0
    assert (busy / "notes.txt").read_text() == "mine"


# --- strict reading ------------------------------------------------------------------------------


@pytest.fixture
def bundle(sm, catalogue: Path, tmp_path: Path) -> Path:  # noqa: ANN001
    out = tmp_path / "bundle"
    assert export(sm, make_site(tmp_path / "src"), out).code == 0
    return out


def _edit_manifest(bundle: Path, change) -> None:  # noqa: ANN001
    data = json.loads((bundle / "manifest.json").read_text())
    change(data)
    (bundle / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d.update(extra=1), "extra: unknown key"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d.update(format="other"), "not an sm120patch bundle"),
        (lambda d: d.pop("targets"), "targets: missing"),
        (lambda d: d["targets"][0].update(version=""), "version: is empty"),
        (lambda d: d.update(arch=["sm_999x"]), "arch[0]"),
        (lambda d: d["recipes"][0]["files"][0].update(path="../etc/passwd"), "is not a path inside"),
        (lambda d: d["recipes"][0]["files"][0].update(before="abc"), "not sha256"),
        (lambda d: d["recipes"][2]["files"][0].update(before="0" * 64), "does not start where"),
        (lambda d: d["recipes"][0].update(status="applied-by-hand"), "unknown status"),
        (lambda d: d["recipes"][0].update(patch="../../x.patch"), "not a patch file name"),
        (lambda d: d["recipes"].reverse(), "series"),
    ],
)
def test_a_damaged_manifest_is_refused_in_one_line(sm, bundle: Path, tmp_path: Path, change, fragment) -> None:  # noqa: ANN001
    _edit_manifest(bundle, change)
    with pytest.raises(BundleError) as e:
        read(bundle)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert "manifest.json" in msg or "series" in msg, msg
    if fragment:
        assert fragment in msg, msg
    r = sm("apply", "--bundle", bundle, make_site(tmp_path / "t"), "--arch", "sm_120")
    assert_one_line_error(r, 2)
    assert not (tmp_path / "t" / ".sm120patch").exists()


def test_an_edited_patch_or_series_is_refused(sm, bundle: Path) -> None:  # noqa: ANN001
    patch = bundle / f"0002-{AUTOTUNE}.patch"
    good = patch.read_bytes()
    patch.write_bytes(good.replace(b'"flashinfer_cutlass"', b'"flashinfer_trtllm"'))
    with pytest.raises(BundleError, match="sha256 is not the one manifest.json records"):
        read(bundle)
    patch.write_bytes(good)
    (bundle / "series").write_text(f"0002-{AUTOTUNE}.patch\n0001-{ALLREDUCE}.patch\n0003-{MOE}.patch\n")
    with pytest.raises(BundleError, match="series: does not list"):
        read(bundle)
    (bundle / "series").unlink()
    with pytest.raises(BundleError, match="series: missing"):
        read(bundle)
    assert_one_line_error(sm("preflight", "--bundle", bundle / "nowhere", "--arch", "sm_120"), 2, "no such folder")


# --- apply --bundle ------------------------------------------------------------------------------


def test_apply_bundle_then_rollback_is_byte_identical(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = make_site(tmp_path / "node")
    pristine = snapshot(node)
    by_tool = make_site(tmp_path / "by-tool")
    assert sm("apply", by_tool, *NO_PROBE_DIFFS).code == 0
    r = sm("apply", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert r.code == 0, r.out
    out = r.json()
    assert out["bundle"]["bytes_match"] and out["bundle"]["probe_level"] == "static"
    assert {x["id"]: x["status"] for x in out["recipes"]} == {ALLREDUCE: "applied", AUTOTUNE: "applied", MOE: "applied"}
    assert snapshot(node) == snapshot(by_tool)
    # the journal keeps each recipe's proof, so status re-checks it with the catalogue
    st = sm("status", node, "--json")
    assert st.code == 0 and len(st.json()["targets"][0]["applied"]) == 3
    # a second run has nothing to do
    again = sm("apply", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert again.code == 0 and {x["status"] for x in again.json()["recipes"]} == {"applied"}
    assert sm("rollback", node).code == 0
    assert snapshot(node) == pristine and not (node / ".sm120patch").exists()


def test_apply_bundle_probes_again_and_blocks(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """Exactly as apply: the bundle was proven elsewhere, this machine's FlashInfer decides."""
    node = make_site(tmp_path / "node")
    install_flashinfer(node, gate="[9, 10]", version="0.6.17")  # same version, another gate
    r = sm("apply", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert r.code == 1
    out = r.json()
    assert {x["id"]: x["status"] for x in out["recipes"]}[ALLREDUCE] == "blocked"
    assert not out["bundle"]["complete"]
    assert b"_is_sm120_supported" not in (node / "sglang/srt/layers/communicator.py").read_bytes()


def test_apply_bundle_refuses_another_release_and_writes_nothing(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = make_site(tmp_path / "node", sglang="0.5.8")
    before = snapshot(node)
    r = sm("apply", "--bundle", bundle, node, "--arch", "sm_120")
    assert_one_line_error(r, 2, "sglang 0.5.8, but the bundle")
    assert snapshot(node) == before and not (node / ".sm120patch").exists()
    node2 = make_site(tmp_path / "node2", version="0.6.18")
    assert_one_line_error(sm("apply", "--bundle", bundle, node2, "--arch", "sm_120"), 2, "flashinfer 0.6.18")


def test_apply_bundle_refuses_bytes_it_was_not_made_from(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    patched = make_site(tmp_path / "patched")
    git_apply_series(bundle, patched)
    before = snapshot(patched)
    assert_one_line_error(sm("apply", "--bundle", bundle, patched, "--arch", "sm_120"), 2, "no sm120patch journal")
    edited = make_site(tmp_path / "edited")
    with (edited / "sglang/srt/server_args.py").open("a") as f:
        f.write("# local change\n")
    assert_one_line_error(sm("apply", "--bundle", bundle, edited, "--arch", "sm_120"), 2, "not the bytes")
    assert snapshot(patched) == before and not (edited / ".sm120patch").exists()


def test_apply_bundle_needs_every_package_of_the_bundle(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from tests.unit.sglang_fakes import make_sglang

    lonely = tmp_path / "lonely"
    make_sglang(lonely)
    assert_one_line_error(sm("apply", "--bundle", bundle, lonely, "--arch", "sm_120"), 2, "holds no flashinfer")
    assert_one_line_error(sm("apply", "--bundle", bundle, lonely, "--recipe", MOE), 2, "--bundle")


# --- preflight --bundle --------------------------------------------------------------------------


def _patched_node(sm, bundle: Path, root: Path) -> Path:  # noqa: ANN001
    node = make_site(root)
    assert sm("apply", "--bundle", bundle, node, "--arch", "sm_120").code == 0
    return node


def test_preflight_bundle_passes_on_a_matching_node(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = _patched_node(sm, bundle, tmp_path / "node")
    report = tmp_path / "shared" / "preflight.json"
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--report", report)
    assert r.code == 0, r.out
    assert "node OK" in r.out
    data = json.loads(report.read_text())
    assert data["ok"] and data["problems"] == [] and data["probe_level"] == "static"
    assert {x["id"]: x["state"] for x in data["recipes"]} == {ALLREDUCE: "ok", AUTOTUNE: "ok", MOE: "ok"}
    sg = next(t for t in data["targets"] if t["package"] == "sglang")
    assert set(sg["files"].values()) == {"patched"} and sg["bundle_version"] == "0.5.9"
    j = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert j.code == 0 and _steady(j.json()) == _steady(data)


def _steady(x: object) -> object:
    """A report without what differs between two runs of one check (timings, cache hits)."""
    if isinstance(x, dict):
        return {k: _steady(v) for k, v in x.items() if k not in ("elapsed_s", "cached")}
    if isinstance(x, list):
        return [_steady(v) for v in x]
    return x


def test_preflight_bundle_fails_on_a_swapped_flashinfer_with_rollback_command(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = _patched_node(sm, bundle, tmp_path / "node")
    install_flashinfer(node, gate="[9, 10]", version="0.6.16")  # a pip install re-pinned it
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert r.code == 1
    out = r.json()
    assert not out["ok"] and any("flashinfer 0.6.16" in p for p in out["problems"])
    checks = {x["id"]: x for x in out["recipes"]}
    ar = checks[ALLREDUCE]
    assert ar["state"] == "mismatch" and "[9, 10]" in ar["reason"] and "0.6.17 -> 0.6.16" in ar["reason"]
    assert ar["rollback"] == f"sm120patch rollback {node.resolve()} --recipe {ALLREDUCE}"
    assert checks[MOE]["state"] == "ok"  # its kernels are still there
    human = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120")
    assert human.code == 1 and f"take it back: sm120patch rollback {node.resolve()} --recipe {ALLREDUCE}" in human.out


def test_preflight_bundle_fails_on_an_edited_file_the_proof_read(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = _patched_node(sm, bundle, tmp_path / "node")
    (node / "flashinfer" / "jit" / "fused_moe.py").write_text(FUSED_MOE.format(majors="[10]"))
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert r.code == 1
    checks = {x["id"]: x for x in r.json()["recipes"]}
    assert checks[MOE]["state"] == "mismatch" and "changed since the probe: jit/fused_moe.py" in checks[MOE]["reason"]
    assert checks[ALLREDUCE]["state"] == "ok"


def test_preflight_bundle_fails_on_another_gpu(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = _patched_node(sm, bundle, tmp_path / "node")
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_100", "--json")
    assert r.code == 1
    for x in r.json()["recipes"]:
        assert x["state"] == "mismatch" and "this node has sm_100" in x["reason"] and x["rollback"]
    # SM121 (DGX Spark) is covered by the recipes: probed again for it, and it passes
    assert sm("preflight", "--bundle", bundle, node, "--arch", "sm_121").code == 0


def test_preflight_bundle_fails_on_unpatched_bytes_with_the_git_command(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    node = make_site(tmp_path / "node")
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    assert r.code == 1
    checks = {x["id"]: x for x in r.json()["recipes"]}
    assert all(c["state"] == "mismatch" and "unpatched" in c["reason"] for c in checks.values())
    # patched with git (no journal): the way back is git apply -R, later patches on the same file first
    git_apply_series(bundle, node)
    assert sm("preflight", "--bundle", bundle, node, "--arch", "sm_120").code == 0
    install_flashinfer(node, gate="[9, 10]", version="0.6.17")
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    ar = {x["id"]: x for x in r.json()["recipes"]}[ALLREDUCE]
    b = bundle.absolute()
    assert ar["rollback"] == (
        f"cd {node.resolve()} && git apply -R {b / f'0003-{MOE}.patch'} && git apply -R {b / f'0001-{ALLREDUCE}.patch'}"
    )
    subprocess.run(ar["rollback"], shell=True, check=True, capture_output=True)
    assert b"_is_sm120_supported" not in (node / "sglang/srt/layers/communicator.py").read_bytes()


def _machine(*archs: str):  # noqa: ANN202
    from sm120patch.arch import parse_arch
    from sm120patch.probes.environment import device

    gpus = [device.Gpu(i, f"fake {a}", parse_arch(a).major, parse_arch(a).minor, "nvml") for i, a in enumerate(archs)]
    return device.Machine(gpus, None, device.CudaToolkit(), None)


def test_preflight_bundle_checks_the_gpus_it_detects(sm, bundle: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """No --arch on a node: NVML's GPUs decide; none at all is a mismatch, not a guess."""
    from sm120patch.probes.environment import device

    node = _patched_node(sm, bundle, tmp_path / "node")
    monkeypatch.setattr(device, "detect", lambda *a, **k: _machine("sm_120", "sm_120"))
    r = sm("preflight", "--bundle", bundle, node, "--json")
    assert r.code == 0 and r.json()["arch_source"] == "detected" and r.json()["archs"] == ["sm_120"]
    monkeypatch.setattr(device, "detect", lambda *a, **k: _machine("sm_90"))
    assert sm("preflight", "--bundle", bundle, node).code == 1
    monkeypatch.setattr(device, "detect", lambda *a, **k: _machine())
    r = sm("preflight", "--bundle", bundle, node, "--json")
    assert r.code == 1 and any("no GPU detected" in p for p in r.json()["problems"])


# --- issue 21: export of an untested release, of the package folder itself ----------------------


def test_export_of_an_untested_release_fails_and_its_bundle_still_reads(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """A tree newer than every recipe's `tested` list: as `apply`, exit 1 and the recipes listed as
    untested (not exported); the manifest must still be one the bundle reader accepts."""
    site = make_site(tmp_path / "site", sglang="0.5.24")
    r = export(sm, site, tmp_path / "bundle")
    assert r.code == 1, r.err
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    untested = [x["id"] for x in manifest["recipes"] if x["status"] == "untested"]
    assert untested and all(x["patch"] is None for x in manifest["recipes"] if x["status"] == "untested")
    b = read(tmp_path / "bundle")  # raised "unknown status 'untested'" before
    assert {x.id for x in b.recipes if x.status == "untested"} == set(untested)
    node = sm("preflight", "--bundle", tmp_path / "bundle", site, "--arch", "sm_120")
    assert node.code in (0, 1) and "unknown status" not in node.err, node.err
    # --allow-untested exports them, as apply would write them
    r = export(sm, site, tmp_path / "bundle2", "--allow-untested")
    assert r.code == 0, r.err
    assert set(untested) <= {x.id for x in read(tmp_path / "bundle2").exported}


def test_export_of_the_package_folder_itself(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """PATH may be the package folder (`site/sglang`), as for plan: the bundle is the site's."""
    site = make_site(tmp_path / "site")
    from_site = export(sm, site / "sglang", tmp_path / "b-pkg")
    assert from_site.code == 0, from_site.err  # exit 3 before (a path made relative to a folder below it)
    whole = export(sm, site, tmp_path / "b-site", "--package", "sglang")
    assert whole.code == 0, whole.err
    for name in read(tmp_path / "b-site").series:
        assert (tmp_path / "b-pkg" / name).read_bytes() == (tmp_path / "b-site" / name).read_bytes()


# --- issue 35: what --force may replace, what a patch may touch, the git apply -R hint --------------


def test_force_replaces_only_a_bundle_export_wrote(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """A folder with a `manifest.json` of its own is not a bundle: --force deleted src/app.js."""
    site = make_site(tmp_path / "site")
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "manifest.json").write_text('{"name": "app"}\n')
    (proj / "src" / "app.js").write_text("x\n")
    before = snapshot(proj)
    assert_one_line_error(export(sm, site, proj, "--force"), 2, "remove it yourself")
    assert snapshot(proj) == before
    # our own bundle plus a file of the user's: refused too, the file kept
    assert export(sm, site, tmp_path / "bundle").code == 0
    (tmp_path / "bundle" / "notes.txt").write_text("mine\n")
    assert_one_line_error(export(sm, site, tmp_path / "bundle", "--force"), 2, "'notes.txt'")
    assert (tmp_path / "bundle" / "notes.txt").read_text() == "mine\n"


def test_a_failed_replace_leaves_the_earlier_bundle(sm, catalogue: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The new bundle is written beside the old; if moving it in fails, the old one is put back."""
    import os

    from sm120patch.bundle import export as export_module

    site = make_site(tmp_path / "site")
    out = tmp_path / "bundle"
    assert export(sm, site, out).code == 0
    before = snapshot(out)
    real = os.rename
    calls = []

    def second_rename_fails(src, dst):  # noqa: ANN001, ANN202
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(export_module.os, "rename", second_rename_fails)
    r = sm("export", site, *NO_PROBE_DIFFS, "-o", out, "--force")
    assert_one_line_error(r, 2, "what was there is as it was")
    assert len(calls) == 3  # moved aside, the move in failed, moved back
    monkeypatch.setattr(export_module.os, "rename", real)
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left


def test_bundle_folder_mode_follows_the_umask(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """Written through a mkdtemp folder (0700), the bundle must still be readable by the image's users."""
    import os

    old = os.umask(0o022)
    try:
        assert export(sm, make_site(tmp_path / "site"), tmp_path / "bundle").code == 0
    finally:
        os.umask(old)
    assert (tmp_path / "bundle").stat().st_mode & 0o777 == 0o755


def test_patch_targets_are_the_manifest_files(sm, bundle: Path) -> None:  # noqa: ANN001
    """The exported patches themselves: the parser names exactly the files the manifest lists
    (git's own --numstat as a second oracle), and follows hunk counts, not line prefixes."""
    from sm120patch.bundle.format import PatchShapeError, patch_targets

    manifest = json.loads((bundle / "manifest.json").read_text())
    for r in manifest["recipes"]:
        if not r["patch"]:
            continue
        text = (bundle / r["patch"]).read_text()
        numstat = subprocess.run(
            ["git", "apply", "--numstat", str(bundle / r["patch"])], capture_output=True, text=True, check=True
        )
        by_git = sorted(line.split("\t")[2] for line in numstat.stdout.splitlines())
        assert sorted(patch_targets(text)) == sorted(f["path"] for f in r["files"]) == by_git
    removed_header = (
        "diff --git a/sglang/x.py b/sglang/x.py\nindex 0000000..1111111 100644\n--- a/sglang/x.py\n+++ b/sglang/x.py\n"
        "@@ -1,2 +1,1 @@\n--- a/looks-like-a-header\n keep\n"
    )
    assert patch_targets(removed_header) == ["sglang/x.py"]  # the removed line is a line
    with pytest.raises(PatchShapeError, match="outside a diff"):  # one line short: the next is a header
        patch_targets(removed_header.replace("@@ -1,2 +1,1 @@", "@@ -1,1 +1,0 @@") + "--- a/../x\n")
    with pytest.raises(PatchShapeError, match="longer than its header"):
        patch_targets(removed_header.replace("@@ -1,2 +1,1 @@", "@@ -1,0 +1,1 @@"))
    with pytest.raises(PatchShapeError, match="twice"):
        patch_targets(removed_header + removed_header)


def test_a_why_that_reads_like_a_diff_still_exports_and_reads(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """The reader refuses header lines in a patch's message; export indents every one of them."""
    toml = catalogue / "sglang" / f"{AUTOTUNE}.toml"
    tricky = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\nBinary files a and b differ\nGIT binary patch\n"
    toml.write_text(toml.read_text().replace('why = """\n', f'why = """\n{tricky}', 1))
    assert export(sm, make_site(tmp_path / "site"), tmp_path / "bundle").code == 0
    b = read(tmp_path / "bundle")
    assert "  @@ -1 +1 @@" in (tmp_path / "bundle" / b.series[1]).read_text()
    git_apply_series(tmp_path / "bundle", make_site(tmp_path / "by-git"))


def test_patch_touching_an_unlisted_file_is_refused_before_any_write(sm, bundle: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """Issue 35 item 7: re-aimed at utils.py and re-hashed, the patch was `not-applicable`, exit 0,
    the other two applied."""
    patch = bundle / f"0001-{ALLREDUCE}.patch"
    patch.write_text(patch.read_text().replace("sglang/srt/layers/communicator.py", "sglang/srt/utils.py"))
    _edit_manifest(
        bundle,
        lambda d: d["recipes"][0].update(patch_sha256=hashlib.sha256(patch.read_bytes()).hexdigest()),
    )
    node = make_site(tmp_path / "node")
    before = snapshot(node)
    assert_one_line_error(sm("apply", "--bundle", bundle, node, "--arch", "sm_120"), 2, "'sglang/srt/utils.py'")
    assert snapshot(node) == before and not (node / ".sm120patch").exists()
    assert_one_line_error(sm("preflight", "--bundle", bundle, node, "--arch", "sm_120"), 2, patch.name)


def test_git_reverse_hint_is_quoted(sm, catalogue: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """Folders with a space and a `$(...)`: the printed command works pasted, and runs nothing else."""
    odd = tmp_path / "my bundles $(touch PWNED)"
    bundle = odd / "b 1"
    assert export(sm, make_site(tmp_path / "src"), bundle).code == 0
    node = make_site(tmp_path / "my node")
    git_apply_series(bundle, node)
    install_flashinfer(node, gate="[9, 10]", version="0.6.17")
    r = sm("preflight", "--bundle", bundle, node, "--arch", "sm_120", "--json")
    hint = {x["id"]: x for x in r.json()["recipes"]}[ALLREDUCE]["rollback"]
    assert hint.startswith("cd ") and "git apply -R" in hint
    done = subprocess.run(hint, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, (hint, done.stderr)
    assert b"_is_sm120_supported" not in (node / "sglang/srt/layers/communicator.py").read_bytes()
    assert not list(tmp_path.rglob("PWNED"))
