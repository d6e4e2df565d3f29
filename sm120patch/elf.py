"""Which GPU architectures a cubin or a shared object holds code for, read from its bytes.

The artifact probe must answer "is there SM120 code here?" without CUDA, a GPU or
cuobjdump, so this reads the two formats directly: a cubin is an ELF file with
e_machine EM_CUDA whose e_flags carry the SM number, and a host .so built by nvcc
carries a `.nv_fatbin` section of fatbin containers, one entry per (kind, arch).
Only headers are read; payloads (possibly compressed) are never decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
ELFABIVERSION_CUDA_V1 = 7  # SM number in the low byte of e_flags
FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = ".nv_fatbin"
_KINDS = {1: "ptx", 2: "sass"}
# Entry flag bits seen with nvcc 13.0 (sm_90a, sm_120a, sm_120f): the arch-specific suffix.
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY = 0x200000


class ElfError(ValueError):
    """The bytes are not the ELF/fatbin they claim to be."""


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" (a cubin), "ptx", or "kind<N>"
    sm: int  # e.g. 120
    suffix: str  # "a", "f" or ""
    compressed: bool

    @property
    def name(self) -> str:
        return f"sm_{self.sm}{self.suffix}"


@dataclass
class FileArchs:
    """What one file holds: the SM numbers of its SASS and PTX."""

    path: str
    kind: str  # "cubin", "so", "other"
    sass: list[int] = field(default_factory=list)
    ptx: list[int] = field(default_factory=list)
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "kind": self.kind, "sass": self.sass, "ptx": self.ptx, "error": self.error}


@dataclass(frozen=True)
class _Header:
    is64: bool
    endian: str
    abiversion: int
    machine: int
    flags: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int


def _header(data: bytes) -> _Header:
    if len(data) < 52 or data[:4] != ELF_MAGIC:
        raise ElfError("not an ELF file")
    ei_class, ei_data = data[4], data[5]
    if ei_class not in (1, 2) or ei_data not in (1, 2):
        raise ElfError(f"bad ELF class/data bytes {ei_class}/{ei_data}")
    e = "<" if ei_data == 1 else ">"
    is64 = ei_class == 2
    if is64:
        if len(data) < 64:
            raise ElfError("truncated ELF64 header")
        machine = struct.unpack_from(e + "H", data, 18)[0]
        shoff, flags = struct.unpack_from(e + "Q", data, 40)[0], struct.unpack_from(e + "I", data, 48)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 58)
    else:
        machine = struct.unpack_from(e + "H", data, 18)[0]
        shoff, flags = struct.unpack_from(e + "II", data, 32)
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 46)
    return _Header(is64, e, data[8], machine, flags, shoff, shentsize, shnum, shstrndx)


def sm_from_flags(flags: int, abiversion: int) -> int:
    """The SM number in a CUDA ELF's e_flags, by ABI version (LLVM's EF_CUDA_SM* rules)."""
    if abiversion == ELFABIVERSION_CUDA_V1:
        return flags & 0xFF
    if abiversion > ELFABIVERSION_CUDA_V1:
        return (flags >> 8) & 0xFF
    # Unknown ABI: old values ran sm_20..sm_90 (0x14..0x5a) in the low byte.
    low = flags & 0xFF
    return low if 0x14 <= low <= 0x5A else (flags >> 8) & 0xFF


def cubin_sm(data: bytes) -> int:
    """SM number of a cubin (needs only its first 64 bytes); ElfError if not a CUDA ELF."""
    h = _header(data)
    if h.machine != EM_CUDA:
        raise ElfError(f"e_machine {h.machine} is not EM_CUDA ({EM_CUDA})")
    return sm_from_flags(h.flags, h.abiversion)


def _sections(data: bytes, h: _Header) -> Iterator[tuple[str, int, int]]:
    """(name, offset, size) of each section."""
    if not h.shoff or not h.shnum:
        return
    fmt = h.endian + ("IIQQQQIIQQ" if h.is64 else "IIIIIIIIII")
    need = struct.calcsize(fmt)
    if h.shentsize < need or h.shoff + h.shnum * h.shentsize > len(data):
        raise ElfError("section header table out of bounds")
    rows = [struct.unpack_from(fmt, data, h.shoff + i * h.shentsize) for i in range(h.shnum)]
    if h.shstrndx >= len(rows):
        raise ElfError("bad section name table index")
    str_off, str_size = rows[h.shstrndx][4], rows[h.shstrndx][5]
    names = data[str_off : str_off + str_size]
    for r in rows:
        name_end = names.find(b"\0", r[0])
        name = names[r[0] : name_end if name_end >= 0 else None].decode("ascii", "replace")
        sh_type, offset, size = r[1], r[4], r[5]
        if sh_type != 8:  # SHT_NOBITS has no bytes in the file
            yield name, offset, size


def fatbin_entries(blob: bytes) -> list[FatbinEntry]:
    """Entries of the fatbin containers laid end to end in `blob` (a .nv_fatbin section)."""
    out: list[FatbinEntry] = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            # containers are 8-byte aligned; skip padding, stop at anything else
            if magic == 0:
                pos += 8
                continue
            break
        q, end = pos + hsize, min(pos + hsize + fsize, len(blob))
        while q + 32 <= end:
            kind, _ev, ehsize, psize = struct.unpack_from("<HHIQ", blob, q)
            if ehsize < 32:
                raise ElfError(f"fatbin entry header size {ehsize} at {q}")
            sm = struct.unpack_from("<I", blob, q + 28)[0]
            flags = struct.unpack_from("<Q", blob, q + 40)[0] if ehsize >= 48 else 0
            suffix = "f" if flags & _FLAG_FAMILY else "a" if flags & _FLAG_ARCH_SPECIFIC else ""
            out.append(
                FatbinEntry(_KINDS.get(kind, f"kind{kind}"), sm, suffix, bool(flags & 0x2000) or bool(flags & 0x8000))
            )
            q += ehsize + psize
        pos = pos + hsize + fsize
    return out


def so_fatbin_entries(data: bytes) -> list[FatbinEntry]:
    """Fatbin entries inside the `.nv_fatbin` section of a host ELF (.so)."""
    h = _header(data)
    out: list[FatbinEntry] = []
    for name, off, size in _sections(data, h):
        if name == FATBIN_SECTION:
            out.extend(fatbin_entries(data[off : off + size]))
    return out


def scan_file(path: Path) -> FileArchs:
    """Classify one file and list its SM numbers; never raises for bad input."""
    res = FileArchs(str(path), "other")
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != ELF_MAGIC:
                return res
            h = _header(head)
            if h.machine == EM_CUDA:
                res.kind = "cubin"
                res.sass = [sm_from_flags(h.flags, h.abiversion)]
                return res
            res.kind = "so"
            f.seek(0)
            data = f.read()
        entries = so_fatbin_entries(data)
    except (OSError, ElfError, struct.error) as e:
        res.error = str(e) or type(e).__name__
        return res
    res.sass = sorted({e.sm for e in entries if e.kind == "sass"})
    res.ptx = sorted({e.sm for e in entries if e.kind == "ptx"})
    return res


@dataclass(frozen=True)
class KernelCode:
    """One kernel of a cubin: its (mangled) symbol and the bytes of its machine code.

    nvcc puts each kernel in a section `.text.<symbol>`, so its size is the size of its
    SASS: a kernel whose body the preprocessor compiled out is as small as an empty one."""

    symbol: str
    size: int

    @property
    def family(self) -> str:
        return kernel_family(self.symbol)


def cubin_kernels(data: bytes) -> list[KernelCode]:
    """Every kernel's machine-code size in a cubin (ElfError if it is not one)."""
    h = _header(data)
    if h.machine != EM_CUDA:
        raise ElfError(f"e_machine {h.machine} is not EM_CUDA ({EM_CUDA})")
    return [
        KernelCode(name[len(".text.") :], size) for name, _, size in _sections(data, h) if name.startswith(".text.")
    ]


def kernel_family(symbol: str) -> str:
    """The function name of a mangled C++ kernel symbol, without namespaces or template
    arguments (`_ZN10flashinfer4comm11my_kernelILi1EEEvv` -> `my_kernel`), so the
    instantiations of one template count together. Plain C names come back unchanged."""
    if not symbol.startswith("_Z"):
        return symbol
    i = 2
    if symbol.startswith("_ZN"):
        i = 3
    last = symbol
    while i < len(symbol) and symbol[i] in "KVr":  # cv-qualifiers of a nested member function
        i += 1
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while j < len(symbol) and symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        last = symbol[j : j + n]
        i = j + n
        if not symbol.startswith("_ZN"):
            break
    return last
