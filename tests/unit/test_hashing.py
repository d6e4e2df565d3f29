"""The digests sm120patch keeps on users' disks are pinned here, each recomputed with hashlib as the
format was first written (issue 21: one hashing module; a journal, a bundle or a cache written by
an earlier release must still match). The oracle is hashlib (and one published test vector), never
sm120patch.hashing itself."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sm120patch import hashing
from sm120patch.arch import Arch
from sm120patch.catalogue.kernels import load_kernels
from sm120patch.census.scan import _Cache
from sm120patch.engine.journal import state_dir_for
from sm120patch.planning.plan_cache import _listing
from sm120patch.probes import build, evidence, verdict_cache
from sm120patch.probes.environment import overlay
from sm120patch.probes.environment.flashinfer import FlashInferEnv
from sm120patch.probes.run import ranks, rung

DATA = b"abc\x00\xff\n"
TEXT = "/opt/tree with space/é"


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_bytes(b"hello\n")
    (tmp_path / "pkg" / "sub" / "b.cu").write_bytes(DATA)
    return tmp_path / "pkg"


# --- the helpers ---------------------------------------------------------------------------------


def test_the_helpers_give_hashlibs_digests() -> None:
    # FIPS 180-2's test vector, so the oracle is not only hashlib
    assert hashing.sha256(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert hashing.sha256(DATA) == _hex(DATA)
    assert hashing.sha256_raw(DATA) == hashlib.sha256(DATA).digest()
    assert hashing.sha256_text(TEXT) == _hex(TEXT.encode("utf-8"))
    assert hashing.sha256_chunks([b"ab", b"", b"c\x00"]) == _hex(b"abc\x00")
    assert hashing.sha256_chunks(iter([])) == _hex(b"")
    assert hashing.sha256_chunks_raw([b"ab", b"c"]) == hashlib.sha256(b"abc").digest()


def test_json_is_hashed_with_json_dumps_default_separators() -> None:
    value = {"b": [1, "é", None], "a": {"z": 1.5, "y": True}}
    assert hashing.sha256_json(value) == _hex(b'{"b": [1, "\\u00e9", null], "a": {"z": 1.5, "y": true}}')
    assert hashing.sha256_json(value, sort_keys=True) == _hex(json.dumps(value, sort_keys=True).encode())
    odd = {"p": Path("/x")}
    assert hashing.sha256_json(odd, default=str) == _hex(b'{"p": "/x"}')


def test_a_file_is_hashed_by_its_bytes_and_an_unreadable_one_is_none(tree: Path) -> None:
    assert hashing.sha256_file(tree / "sub" / "b.cu") == _hex(DATA)
    assert hashing.sha256_file(tree / "absent") is None
    assert hashing.sha256_file(tree / "sub") is None  # a folder


# --- the formats on disk ---------------------------------------------------------------------------


def test_journal_state_folder_is_named_by_the_roots_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "not there" / "é"  # not writable: the journal lives in the state folder
    assert state_dir_for(root) == tmp_path / "state" / "sm120patch" / _hex(str(root).encode())[:16]


def test_verdict_cache_key_and_file_signatures(tree: Path) -> None:
    parts = {"kind": "k", "b": [1, Path("/x")], "a": {"é": None}}
    blob = json.dumps({"schema": verdict_cache.SCHEMA, **parts}, sort_keys=True, default=str)
    assert verdict_cache.ProbeCache.key(parts) == _hex(blob.encode())[:32]
    verdict_cache.forget_digests()
    assert verdict_cache.file_digest(tree / "a.py") == _hex(b"hello\n")
    assert verdict_cache.file_digest(tree / "a.py") == _hex(b"hello\n")  # remembered
    assert verdict_cache.file_digest(tree / "absent") == "missing"
    assert verdict_cache.file_signature(tree / "sub" / "b.cu", tree) == "sha256:" + _hex(DATA)


def test_evidence_records_each_files_digest(tree: Path) -> None:
    assert evidence.file_sha(tree / "sub" / "b.cu") == _hex(DATA)
    assert evidence.file_sha(tree / "absent") == evidence.MISSING
    assert evidence.hash_files(tree, ["sub/b.cu", "a.py", "a.py", "zz"]) == {
        "a.py": _hex(b"hello\n"),
        "sub/b.cu": _hex(DATA),
        "zz": "missing",
    }


def test_overlay_folder_is_named_by_the_tree_stamp_and_the_planned_bytes(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tree.parent / "cache"))
    stamp = hashlib.sha256()
    for rel in ("a.py", "sub/b.cu"):  # the walk's order: files of a folder, then its subfolders
        st = os.lstat(tree / rel)
        stamp.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    h = hashlib.sha256(str(tree.resolve()).encode())
    h.update(stamp.digest())
    changes = {"sub/b.cu": b"", "a.py": b"new"}
    for rel in sorted(changes):
        h.update(rel.encode() + b"\0" + hashlib.sha256(changes[rel]).digest())
    assert overlay.overlay_root(tree, changes) == tree.parent / "cache" / "sm120patch" / "overlays" / h.hexdigest()[:24]


def test_build_cache_key(tree: Path) -> None:
    src = tree / "sub" / "b.cu"
    unit = build.Unit(src, ["nvcc", "-c", str(src), "-o", "/tmp/x.o", f"-I{tree}/include"])
    blob = {
        "schema": build.SCHEMA,
        "argv": ["nvcc", "-c", f"{build.FI}/sub/b.cu", f"-I{build.FI}/include"],
        "nvcc": ["/usr/local/cuda/bin/nvcc", "12.8"],
        "source": [f"{build.FI}/sub/b.cu", _hex(DATA)],
    }
    expected = _hex(json.dumps(blob, sort_keys=True).encode())[:32]
    assert build._key(unit, tree, "/usr/local/cuda/bin/nvcc", "12.8") == expected


def test_run_rung_fingerprint_and_workspace(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rung.CHECKS_ENV, raising=False)
    kernel = next(k for k in load_kernels().values() if k.run in rung.CHECKS)
    check = rung.CHECKS_DIR / rung.CHECKS[kernel.run].file
    blob = b"".join(p.read_bytes() for p in (check, ranks.HARNESS, ranks.TIMING_LIB))
    assert rung.run_fingerprint(kernel) == _hex(blob)
    fi = FlashInferEnv(tree, "0.6.3", python="/usr/bin/python3")
    where = _hex(f"{tree}|/usr/bin/python3".encode())[:12]
    assert rung.workspace(kernel, Arch(12, 0), fi, tree.parent / "rc").name == f"run-0.6.3-sm_120-{where}"


def test_census_cache_file_is_named_by_the_site(tmp_path: Path) -> None:
    site = tmp_path / "site-packages é"
    assert _Cache.load(tmp_path / "census", site).path == tmp_path / "census" / f"{_hex(str(site).encode())[:24]}.json"


def test_plan_cache_listing(tree: Path) -> None:
    class Index:  # what _listing reads of a PackageIndex
        class target:  # noqa: N801
            package_dir = tree

        def files(self) -> list[Path]:
            return [tree / "a.py", tree / "sub" / "b.cu"]

    st = os.stat(tree / "sub" / "b.cu", follow_symlinks=False)
    entries = [["a.py", None], ["sub/b.cu", [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino]]]
    assert _listing(Index(), {str(tree / "a.py")}) == _hex(json.dumps(entries).encode())  # type: ignore[arg-type]
