"""One architecture-gated site: where it is, the test as written, what it admits, what it is for SM12x."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# verdicts for SM12x, in the order a maintainer reads them (candidates first)
CANDIDATE = "candidate"  # shut to SM12x, and the kernels behind it exist for SM12x in the FlashInfer given
UNKNOWN = "unknown"  # shut (or unreadable), and nothing says whether the kernels exist
COVERED = "covered"  # a recipe edits it
SHUT = "shut"  # shut, and right to stay shut: the kernels behind it do not exist for SM12x
OPEN = "open"  # already admits SM12x
VERDICTS = (CANDIDATE, UNKNOWN, COVERED, SHUT, OPEN)


@dataclass
class Site:
    """A test that reads the GPU's architecture.

    `admits` is where the test is true; `path` is where the code it guards runs (for a guard
    clause, `if not X: return`, the archs where the test is false); None means unknown."""

    package: str
    file: str  # relative to the folder holding the package: "sglang/srt/layers/foo.py"
    function: str  # qualified: "Class.method", "<module>"
    line: int
    end_line: int
    test: str  # the test as written (its source segment)
    kind: str  # if | elif | ifexp | while | assert | return | arg | assign | filter | expr | jit-majors | ...
    admits: list[str] | None
    path: list[str] | None
    guard: bool = False
    norm_test: str = ""  # the test with layout normalized (ast.unparse), for matching across releases
    norm_body: str = ""  # a digest of the statement it guards, layout and line numbers aside
    context: str = field(default="", repr=False)  # the guarded code's text: what the kernel words are read from
    verdict: str = UNKNOWN
    reason: str = ""
    recipe: str | None = None  # the recipe that covers it
    recipe_status: str | None = None
    kernels: list[str] = field(default_factory=list)
    defined_at: list[tuple[int, int]] = field(default_factory=list)  # lines of the flags the test reads

    @property
    def key(self) -> tuple[str, str]:
        """What a site is across releases, wherever it sits: its test and the code it guards."""
        return (self.norm_test, self.norm_body)

    @property
    def place(self) -> tuple[str, str]:
        return (self.file, self.function)

    def to_dict(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "file": self.file,
            "function": self.function,
            "line": self.line,
            "end_line": self.end_line,
            "test": self.test,
            "kind": self.kind,
            "guard": self.guard,
            "admits": self.admits,
            "path": self.path,
            "verdict": self.verdict,
            "reason": self.reason,
            "recipe": self.recipe,
            "recipe_status": self.recipe_status,
            "kernels": self.kernels,
            "defined_at": [list(r) for r in self.defined_at],
        }


@dataclass(frozen=True)
class Predicate:
    """A name the release defines to answer an architecture question, and what it admits."""

    name: str
    file: str
    line: int
    admits: list[str] | None
    scope: str  # "release" (utils, platform) or "module" (a flag of one file)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
