"""The frontier recipes (SGLang 0.5.17-0.5.23 SM12x gates) on every real release they claim.

Per release, from PyPI: each recipe's status with the FlashInfer that release pins and with the
newest one (the static probe reads the real FlashInfer wheels); after applying the catalogue,
every edited module compiles, reads no name it does not bind and imports nothing its source
module lacks; each gate, evaluated with the release's own predicate definitions
(tests/integration/gates.py, never sm120patch.arch), admits major 12 only under the recipe's
run-time conditions and answers majors 8, 9 and 10 exactly as the pristine release does;
a plan after apply finds nothing left to do; rollback is byte-identical. A copy of 0.5.23 that
says 0.5.24 gets `untested`, and apply leaves it alone. Git-clone layouts of every release are
applied and rolled back in test_sglang_releases.py.
"""

from __future__ import annotations

import ast
import hashlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.version import Version

from sm120patch.arch import PREDICATE_MAJORS, parse_arch
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.engine import tree as engine
from sm120patch.planning.plan import APPLICABLE, APPLIED, BLOCKED, NOT_APPLICABLE, SATISFIED, UNTESTED, plan
from sm120patch.planning.targets import discover
from sm120patch.probes import recipe_probe as gatekeeper
from sm120patch.probes.environment import flashinfer as flashinfer_env
from tests.conftest import fetch_or_skip, pristine_or_skip
from tests.integration import gates
from tests.integration.gates import Device, Scope
from tools.releases import SGLANG_RELEASES

pytestmark = pytest.mark.releases

DSA, FP4, GDN = "sglang-dsa-sparse-mla-sm120", "sglang-fp4-gemm-b12x-sm120", "sglang-gdn-prefill-sm120"
PCIE, GUARD, MHA = (
    "sglang-pcie-ipc-allreduce-sm120",
    "sglang-autotune-moe-guard-sm120",
    "sglang-gptoss-trtllm-mha-sm120",
)
AR = "sglang-allreduce-fusion-sm120"
FRONTIER = (DSA, FP4, GDN, PCIE, GUARD, MHA)

# flashinfer-python each SGLang release pins (wheel METADATA, facts.md); NEWER is the newest on PyPI
PINNED = {
    **{f"0.5.{n}": v for n, v in ((5, "0.5.0"), (6, "0.5.3"), (7, "0.5.3"), (8, "0.6.1"), (9, "0.6.3"))},
    "0.5.10": "0.6.7.post2",
    "0.5.11": "0.6.8.post1",
    "0.5.12": "0.6.11.post1",
    **{f"0.5.{n}": "0.6.12" for n in (13, 14, 15)},
    "0.5.16": "0.6.14",
    "0.5.17": "0.6.15.post1",
    "0.5.18": "0.6.17",
    **{f"0.5.{n}": "0.6.18" for n in (19, 20, 21)},
    "0.5.22": "0.7.1",
    "0.5.23": "0.7.2",
}
NEWER = "0.7.4"
# the first FlashInfer whose wheel holds what each recipe needs (read from the wheels, see kernels.toml)
FIRST_FI = {
    DSA: "0.6.14",  # gen_sparse_mla_sm120_module + the v32 SM120 decode
    FP4: "0.6.14",  # b12x with auto's ragged-K fallback (0.6.11/0.6.12 have b12x but raise on it)
    GDN: "0.6.14",  # delta_rule_prefill_dsl + the _arch_major == 12 dispatch
    PCIE: "0.7.0",  # gen_pcie_ipc_comm_module
    GUARD: "0.6.15",  # autotune skip_ops + the gemm1/gemm2 op names
    MHA: "0.6.7",  # gen_fmha_v2_module [9, 12] + sinks
}
# the first SGLang release where each gate exists in the form the recipe opens
FIRST_SGLANG = {DSA: 17, FP4: 8, GDN: 19, PCIE: 21, GUARD: 17, MHA: 19}
MAJORS = (8, 9, 10, 12)
SM12X = (Device(12, 0), Device(12, 1))


def _n(version: str) -> int:
    return int(version.split(".")[2])


def expected(version: str, fi: str) -> dict[str, str]:
    """Status of each frontier recipe on `version` planned against FlashInfer `fi` (static probe)."""
    out = {}
    for rid in FRONTIER:
        if _n(version) < FIRST_SGLANG[rid]:
            out[rid] = NOT_APPLICABLE
        else:
            out[rid] = APPLICABLE if Version(fi) >= Version(FIRST_FI[rid]) else BLOCKED
    return out


@pytest.fixture(scope="module")
def recipes():
    return load_recipes()


def _probe(fi_version: str) -> Any:
    fi = flashinfer_env.from_tree(pristine_or_skip("flashinfer", fi_version))
    return gatekeeper.make_probe([parse_arch("sm_120")], fi, "static")


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*.py")
        if ".git" not in p.parts
    }


FRONTIER_VERSIONS = [v for v in SGLANG_RELEASES if _n(v) >= min(FIRST_SGLANG.values())]


@pytest.mark.parametrize("version", FRONTIER_VERSIONS)
def test_statuses_with_pinned_and_newer_flashinfer(version: str, recipes) -> None:
    tree = pristine_or_skip("sglang", version)
    (meta,) = tree.glob("sglang-*.dist-info/METADATA")
    assert re.search(
        rf"^Requires-Dist: flashinfer[-_]python(\[\w+\])?=={re.escape(PINNED[version])}$", meta.read_text(), re.M
    )
    (target,) = discover(tree)
    sm120 = parse_arch("sm_120")
    for fi in (PINNED[version], NEWER):
        plans = {p.recipe.id: p for p in engine.make_plan(target, recipes, sm120, probe=_probe(fi))}
        got = {rid: plans[rid].status for rid in FRONTIER}
        assert got == expected(version, fi), f"FlashInfer {fi}"
        for rid in FRONTIER:
            p = plans[rid]
            if p.status == BLOCKED:  # the reason names the kernel, the FlashInfer and the rung
                assert any(k in p.reason for k in p.recipe.needs) and f"FlashInfer {fi}" in p.reason, p.reason
                assert " rung: " in p.reason


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_apply_gates_and_rollback(version: str, tmp_path: Path, recipes) -> None:
    tree = fetch_or_skip("sglang", version, tmp_path / "tree")
    pristine = pristine_or_skip("sglang", version)
    (target,) = discover(tree)
    sm120 = parse_arch("sm_120")
    before = _hashes(tree)
    planned = {p.recipe.id: p for p in engine.make_plan(target, recipes, sm120)}
    for rid in FRONTIER:
        assert recipes_by_id(recipes)[rid].untested(version) is False
    result = {p.recipe.id: p for p in engine.apply(target, recipes, sm120)}
    changed = sorted({rel for p in result.values() if p.status == APPLIED for rel in p.files})
    assert changed

    # every edited module compiles, binds what it reads, imports only what exists in this release
    root = target.package_dir
    problems = gates.check_edit_bindings(
        root, [(rel, (pristine / rel).read_bytes(), (tree / rel).read_bytes()) for rel in changed]
    )
    assert problems == []

    new, old = tree / "sglang", pristine / "sglang"
    n = _n(version)
    check_allreduce_auto_enable(new, old, planned[AR])
    if n >= FIRST_SGLANG[FP4]:
        check_fp4(new, old)
    if n >= FIRST_SGLANG[DSA]:
        check_dsa(new, old)
    if n >= FIRST_SGLANG[GUARD]:
        check_guard(new, old)
    if n >= FIRST_SGLANG[GDN]:
        check_gdn(new, old)
    if n >= FIRST_SGLANG[MHA]:
        check_gptoss(new, old)
    if n >= FIRST_SGLANG[PCIE]:
        check_pcie(new, old)

    # nothing left to do: a plan after apply opens nothing, a second apply writes nothing
    again = engine.make_plan(target, recipes, sm120)
    assert all(p.status in (APPLIED, SATISFIED, NOT_APPLICABLE) for p in again), [
        (p.recipe.id, p.status) for p in again
    ]
    after = _hashes(tree)
    engine.apply(target, recipes, sm120)
    assert _hashes(tree) == after

    engine.rollback(target, recipes)
    assert _hashes(tree) == before
    assert not (tree / ".sm120patch").exists()


def recipes_by_id(recipes: list) -> dict[str, Any]:
    return {r.id: r for r in recipes}


def test_newer_release_is_untested_and_left_alone(tmp_path: Path, recipes) -> None:
    """A tree that says 0.5.24 (0.5.23's code): every recipe that would open a gate is `untested`,
    loudly, and apply writes nothing; with allow_untested the plan is the 0.5.23 one."""
    tree = fetch_or_skip("sglang", "0.5.23", tmp_path / "tree")
    for name in ("version.py", "_version.py"):  # wherever the release states its version
        f = tree / "sglang" / name
        text = f.read_text()
        f.unlink()  # a hard link into the shared cache: never write through it
        f.write_text(text.replace("'0.5.23'", "'0.5.24'").replace('"0.5.23"', '"0.5.24"'))
    for info in tree.glob("sglang-0.5.23.dist-info"):
        shutil.rmtree(info)
    (target,) = discover(tree)
    assert target.version == "0.5.24"
    sm120 = parse_arch("sm_120")
    plans = {p.recipe.id: p for p in engine.make_plan(target, recipes, sm120)}
    for rid in (*FRONTIER, AR):
        assert plans[rid].status == UNTESTED, (rid, plans[rid].status)
        assert "0.5.24" in plans[rid].reason and "0.5.23" in plans[rid].reason
        assert "--allow-untested" in plans[rid].reason and plans[rid].diff()
    before = _hashes(tree)
    result = engine.apply(target, recipes, sm120)
    assert all(p.status != APPLIED for p in result)
    assert _hashes(tree) == before and not (tree / ".sm120patch").exists()
    allowed = {p.recipe.id: p.status for p in plan(target, recipes, sm120, allow_untested=True)}
    assert all(allowed[rid] == APPLICABLE for rid in (*FRONTIER, AR))


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_arch_table_matches_each_release(version: str) -> None:
    """Issue 14.4: what sm120patch.arch says a predicate admits, against the release's own
    definition of it. `blackwell` is [10, 11, 12] from 0.5.9 ([10, 12] before: no major 11)."""
    root = pristine_or_skip("sglang", version) / "sglang"
    token_of = {
        "is_sm90_supported": "sm90",
        "is_sm100_supported": "sm100",
        "is_sm100_or_sm110_supported": "sm100_or_sm110",
        "is_sm110_supported": "sm110",
        "is_sm120_supported": "sm120",
        "is_blackwell_supported": "blackwell",
    }
    checked = 0
    for name, token in token_of.items():
        admitted = set()
        for major in (8, 9, 10, 11, 12):
            preds = gates.release_predicates(root, Device(major))
            if name not in preds:
                break
            if preds[name]():
                admitted.add(major)
        else:
            table = set(PREDICATE_MAJORS[token])
            if _n(version) <= 8 and token == "blackwell":
                assert admitted == table - {11}, (name, admitted)
            else:
                assert admitted == table, (name, admitted)
            checked += 1
    assert checked >= 4
    # SM121 (DGX Spark) passes every major-12 predicate; the exact-minor helpers tell them apart
    p121 = gates.release_predicates(root, Device(12, 1))
    assert p121["is_sm120_supported"]() and p121["is_blackwell_supported"]()
    if "is_sm120" in p121:
        assert p121["is_sm120"]() is False and gates.release_predicates(root, Device(12, 0))["is_sm120"]()


# --- the gates, evaluated with each release's own predicates ---------------------------------------------


def _fn(path: Path, name: str) -> ast.FunctionDef:
    (fn,) = gates.functions(ast.parse(path.read_bytes()), {name})
    return fn


def _assigned(fn: ast.FunctionDef, name: str) -> ast.expr:
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return n.value
    raise AssertionError(f"no {name} = ... in {fn.name}")


def both(new: Path, old: Path, rel: str) -> tuple[Path, Path]:
    return new / rel, old / rel


def taken_recorder() -> tuple[Callable[..., object], list[str]]:
    """A stand-in for the inserted `_sm120patch_taken` with its rule (log when the value takes the
    gate: true, false for logs_if False, any for None), recording the ids it would log."""
    logged: list[str] = []

    def taken(rid: str, value: object, logs_if: bool | None = True) -> object:
        if logs_if is None or bool(value) == logs_if:
            logged.append(rid)
        return value

    return taken, logged


def check_dsa(new: Path, old: Path) -> None:
    """DeepSeek-V3.2 (and its MTP draft) on major 12 with an FP8 KV cache take flashinfer_sparse_mla;
    GLM keeps it, other DSA models and other majors answer as before."""
    path, pristine = both(new, old, "srt/arg_groups/overrides.py")
    archs = ("GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "MistralLarge3ForCausalLM")
    for dev in (*[Device(m) for m in MAJORS], *SM12X):
        for arch in archs:
            for kv in ("fp8_e4m3", "bfloat16"):
                values = {"model_arch": arch, "major": dev.major, "kv_cache_dtype": kv}
                taken, logged = taken_recorder()
                got = Scope(path, dev, {**values, "_sm120patch_taken": taken}).eval(
                    _assigned(_fn(path, "_dsa_split_backend_resolution"), "is_glm_sm12_fp8")
                )
                was = Scope(pristine, dev, values).eval(
                    _assigned(_fn(pristine, "_dsa_split_backend_resolution"), "is_glm_sm12_fp8")
                )
                assert was == (arch == archs[0] and dev.major == 12 and kv == "fp8_e4m3")
                assert got == (arch in archs[:2] and dev.major == 12 and kv == "fp8_e4m3"), (arch, dev, kv)
                # the taken line marks exactly the cases where the recipe changed SGLang's own choice
                # (a DeepSeek-V3.2 on an H200, or with a bf16 KV cache, says nothing)
                assert logged == (["sglang-dsa-sparse-mla-sm120"] if got and not was else []), (arch, dev, kv, logged)
    # the runtime validator accepts the same models (the draft runs under its NextN name)
    path, pristine = both(new, old, "kernels/ops/attention/flash_mla_sm120.py")
    for arch in (*archs, "DeepseekV3ForCausalLMNextN", "GlmMoeDsaForCausalLMNextN"):
        for major in MAJORS:
            ok_new = _validator_accepts(path, arch, major)
            ok_old = _validator_accepts(pristine, arch, major)
            admitted = {"GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN"}
            assert ok_old == (arch in admitted and major == 12)
            assert ok_new == (
                arch in admitted | {"DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN"} and major == 12
            )


def _validator_accepts(path: Path, arch: str, major: int) -> bool:
    scope = Scope(path, Device(major))
    validate = scope.function("_validate_flashinfer_sparse_mla_backend")
    torch = scope["torch"]
    try:
        return bool(
            validate(
                model_arch=arch,
                device_sm_major=major,
                kv_cache_dtype=torch.float8_e4m3fn,
                prefill_impl="flashinfer_sparse_mla",
                decode_impl="flashinfer_sparse_mla",
            )
        )
    except ValueError:
        return False


def check_fp4(new: Path, old: Path) -> None:
    """mm_fp4 gets "auto" for "cutlass" on major 12 only; every other backend and major as before."""
    path, pristine = both(new, old, "srt/layers/quantization/modelopt_quant.py")

    def backend_arg(p: Path) -> ast.expr:
        for n in ast.walk(_fn(p, "fp4_gemm")):
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "flashinfer_fp4_gemm":
                (kw,) = [k for k in n.keywords if k.arg == "backend"]
                return kw.value
        raise AssertionError(f"no flashinfer_fp4_gemm(..., backend=...) in {p}")

    for dev in (*[Device(m) for m in MAJORS], *SM12X):
        for backend in ("cutlass", "cudnn", "trtllm", "cute-dsl", "b12x"):
            taken, logged = taken_recorder()
            got = Scope(path, dev, {"backend": backend, "_sm120patch_taken": taken}).eval(backend_arg(path))
            was = Scope(pristine, dev, {"backend": backend}).eval(backend_arg(pristine))
            assert was == backend
            assert got == ("auto" if backend == "cutlass" and dev.major == 12 else backend), (dev, backend)
            # the taken line marks exactly the calls whose backend the recipe changed
            assert logged == (["sglang-fp4-gemm-b12x-sm120"] if got != was else []), (dev, backend, logged)


def check_guard(new: Path, old: Path) -> None:
    """On major 12 autotune skips exactly the two CUTLASS fused-MoE ops, on top of what it skipped."""
    rel = "srt/model_executor/runner/flashinfer_autotune.py"
    path, pristine = both(new, old, rel)
    for dev in (*[Device(m) for m in MAJORS], *SM12X):
        for user in (None, ["fp4_gemm"]):
            kernel = SimpleNamespace(flashinfer_autotune_skip_ops=user)
            runner = SimpleNamespace(server_args=SimpleNamespace(flashinfer_autotune_skip_ops=user))
            imports = {"get_exec": lambda k=kernel: SimpleNamespace(kernel=k)}
            taken, logged = taken_recorder()
            scope = Scope(path, dev, {"_sm120patch_taken": taken}, imports=imports)
            got = scope.function("get_flashinfer_autotune_skip_ops")(runner)
            was = Scope(pristine, dev, imports=imports).function("get_flashinfer_autotune_skip_ops")(runner)
            assert set(user or ()) <= was
            extra = {"trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"} if dev.major == 12 else set()
            assert set(got) == set(was) | extra, (dev, user)
            assert logged == (["sglang-autotune-moe-guard-sm120"] if set(got) != set(was) else []), (dev, user)


def check_gdn(new: Path, old: Path) -> None:
    """Major 12 defaults GDN prefill to FlashInfer only with CUDA >= 13, a chunk of at most 8192
    and a float32 state pool; majors 9 and 10 keep their own domains."""
    path, pristine = both(new, old, "srt/layers/attention/linear/gdn_backend.py")
    for dev in (*[Device(m, cuda=c) for m in MAJORS for c in ("12.9", "13.0")], *SM12X):
        for chunk in (4096, 8192, 16384):
            for state in ("float32", "bfloat16"):
                taken, logged = taken_recorder()
                got = _gdn_default(path, dev, chunk, state, taken)
                was = _gdn_default(pristine, dev, chunk, state)
                # the taken line is logged wherever the recipe changed the default, and only where its
                # arm let the call through (SGLang's later checks, the state dtype, may still decline)
                arm = dev.major == 12 and int(dev.cuda.split(".")[0]) >= 13 and chunk <= 8192
                assert (got == was or logged == ["sglang-gdn-prefill-sm120"]) and (arm or not logged), (
                    dev,
                    chunk,
                    state,
                    logged,
                )
                cuda13 = int(dev.cuda.split(".")[0]) >= 13
                if dev.major == 12:
                    assert was is None
                    assert got == ("flashinfer" if cuda13 and chunk <= 8192 and state == "float32" else None), (
                        dev,
                        chunk,
                        state,
                    )
                else:
                    assert got == was, (dev, chunk, state)
    # the SM9x/SM10x domains are upstream's: check the oracle sees them at all
    assert _gdn_default(pristine, Device(10, cuda="13.0"), 4096, "bfloat16") == "flashinfer"
    assert _gdn_default(pristine, Device(9), 16384, "float32") == "flashinfer"


def _gdn_default(
    path: Path, dev: Device, chunk: int, state: str, taken: Callable[..., object] | None = None
) -> str | None:
    torch = gates.fake_torch(dev)
    mamba = SimpleNamespace(linear_attn_prefill_backend=None, linear_attn_backend="triton")
    exec_ = SimpleNamespace(mamba=mamba, deterministic=SimpleNamespace(enable_deterministic_inference=False))
    schedule = SimpleNamespace(chunked_prefill_size=chunk, enable_dynamic_chunking=False)
    config = SimpleNamespace(linear_key_head_dim=128, linear_value_head_dim=128)
    pool = SimpleNamespace(mamba_cache=SimpleNamespace(temporal=SimpleNamespace(dtype=getattr(torch, state))))
    runner = SimpleNamespace(model_config=object(), req_to_token_pool=SimpleNamespace(mamba_pool=pool))
    imports = {
        "get_exec": lambda: exec_,
        "get_memory": lambda: SimpleNamespace(enable_page_major_kv_layout=False),
        "get_schedule": lambda: schedule,
        "hybrid_gdn_config": lambda mc: config,
        "rank0_log": lambda *a, **k: None,
        "is_flashinfer_gdn_prefill_available": lambda: True,
    }
    values = {"_sm120patch_taken": taken} if taken else None
    return Scope(path, dev, values, imports=imports).function("flashinfer_gdn_prefill_default")(runner)


def check_gptoss(new: Path, old: Path) -> None:
    """GPT-OSS's default attention on major 12 is trtllm_mha with a bf16/auto KV cache, no
    skip-softmax and no prefill context parallelism; SM100 keeps it, SM90 and others do not get it."""
    path, pristine = both(new, old, "srt/arg_groups/model_overrides/gpt_oss.py")

    def trtllm_test(p: Path) -> ast.expr:
        for n in ast.walk(_fn(p, "_gpt_oss_overrides")):
            if isinstance(n, ast.If) and isinstance(n.body[0], ast.Assign) and "trtllm_mha" in ast.unparse(n.body[0]):
                return n.test
        raise AssertionError(f"no trtllm_mha arm in {p}")

    for dev in (*[Device(m) for m in MAJORS], *SM12X):
        for kv in ("auto", "bfloat16", "fp8_e4m3"):
            for skip in (None, 0.0, 0.5):
                for cp in (1, 2):
                    cfg = SimpleNamespace(kv_cache_dtype=kv, attn_cp_size=cp)
                    imports = {"envs": gates.env_stub(SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR=skip)}
                    taken, logged = taken_recorder()
                    got = Scope(path, dev, {"cfg": cfg, "_sm120patch_taken": taken}, imports).eval(trtllm_test(path))
                    was = Scope(pristine, dev, {"cfg": cfg}, imports).eval(trtllm_test(pristine))
                    assert bool(was) == (dev.major == 10)
                    sm12 = dev.major == 12 and kv != "fp8_e4m3" and not skip and cp == 1
                    assert bool(got) == (dev.major == 10 or sm12), (dev, kv, skip, cp)
                    # the taken line marks exactly where the recipe changed the choice
                    want = ["sglang-gptoss-trtllm-mha-sm120"] if bool(got) != bool(was) else []
                    assert logged == want, (dev, kv, skip, cp, logged)


def check_pcie(new: Path, old: Path) -> None:
    """With SGLANG_ENABLE_PCIE_IPC_ALLREDUCE unset, the TP group uses PCIe-IPC on major 12 only at
    world size 2/4/8 with P2P and without NVLink; set, the variable decides as upstream."""
    path, pristine = both(new, old, "srt/distributed/device_communicators/pcie_ipc_ar.py")
    hosts = [Device(m) for m in MAJORS] + [
        Device(12, 1),
        Device(12, p2p=False),
        Device(12, nvlink=True),
        Device(12, count=2),
    ]
    for dev in hosts:
        for env in (None, True, False):
            for group, world in (("tp", 2), ("tp", 4), ("tp", 8), ("tp", 3), ("tp", 1), ("pp", 4)):
                imports = {
                    "envs": gates.env_stub(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=env),
                    "is_full_nvlink": lambda ids, n, d=dev: d.nvlink,
                }
                args = {"group_name": group, "world_size": world, "deterministic": False}
                taken, logged = taken_recorder()
                got = Scope(path, dev, {"_sm120patch_taken": taken}, imports=imports).function("eligible_group")(**args)
                was = Scope(pristine, dev, imports=imports).function("eligible_group")(**args)
                want = ["sglang-pcie-ipc-allreduce-sm120"] if got != was else []
                assert logged == want, (dev, env, group, world, logged)
                upstream = bool(env) and world > 1 and group == "tp"
                assert was == upstream
                if env is not None or dev.major != 12:
                    assert got == was, (dev, env, group, world)
                else:
                    auto = group == "tp" and world in (2, 4, 8) and world <= dev.count and dev.p2p and not dev.nvlink
                    assert got == auto, (dev, group, world)
        quiet = {"envs": gates.env_stub(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=None), "is_full_nvlink": lambda ids, n: False}
        eligible = Scope(path, dev, imports=quiet).function("eligible_group")
        assert eligible(group_name="tp", world_size=2, deterministic=True) is False


def check_allreduce_auto_enable(new: Path, old: Path, planned: Any) -> None:
    """The fusion auto-enable: majors 8/9/10 as before; on major 12 it turns fusion on below TP 4
    and never at TP 4 or 8 (sglang PR 32330)."""
    rels = sorted(
        {f.removeprefix("sglang/") for e in planned.edits if e.name.startswith("auto-enable") for f in e.files}
    )
    assert rels, "every release from 0.5.5 has an auto-enable the TP limit applies to"
    for rel in rels:
        path, pristine = both(new, old, rel)
        new_tests, old_tests = _auto_enable_tests(path), _auto_enable_tests(pristine)
        assert len(new_tests) == len(old_tests) >= 1
        opened = upstream = False
        for major in MAJORS:
            for tp in (2, 4, 8):
                args = _server_args(tp)
                values = {"self": args, "view": args, **_AR_LOCALS}
                imports = {"attn_dp_enabled_of": lambda v: False}
                dev = Device(major)
                got = [bool(Scope(path, dev, values, imports).eval(t)) for t in new_tests]
                was = [bool(Scope(pristine, dev, values, imports).eval(t)) for t in old_tests]
                upstream |= major in (9, 10) and any(was)
                if major == 12 and tp >= 4:
                    assert not any(got), (rel, tp)
                elif major == 12:
                    opened |= any(got)
                else:
                    assert got == was, (rel, major, tp)
        assert opened, f"{rel}: the auto-enable does not turn fusion on at TP 2 on major 12"
        assert upstream, f"{rel}: the oracle never saw upstream's own auto-enable fire"


_AR_LOCALS = {
    "model_arch": "DeepseekV3ForCausalLM",
    "is_h20_device": False,
    "is_mimo": False,
    "prefer_custom_dsv41": False,
}


def _server_args(tp: int) -> SimpleNamespace:
    return SimpleNamespace(
        tp_size=tp,
        enable_flashinfer_allreduce_fusion=False,
        flashinfer_allreduce_fusion_backend=None,
        enable_dp_attention=False,
        nnodes=1,
        moe_a2a_backend="none",
        attn_cp_size=1,
        encoder_only=False,
        enable_pdmux=False,
        disable_custom_all_reduce=False,
        device="cuda",
    )


def _auto_enable_tests(path: Path) -> list[ast.expr]:
    """The `if` tests of the auto-enable functions that hold an arch predicate and whose own body
    touches the fusion switch, in source order."""
    tree = ast.parse(path.read_bytes())
    root = gates.package_root(path)
    out = []
    for fn in gates.functions(tree, {"_handle_model_specific_adjustments", "_flashinfer_allreduce_fusion_auto_enable"}):
        for n in ast.walk(fn):
            if not isinstance(n, ast.If) or "allreduce_fusion" not in "\n".join(ast.unparse(s) for s in n.body):
                continue
            if any(gates.is_arch_predicate(x, root, tree) for x in ast.walk(n.test) if isinstance(x, ast.expr)):
                out.append(n.test)
    return out
