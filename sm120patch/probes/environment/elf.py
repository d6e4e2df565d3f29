"""Which GPU architectures a cubin or a shared object holds code for, read from its bytes.

The artifact probe must answer "is there SM120 code here?" without CUDA, a GPU or
cuobjdump, so this reads the two formats directly: a cubin is an ELF file with
e_machine EM_CUDA whose e_flags carry the SM number, and a host .so built by nvcc
carries a `.nv_fatbin` section of fatbin containers (one per translation unit), one
entry per (kind, arch). Only headers are read, by seeking: the ELF header, the section
header table, the section names and each fatbin entry's header; payloads (possibly
compressed: nvcc 13 compresses PTX by default and SASS with `-Xfatbin -compress-all`)
are skipped, so a 1 GB extension costs a few kilobytes of reads.

Fatbin entry header (little-endian), as nvcc 13.0 writes it (checked on its output in
tests/unit/test_census_nvcc.py): u16 kind (1 PTX, 2 ELF/SASS, 8 LTO IR: `code=lto_90`), u16 version, u32
header size, u64 payload size, u32 compressed size, u32 -, u16 minor, u16 major (for
PTX: the PTX ISA version, e.g. 9.0 from CUDA 13.0), u32 SM number, u32/u32 name,
u64 flags (0x100000 `a`, 0x200000 `f`, 0x2000/0x8000 compressed).
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
ELFABIVERSION_CUDA_V1 = 7  # SM number in the low byte of e_flags
FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = ".nv_fatbin"
_KINDS = {1: "ptx", 2: "sass", 8: "lto"}  # 8: nvcc 13.0 `-gencode arch=compute_90,code=lto_90`
# Entry flag bits seen with nvcc 13.0 (sm_90a, sm_120a, sm_120f): the arch-specific suffix.
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY = 0x200000
_FLAG_COMPRESSED = 0x2000 | 0x8000  # CUDA 11-12 `-compress-all` (0x2000); CUDA 12.8+ compress modes (0x8000)
# Bounds that keep a corrupt or hostile file from making the reader loop or allocate without end
_MAX_SECTIONS = 65536
_MAX_NAMES = 1 << 22
# What a real fatbin holds is far below these (cuBLASLt 13.1's .nv_fatbin: 2,782 containers, 5,737
# entries; cuFFT 12 keeps 23,984 containers in .ldata); past them a file is cut short, and says
# so, rather than costing time without bound (a zero-filled or sparse section).
_MAX_ENTRIES = 1 << 18
_MAX_CONTAINERS = 1 << 17
_MAX_PADDING = 1 << 16  # zero bytes between two containers (nvcc aligns them to 8)
_MAX_PADDING_TOTAL = 1 << 20  # zero bytes skipped in one file, all gaps together
_PAD_CHUNK = 4096
# A data section this large beside a .nv_fatbin that cannot run is where a library may keep
# kernels it loads itself (cuFFT 12: 23,984 fatbin containers in `.ldata`, one sm_75 cubin in
# .nv_fatbin): the headers cannot tell
BIG_DATA = 16 << 20
_DATA_SECTIONS = (".ldata", ".lrodata", ".rodata", ".data", ".data.rel.ro")


class ElfError(ValueError):
    """The bytes are not the ELF/fatbin they claim to be."""


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" (a cubin), "ptx", or "kind<N>"
    sm: int  # e.g. 120
    suffix: str  # "a", "f" or ""
    compressed: bool
    isa: str = ""  # PTX entries: the PTX ISA version ("9.0"); "" for SASS
    container: int = 0  # which fatbin container (translation unit) of the section it is in
    kernels: int = -1  # small uncompressed SASS: how many kernels its cubin has (-1: not counted)

    @property
    def name(self) -> str:
        return f"sm_{self.sm}{self.suffix}"

    @property
    def code(self) -> str:
        """Compact text form, `sass:sm_120a` or `ptx:sm_120:9.0` (what the census caches)."""
        return f"{self.kind}:{self.name}" + (f":{self.isa}" if self.isa else "")


@dataclass
class FileArchs:
    """What one file holds: the SM numbers of its SASS and PTX."""

    path: str
    kind: str  # "cubin", "so", "other"
    sass: list[int] = field(default_factory=list)
    ptx: list[int] = field(default_factory=list)
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


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


Reader = Callable[[int, int], bytes]  # read(offset, size) -> at most `size` bytes


def _bytes_reader(data: bytes) -> Reader:
    return lambda off, size: data[off : off + size] if off >= 0 else b""


def _file_reader(f: BinaryIO) -> Reader:
    def read(off: int, size: int) -> bytes:
        if off < 0 or size < 0:
            return b""
        f.seek(off)
        return f.read(size)

    return read


def _section_rows(read: Reader, h: _Header) -> Iterator[tuple[str, int, int, int]]:
    """(name, type, offset, size) of each section, from the section header table and the names."""
    if not h.shoff or not h.shnum:
        return
    fmt = h.endian + ("IIQQQQIIQQ" if h.is64 else "IIIIIIIIII")
    need = struct.calcsize(fmt)
    if h.shentsize < need or h.shnum > _MAX_SECTIONS:
        raise ElfError("bad section header table")
    table = read(h.shoff, h.shnum * h.shentsize)
    if len(table) < h.shnum * h.shentsize:
        raise ElfError("section header table out of bounds")
    rows = [struct.unpack_from(fmt, table, i * h.shentsize) for i in range(h.shnum)]
    if h.shstrndx >= len(rows):
        raise ElfError("bad section name table index")
    str_off, str_size = rows[h.shstrndx][4], rows[h.shstrndx][5]
    names = read(str_off, min(str_size, _MAX_NAMES))
    for r in rows:
        name_end = names.find(b"\0", r[0])
        name = names[r[0] : name_end if name_end >= 0 else None].decode("ascii", "replace")
        yield name, r[1], r[4], r[5]


def _sections(data: bytes, h: _Header) -> Iterator[tuple[str, int, int]]:
    """(name, offset, size) of each section of an ELF held in memory."""
    for name, sh_type, offset, size in _section_rows(_bytes_reader(data), h):
        if sh_type != 8:  # SHT_NOBITS has no bytes in the file
            yield name, offset, size


class _Walk:
    """Entries found, and why the walk stopped early ("" when it read the whole section)."""

    def __init__(self) -> None:
        self.entries: list[FatbinEntry] = []
        self.cut = ""
        self.data: tuple[str, int] = ("", 0)  # the largest data section of at least BIG_DATA bytes
        self.padding = 0  # zero bytes skipped so far


def _skip_zeros(read: Reader, pos: int, stop: int, walk: _Walk) -> int:
    """The first 8-aligned offset at or after `pos` (within `stop`) that is not zero padding,
    reading at most _MAX_PADDING bytes (and _MAX_PADDING_TOTAL in all); -1 past that."""
    limit = min(stop, pos + _MAX_PADDING, pos + max(0, _MAX_PADDING_TOTAL - walk.padding))
    start = pos
    while pos < limit:
        chunk = read(pos, min(_PAD_CHUNK, limit - pos))
        if not chunk:
            return stop
        stripped = chunk.lstrip(b"\0")
        if stripped:
            pos += ((len(chunk) - len(stripped)) // 8) * 8
            walk.padding += pos - start
            return pos
        pos += len(chunk)
    walk.padding += pos - start
    return pos if pos >= stop else -1


def _walk_fatbin(read: Reader, start: int, size: int, walk: _Walk | None = None) -> list[FatbinEntry]:
    """Entries of the fatbin containers laid end to end in [start, start+size), headers only;
    bounded by the entries, containers and padding a real fatbin has (walk.cut says where not)."""
    walk = walk if walk is not None else _Walk()
    out = walk.entries
    pos, stop, container, first = start, start + size, 0, len(out)
    while pos + 16 <= stop:
        if len(out) >= _MAX_ENTRIES or container >= _MAX_CONTAINERS:
            walk.cut = f"cut short after {len(out)} entries in {container} containers (more than a real fatbin has)"
            break
        head = read(pos, 16)
        if len(head) < 16:
            raise ElfError(f"fatbin container header at {pos} is past the end of the file")
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", head)
        if magic != FATBIN_MAGIC:
            # containers are 8-byte aligned; skip a bounded run of padding, stop at anything else
            if magic == 0:
                nxt = _skip_zeros(read, pos, stop, walk)
                if nxt < 0:
                    walk.cut = f"cut short at offset {pos}: zero bytes where a fatbin container should be"
                    break
                pos = max(nxt, pos + 8)
                continue
            break
        if hsize < 16:
            raise ElfError(f"fatbin container header size {hsize} at {pos}")
        q, end = pos + hsize, min(pos + hsize + fsize, stop)
        while q + 32 <= end and len(out) < _MAX_ENTRIES:
            eh = read(q, 64)
            if len(eh) < 32:
                raise ElfError(f"fatbin entry header at {q} is past the end of the file")
            kind, _ev, ehsize, psize = struct.unpack_from("<HHIQ", eh)
            if ehsize < 32:
                raise ElfError(f"fatbin entry header size {ehsize} at {q}")
            minor, major, sm = struct.unpack_from("<HHI", eh, 24)
            flags = struct.unpack_from("<Q", eh, 40)[0] if ehsize >= 48 and len(eh) >= 48 else 0
            suffix = "f" if flags & _FLAG_FAMILY else "a" if flags & _FLAG_ARCH_SPECIFIC else ""
            kind_name = _KINDS.get(kind, f"kind{kind}")
            isa = f"{major}.{minor}" if kind_name == "ptx" and major else ""
            compressed = bool(flags & _FLAG_COMPRESSED)
            kernels = _count_kernels(read, q + ehsize, psize) if kind == 2 and not compressed else -1
            out.append(FatbinEntry(kind_name, sm, suffix, compressed, isa, container, kernels))
            q += ehsize + psize
        container += 1
        pos = pos + hsize + fsize
    return out[first:]


_SMALL_CUBIN = 64 << 10
_MENTION_SECTIONS = (".dynstr", ".rodata")
_MAX_MENTION = 8 << 20


def _mentions(read: Reader, h: _Header, word: bytes) -> bool:
    """Does `word` appear in the file's .dynstr (a symbol or DT_NEEDED it imports) or .rodata
    (a library name it dlopens), each read only up to _MAX_MENTION bytes?"""
    try:
        for name, sh_type, off, size in _section_rows(read, h):
            if name in _MENTION_SECTIONS and sh_type != 8 and word in read(off, min(size, _MAX_MENTION)):
                return True
    except (ElfError, struct.error):
        pass
    return False


def _count_kernels(read: Reader, off: int, size: int) -> int:
    """Kernels (`.text.<symbol>` sections) of a small uncompressed cubin payload at `off`, read
    from its section headers; -1 when it is large (not counted: a real library) or unreadable.
    nvcc's device-link unit (`nvcc -shared`, cuFFTW's one sm_75 cubin) has none: no call needs it."""
    if size > _SMALL_CUBIN or size < 64:
        return -1

    def sub(o: int, n: int) -> bytes:
        return read(off + o, max(0, min(n, size - o))) if 0 <= o < size else b""

    try:
        h = _header(sub(0, 64))
        if h.machine != EM_CUDA:
            return -1
        return sum(1 for name, *_ in _section_rows(sub, h) if name.startswith(".text."))
    except (ElfError, struct.error):
        return -1


def fatbin_entries(blob: bytes) -> list[FatbinEntry]:
    """Entries of the fatbin containers laid end to end in `blob` (a .nv_fatbin section)."""
    return _walk_fatbin(_bytes_reader(blob), 0, len(blob))


def _fatbin_sections(read: Reader, h: _Header, walk: _Walk | None = None) -> list[FatbinEntry]:
    walk = walk if walk is not None else _Walk()
    for name, sh_type, off, size in _section_rows(read, h):
        if name == FATBIN_SECTION and sh_type != 8:
            base = walk.entries[-1].container + 1 if walk.entries else 0
            sub = _Walk()
            _walk_fatbin(read, off, size, sub)
            room = _MAX_ENTRIES - len(walk.entries)
            walk.entries.extend(replace(e, container=e.container + base) for e in sub.entries[:room])
            walk.cut = walk.cut or sub.cut
            if len(sub.entries) > room and not walk.cut:
                walk.cut = f"cut short after {len(walk.entries)} entries (more than a real fatbin has)"
        elif name in _DATA_SECTIONS and sh_type != 8 and size >= BIG_DATA and size > walk.data[1]:
            walk.data = (name, size)
    return walk.entries


def so_fatbin_entries(data: bytes) -> list[FatbinEntry]:
    """Fatbin entries inside the `.nv_fatbin` section of a host ELF (.so) held in memory."""
    return _fatbin_sections(_bytes_reader(data), _header(data))


@dataclass
class FileCode:
    """What one file holds, read by seeks: its kind and, for a host ELF, its fatbin entries."""

    kind: str  # "cubin", "so" (any host ELF), "fatbin" (a loose one), "other"
    entries: list[FatbinEntry] = field(default_factory=list)
    error: str = ""
    note: str = ""  # read, but not all of it: why (a fatbin cut short at the reader's bounds)
    data_section: str = ""  # a data section of BIG_DATA bytes or more (".ldata 277 MB"): see BIG_DATA
    skipped: str = ""  # not read at all: why (not a regular file)
    nvjitlink: bool = False  # its .dynstr/.rodata names nvJitLink: it links LTO IR itself (cuFFT dlopens it)


def _open_regular(path: Path) -> tuple[int, str]:
    """A read-only descriptor of `path` when it is a regular file, else (-1, what it is).
    O_NONBLOCK: opening a FIFO (a RECORD may name one) must not wait for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if stat.S_ISREG(mode):
        return fd, ""
    os.close(fd)
    what = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
    return -1, what.get(stat.S_IFMT(mode), "a socket" if stat.S_ISSOCK(mode) else "a directory")


def read_file_code(path: Path) -> FileCode:
    """Classify one file and read its fatbin entry headers (a cubin counts as one SASS entry);
    reads only headers, never the payloads, and only regular files; never raises for bad input."""
    try:
        fd, other = _open_regular(path)
        if fd < 0:
            return FileCode("other", skipped=f"{other}, not a regular file: not read")
        with os.fdopen(fd, "rb") as f:
            read = _file_reader(f)
            head = read(0, 64)
            if head[:4] == struct.pack("<I", FATBIN_MAGIC):  # a loose .fatbin (nvcc -fatbin)
                walk = _Walk()
                _walk_fatbin(read, 0, os.fstat(f.fileno()).st_size, walk)
                return FileCode("fatbin", walk.entries, note=walk.cut)
            if head[:4] != ELF_MAGIC:
                return FileCode("other")
            h = _header(head)
            if h.machine == EM_CUDA:
                sm = sm_from_flags(h.flags, h.abiversion)
                return FileCode("cubin", [FatbinEntry("sass", sm, _cubin_suffix(read, h), False)])
            walk = _Walk()
            _fatbin_sections(read, h, walk)
            data = f"{walk.data[0]} {walk.data[1] >> 20} MB" if walk.data[1] else ""
            jit = (walk.data[1] > 0 or any(e.kind == "lto" for e in walk.entries)) and _mentions(read, h, b"nvJitLink")
            return FileCode("so", walk.entries, note=walk.cut, data_section=data, nvjitlink=jit)
    except (OSError, ElfError, struct.error, ValueError) as e:
        return FileCode("other" if isinstance(e, OSError) else "so", error=str(e) or type(e).__name__)


_TKINFO = ".note.nv.tkinfo"
_TKINFO_ARCH = re.compile(rb"-arch[= ]sm_(\d+)([af]?)\b")


_EF_CUDA_ARCH_SPECIFIC = 0x08  # e_flags bit, ABI 8, on cubins without the ptxas command line


def _cubin_suffix(read: Reader, h: _Header) -> str:
    """`a`, `f` or "" of a cubin's target. nvcc's own cubins keep the ptxas command line in
    `.note.nv.tkinfo` (`-arch sm_120a -m 64`); their e_flags do not tell (nvcc 13.0 writes
    0x6007802 for sm_120, sm_120a and sm_120f alike). Cubins from NVIDIA's internal assembler
    (flashinfer-cubin's trtllm-gen kernels, CUDA 12.9) have no `-arch` there but set bit 0x08
    for `a` (sm_100a: 0x..640c, sm_103a: 0x..670a; sm_100f: 0x..6402). Without either: ""."""
    try:
        for name, _t, off, size in _section_rows(read, h):
            if name == _TKINFO:
                m = _TKINFO_ARCH.search(read(off, min(size, 4096)))
                if m:
                    return m.group(2).decode()
    except (ElfError, struct.error):
        pass
    return "a" if h.abiversion > ELFABIVERSION_CUDA_V1 and h.flags & _EF_CUDA_ARCH_SPECIFIC else ""


def scan_file(path: Path) -> FileArchs:
    """Classify one file and list its SM numbers; never raises for bad input."""
    code = read_file_code(path)
    res = FileArchs(str(path), code.kind, error=code.error or code.skipped)
    res.sass = sorted({e.sm for e in code.entries if e.kind == "sass"})
    res.ptx = sorted({e.sm for e in code.entries if e.kind == "ptx"})
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
