"""preflight on a real SGLang release and real FlashInfer trees, with no GPU (`--arch sm_120`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fetch_or_skip
from tests.integration.fi_releases import unpacked

pytestmark = pytest.mark.releases


def _preflight(*args: str, env_cache: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(env_cache), "HOME": str(env_cache)}
    return subprocess.run(
        [sys.executable, "-m", "sm120patch", "preflight", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_preflight_names_blocked_recipe_and_rung(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    fi = unpacked("flashinfer-python", "0.6.1")
    args = (str(tree), "--arch", "sm_120", "--no-torch", "--flashinfer", str(fi), "--json")
    cold = _preflight(*args, env_cache=tmp_path / "cache")
    assert cold.returncode == 1, cold.stderr  # a recipe is blocked
    report = json.loads(cold.stdout)
    assert report["archs"] == ["sm_120"] and report["arch_source"] == "--arch"
    assert report["machine"]["gpus"][0]["arch"] == "sm_120" and report["machine"]["overridden"] is True
    assert report["targets"][0]["version"] == "0.5.9"
    assert report["flashinfer"]["version"] == "0.6.1"
    rows = {r["id"]: r for r in report["recipes"]}
    ar = rows["sglang-allreduce-fusion-sm120"]
    assert ar["status"] == "blocked" and ar["rung"] == "static" and "[9, 10]" in ar["reason"]
    assert "upgrade FlashInfer" in ar["advice"]
    at = rows["sglang-autotune-flashinfer-cutlass"]
    assert at["status"] == "applicable" and at["probe"] and all(v["result"] == "pass" for v in at["probe"])
    assert "sm120patch apply" in at["advice"]

    warm = _preflight(*args, env_cache=tmp_path / "cache")  # plan and probe caches now warm
    assert warm.returncode == 1
    again = json.loads(warm.stdout)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "probe"} for r in rows]  # noqa: E731
    assert strip(again["recipes"]) == strip(report["recipes"])

    human = _preflight(*args[:-1], env_cache=tmp_path / "cache")
    assert "blocked" in human.stdout and "planning for: sm_120 (--arch)" in human.stdout


def test_preflight_with_new_flashinfer_blocks_nothing(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    fi = unpacked("flashinfer-python", "0.6.17")
    r = _preflight(
        str(tree), "--arch", "sm_120", "--no-torch", "--flashinfer", str(fi), "--json", env_cache=tmp_path / "cache"
    )
    assert r.returncode == 0, r.stderr
    # (recipes for gates 0.5.9 does not have are not-applicable)
    assert {x["status"] for x in json.loads(r.stdout)["recipes"]} - {"not-applicable"} == {"applicable"}


def test_preflight_with_a_flashinfer_tree_beside_names_the_backport_that_apply_would_write(tmp_path: Path) -> None:
    """SGLang 0.5.9 and the FlashInfer it pins (0.6.3) as two trees, FlashInfer given by --flashinfer:
    the allreduce gate is blocked on that FlashInfer, and the advice is the pair's apply command.
    The command preflight prints, run, opens the gate: FlashInfer's majors and SGLang's predicates say so."""
    import shlex

    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "sg")
    fi = fetch_or_skip("flashinfer", "0.6.3", tmp_path / "fi")
    r = _preflight(
        str(tree), "--arch", "sm_120", "--no-torch", "--flashinfer", str(fi), "--json", env_cache=tmp_path / "cache"
    )
    assert r.returncode == 1, r.stderr
    ar = next(x for x in json.loads(r.stdout)["recipes"] if x["id"] == "sglang-allreduce-fusion-sm120")
    assert ar["status"] == "blocked" and ar["needs_recipes"] == ["flashinfer-trtllm-comm-sm120"], ar
    cmd = shlex.split(ar["advice"].split("`")[1])
    assert cmd[:2] == ["sm120patch", "apply"]
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "sm120patch", *cmd[1:], "--arch", "sm_120", "--probe", "static", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    statuses = {x["id"]: x["status"] for x in json.loads(done.stdout)["recipes"]}
    assert statuses["flashinfer-trtllm-comm-sm120"] == "applied"
    assert statuses["sglang-allreduce-fusion-sm120"] == "applied", done.stderr
    # and the gate is open by the releases' own code, not by apply's word: FlashInfer's JIT now builds
    # trtllm_comm for major 12 (its supported_major_versions, read with ast), and every arch chain of
    # SGLang's runtime check admits major 12 with SGLang's own predicates (gates.py)
    from tests.integration import gates
    from tests.integration.test_flashinfer_releases import majors
    from tests.integration.test_sglang_releases import RUNTIME_FNS

    assert 12 in majors(fi)
    chains = [c for f in sorted(tree.rglob("communicator.py")) for c in gates.chains_admit(f, RUNTIME_FNS, 12)]
    assert chains and all(chains)


def test_warm_preflight_parses_no_sglang_file_for_the_backport_note(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A warm pre-flight serves the FlashInfer-backport note's SGLang plan from the plan-result
    cache: it parses none of the SGLang files (it once re-planned the pair with libcst on every
    run, ~100x slower). Counted (the libcst modules asked for, per file), not timed; the note
    itself must stay."""
    from sm120patch.cli import run
    from sm120patch.planning import plan as planning

    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "src", layout="git")
    fi = unpacked("flashinfer-python", "0.6.3")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parsed: list[Path] = []
    module = planning.Workspace.module

    def counting(self: planning.Workspace, path: Path) -> object:  # every libcst module a plan asks for
        parsed.append(Path(path))
        return module(self, path)

    monkeypatch.setattr(planning.Workspace, "module", counting)
    args = ["preflight", str(tree), "--arch", "sm_120", "--no-torch", "--no-census", "--flashinfer", str(fi)]
    args += ["--report", str(tmp_path / "r.json")]
    assert run(args) == 1  # b12x stays blocked on FlashInfer 0.6.3
    cold = [p for p in parsed if tree in p.parents]
    assert cold, "the counter saw no SGLang parse on a cold run: it counts nothing"
    first = json.loads((tmp_path / "r.json").read_text())
    parsed.clear()
    assert run(args) == 1
    assert [p for p in parsed if tree in p.parents] == []
    rows = {r["id"]: r for r in json.loads((tmp_path / "r.json").read_text())["recipes"]}
    assert "opens with the FlashInfer backport" in rows["sglang-allreduce-fusion-sm120"]["advice"]
    strip = lambda rows: {r["id"]: {k: v for k, v in r.items() if k != "probe"} for r in rows}  # noqa: E731
    assert strip(rows.values()) == strip(first["recipes"])  # verdicts differ in timing and cache flags only
