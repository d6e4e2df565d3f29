"""Real FlashInfer releases from PyPI, downloaded once into a cache outside the repo.

Wheels and unpacked trees come from tools/releases.py (one cache for tests, demo and bench);
this adds what only the probe tests need: FlashInfer beside flashinfer-cubin, and one venv
(CPU torch 2.13.0 + flashinfer-python 0.6.1) for the spec rung. A download that fails fails
the test in CI and skips it elsewhere (`tests.conftest.unavailable`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import pristine_or_skip, unavailable
from tools import releases

# What `import flashinfer.jit.comm` needs besides torch (0.6.1 .. 0.7.4, checked by hand):
SPEC_VENV_DEPS = ("apache-tvm-ffi", "packaging", "nvidia-ml-py", "requests", "tqdm", "numpy")
SPEC_TORCH = "torch==2.13.0"  # the CPU wheel this machine keeps on disk
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


def spec_venv() -> Path:
    """A venv's python with CPU torch and flashinfer-python 0.6.1 (--no-deps), built once."""
    venv = cache_root() / "venvs" / f"spec-fi{SPEC_FI}-torch2.13.0-py{sys.version_info[0]}{sys.version_info[1]}"
    py = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        return py
    fi_whl = wheel("flashinfer-python", SPEC_FI)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    for args in ([SPEC_TORCH, *SPEC_VENV_DEPS], ["--no-deps", str(fi_whl)]):
        p = subprocess.run([str(py), "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=1200)
        if p.returncode != 0:
            unavailable(f"cannot build the spec venv ({' '.join(args)}): {p.stderr.strip()[-400:]}")
    v = subprocess.run(
        [str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, timeout=300
    ).stdout.strip()
    if not v.startswith("2.13.0"):
        pytest.fail(f"spec venv got torch {v!r}, not the CPU 2.13.0 wheel")
    (venv / ".ready").write_text(v + "\n")
    return py
