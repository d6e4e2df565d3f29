"""Fetch real SGLang/FlashInfer releases from PyPI into a cache, for tests, demo and benchmarks.

Nothing fetched here is ever committed: the cache lives outside the repo
(`$SM120PATCH_CACHE`, default ~/.cache/sm120patch). Each release is downloaded
once (`pip download --no-deps`), unpacked once into a read-only pristine tree,
and handed out as cheap copies: hard links, safe because sm120patch always
writes by replacing a file, never in place.

    python tools/releases.py sglang 0.5.9 --layout git DEST
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.version import Version

SGLANG_RELEASES = [f"0.5.{n}" for n in range(5, 24)]
# The flashinfer-python each SGLang release pins exactly (`flashinfer_python==` in its wheel's METADATA)
FLASHINFER_PINS = {
    "0.5.5": "0.5.0",
    "0.5.6": "0.5.3",
    "0.5.7": "0.5.3",
    "0.5.8": "0.6.1",
    "0.5.9": "0.6.3",
    "0.5.10": "0.6.7.post2",
    "0.5.11": "0.6.8.post1",
    "0.5.12": "0.6.11.post1",
    "0.5.13": "0.6.12",
    "0.5.14": "0.6.12",
    "0.5.15": "0.6.12",
    "0.5.16": "0.6.14",
    "0.5.17": "0.6.15.post1",
    "0.5.18": "0.6.17",
    "0.5.19": "0.6.18",
    "0.5.20": "0.6.18",
    "0.5.21": "0.6.18",
    "0.5.22": "0.7.1",
    "0.5.23": "0.7.2",
}
# What tests and docs cover: every pinned FlashInfer, the last one before upstream's SM12x fix, the newest
FLASHINFER_RELEASES = sorted({*FLASHINFER_PINS.values(), "0.6.16", "0.7.4"}, key=Version)
DIST = {"sglang": "sglang", "flashinfer": "flashinfer-python"}
# PyPI distribution names that are one of our packages (so a tree is unpacked once)
PACKAGE_OF = {"flashinfer-python": "flashinfer"}


def cache_dir() -> Path:
    return Path(os.environ.get("SM120PATCH_CACHE", Path.home() / ".cache" / "sm120patch"))


def wheel(package: str, version: str) -> Path:
    """The release's wheel, downloaded from PyPI on first use (into a private folder, then
    moved into the cache, so a parallel run never reads a wheel that is still arriving)."""
    dist = DIST.get(package, package)
    dl = cache_dir() / "pypi"
    dl.mkdir(parents=True, exist_ok=True)
    prefix = dist.replace("-", "_")
    patterns = (f"{prefix}-{version}-*.whl", f"{dist}-{version}-*.whl")

    def cached() -> Path | None:
        hits = sorted(h for pat in patterns for h in dl.glob(pat))
        return hits[0] if hits else None

    if hit := cached():
        return hit
    with tempfile.TemporaryDirectory(dir=dl, prefix=".download.") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
        cmd += ["--disable-pip-version-check", "-d", tmp, f"{dist}=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        got = sorted(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not got:
            raise RuntimeError(f"could not download {dist}=={version} from PyPI: {r.stderr.strip()[-400:]}")
        os.replace(got[0], dl / got[0].name)
    hit = cached()
    assert hit is not None
    return hit


def pristine(package: str, version: str) -> Path:
    """An unpacked wheel tree (holding `<package>/` and its dist-info); do not modify.

    Unpacked into a private temporary folder and renamed into place, so two processes
    (parallel test runs) that ask for the same release at once never see half a tree."""
    package = PACKAGE_OF.get(package, package)
    dest = cache_dir() / "trees" / f"{package}-{version}"
    if (dest / ".complete").exists():
        return dest
    whl = wheel(package, version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        with zipfile.ZipFile(whl) as z:
            z.extractall(tmp)
        (tmp / ".complete").touch()
        if dest.exists() and not (dest / ".complete").exists():
            shutil.rmtree(dest, ignore_errors=True)  # what a killed run of the old layout left
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / ".complete").exists():  # lost the race to a run that failed: give up loudly
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def copy_tree(package: str, version: str, dest: Path, layout: str = "wheel") -> Path:
    """A private copy of a release: `wheel` (dest/sglang/...) or `git` (dest/python/sglang/..., committed)."""
    src = pristine(package, version)
    pkg_root = dest / "python" if layout == "git" and package == "sglang" else dest
    pkg_root.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name == ".complete" or (layout == "git" and item.name.endswith(".dist-info")):
            continue
        target = pkg_root / item.name
        if item.is_dir():
            shutil.copytree(item, target, copy_function=os.link)
        else:
            os.link(item, target)
    if layout == "git":
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        for cmd in (
            ["git", "init", "-q", "-b", "main"],
            ["git", "add", "-A"],
            ["git", "commit", "-q", "-m", f"{package} {version}"],
            ["git", "tag", f"v{version}"],
        ):
            subprocess.run(cmd, cwd=dest, check=True, env=env, capture_output=True)
    return dest


def differences(package: str, version: str, tree: Path) -> list[str]:
    """Files of `tree` that differ from the release, are missing or extra (journal folders aside)."""
    import hashlib

    def files(root: Path) -> dict[str, str]:
        out = {}
        for p in root.rglob("*"):
            rel = p.relative_to(root)
            if p.is_file() and rel.parts[0] not in (".complete", ".sm120patch", ".git"):
                out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
        return out

    want, have = files(pristine(package, version)), files(tree)
    return sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", choices=sorted(DIST))
    ap.add_argument("version")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--layout", choices=["wheel", "git"], default="wheel")
    ap.add_argument("--same", action="store_true", help="check DEST is byte-identical to the release (wheel layout)")
    a = ap.parse_args()
    if a.same:
        diff = differences(a.package, a.version, a.dest)
        if diff:
            sys.exit(f"{a.dest}: differs from {a.package} {a.version} in {len(diff)} files: {', '.join(diff[:5])}")
        print(f"pristine: {a.dest} is byte-identical to {a.package} {a.version}")
        return
    if a.dest.exists():
        sys.exit(f"{a.dest}: already exists; remove it or pick another folder")
    print(copy_tree(a.package, a.version, a.dest, a.layout))


if __name__ == "__main__":
    main()
