"""Binary wheels of any PyPI distribution, for a given platform, unpacked once for the census to read.

The census tests and the calibration of patches/fixed_versions.toml (tools/calibrate_versions.py) read the
CUDA code real wheels carry. Each wheel is downloaded once (`pip download --platform --only-binary`) into the
shared cache (`tools/releases.py`'s cache_dir()/pypi), and its CUDA files (plus dist-info, and with `python` its
.py files) are unpacked once into cache_dir()/trees/census-<dist>-<version>-<platform>/, marked complete only
when whole, so parallel runs never read half a tree. Nothing here is ever committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sm120patch.census import scan
from tools.releases import cache_dir


def wheel(dist: str, version: str, platform: str, python_version: str = "3.11") -> Path:
    """The wheel of `dist==version` for `platform` (a pip --platform tag), downloaded on first use; RuntimeError
    when pip cannot get it (no such release, no wheel for that platform, no network)."""
    dl = cache_dir() / "pypi"
    dl.mkdir(parents=True, exist_ok=True)
    stem = dist.replace("-", "_")
    arch = platform.split("_", 1)[1] if platform.startswith("manylinux") else platform
    hits = sorted(p for s in {stem, dist} for p in dl.glob(f"{s}-{version}-*{arch}.whl"))
    if hits:
        return hits[0]
    with tempfile.TemporaryDirectory(dir=dl, prefix=".download.") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--platform", platform, "--python-version", python_version, "-d", tmp, f"{dist}=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        got = sorted(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not got:
            raise RuntimeError(f"could not download {dist}=={version} for {platform}: {r.stderr.strip()[-300:]}")
        os.replace(got[0], dl / got[0].name)
        return dl / got[0].name


def census_site(
    dist: str, version: str, platform: str, keep_wheel: bool = True, python: bool = False, python_version: str = "3.11"
) -> Path:
    """A site-packages holding the wheel's CUDA files and its dist-info (unpacked once); with `python`, its .py
    files too (how the package loads its modules is read from them: census/loading.py). Without `keep_wheel` the
    wheel is deleted once unpacked (the tree is the cache)."""
    dest = cache_dir() / "trees" / f"census-{dist}-{version}-{platform}{'-py' if python else ''}"
    if (dest / ".complete").exists():
        return dest
    whl = wheel(dist, version, platform, python_version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        with zipfile.ZipFile(whl) as z:
            for m in z.infolist():
                if (
                    ".dist-info/" in m.filename
                    or scan.CANDIDATE.search(m.filename)
                    or (python and m.filename.endswith(".py"))
                ):
                    z.extract(m, tmp)
        (tmp / ".complete").touch()
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not keep_wheel:
        whl.unlink(missing_ok=True)
    return dest
