"""What a line's level and a log's end say (issue 32), on hand-written lines: NCCL's INFO lines are chatter (a plugin
it does not find is no broken environment), but an error path NCCL logs at INFO (its shared-memory check) is still
fatal; a log that ends inside a traceback cannot say the architecture was not the cause; and a few wordings read as
what they are (a cuda-gdb fault typed without hyphens, a linker that cannot find libcuda, ptxas quotes turned
typographic by a forum). Each with a counter-case."""

from __future__ import annotations

from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import diagnose

G5090 = "GPU 0: NVIDIA GeForce RTX 5090 (compute capability 12.0)\n"
H100 = "GPU 0: NVIDIA H100 80GB HBM3 (compute capability 9.0)\n"


def _run(log: str):
    return add_advice(diagnose(log.splitlines(keepends=True), [], None), [], None)


def _text(d) -> str:
    return "\n".join([f.next_step for f in d.causes] + [n for f in d.causes for n in f.notes])


def test_nccl_info_chatter_is_not_a_failure() -> None:
    log = (
        "node1:100:200 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.\n"
        "node1:100:200 [0] NCCL INFO Failed to open libibverbs.so[.1]\n"
        "node1:100:200 [0] NCCL INFO Using network Socket\n"
    )
    d = _run(log)
    assert not d.causes and d.exit_code == 0, d.render()


def test_an_nccl_warn_line_still_counts() -> None:
    log = "node1:100:200 [0] enqueue.cc:1500 NCCL WARN Cuda failure 1 'invalid argument'\n"
    d = _run(log)
    assert d.causes and d.causes[0].fatal and d.causes[0].line_no == 1, d.render()


def test_ncclmaxsharedmem_at_info_level_is_fatal_and_names_the_nccl_release() -> None:
    log = (
        G5090
        + "node1:100:200 [0] NCCL INFO NCCL version 2.25.1+cuda12.8\n"
        + "node1:100:201 [0] NCCL INFO ncclMaxSharedMem 90000 exceeds device/fn maxSharedMem 80000\n"
    )
    d = _run(log)
    (f,) = [f for f in d.causes if f.fatal]
    assert f.signature == "nccl-shared-memory-exceeds" and f.cls == "resource-limit", d.render()
    assert f.details.get("library") == "nccl", f.details
    text = _text(d)
    assert "2.26.2" in text and "nvidia-nccl-cu12" in text, text
    # NCCL's own kernels: no tile-size or num_stages knob of a kernel config to turn
    assert "tile size" not in text and "num_stages" not in text, text


def test_a_traceback_cut_off_before_its_exception_line_does_not_deny_sm12x() -> None:
    log = (
        G5090 + "Traceback (most recent call last):\n"
        '  File "/srv/app/server/scheduler.py", line 10, in run\n'
        "    self.capture()\n"
        '  File "/srv/app/server/runner.py", line 20, in capture\n'
        "    self.capture_one(bs)\n"
    )
    d = _run(log)
    f = d.causes[0]
    assert f.sm12x == "maybe" and "before its exception line" in f.check, (f.sm12x, f.check)


def test_a_whole_traceback_on_another_gpu_still_says_no() -> None:
    log = (
        H100 + "Traceback (most recent call last):\n"
        '  File "/srv/app/server/scheduler.py", line 10, in run\n'
        "    self.load()\n"
        "KeyError: 'model.layers.0.weight'\n"
    )
    assert all(f.sm12x == "no" for f in _run(log).causes)


def test_a_fault_typed_without_hyphens_is_a_kernel_fault() -> None:
    log = "CUDA Exception: Warp Out of range Address\nkernel: void some_kernel<128>(float*)\n"
    assert _run(log).causes[0].cls == "kernel-fault"


def test_a_linker_that_cannot_find_a_library_another_needs_is_the_environment() -> None:
    log = "/usr/bin/ld: warning: libcuda.so.1, needed by ../lib/libfoo-cuda.so.1, not found (try using -rpath)\n"
    f = _run(log).causes[0]
    assert f.cls == "environment" and f.sm12x == "no", (f.cls, f.sm12x)


def test_ptxas_quotes_turned_typographic_still_name_the_arch_specific_target() -> None:
    log = (
        "ptxas /tmp/x.ptx, line 9; error : "
        "Instruction \u2018mma with block scale\u2019 not supported on .target \u2018sm_120\u2019\n"
    )
    d = _run(log)
    assert d.causes[0].signature == "ptx-feature-not-on-sm12x", d.render()
    assert "120a" in _text(d) and "GGML_NATIVE=OFF" in _text(d)


def test_a_cublas_refusal_names_the_first_cublas_for_blackwell() -> None:
    log = G5090 + "RuntimeError: cuBLAS failed with status CUBLAS_STATUS_NOT_SUPPORTED\n"
    text = _text(_run(log))
    assert "CUDA 12.8" in text and "nvidia-cublas-cu12" in text, text
