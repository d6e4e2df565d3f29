"""GPU architectures by name (`sm_120`) and what SGLang's arch predicates admit."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sm120patch.errors import UserError


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}"

    def __str__(self) -> str:
        return self.name


KNOWN = ("sm_90", "sm_100", "sm_103", "sm_120", "sm_121")
DEFAULT = "sm_120"


# Every compute capability CUDA has named (CUDA C Programming Guide, "Compute Capabilities"; 10.1 is
# Thor's number before CUDA 13 called it 11.0). A name outside it is a typo, never a GPU: `sm_999`
# or `sm_12` would plan every recipe `not-applicable` and exit 0, a silent "nothing to do".
CUDA_ARCHS: frozenset[tuple[int, int]] = frozenset(
    {(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 8), (8, 9)}
    | {(9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)}
)


def parse_arch(text: str) -> Arch:
    """Accept `sm_120`, `sm120`, `120`, `12.0` (an `a`/`f` suffix too) for an architecture CUDA
    has; reject anything else, naming the ones this tool's recipes are about."""
    t = text.strip().lower()
    m = re.fullmatch(r"(?:sm_?)?(\d{2,3})[af]?", t)
    n = re.fullmatch(r"(\d{1,2})\.(\d)", t)
    if m:
        arch = Arch(int(m.group(1)[:-1]), int(m.group(1)[-1]))
    elif n:
        arch = Arch(int(n.group(1)), int(n.group(2)))
    else:
        raise UserError(f"--arch {text!r}: not an architecture; use one of {', '.join(KNOWN)} (or 12.0 style)")
    if (arch.major, arch.minor) not in CUDA_ARCHS:
        raise UserError(
            f"--arch {text!r}: no GPU has compute capability {arch.major}.{arch.minor}; use one of "
            f"{', '.join(KNOWN)} (or another CUDA architecture, such as sm_86)"
        )
    return arch


# What SGLang/FlashInfer arch predicates mean, by the token in their name:
# `is_sm100_supported()` is major 10, `is_blackwell_supported()` is majors 10, 11 and 12
# (SGLang 0.5.9+ passes device_capability_majors=[10, 11, 12]; 0.5.5-0.5.8 [10, 12]),
# `is_sm120_supported()` is major 12 (SM121 included). Used to decide whether an arch
# test already admits an architecture. Tests never evaluate gates with this table: they
# read each release's own predicate definitions (tests/integration/gates.py) and check
# this table against them (tests/integration/test_frontier_releases.py).
PREDICATE_MAJORS: dict[str, frozenset[int]] = {
    "sm90": frozenset({9}),
    "hopper": frozenset({9}),
    "sm100": frozenset({10}),
    "sm100_or_sm110": frozenset({10, 11}),
    "sm110": frozenset({11}),
    "sm120": frozenset({12}),
    "sm12x": frozenset({12}),
    "blackwell": frozenset({10, 11, 12}),
}

_TOKEN = re.compile(r"sm100_or_sm110|sm\d+x?|hopper|blackwell")


def predicate_token(identifier: str) -> str | None:
    """The arch token in an identifier: `_is_sm100_supported` -> `sm100`."""
    m = _TOKEN.search(identifier.lower())
    return m.group(0) if m and m.group(0) in PREDICATE_MAJORS else None


def admits(identifier: str, major: int) -> bool:
    token = predicate_token(identifier)
    return token is not None and major in PREDICATE_MAJORS[token]
