"""Next steps read from the evidence a finding's lines show, beyond its class's general advice: the CUDA major a
missing runtime library names (the wheel index that fits), Triton's knobs for a shared-memory limit, the
interface variable for a Gloo/NCCL socket failure. Each is added as a note only when the log shows its cue."""

from __future__ import annotations

import re
from collections.abc import Callable

from sm120patch.triage.diagnose import Diagnosis, Finding

_CUDA_LIB = re.compile(
    r"\blib(?:cudart|cublas\w*|cusparse\w*|cufft\w*|nvrtc\w*|cudnn\w*|nccl)\.so\.(?P<major>1[2-9])\b"
)
_TORCH_INDEX = {"12": "cu128", "13": "cu130"}
_SMEM = re.compile(r"(?i)out of resource: shared memory|shared memory.{0,40}(?:exceed|limit)|num_stages")
_SOCKET = re.compile(
    r"(?i)\bgloo\b.{0,80}(?:connect|socket|interface|address|timed out)|socket.{0,20}interface|"
    r"\bbootstrap\b.{0,60}(?:socket|connect)|GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME"
)


def _cuda_runtime(text: str, f: Finding) -> str | None:
    m = _CUDA_LIB.search(text)
    if m is None or not re.search(r"(?i)cannot open shared object|not found|no such file|undefined symbol", text):
        return None
    major = m.group("major")
    other = "13" if major == "12" else "12"
    index = _TORCH_INDEX.get(major, f"cu{major}x")
    return (
        f"{m.group(0)} is CUDA {major}'s runtime: a wheel built for CUDA {major} meets an environment without it "
        f"(a CUDA {other} torch?). Check `python -c 'import torch; print(torch.version.cuda)'`, then install the "
        f"package's build for that CUDA (torch itself: https://download.pytorch.org/whl/{index} for CUDA {major}, "
        f"https://download.pytorch.org/whl/{_TORCH_INDEX.get(other, 'cu130')} for CUDA {other})"
    )


def _triton_smem(text: str, f: Finding) -> str | None:
    if f.cls != "resource-limit" or not _SMEM.search(text) or "triton" not in text.lower():
        return None
    return (
        "a Triton kernel's config asks for more shared memory than this GPU has per block (the limit the log "
        "gives): lower its num_stages (e.g. 2) or its BLOCK_M/BLOCK_N/BLOCK_K, in the kernel's config or autotune list"
    )


def _socket(text: str, f: Finding) -> str | None:
    if f.cls != "communication" or not _SOCKET.search(text):
        return None
    return (
        "the ranks reach each other over a socket on the wrong interface: set GLOO_SOCKET_IFNAME and "
        "NCCL_SOCKET_IFNAME to the one that connects them (e.g. eth0; `ip -br addr` lists them)"
    )


RULES: tuple[Callable[[str, Finding], str | None], ...] = (_cuda_runtime, _triton_smem, _socket)


def add_evidence_advice(result: Diagnosis) -> None:
    """A note per rule whose cue the finding's line, its details or the fatal lines near it show."""
    around = [e.line for e in result.unnamed_errors]
    for f in result.causes:
        text = " ".join([f.line, *f.details.values(), *around])
        for rule in RULES:
            note = rule(text, f)
            if note and note not in f.notes:
                f.notes.append(note)
