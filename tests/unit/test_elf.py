"""The ELF/fatbin reader on hand-built bytes: both e_flags ABIs, fatbin entries, bad input."""

from __future__ import annotations

import pytest

from sm120patch.probes.environment.elf import ElfError, cubin_sm, scan_file, sm_from_flags, so_fatbin_entries
from tests.unit.fi_fakes import cubin, elf64_header, fatbin, host_so


@pytest.mark.parametrize("sm", [75, 90, 100, 103, 120, 121])
def test_cubin_sm_current_abi(sm: int) -> None:
    assert cubin_sm(cubin(sm, abiversion=8)) == sm


@pytest.mark.parametrize("sm", [70, 80, 86, 90])
def test_cubin_sm_old_abi_low_byte(sm: int) -> None:
    assert cubin_sm(cubin(sm, abiversion=7)) == sm


def test_flags_seen_in_flashinfer_cubin() -> None:
    # e_flags of real flashinfer-cubin 0.6.1 files (ABI 8): sm_100f, sm_103a
    assert sm_from_flags(0x6006402, 8) == 100
    assert sm_from_flags(0x600670A, 8) == 103


def test_not_cuda_elf() -> None:
    with pytest.raises(ElfError, match="EM_CUDA"):
        cubin_sm(elf64_header(62, 0, 0))
    with pytest.raises(ElfError):
        cubin_sm(b"not an elf at all" * 4)


def test_fatbin_entries_in_so() -> None:
    so = host_so(fatbin([(2, 90, 0x100000), (2, 120, 0x1200000), (1, 121, 0x108000)]))
    entries = so_fatbin_entries(so)
    assert [(e.kind, e.sm, e.suffix) for e in entries] == [("sass", 90, "a"), ("sass", 120, "f"), ("ptx", 121, "a")]
    assert [e.name for e in entries] == ["sm_90a", "sm_120f", "sm_121a"]


def test_scan_file(tmp_path) -> None:
    (tmp_path / "m.so").write_bytes(host_so(fatbin([(2, 100, 0), (2, 90, 0), (1, 90, 0)])))
    (tmp_path / "k.cubin").write_bytes(cubin(120))
    (tmp_path / "t.txt").write_text("hello")
    (tmp_path / "bad.so").write_bytes(elf64_header(62, 0, 0, shoff=10_000, shnum=3, shstrndx=1))
    so = scan_file(tmp_path / "m.so")
    assert (so.kind, so.sass, so.ptx) == ("so", [90, 100], [90])
    assert scan_file(tmp_path / "k.cubin").sass == [120]
    assert scan_file(tmp_path / "t.txt").kind == "other"
    assert scan_file(tmp_path / "bad.so").error  # reported, not raised
    assert scan_file(tmp_path / "missing.so").error
