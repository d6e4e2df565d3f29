"""An SGLang tree and the FlashInfer it runs on, in one run (fake trees, a fake backport recipe).

The FlashInfer recipe is a diff we write that widens the fake generator's arch gate: the
shape of the real backport, not its content. What is tested is the order and the safety:
FlashInfer is planned, probed on its overlay and written first; the SGLang recipe's probe
judges that patched FlashInfer; dependents roll back before what they stood on.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import default_recipe_dir, load_recipes
from sm120patch.engine import steps
from sm120patch.engine.journal import Journal
from sm120patch.engine.pipeline import RunSettings, apply_many, plan_many, rollback_many
from sm120patch.engine.which_flashinfer import resolve_flashinfer
from sm120patch.planning.plan import APPLICABLE, APPLIED, BLOCKED
from sm120patch.planning.targets import discover
from sm120patch.probes.recipe_probe import make_probe
from tests.unit.fi_fakes import make_tree
from tests.unit.sglang_fakes import make_sglang, snapshot

AR = "sglang-allreduce-fusion-sm120"
FIX = "fake-flashinfer-backport"
SM120 = [parse_arch("sm_120")]
BACKPORT = (
    "--- a/jit/comm.py\n"
    "+++ b/jit/comm.py\n"
    "@@ -28,5 +28,5 @@\n"
    " \n"
    " \n"
    " def gen_trtllm_comm_module():\n"
    "-    _flags(supported_major_versions=[9, 10])\n"
    "+    _flags(supported_major_versions=[9, 10, 12])\n"
    "     return JitSpec()\n"
)
RECIPE = f"""\
id = "{FIX}"
package = "flashinfer"
title = "A fake backport: widen the fake trtllm_comm gate"
why = "Test data: the shape of a FlashInfer-side recipe."
versions = ">=0"
arch = ["sm_120", "sm_121"]
needs = ["flashinfer:trtllm_comm"]

[[edit]]
name = "gate"
diff = "{FIX}.diff"
"""


@pytest.fixture
def recipes(tmp_path: Path) -> list:
    d = tmp_path / "recipes"
    (d / "sglang").mkdir(parents=True)
    (d / "flashinfer").mkdir()
    shutil.copy(default_recipe_dir() / "sglang" / f"{AR}.toml", d / "sglang")
    (d / "flashinfer" / f"{FIX}.toml").write_text(RECIPE)
    (d / "flashinfer" / f"{FIX}.diff").write_text(BACKPORT)
    return load_recipes(d)


@pytest.fixture(autouse=True)
def _private_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-home"))


def trees(tmp_path: Path) -> tuple[Path, Path]:
    sg, fi = tmp_path / "sglang-site", tmp_path / "flashinfer-tree"
    make_sglang(sg)
    make_tree(fi, gate="[9, 10]", host="fixed")
    return sg, fi


def run_for(targets: list) -> RunSettings:
    return RunSettings(SM120, resolve_flashinfer(targets, None, None), "static", make_probe)


def test_the_backport_in_the_same_plan_unblocks_the_sglang_gate(tmp_path: Path, recipes: list) -> None:
    sg, fi = trees(tmp_path)
    alone = discover(sg)
    run = RunSettings(SM120, resolve_flashinfer(alone, fi, None), "static", make_probe)
    plans = {p.recipe.id: p for p in plan_many(alone, recipes, run)}
    assert plans[AR].status == BLOCKED and "[9, 10]" in plans[AR].reason
    both = discover(sg) + discover(fi)
    before = snapshot(sg), snapshot(fi)
    plans = {p.recipe.id: p for p in plan_many(both, recipes, run_for(both))}
    assert plans[FIX].status == APPLICABLE and plans[AR].status == APPLICABLE, plans[AR].reason
    # the SGLang probe read the patched gate, from the overlay (nothing was written)
    (v,) = plans[AR].probe
    assert "[9, 10, 12]" in v["reason"]
    # it stands for the real FlashInfer once written (the overlay is only where it was read), and
    # the bytes it read are the patched ones, not those on disk
    assert v["evidence"]["flashinfer"]["location"] == str((fi / "flashinfer").resolve())
    on_disk = hashlib.sha256((fi / "flashinfer" / "jit" / "comm.py").read_bytes()).hexdigest()
    assert v["evidence"]["files"]["jit/comm.py"] not in (on_disk, "missing")
    assert (snapshot(sg), snapshot(fi)) == before


def test_apply_writes_flashinfer_first_and_records_the_dependent(tmp_path: Path, recipes: list) -> None:
    sg, fi = trees(tmp_path)
    both = discover(sg) + discover(fi)
    plans = {p.recipe.id: p for p in apply_many(both, recipes, run_for(both))}
    assert plans[FIX].status == APPLIED and plans[AR].status == APPLIED, (plans[FIX].reason, plans[AR].reason)
    assert "[9, 10, 12]" in (fi / "flashinfer" / "jit" / "comm.py").read_text()
    (fix,) = Journal.open(fi).applied
    assert fix["dependents"] == [{"root": str(sg.resolve()), "package": "sglang", "id": AR}]
    # the proofs name the real trees, not the overlay the backport was proven on
    where = {v["evidence"]["flashinfer"]["location"] for v in fix["evidence"]["verdicts"]}
    assert where == {str((fi / "flashinfer").resolve())}
    (ar,) = [a for a in Journal.open(sg).applied if a["id"] == AR]
    assert {v["evidence"]["flashinfer"]["location"] for v in ar["evidence"]["verdicts"]} == where
    # and they hold: a second run finds everything applied and writes nothing
    journals = (Journal.open(fi).data, Journal.open(sg).data)
    again = {p.recipe.id: p.status for p in apply_many(both, recipes, run_for(both))}
    assert again == {FIX: APPLIED, AR: APPLIED}
    assert [a["id"] for a in Journal.open(fi).applied] == [FIX]  # recorded once
    assert (Journal.open(fi).data["applied"], Journal.open(sg).data["applied"]) == (
        journals[0]["applied"],
        journals[1]["applied"],
    )


def test_a_compiled_module_that_would_shadow_the_patch_is_named(tmp_path: Path, recipes: list) -> None:
    """An AOT trtllm_comm beside FlashInfer is loaded before any JIT build: the patch would not run."""
    sg, fi = trees(tmp_path)
    aot = fi / "flashinfer" / "data" / "aot" / "trtllm_comm"
    aot.mkdir(parents=True)
    (aot / "trtllm_comm.so").write_bytes(b"\x7fELF")
    both = discover(sg) + discover(fi)
    plans = {p.recipe.id: p for p in plan_many(both, recipes, run_for(both))}
    assert "WARNING" in plans[FIX].reason and "trtllm_comm.so" in plans[FIX].reason and "AOT" in plans[FIX].reason


def test_rolling_back_the_flashinfer_tree_takes_its_dependent_first(tmp_path: Path, recipes: list) -> None:
    sg, fi = trees(tmp_path)
    pristine = snapshot(sg), snapshot(fi)
    both = discover(sg) + discover(fi)
    apply_many(both, recipes, run_for(both))
    results = rollback_many(discover(fi), recipes)
    said = [(r["target"]["package"], r["rolled_back"], r.get("because", "")) for r in results]
    assert said[0][:2] == ("sglang", [AR]) and "FlashInfer recipes" in said[0][2]
    assert said[1][:2] == ("flashinfer", [FIX])
    assert (snapshot(sg), snapshot(fi)) == pristine


def test_rolling_back_the_pair_restores_both(tmp_path: Path, recipes: list) -> None:
    sg, fi = trees(tmp_path)
    pristine = snapshot(sg), snapshot(fi)
    both = discover(sg) + discover(fi)
    apply_many(both, recipes, run_for(both))
    results = rollback_many(both, recipes)
    assert [r["target"]["package"] for r in results] == ["sglang", "flashinfer"]  # SGLang goes first
    assert (snapshot(sg), snapshot(fi)) == pristine


def test_ctrl_c_after_flashinfer_puts_flashinfer_back_too(tmp_path: Path, recipes: list, monkeypatch) -> None:
    """Ctrl-C between the two trees' writes: the command is one transaction, so the FlashInfer
    bytes already written are put back before the interrupt goes on; the next run does it all."""
    sg, fi = trees(tmp_path)
    before = snapshot(sg), snapshot(fi)
    both = discover(sg) + discover(fi)
    real = steps.write_proven  # the step the pipeline calls per tree

    def killed(journal: Journal, t: object, *a: object, **k: object) -> None:
        if getattr(t, "package", "") == "sglang":
            raise KeyboardInterrupt
        real(journal, t, *a, **k)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(steps, "write_proven", killed)
        with pytest.raises(KeyboardInterrupt, match="put back"):
            apply_many(both, recipes, run_for(both))
    assert (snapshot(sg), snapshot(fi)) == before
    assert not (fi / ".sm120patch").exists() and not (sg / ".sm120patch").exists()
    plans = {p.recipe.id: p.status for p in apply_many(both, recipes, run_for(both))}
    assert plans == {FIX: APPLIED, AR: APPLIED}


def test_one_site_packages_holding_both(tmp_path: Path, recipes: list) -> None:
    site = tmp_path / "site"
    make_sglang(site)
    make_tree(site, gate="[9, 10]", host="fixed")
    pristine = snapshot(site)
    both = discover(site)
    assert [t.package for t in both] == ["sglang", "flashinfer"] and both[0].root == both[1].root
    plans = {p.recipe.id: p.status for p in apply_many(both, recipes, run_for(both))}
    assert plans == {FIX: APPLIED, AR: APPLIED}
    journal = json.loads((site / ".sm120patch" / "journal.json").read_text())
    assert [a["package"] for a in journal["applied"]] == ["flashinfer", "sglang"]
    rollback_many(both, recipes)
    assert snapshot(site) == pristine


def test_the_overlay_cache_keeps_the_most_recent_and_removes_read_only_leftovers(tmp_path: Path, monkeypatch) -> None:
    import os

    from sm120patch.probes.environment import overlay as ov

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    base = ov.cache_dir()
    for i in range(5):
        d = base / f"o{i}" / "flashinfer" / "ro"
        d.mkdir(parents=True)
        (d / "f").write_text("x")
        d.chmod(0o555)  # what an older overlay of a read-only tree looked like
        os.utime(base / f"o{i}", (1000 + i, 1000 + i))
    killed = base / ".o9.half"
    killed.mkdir()
    os.utime(killed, (1, 1))
    ov.prune(keep=2)
    assert sorted(p.name for p in base.iterdir()) == ["o3", "o4"]
