"""Hostile input to the census (issue 35: 3, 4, 5 and the minors): a site-packages whose RECORD
names a FIFO, a zero-filled or sparse `.nv_fatbin`, a census cache entry of the right shape and
bad content, RECORD entries that leave the site, one file that takes long. Each ends in an
answer (never a hang, a traceback or an exit 3) that says what was not read, and why.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sm120patch import census
from sm120patch.arch import Arch
from sm120patch.census import render, scan
from sm120patch.hashing import sha256_text
from sm120patch.probes.environment.elf import read_file_code
from tests.reliability.conftest import REPO_ROOT, count
from tests.unit.fi_fakes import elf64_header, fatbin, host_so

SM120 = Arch(12, 0)


def _site(root: Path, files: dict[str, bytes | None], dist: str = "evil", record: list[str] | None = None) -> Path:
    """A site-packages with one distribution: `files` (rel -> bytes; None: a FIFO), in its RECORD
    (or `record`'s lines)."""
    site = root / "site"
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    for rel, data in files.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            os.mkfifo(p)
        else:
            p.write_bytes(data)
    lines = record if record is not None else [f"{rel},," for rel in files]
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return site


def _child_census(site: Path, cache: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The census in a child, so a hang is a failed test, not a stuck suite."""
    code = (
        "import json, sys; from pathlib import Path; from sm120patch import census; from sm120patch.arch import Arch; "
        "r = census.census([Path(sys.argv[1])], [Arch(12, 0)], cache_root=Path(sys.argv[2]), env={}); "
        "print(json.dumps(r))"
    )
    try:
        return subprocess.run(
            [sys.executable, "-c", code, str(site), str(cache)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the census of {site} did not finish in {timeout} s")


def test_a_fifo_in_a_record_is_skipped_with_a_note(tmp_path: Path) -> None:
    good = host_so(fatbin([(2, 120, 0)]))
    site = _site(tmp_path, {"evil/pipe.so": None, "evil/good.so": good})
    r = _child_census(site, tmp_path / "cache")
    count("census_cases")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    (row,) = report["distributions"]
    assert row["unreadable"] == [{"path": "evil/pipe.so", "error": "a FIFO, not a regular file: not read"}]
    assert row["gpus"]["sm_120"]["modules"]["evil/good.so"]["status"] == "ok"
    text = "\n".join(render.render_lines(report))
    assert "evil/pipe.so could not be read (a FIFO, not a regular file: not read)" in text
    # the CLI, as a user runs it: one answer, exit 0, no hang
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "sm120patch", "census", "--site-packages", str(site), "--arch", "sm_120", "--no-torch"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "evil/pipe.so could not be read (a FIFO" in p.stdout


def _zero_fatbin_so(path: Path, zeros: int) -> None:
    """A host .so whose `.nv_fatbin` is one real container followed by `zeros` zero bytes,
    written sparsely (a hole, no data blocks), then the section names and table."""
    real = fatbin([(2, 90, 0)])
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(real) + zeros
    shoff = (names_off + len(names) + 7) // 8 * 8

    def sh(name: int, typ: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, 1, 0)

    table = sh(0, 0, 0, 0) + sh(1, 3, names_off, len(names)) + sh(11, 1, data_off, len(real) + zeros)
    with open(path, "wb") as f:
        f.write(elf64_header(62, 0, 0, shoff=shoff, shnum=3, shstrndx=1) + real)
        f.seek(names_off)
        f.write(names)
        f.seek(shoff)
        f.write(table)


def _rchar() -> int:
    lines = Path("/proc/self/io").read_text().splitlines()
    return int(next(ln for ln in lines if ln.startswith("rchar")).split()[1])


@pytest.mark.parametrize("zeros", [64 << 20, 16 << 30])
def test_a_zero_filled_fatbin_is_read_within_bounds_and_said_cut_short(tmp_path: Path, zeros: int) -> None:
    """The reader once stepped 8 bytes at a time over the zeros (3 s per 64 MB; a sparse 16 GB
    file, minutes). Now the work is bounded by what a real fatbin has: counted here in bytes
    read (the kernel's rchar), not in time."""
    if not Path("/proc/self/io").exists():
        pytest.skip("/proc/self/io (Linux) counts the bytes read")
    path = tmp_path / "zeros.so"
    _zero_fatbin_so(path, zeros)
    before = _rchar()
    code = read_file_code(path)
    spent = _rchar() - before
    count("census_cases")
    assert [e.name for e in code.entries] == ["sm_90"], code
    assert spent < 4 << 20, f"read {spent} bytes of a file with {zeros} zero bytes of fatbin"
    assert "cut short" in code.note and "zero bytes" in code.note, code.note
    site = tmp_path / "site"
    (site / "evil").mkdir(parents=True)
    os.replace(path, site / "evil" / "zeros.so")
    (site / "evil-1.0.dist-info").mkdir()
    (site / "evil-1.0.dist-info" / "RECORD").write_text("evil/zeros.so,,\n")
    report = census.census([site], [Arch(9, 0)], cache_root=tmp_path / "c", env={})
    (row,) = report["distributions"]
    assert row["cut_short"] and row["gpus"]["sm_90"]["status"] == "ok"
    assert "evil/zeros.so: fatbin cut short at offset" in "\n".join(render.render_lines(report))


def test_a_cache_entry_of_the_right_shape_and_bad_content_is_dropped_and_read_again(tmp_path: Path) -> None:
    site = _site(tmp_path, {"evil/a.so": host_so(fatbin([(2, 120, 0)])), "evil/b.so": host_so(fatbin([(1, 90, 0)]))})
    cache = tmp_path / "cache"
    first = census.census([site], [SM120], cache_root=cache, env={})
    path = cache / f"{sha256_text(str(site))[:24]}.json"
    data = json.loads(path.read_text())
    bad_contents = [
        {"groups": [[["sass:not-a-code"], 1]]},  # what once made `census` exit 3 (ValueError)
        {"groups": [[["gpu:sm_120"], 1]]},
        {"groups": [[[], 1]]},
        {"groups": [[["sass:sm_120"], -4]]},
        {"groups": [[["sass:sm_120"], "2"]]},
        {"groups": [[["sass:sm_120"], 1, 9]]},
        {"kind": 7},
        {"error": None},
    ]
    for bad in bad_contents:
        for entry in data["files"].values():
            entry[3] = {**entry[3], **bad}
        path.write_text(json.dumps(data))
        again = census.census([site], [SM120], cache_root=cache, env={})
        count("census_cases")
        assert again["files_read"] == 2, bad
        assert again["distributions"] == first["distributions"], bad
        data = json.loads(path.read_text())  # what the re-read wrote back
    # the same through the CLI, whose cache (under XDG_CACHE_HOME) holds that entry: an answer
    xdg = tmp_path / "xdg"
    cli_cache = xdg / "sm120patch" / "probes" / "census" / path.name
    cli_cache.parent.mkdir(parents=True)
    for entry in data["files"].values():
        entry[3]["groups"] = [[["sass:not-a-code"], 1]]
    cli_cache.write_text(json.dumps(data))
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg), "HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "sm120patch", "census", "--site-packages", str(site), "--arch", "sm_120"]
    p = subprocess.run([*cmd, "--no-torch", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and "internal error" not in p.stderr, p.stderr
    got = json.loads(p.stdout)["census"]
    assert got["files_read"] == 2 and got["distributions"] == first["distributions"]


def test_record_entries_outside_the_site_are_not_read(tmp_path: Path) -> None:
    """RECORD names an absolute path and `../..` ones: a census of one site reads that site."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.so").write_bytes(host_so(fatbin([(2, 80, 0)])))
    site_root = tmp_path / "deep" / "lib"
    lines = [f"{outside / 'x.so'},,", "../../../outside/x.so,,", "evil/../../../../outside/x.so,,", "evil/in.so,,"]
    site = _site(site_root, {"evil/in.so": host_so(fatbin([(2, 120, 0)]))}, record=lines)
    report = census.census([site], [SM120], cache_root=tmp_path / "c", env={})
    count("census_cases")
    (row,) = report["distributions"]
    assert row["modules"] == ["evil/in.so"]
    assert row["sass"] == ["sm_120"]  # x.so's sm_80 was not read
    (note,) = [n for n in report["notes"] if "outside" in n]
    assert "evil-1.0.dist-info: RECORD lists 3 files outside" in note and "not read" in note
    # a cached file list of the old form cannot bring them back either
    warm = census.census([site], [SM120], cache_root=tmp_path / "c", env={})
    assert warm["distributions"] == report["distributions"]


def test_a_census_stuck_on_one_file_says_which(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slow file (a network mount, a cold disk): the census names it while it waits."""
    site = _site(tmp_path, {"evil/slow.so": host_so(fatbin([(2, 120, 0)]))})
    real = scan._read

    def slow(path: Path) -> dict:
        time.sleep(1.6)
        return real(path)

    monkeypatch.setattr(scan, "_read", slow)
    monkeypatch.setattr(scan, "PROGRESS_AFTER_S", 0.5)
    out = io.StringIO()
    census.census([site], [SM120], cache_root=tmp_path / "c", progress=out, env={})
    count("census_cases")
    assert "census: still reading evil/slow.so (" in out.getvalue(), out.getvalue()
