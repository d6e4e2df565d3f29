"""Every `run` block of README.md and docs/*.md, run as written (docs/doctest.md).

Each block runs in bash with `set -e -o pipefail`, in a fresh folder, with this venv's
`sm120patch` first on PATH and HOME holding the trees its setup names: real releases from the
cache (SGLang 0.5.9 as a clone's layout, the FlashInfer it pins, 0.6.3, and both as one
site-packages), copied per block so no block sees another's writes. Its exit code (each
command's, with `each`) and the lines of the `output` block that follows it are checked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docblocks
from tests.conftest import fetch_or_skip, pristine_or_skip, unavailable
from tools import releases

pytestmark = pytest.mark.releases

SGLANG, FLASHINFER = "0.5.9", "0.6.3"  # the demo's pair: SGLang 0.5.9 and the FlashInfer it pins
RUN = [b for b in docblocks.all_blocks() if b.marker and b.marker.kind == "run"]
BIN = Path(sys.executable).parent


def _param(b: docblocks.Block):  # noqa: ANN202
    return pytest.param(b, id=b.where, marks=[pytest.mark.slow] if b.marker and b.marker.slow else [])


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What every block may share: the pristine releases (read-only) and one cache folder, so the
    probe and plan caches warm up across blocks as they would on a user's box."""
    if not (BIN / "sm120patch").is_file():
        unavailable(f"{BIN}/sm120patch: no sm120patch in this venv; run `make venv`")
    pristine_or_skip("sglang", SGLANG)
    pristine_or_skip("flashinfer", FLASHINFER)
    return {"cache": tmp_path_factory.mktemp("doc-xdg-cache")}


def _site(dest: Path) -> Path:
    """SGLang and its FlashInfer in one folder, as pip leaves them in site-packages."""
    fetch_or_skip("sglang", SGLANG, dest)
    fi = fetch_or_skip("flashinfer", FLASHINFER, dest.parent / f".{dest.name}-fi")
    for entry in fi.iterdir():
        entry.rename(dest / entry.name)
    fi.rmdir()
    return dest


@pytest.fixture(scope="session")
def bundle(shared: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export of the pair for sm_120, made once and copied into each block that needs it."""
    work = tmp_path_factory.mktemp("doc-bundle")
    site = _site(work / "site")
    r = subprocess.run(
        [str(BIN / "sm120patch"), "export", str(site), "--arch", "sm_120", "-o", str(work / "bundle")],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(work, shared["cache"], {}),
    )
    assert r.returncode in (0, 1) and (work / "bundle" / "series").is_file(), r.stdout + r.stderr
    return work / "bundle"


def _env(home: Path, cache: Path, extra: dict[str, str]) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("LANG", "LC_ALL", "TMPDIR", "SM120PATCH_CHECK_SPLICE") if k in os.environ}
    return {
        **keep,
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(cache),
        "SM120PATCH_CACHE": str(releases.cache_dir()),
        "GIT_CONFIG_NOSYSTEM": "1",
        **extra,
    }


def _setup(name: str, tmp: Path, request: pytest.FixtureRequest) -> tuple[Path, dict[str, str]]:
    """(the folder the block runs in, the variables its setup provides); HOME is `tmp/home`."""
    home = tmp / "home"
    home.mkdir()
    cwd = home / "work"
    extra: dict[str, str] = {}
    if name in ("home", "bundle"):
        src = home / "src"
        extra["SGLANG"] = str(fetch_or_skip("sglang", SGLANG, src / "sglang", layout="git"))
        extra["FLASHINFER"] = str(fetch_or_skip("flashinfer", FLASHINFER, src / "flashinfer"))
        extra["SITE"] = str(_site(home / "site"))
    if name == "bundle":
        made = request.getfixturevalue("bundle")
        extra["BUNDLE"] = str(shutil.copytree(made, home / "bundle"))
    if name == "repo":
        files = subprocess.run(
            ["git", "-C", str(docblocks.REPO), "ls-files", "-z"], capture_output=True, text=True, timeout=60
        ).stdout.split("\0")
        cwd = home / "sm120patch"
        for rel in filter(None, files):
            src_f = docblocks.REPO / rel
            if src_f.is_file():
                (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src_f, cwd / rel)  # mtimes kept: make sees the venv as up to date
        (cwd / ".venv").symlink_to(BIN.parent)
    cwd.mkdir(exist_ok=True)
    return cwd, extra


def _bash(script: str, cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", "set -e -o pipefail\n" + script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("block", [_param(b) for b in RUN])
def test_doc_block_runs_as_written(
    block: docblocks.Block, shared: dict[str, Path], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    mk = block.marker
    assert mk is not None
    cwd, extra = _setup(mk.setup, tmp_path, request)
    env = _env(tmp_path / "home", shared["cache"], extra)
    commands = block.commands() if mk.each else [block.body]
    exits = mk.exits * len(commands) if len(mk.exits) == 1 else mk.exits
    transcript = []
    for cmd, want in zip(commands, exits, strict=True):
        r = _bash(cmd, cwd, env, mk.timeout)
        transcript.append(f"$ {cmd.strip()}\n{r.stdout}[exit {r.returncode}]")
        assert r.returncode == want, (
            f"{block.where}: exit {r.returncode}, the doc says {want}:\n" + "\n".join(transcript)[-6000:]
        )
    out = "\n".join(transcript)
    missing = [line for line in block.output if not docblocks.shows(out, line)]
    assert not missing, f"{block.where}: the doc shows lines the run did not print: {missing}\n{out[-6000:]}"


def test_file_names_in_the_docs_exist_here_or_upstream() -> None:
    """A bare `name.py` in the prose is a file of this repository or of the SGLang and FlashInfer
    releases the docs talk about: a module renamed or split (cli.py -> cli/) must not linger."""
    names = {p.name for p in docblocks.REPO.rglob("*.py") if ".venv" not in p.parts}
    # the releases the docs speak of: the demo pair, and 0.5.23 with the FlashInfer it pins (docs/gates.md's map)
    for package, version in (
        ("sglang", "0.5.9"),
        ("sglang", "0.5.23"),
        ("flashinfer", FLASHINFER),
        ("flashinfer", "0.7.2"),
    ):
        for _, _, files in os.walk(pristine_or_skip(package, version)):
            names.update(files)
    bad = {}
    for doc in docblocks.docs():
        prose = docblocks.prose(doc)
        gone = sorted({n for n in re.findall(r"(?<![\w/.-])([\w-]+\.py)\b", prose) if n not in names})
        if gone:
            bad[docblocks.rel(doc)] = gone
    assert not bad, f"the docs name .py files that exist neither here nor upstream: {bad}"
