"""The keyword prefilter never changes an answer: diagnose with and without it agree on every
corpus excerpt and on one real line per signature (the prefilter only skips work)."""

from __future__ import annotations

import pytest

from sm120patch.catalogue.recipes import load_recipes
from sm120patch.triage.diagnose import diagnose
from sm120patch.triage.prefilter import Prefilter
from tests.unit.test_diagnose import JIT_CRASH, REAL_LINES
from tools.triage_score import load_corpus

CASES = load_corpus()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_same_answer_with_and_without_the_prefilter(case) -> None:  # noqa: ANN001
    lines = case.excerpt.splitlines(keepends=True)
    fast = diagnose(lines, [], None).to_dict()
    full = diagnose(lines, [], None, prefilter=False).to_dict()
    assert fast == full


def test_every_real_signature_line_passes() -> None:
    p = Prefilter()
    missed = [sid for sid, line in REAL_LINES.items() if not p.passes(line)]
    assert missed == []


def test_recipe_signatures_pass_and_the_seed_crash_is_named_the_same() -> None:
    recipes = load_recipes()
    p = Prefilter(s for r in recipes for s in r.crash_signatures)
    assert all(p.passes(f"x {s} y") for r in recipes for s in r.crash_signatures)
    fast = diagnose(JIT_CRASH, recipes, None).to_dict()
    assert fast == diagnose(JIT_CRASH, recipes, None, prefilter=False).to_dict()


def test_decode_progress_lines_are_skipped() -> None:
    p = Prefilter()
    # the steady-state lines that make up most of a long server log (SGLang, vLLM)
    assert not p.passes(
        "[2026-01-02 10:00:00 TP0] Decode batch. #running-req: 8, #token: 4096, token usage: 0.02, "
        "cuda graph: True, gen throughput (token/s): 512.30, #queue-req: 0"
    )
    assert not p.passes(
        "INFO 01-02 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
        "throughput: 50.1 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%"
    )
    assert p.passes("RuntimeError: something new")


def test_trie_pattern_matches_exactly_the_words() -> None:
    import re

    from sm120patch.triage.prefilter import trie_pattern

    r = re.compile(trie_pattern(["sm_", "sm1", "error", "err", "fail"]))
    for text in ("sm_120", "xsm1x", "an error", "err", "failed"):
        assert r.search(text), text
    for text in ("sm2", "er", "fai", "smx"):
        assert not r.search(text), text


def test_every_library_the_classifier_names_passes_the_prefilter() -> None:
    from sm120patch.triage.classes import _LIBRARIES, LIBRARY_WORDS

    p = Prefilter(LIBRARY_WORDS)
    samples = {
        "flashinfer": "at flashinfer::x", "sgl_kernel": "sgl_kernel.ops", "deep_gemm": "deep_gemm.jit",
        "flash_mla": "flash_mla fwd", "vllm._C": "vllm/_C.abi3.so", "cutlass": "cutlass::gemm",
        "tensorrt_llm": "tensorrt_llm.runtime", "tensorrt": "tensorrt.Builder", "xformers": "xformers.ops",
        "flash_attn": "flash_attn_2_cuda", "bitsandbytes": "bitsandbytes.functional", "triton": "triton.language",
        "llama.cpp/ggml": "ggml_cuda_op", "transformer_engine": "transformer_engine.pytorch",
        "mamba_ssm": "mamba_ssm.ops", "onnxruntime": "onnxruntime.capi", "jax": "jaxlib.xla_client",
        "tensorflow": "tensorflow.python", "vllm": "vllm.engine", "sglang": "sglang.srt", "torch": "torch.nn",
        "fbgemm": "fbgemm_gpu.ops", "nunchaku": "nunchaku.models", "sageattention": "sageattention/core.py",
        "deep_ep": "deep_ep.buffer", "torchao": "torchao.float8", "liger_kernel": "liger_kernel.ops",
        "quantization kernels": "exllamav2_ext", "fla": "fla/ops/gla", "cupy": "cupy_backends.cuda",
        "apex": "apex/normalization", "tiny-cuda-nn": "tinycudann.modules", "gsplat": "gsplat/cuda",
        "nvdiffrast": "nvdiffrast.torch", "quack": "quack/cute_dsl_utils.py",
        "a compiled extension": "site-packages/foo_kernels/_ops.py", "CUDA.jl": "@ CUDA ~/.julia/packages/CUDA/x/lib",
        "ctranslate2": "ctranslate2/models/whisper.py", "paddle": "paddle/phi/kernels/gpu/matmul_kernel.cu",
        "lmdeploy": "lmdeploy/turbomind/turbomind.py", "ktransformers": "ktransformers/operators/experts.py",
        "numba": "numba.cuda.cudadrv.driver", "tvm": "tvm/runtime/module.py", "mlc_llm": "mlc_llm/serve/engine.py",
        "taichi": "taichi/lang/misc.py", "mxnet": "mxnet/base.py", "mindspore": "mindspore/common/api.py",
        "jittor": "jittor/compiler.py", "llama_cpp": "llama_cpp/llama.py",
        "CUDA math libraries": "cublasLtMatmul failed", "nccl": "ncclCommInitRank failed",
        "CuTe DSL": "cutlass.cute.nvgpu.cpasync", "tilelang": "tilelang/jit/kernel.py",
    }  # fmt: skip
    assert set(samples) == {name for name, _ in _LIBRARIES}
    for name, pattern in _LIBRARIES:
        assert pattern.search(samples[name]) and p.passes(samples[name]), name
