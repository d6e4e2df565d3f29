"""Real FlashInfer releases from PyPI, downloaded once into a cache outside the repo.

Wheels and unpacked trees come from tools/releases.py (one cache for tests, demo and bench);
this adds what only the probe tests need: FlashInfer beside flashinfer-cubin, and one venv
(torch 2.13.0 + flashinfer-python 0.6.1, other dependencies pinned) for the spec rung. Its torch is
the CPU wheel where a local wheel folder (pip's find-links) holds one, else what the index gives
(the CUDA build, from PyPI); the choice is in the venv's name and `.ready`, and a test that needs
the CPU build calls `requires_cpu_torch()`. A download that fails fails
the test in CI and skips it elsewhere (`tests.conftest.unavailable`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import pristine_or_skip, requires, unavailable
from tools import releases

# What `import flashinfer.jit.comm` needs besides torch (0.6.1 .. 0.7.4, checked by hand), pinned with
# what it pulls in, so two machines build the same venv (the versions that venv was first built with).
SPEC_VENV_DEPS = (
    "apache-tvm-ffi==0.1.15.post2",
    "packaging==26.4",
    "nvidia-ml-py==13.615.71",
    "requests==2.34.2",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "idna==3.20",
    "urllib3==2.8.0",
    "tqdm==4.70.1",
    "numpy==2.4.6; python_version >= '3.11'",
    "numpy==2.2.6; python_version < '3.11'",
)
SPEC_TORCH_VERSION = "2.13.0"
SPEC_FI = "0.6.1"


def cache_root() -> Path:
    return releases.cache_dir() / "pypi"


def wheel(dist: str, version: str) -> Path:
    try:
        return releases.wheel(dist, version)
    except RuntimeError as e:
        unavailable(str(e))


def unpacked(dist: str, version: str) -> Path:
    """The wheel's contents (a site-packages-like folder), unpacked once, shared read-only."""
    return pristine_or_skip(dist, version)


def site_with_cubin(fi_version: str, cubin_version: str) -> Path:
    """flashinfer and flashinfer_cubin side by side, as pip would install them."""
    site = cache_root() / "sites" / f"fi{fi_version}-cubin{cubin_version}"
    fi, cub = unpacked("flashinfer-python", fi_version), unpacked("flashinfer-cubin", cubin_version)
    site.mkdir(parents=True, exist_ok=True)
    for name, src in (("flashinfer", fi / "flashinfer"), ("flashinfer_cubin", cub / "flashinfer_cubin")):
        if not (site / name).exists():
            (site / name).symlink_to(src, target_is_directory=True)
    return site


def find_links() -> list[Path]:
    """The local wheel folders pip is told about (`PIP_FIND_LINKS`, `pip config`'s find-links)."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    p = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120)
    for line in p.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            values += value.strip().strip("'\"").split()
    out = []
    for v in values:
        d = Path(v.removeprefix("file://"))
        if d.is_dir() and d not in out:
            out.append(d)
    return out


def local_cpu_torch() -> Path | None:
    """A CPU torch wheel of SPEC_TORCH_VERSION for this Python, in a local wheel folder."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    for d in find_links():
        found = sorted(d.glob(f"torch-{SPEC_TORCH_VERSION}+cpu-{tag}-{tag}-*.whl"))
        if found:
            return found[-1]
    return None


def spec_torch_choice() -> tuple[str, str]:
    """(what to pip install, where it comes from): the on-disk CPU wheel where a local wheel folder
    holds one (PyTorch's CPU index is not reachable from every machine); else `torch==VERSION` from the
    configured index, which on Linux x86_64 PyPI is the CUDA build (several GB). Recorded in `.ready`."""
    whl = local_cpu_torch()
    if whl is not None:
        return str(whl), "cpu-local"
    return f"torch=={SPEC_TORCH_VERSION}", "index"


def spec_venv() -> Path:
    """A venv's python with torch SPEC_TORCH_VERSION and flashinfer-python 0.6.1 (--no-deps), built once.

    Which torch it got is in `<venv>/.ready` (JSON: version, source, cpu); `spec_torch()` reads it
    and `requires_cpu_torch()` skips, saying why, a test that needs the CPU build."""
    install, source = spec_torch_choice()
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    venv = cache_root() / "venvs" / f"spec-fi{SPEC_FI}-torch{SPEC_TORCH_VERSION}-{source}-{tag}"
    py = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        return py
    fi_whl = wheel("flashinfer-python", SPEC_FI)
    # built under a private name, then renamed: a parallel run never sees a half-built venv
    work = venv.with_name(f"{venv.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(work)], check=True, timeout=300)
    wpy = work / "bin" / "python"
    for args in ([install, *SPEC_VENV_DEPS], ["--no-deps", str(fi_whl)]):
        cmd = [str(wpy), "-m", "pip", "install", "-q", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        if p.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            unavailable(f"cannot build the spec venv ({' '.join(args)}): {p.stderr.strip()[-400:]}")
    v = subprocess.run(
        [str(wpy), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()
    version, cuda = (v + ["", ""])[:2]
    cpu = cuda == "None"
    if not version.startswith(SPEC_TORCH_VERSION) or (source == "cpu-local" and not cpu):
        shutil.rmtree(work, ignore_errors=True)
        pytest.fail(f"spec venv got torch {version!r} (CUDA {cuda}) from {install}, not {SPEC_TORCH_VERSION}")
    record = {"version": version, "cpu": cpu, "source": install, "cuda": None if cpu else cuda}
    (work / ".ready").write_text(json.dumps(record) + "\n")
    try:
        work.rename(venv)
    except OSError:  # another run finished first: use its venv
        shutil.rmtree(work, ignore_errors=True)
    return py


def spec_torch() -> dict:
    """What torch the spec venv holds: {"version", "cpu", "source", "cuda"}."""
    return json.loads((spec_venv().parent.parent / ".ready").read_text())


def requires_cpu_torch() -> dict:
    """Skip, saying why, where the spec venv's torch is not a CPU build (no local CPU wheel here)."""
    t = spec_torch()
    requires(
        t["cpu"],
        f"needs a CPU torch {SPEC_TORCH_VERSION}; the spec venv has {t['version']} from {t['source']} "
        f"(put torch-{SPEC_TORCH_VERSION}+cpu-cpXY-*.whl in a pip find-links folder)",
    )
    return t
