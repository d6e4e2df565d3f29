"""The probe ladder on fake FlashInfer trees: static gate reading, spec in a subprocess,
early stop on fail, absent-by-design kernels, artifacts, cache."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import load_kernels
from sm120patch.errors import UserError
from sm120patch.probes import ProbeCache, probe_kernel, probe_recipe, recipe_passes
from sm120patch.probes import spec as spec_mod
from sm120patch.probes.environment.flashinfer import from_tree
from sm120patch.probes.static import read_gate
from sm120patch.probes.subproc import arch_list_value
from tests.unit.fi_fakes import HOST_FILES, cubin, fatbin, host_so, make_tree

SM90, SM100, SM120, SM121 = (parse_arch(a) for a in ("sm_90", "sm_100", "sm_120", "sm_121"))
COMM = "flashinfer:trtllm_comm"


@pytest.fixture(autouse=True)
def _no_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-home"))


def test_static_reads_literal_constant_and_indirect(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "GATE = [9, 10, 12]\n"
        "def helper():\n    return ctx.flags(supported_major_versions=[10])\n"
        "def gen_lit():\n    return ctx.flags(supported_major_versions=[9, 10])\n"
        "def gen_const():\n    return ctx.flags(supported_major_versions=GATE)\n"
        "def gen_local():\n    m = (12,)\n    return ctx.flags(supported_major_versions=m)\n"
        "def gen_indirect():\n    return helper()\n"
        "def gen_dynamic(x):\n    return ctx.flags(supported_major_versions=x.majors)\n"
        "def gen_none():\n    return spec()\n"
    )
    assert read_gate(f, "gen_lit").majors == (9, 10)
    assert read_gate(f, "gen_const").majors == (9, 10, 12)
    assert read_gate(f, "gen_local").majors == (12,)
    assert read_gate(f, "gen_indirect").majors == (10,)
    assert read_gate(f, "gen_dynamic").dynamic
    assert read_gate(f, "gen_none").found and read_gate(f, "gen_none").majors is None
    assert not read_gate(f, "gen_missing").found
    assert not read_gate(tmp_path / "nope.py", "gen_lit").found


def test_static_verdicts(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path, gate="[9, 10]"))
    v = probe_kernel(COMM, SM120, fi, "static")
    assert (v.result, v.rung) == ("fail", "static")
    assert "[9, 10]" in v.reason and "excludes major 12" in v.reason
    assert probe_kernel(COMM, SM90, fi, "static").result == "pass"
    assert probe_kernel(COMM, SM100, fi, "static").result == "pass"


def test_static_unknown_when_generator_missing(tmp_path: Path) -> None:
    make_tree(tmp_path)
    (tmp_path / "flashinfer" / "jit" / "comm.py").write_text("def other():\n    pass\n")
    v = probe_kernel(COMM, SM120, from_tree(tmp_path), "static")
    assert (v.result, v.rung) == ("unknown", "none") and "not found" in v.reason


def test_no_gate_is_not_a_pass(tmp_path: Path) -> None:
    """A generator that passes no supported_major_versions says nothing about the arch."""
    fi = from_tree(make_tree(tmp_path, gate="None"))
    comm = tmp_path / "flashinfer" / "jit" / "comm.py"
    comm.write_text(comm.read_text().replace("_flags(supported_major_versions=None)", "pass"))
    v = probe_kernel(COMM, SM90, fi, "static")
    assert (v.result, v.rung, v.asked) == ("unknown", "none", "static")
    assert "passes no supported_major_versions" in v.reason


def test_gate_none_and_symbol_are_declared_in_the_catalogue(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path))
    comm = tmp_path / "flashinfer" / "jit" / "comm.py"
    comm.write_text(comm.read_text() + "\ndef gen_any_module():\n    return JitSpec()\n")
    base = load_kernels()[COMM]
    any_arch = dataclasses.replace(base, id="t:any", generator="gen_any_module", gate="none", source_checks=())
    symbol = dataclasses.replace(base, id="t:sym", generator="gen_trtllm_comm_module", gate="symbol", source_checks=())
    cat = {k.id: k for k in (any_arch, symbol)}
    v = probe_kernel("t:any", SM120, fi, "static", catalogue=cat)
    assert (v.result, v.rung) == ("pass", "static") and "for every arch" in v.reason
    v = probe_kernel("t:sym", SM120, fi, "static", catalogue=cat)  # the [9, 10] gate is not read
    assert (v.result, v.rung) == ("pass", "static") and "exists" in v.reason
    gone = dataclasses.replace(any_arch, generator="gen_missing")
    assert probe_kernel("t:any", SM120, fi, "static", catalogue={"t:any": gone}).result == "unknown"


@pytest.mark.parametrize(
    ("host", "result", "words"),
    [
        ("fixed", "pass", ["5 source check(s) hold"]),
        ("broken", "fail", ["cluster of 8", "PR 3903", "stride"]),
        ("absent", "unknown", ["not found; cannot check"]),
    ],
)
def test_source_checks_for_sm12x(tmp_path: Path, host: str, result: str, words: list[str]) -> None:
    fi = from_tree(make_tree(tmp_path, gate="[9, 10, 12]", host=host))
    v = probe_kernel(COMM, SM120, fi, "static")
    assert v.result == result, v.reason
    assert all(w in v.reason for w in words), v.reason
    # the checks are about SM12x launches: SM90 is judged on its gate alone
    assert probe_kernel(COMM, SM90, fi, "static").result == "pass"


def test_a_source_finding_does_not_stop_the_climb(tmp_path: Path) -> None:
    """Unlike an arch gate that refuses the arch, a launch problem leaves the higher rungs to look
    (and report their own findings); the verdict keeps every fail."""
    fi = from_tree(make_tree(tmp_path, gate="[9, 10, 12]", host="broken"), python=sys.executable)
    v = probe_kernel(COMM, SM120, fi, "spec")
    assert v.result == "fail" and [s["rung"] for s in v.steps] == ["static", "artifact", "spec"]
    assert v.rung == "spec" and "cluster of 8" in v.reason  # reached spec; the static finding stands


def test_evidence_names_the_files_read_and_notices_a_swap(tmp_path: Path) -> None:
    from sm120patch.probes.evidence import changes

    fi = from_tree(make_tree(tmp_path / "a", gate="[9, 10, 12]", host="fixed"))
    v = probe_kernel(COMM, SM120, fi, "static")
    files = v.evidence["files"]
    assert set(files) == {"jit/comm.py", *HOST_FILES} and all(len(h) == 64 for h in files.values())
    assert v.evidence["flashinfer"] == {"version": "0.6.1", "location": fi.location, "python": None, "source": "tree"}
    assert changes(v.evidence, fi) == []
    host = tmp_path / "a" / "flashinfer" / "data" / "csrc" / "trtllm_allreduce.cu"
    host.write_text(host.read_text() + "// edited\n")
    assert changes(v.evidence, fi) == ["changed since the probe: data/csrc/trtllm_allreduce.cu"]
    other = from_tree(make_tree(tmp_path / "b", gate="[9, 10, 12]", version="0.6.16"))
    said = changes(v.evidence, other)
    assert any("moved" in c for c in said) and any("0.6.1 -> 0.6.16" in c for c in said)


def test_spec_rung_runs_generator_in_subprocess(tmp_path: Path) -> None:
    # The fake generator raises FlashInfer's error text for archs outside its gate;
    # the static gate says [9, 10, 12] but the runtime list is only [9, 10]: spec wins.
    make_tree(tmp_path, gate="MAJORS", majors="[9, 10]")
    comm = tmp_path / "flashinfer" / "jit" / "comm.py"
    comm.write_text(comm.read_text().replace("MAJORS = [9, 10]", "MAJORS = list(range(9, 11))"))
    fi = from_tree(tmp_path, python=sys.executable)
    v = probe_kernel(COMM, SM120, fi, "spec")
    assert (v.result, v.rung) == ("fail", "spec"), v
    assert "No supported CUDA architectures found for major versions [9, 10]" in v.reason
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0f" in v.reason
    v = probe_kernel(COMM, SM90, fi, "spec")
    assert (v.result, v.rung) == ("pass", "spec") and "JitSpec" in v.reason


def test_static_pass_upgraded_by_spec(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path, gate="[9, 10, 12]"), python=sys.executable)
    assert probe_kernel(COMM, SM120, fi, "static").rung == "static"
    v = probe_kernel(COMM, SM120, fi, "spec")
    assert (v.result, v.rung) == ("pass", "spec")


def test_spec_degrades_without_interpreter_or_imports(tmp_path: Path) -> None:
    make_tree(tmp_path, gate="[9, 10, 12]")
    (tmp_path / "flashinfer" / "jit" / "comm.py").write_text(
        "import torch  # noqa\ndef gen_trtllm_comm_module():\n    return f(supported_major_versions=[9, 10, 12])\n"
    )
    v = probe_kernel(COMM, SM120, from_tree(tmp_path, python=sys.executable), "spec")
    # static passed; spec could not import torch here: the verdict stays on static, says why
    assert (v.result, v.rung) == ("pass", "static")
    assert "cannot import torch" in v.reason or "torch" in v.reason
    v = probe_kernel(COMM, SM120, from_tree(tmp_path), "spec")
    assert v.rung == "static" and "no Python interpreter" in v.reason


def test_early_stop_skips_spec(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path, gate="[9, 10]"), python=str(tmp_path / "no-python"))
    v = probe_kernel(COMM, SM120, fi, "run")
    assert (v.result, v.rung) == ("fail", "static")  # no subprocess was needed


def test_absent_by_design(tmp_path: Path) -> None:
    make_tree(tmp_path)
    cubins = tmp_path / "flashinfer_cubin" / "cubins" / "abc" / "batched_gemm-1"
    cubins.mkdir(parents=True)
    (tmp_path / "flashinfer_cubin" / "__init__.py").write_text("")
    for i, sm in enumerate((100, 100, 103)):
        (cubins / f"k{i}.cubin").write_bytes(cubin(sm))
    fi = from_tree(tmp_path)
    v = probe_kernel("flashinfer:trtllm_gen_moe", SM121, fi, "static")
    assert (v.result, v.rung) == ("fail", "static") and "does not exist for sm_121" in v.reason
    v = probe_kernel("flashinfer:trtllm_gen_moe", SM120, fi, "artifact")
    assert (v.result, v.rung) == ("fail", "artifact")
    assert "3 cubins" in v.reason and "[100, 103]" in v.reason
    (cubins / "k9.cubin").write_bytes(cubin(120))
    v = probe_kernel("flashinfer:trtllm_gen_moe", SM120, fi, "artifact")
    assert v.result == "unknown" and "update kernels.toml" in v.reason


def test_artifact_pass_from_jit_cache(tmp_path: Path, monkeypatch) -> None:
    make_tree(tmp_path / "t", gate="[9, 10, 12]")
    ops = tmp_path / "fi-home" / ".cache" / "flashinfer" / "0.6.1" / "120f" / "cached_ops"
    (ops / "trtllm_comm").mkdir(parents=True)
    (ops / "trtllm_comm" / "trtllm_comm.so").write_bytes(host_so(fatbin([(2, 120, 0x1200000)])))
    fi = from_tree(tmp_path / "t")
    assert fi.user_cache_dirs == [ops]
    v = probe_kernel(COMM, SM120, fi, "artifact")
    assert (v.result, v.rung) == ("pass", "artifact") and "trtllm_comm.so" in v.reason
    v = probe_kernel(COMM, SM90, fi, "artifact")
    assert (v.result, v.rung) == ("pass", "static")  # the .so has no sm_90: no evidence


def _no_subprocess(*a: object, **k: object) -> None:
    raise AssertionError("a cached verdict started a subprocess")


def test_cache_answers_without_a_subprocess_and_is_invalidated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fi = from_tree(make_tree(tmp_path / "t", gate="[9, 10, 12]"), python=sys.executable)
    cache = ProbeCache(tmp_path / "c")
    cold = probe_kernel(COMM, SM120, fi, "spec", cache)
    assert not cold.cached and cold.result == "pass"
    with monkeypatch.context() as m:  # a warm verdict must not start FlashInfer again
        m.setattr(spec_mod, "run_script", _no_subprocess)
        warm = probe_kernel(COMM, SM120, fi, "spec", cache)
    assert warm.cached and warm.result == "pass"
    assert warm.reason == cold.reason
    comm = tmp_path / "t" / "flashinfer" / "jit" / "comm.py"
    comm.write_text(
        comm.read_text().replace("supported_major_versions=[9, 10, 12]", "supported_major_versions=[9, 10]")
    )
    again = probe_kernel(COMM, SM120, fi, "spec", cache)
    assert not again.cached and again.result == "fail"


def test_probe_recipe(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path, gate="[9, 10]"))
    vs = probe_recipe([COMM], [SM90, SM120], fi, "static")
    assert [(v.arch, v.result) for v in vs] == [("sm_90", "pass"), ("sm_120", "fail")]
    assert not recipe_passes(vs) and recipe_passes(vs[:1])
    assert all(isinstance(v.to_dict()["elapsed_s"], float) for v in vs)


def test_bad_level_and_missing_fi(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path))
    with pytest.raises(UserError, match="unknown level"):
        probe_kernel(COMM, SM120, fi, "gpu")
    fi.package_dir, fi.error = None, "flashinfer is not importable"
    assert probe_kernel(COMM, SM120, fi).reason == "flashinfer is not importable"


def test_run_rung_without_check_says_why(tmp_path: Path) -> None:
    fi = from_tree(make_tree(tmp_path, gate="[9, 10, 12]"))
    none = dataclasses.replace(load_kernels()[COMM], run="", run_unavailable="no GPUs of this kind to run it on")
    v = probe_kernel(COMM, SM120, fi, "run", catalogue={COMM: none})
    assert v.result == "pass" and v.rung == "static" and "no GPUs of this kind to run it on" in v.reason
    v = probe_kernel(COMM, SM120, fi, "run", catalogue=load_kernels())  # a check, but no interpreter to run it
    assert v.rung == "static" and "run: no Python interpreter" in v.reason


def test_arch_list_values() -> None:
    assert [arch_list_value(a) for a in (SM90, SM100, SM120, SM121)] == ["9.0a", "10.0a", "12.0f", "12.1a"]
    assert arch_list_value(SM120, cuda_at_least_12_9=False) == "12.0a"


CRASHING_COMM = """
import os


class JitSpec:
    name = "x"


def gen_trtllm_comm_module():
    return JitSpec()


def gen_norm_module():
    os.abort()  # what a generator that takes the interpreter down looks like from outside


def gen_moe_module():
    raise RuntimeError("No supported CUDA architectures found for major versions [10].")


def gen_xqa_module():
    import time
    time.sleep(60)  # a generator that hangs (a download with no network)
"""


def _kernels() -> dict[str, object]:
    base = load_kernels()[COMM]
    return {
        name: dataclasses.replace(base, id=f"flashinfer:{name}", generator=gen, source_checks=())
        for name, gen in (
            ("comm", "gen_trtllm_comm_module"),
            ("norm", "gen_norm_module"),
            ("moe", "gen_moe_module"),
            ("xqa", "gen_xqa_module"),
        )
    }


def test_one_interpreter_answers_every_check_and_a_crash_is_that_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(tmp_path / "t", gate="[9, 10, 12]")
    (tmp_path / "t" / "flashinfer" / "jit" / "comm.py").write_text(CRASHING_COMM)
    fi = from_tree(tmp_path / "t", python=sys.executable)
    k = _kernels()
    started: list[int] = []
    real = spec_mod.run_script

    def counting(python, script, args, env, timeout, progress=None):  # noqa: ANN001, ANN202
        started.append(len(__import__("json").loads(args[0])))
        return real(python, script, args, env, timeout, progress)

    monkeypatch.setattr(spec_mod, "run_script", counting)
    asks = [spec_mod.Ask(k[n], SM120) for n in ("comm", "moe")]
    out = spec_mod.ask(asks, fi, tmp_path / "c")
    assert started == [2]  # two checks, one interpreter
    assert out[asks[0]]["ok"] and "No supported CUDA architectures" in out[asks[1]]["error"]
    # the crash is the check's that was running; the check after it gets a fresh interpreter
    started.clear()
    asks = [spec_mod.Ask(k[n], SM120) for n in ("norm", "comm")] + [spec_mod.Ask(k["comm"], SM90)]
    out = spec_mod.ask(asks, fi, tmp_path / "c2")
    # sm_120: [norm, comm] crashed on norm, then [comm] alone; sm_90: [comm], beside them
    assert sorted(started) == [1, 1, 2], started
    assert out[asks[0]]["stage"] == "crash" and "exited" in out[asks[0]]["error"]
    assert out[asks[1]]["ok"] and out[asks[2]]["ok"]
    step = spec_mod.check_spec(k["norm"], SM120, fi, cache_root=tmp_path / "c2")  # never cached: asked again
    assert step.result == "unknown" and "exited" in step.reason and "gen_norm_module" in step.reason


def test_a_warm_spec_answer_starts_no_interpreter_until_a_file_it_loaded_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fi = from_tree(make_tree(tmp_path / "t", gate="[9, 10, 12]"), python=sys.executable)
    kernel = load_kernels()[COMM]
    cold = spec_mod.check_spec(kernel, SM120, fi, cache_root=tmp_path / "c")
    assert cold.result == "pass" and "from cache" not in cold.reason
    with monkeypatch.context() as m:
        m.setattr(spec_mod, "run_script", _no_subprocess)
        warm = spec_mod.check_spec(kernel, SM120, fi, cache_root=tmp_path / "c")
    assert warm.result == "pass" and "from cache" in warm.reason
    # FlashInfer's package __init__ was loaded by the answer: an edit there asks again
    (tmp_path / "t" / "flashinfer" / "__init__.py").write_text("X = 1\n")
    again = spec_mod.check_spec(kernel, SM120, fi, cache_root=tmp_path / "c")
    assert again.result == "pass" and "from cache" not in again.reason


def test_two_kernels_with_one_generator_share_one_answer_and_it_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalogue has kernels that share a generator (fused MoE and its tactic skip): their one
    answer is cached, so neither asks again."""
    fi = from_tree(make_tree(tmp_path / "t", gate="[9, 10, 12]"), python=sys.executable)
    base = load_kernels()[COMM]
    twin = dataclasses.replace(base, id="flashinfer:twin")
    out = spec_mod.ask([spec_mod.Ask(base, SM120), spec_mod.Ask(twin, SM120)], fi, tmp_path / "c")
    assert all(a.get("ok") for a in out.values())
    with monkeypatch.context() as m:
        m.setattr(spec_mod, "run_script", _no_subprocess)
        again = spec_mod.ask([spec_mod.Ask(twin, SM120)], fi, tmp_path / "c")
    assert next(iter(again.values())).get("cached")


def test_a_hung_check_is_that_checks_and_the_rest_are_answered(tmp_path: Path) -> None:
    make_tree(tmp_path / "t", gate="[9, 10, 12]")
    (tmp_path / "t" / "flashinfer" / "jit" / "comm.py").write_text(CRASHING_COMM)
    fi = from_tree(tmp_path / "t", python=sys.executable)
    k = _kernels()
    asks = [spec_mod.Ask(k["xqa"], SM120), spec_mod.Ask(k["comm"], SM120)]
    out = spec_mod.ask(asks, fi, tmp_path / "c", timeout=3.0)
    assert out[asks[0]]["stage"] == "timeout" and "within 3 s" in out[asks[0]]["error"]
    assert out[asks[1]]["ok"]
