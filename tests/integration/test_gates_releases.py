"""`sm120patch gates` on the real SGLang releases (0.5.5 to 0.5.23, from the cache or PyPI).

1. Every gate line a recipe edits is a site, and the site is covered by that recipe. The oracle is
   not the scanner: the recipe's own edits come from `plan` (the lines its diff changes), and a
   changed line is a gate line when it names one of the release's predicates, read here with
   regular expressions from the release's own utils and platform table, or a name the same file
   binds to `get_device_capability()`.
2. A hand-checked list of sites in 0.5.9, 0.5.17 and 0.5.23, found by reading the code with grep
   and sed (file, function, the test, where the guarded code runs, from the predicate definitions
   of that release: `is_sm100_supported` majors [10], `is_sm90_supported` [9], `is_sm120_supported`
   [12], `is_blackwell_supported` [10, 11, 12], `is_sm120()` exactly (12, 0)).
3. The two-release diff 0.5.22 -> 0.5.23.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import load_kernels
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.gates import GateMap, gate_map
from sm120patch.gates.diff import diff_sites, recipe_moves
from sm120patch.planning.plan import plan
from sm120patch.planning.targets import discover
from tests.conftest import pristine_or_skip
from tools.releases import SGLANG_RELEASES

pytestmark = pytest.mark.releases

B = ["sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]  # is_blackwell_supported: majors 10, 11, 12
S100 = ["sm_100", "sm_103"]


@lru_cache(maxsize=4)
def _map(version: str) -> GateMap:
    root = pristine_or_skip("sglang", version)
    return gate_map(discover(root, "sglang")[0], load_recipes(), load_kernels(), None)


def _oracle_words(pkg: Path, text_of_file: str) -> set[str]:
    """The release's predicate names (its utils and platform table) and the names this file binds
    to the device capability: read with regular expressions, not with the scanner."""
    words: set[str] = set()
    for util in [*(pkg / "srt").glob("utils*.py"), pkg / "srt" / "utils" / "common.py"]:
        if util.is_file():
            src = util.read_text(encoding="utf-8")
            words.update(re.findall(r"^def (is_\w*(?:sm\d|blackwell|hopper)\w*)\(", src, re.M))
            for line in re.findall(r"^((?:is_\w+\s*=\s*)+)", src, re.M):
                words.update(n for n in re.findall(r"(is_\w+)\s*=", line) if re.search(r"sm\d|blackwell|hopper", n))
    for rc in (pkg / "srt").glob("*.py"):
        src = rc.read_text(encoding="utf-8", errors="replace")
        if "def get_platform" in src:
            words.update(k for k, v in re.findall(r'"(is_\w+)":\s*"(\w+)"', src) if v in words)
    words.update(
        re.findall(r"^(_is_\w+)\s*=.*\b(?:" + "|".join(map(re.escape, words or {"x"})) + r")\b", text_of_file, re.M)
    )
    words.update(re.findall(r"(\w+)(?:\s*,\s*\w+)*\s*=\s*[^=\n]*get_device_capability\(", text_of_file))
    return words


def _gate_lines(m: GateMap, recipe_id: str) -> list[tuple[str, int, str]]:
    """(file, release line, text) of each line the recipe's plan changes that names a gate word."""
    target = m.target
    plans = plan(target, [r for r in load_recipes() if r.id == recipe_id], [parse_arch("sm_120")])
    out = []
    for p in plans:
        for rel, (before, after) in p.changes.items():
            release = (target.root / rel).read_text(encoding="utf-8").splitlines()
            b = before.decode("utf-8").splitlines()
            words = _oracle_words(target.package_dir, "\n".join(release))
            rx = re.compile(r"\b(" + "|".join(map(re.escape, sorted(words))) + r")\b")
            for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, b, after.decode("utf-8").splitlines()).get_opcodes():
                for line in b[i1:i2] if tag in ("replace", "delete") else ():
                    code = line.split("#", 1)[0]
                    if rx.search(code):
                        hits = [k + 1 for k, x in enumerate(release) if x == line]
                        assert hits, f"{rel}: changed line {line!r} not in the release"
                        no = min(hits, key=lambda k: abs(k - (i1 + 1)))
                        pkg_rel = (target.root / rel).relative_to(target.package_dir.parent).as_posix()
                        out.append((pkg_rel, no, line.strip()))
    return out


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_every_gate_a_recipe_edits_is_a_site_covered_by_it(version: str) -> None:
    m = _map(version)
    checked = 0
    for cov in m.recipes:
        if cov.status not in ("applicable", "untested"):
            continue
        for file, line, text in _gate_lines(m, cov.id):
            sites = [
                s
                for s in m.sites
                if s.file == file and (s.line <= line <= s.end_line or any(a <= line <= b for a, b in s.defined_at))
            ]
            assert sites, f"{version} {cov.id}: no site at {file}:{line} ({text})"
            assert any(s in cov.sites and s.verdict == "covered" for s in sites), (
                f"{version} {cov.id}: {file}:{line} is a site but not covered by it: "
                f"{[(s.recipe, s.verdict) for s in sites]}"
            )
            checked += 1
    # the allreduce-fusion recipe edits an sm90-or-sm100 test on every release
    assert checked >= 1


# (file, function, a piece of the test as written, where the guarded code runs) read by hand
HAND = {
    "0.5.9": [
        ("sglang/srt/server_args.py", "ServerArgs._handle_model_specific_adjustments",
         'model_arch == "GlmMoeDsaForCausalLM" and is_blackwell_supported()', B),
        ("sglang/srt/server_args.py", "ServerArgs._handle_model_specific_adjustments",
         "is_blackwell_supported() and is_mxfp4_quant_format", B),
        ("sglang/srt/server_args.py", "ServerArgs._handle_deterministic_inference",
         "is_sm100_supported() or is_sm120_supported()", ["sm_100", "sm_103", "sm_120", "sm_121"]),
        ("sglang/srt/server_args.py", "ServerArgs._handle_attention_backend_compatibility",
         "not is_blackwell_supported()", B),  # a guard: raises elsewhere
        ("sglang/srt/layers/attention/flashinfer_backend.py", "FlashInferAttnBackend.__init__",
         "is_sm100_supported()", S100),
        # a guard that raises only for fa3 on Blackwell: the code after it runs everywhere
        ("sglang/srt/layers/attention/vision.py", "VisionAttention._determine_attention_backend",
         'backend == "fa3" and is_blackwell_supported()', ["sm_80", "sm_89", "sm_90", *B]),
        ("sglang/srt/layers/quantization/fp8_utils.py", "_check_cutlass_block_fp8_hardware_support",
         "is_sm90_supported() or is_blackwell_supported()", ["sm_90", *B]),
        ("sglang/srt/layers/quantization/fp8_utils.py", "triton_mxfp8_blockscaled_linear",
         "not (_is_cuda and is_sm100_supported())", S100),
        ("sglang/srt/layers/quantization/fp8.py", "Fp8MoEMethod.__init__",
         "is_sm100_supported() or is_sm90_supported()", ["sm_90", *S100]),
        ("sglang/srt/layers/quantization/modelopt_quant.py", "<module>", "is_sm120_supported()", ["sm_120", "sm_121"]),
        ("sglang/srt/layers/quantization/mxfp4.py", "_swizzle_mxfp4", "_is_sm100_supported", S100),
        ("sglang/srt/layers/communicator.py", "apply_flashinfer_allreduce_fusion",
         "(_is_sm90_supported or _is_sm100_supported)", ["sm_90", *S100]),
    ],
    "0.5.17": [
        ("sglang/srt/server_args.py", "ServerArgs._handle_model_specific_adjustments", "is_sm120_supported()",
         ["sm_120", "sm_121"]),
        ("sglang/srt/server_args.py", "ServerArgs._get_default_attn_backend", "is_sm100_supported()", S100),
        ("sglang/srt/server_args.py", "ServerArgs._handle_mxfp8_kv_cache_compatibility",
         "not is_blackwell_supported()", B),
        ("sglang/srt/model_executor/runner/flashinfer_autotune.py", "should_run_flashinfer_autotune",
         "torch.cuda.get_device_capability()[0] < 9", ["sm_90", *B]),
        ("sglang/srt/layers/k3_gemm_ar.py", "_init", "torch.cuda.get_device_capability() < (10, 0)", B),
        ("sglang/srt/layers/attention/flashinfer_backend.py", "FlashInferAttnBackend.__init__",
         "is_sm100_supported()", S100),
        ("sglang/srt/layers/attention/dsa/paged_mqa_logits_backend.py", "DSAPagedMQALogitsBackend.resolve",
         "not is_sm100_supported()", S100),
        ("sglang/srt/layers/attention/linear/kda_backend.py", "KDAAttnBackend._can_run_dspark_cutedsl_mtp",
         "torch.cuda.get_device_capability()[0] != 10", S100),
        ("sglang/srt/layers/flashinfer_comm_fusion.py", "_mnnvl_supported", "is_sm90_supported() and not is_multi_node",
         ["sm_90"]),
        ("sglang/srt/layers/flashinfer_comm_fusion.py", "_resolve_backend",
         "not (is_sm90_supported() or is_sm100_supported())", ["sm_90", *S100]),
        ("sglang/srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py", "<module>", "is_sm100_supported()", S100),
        ("sglang/srt/layers/quantization/fp8_utils.py", "_dispatch_explicit_backend",
         "not (is_sm100_supported() and is_flashinfer_available())", S100),
    ],
    "0.5.23": [
        ("sglang/srt/layers/attention/linear/gdn_backend.py", "flashinfer_gdn_prefill_default",
         "sm_major not in (9, 10)", ["sm_90", *S100]),
        ("sglang/srt/layers/attention/linear/gdn_backend.py", "flashinfer_gdn_prefill_default", "sm_major == 10", S100),
        ("sglang/srt/layers/attention/linear/kernels/gdn_flashinfer.py", "FlashInferGDNKernel.__init__",
         "sm_major in (9, 10)", ["sm_90", *S100]),
        ("sglang/srt/layers/attention/qwen_sparse_attn_backend.py", "_resolve_trtllm_sparse_decode",
         "not (is_sm100_supported() or is_sm120())", [*S100, "sm_120"]),  # SM121 out on purpose
        ("sglang/srt/layers/layer_boundary/residual/add_norm.py", "flashinfer_ar_fusion_applies",
         "(_is_sm90_supported or _is_sm100_supported)", ["sm_90", *S100]),
        ("sglang/srt/layers/flashinfer_comm_fusion.py", "_resolve_backend",
         "not (get_platform().is_sm90 or get_platform().is_sm100)", ["sm_90", *S100]),
        ("sglang/srt/arg_groups/overrides.py", "_dsa_split_backend_resolution",
         "is_glm_sm12_fp8", ["sm_120", "sm_121"]),
        ("sglang/srt/arg_groups/model_override_base.py", "get_default_attn_backend", "get_platform().is_sm100", S100),
        ("sglang/srt/arg_groups/model_overrides/gpt_oss.py", "_gpt_oss_overrides", "get_platform().is_sm100", S100),
        ("sglang/srt/model_executor/runner/flashinfer_autotune.py", "should_run_flashinfer_autotune",
         "torch.cuda.get_device_capability()[0] < 9", ["sm_90", *B]),
    ],
}  # fmt: skip


@pytest.mark.parametrize("version", sorted(HAND))
def test_hand_checked_sites(version: str) -> None:
    m = _map(version)
    missing = []
    for file, function, test, runs_on in HAND[version]:
        hits = [s for s in m.sites if s.file == file and s.function == function and test in " ".join(s.test.split())]
        if not any(s.path == runs_on for s in hits):
            missing.append((file, function, test, runs_on, [(s.test, s.path) for s in hits]))
    assert not missing, missing


def test_hand_checked_predicates_0_5_23() -> None:
    """Read by hand in utils/common.py, runtime_context.py and gdn_cutedsl.py of 0.5.23."""
    preds = {(p.name, p.scope): p.admits for p in _map("0.5.23").predicates}
    assert preds[("is_sm120_supported", "release")] == ["sm_120", "sm_121"]  # majors [12]: SM121 too
    assert preds[("is_sm120", "release")] == ["sm_120"]  # == (12, 0): excludes GB10
    assert preds[("is_sm121", "release")] == ["sm_121"]
    assert preds[("is_sm100_or_sm110_supported", "release")] == ["sm_100", "sm_103", "sm_110"]
    # srt/layers/attention/linear/kernels/gdn_cutedsl.py: `major, _ = get_device_capability(); return major == 10`
    assert preds[("_is_sm10x", "module")] == S100


def test_diff_0_5_22_to_0_5_23() -> None:
    old, new = _map("0.5.22"), _map("0.5.23")
    d = diff_sites(old.sites, new.sites)
    # every site is accounted for exactly once on each side
    assert d.unchanged + len(d.moved) + len(d.changed) + len(d.removed) == len(old.sites)
    assert d.unchanged + len(d.moved) + len(d.changed) + len(d.added) == len(new.sites)
    for mv in d.moved:
        assert mv.old.key == mv.new.key and mv.old.place != mv.new.place
    old_keys = {(s.file, s.function, s.key) for s in old.sites}
    assert all((s.file, s.function, s.key) not in old_keys for s in d.added)
    # read by hand (diff of the two files): dsv4/index_logits.py defines _is_sm100() and gates on it from 0.5.23
    rel = "sglang/kernels/ops/attention/dsv4/index_logits.py"
    assert "_is_sm100" not in (pristine_or_skip("sglang", "0.5.22") / rel).read_text(encoding="utf-8")
    assert any(s.file == rel and "_is_sm100()" in s.test for s in d.added)
    moves = {r["id"]: r for r in recipe_moves(old.recipes, new.recipes)}
    # the recipes tested on both releases keep their sites where they were
    assert moves["sglang-allreduce-fusion-sm120"]["sites"] == "same"
    assert moves["sglang-gdn-prefill-sm120"]["sites"] == "same"
    assert moves["sglang-gdn-prefill-sm120"]["new"] == [
        "sglang/srt/layers/attention/linear/gdn_backend.py:flashinfer_gdn_prefill_default"
    ]
