"""The code blocks of README.md and docs/*.md, with their doctest markers (docs/doctest.md).

A marker is an HTML comment on the line right above a fence:

    <!-- doctest: run setup=home exit=1 -->       run the block, expect exit 1
    <!-- doctest: run each exit=0,1 -->           run each command on its own, one exit code each
    <!-- doctest: output -->                      this fence shows the previous run block's output
    <!-- doctest: skip gpu: needs two SM12x GPUs -->

Parsing only; tests/unit/test_docs_blocks.py checks the markers and links, and
tests/integration/test_docs_run.py runs the blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*doctest:\s*(?P<body>.*?)\s*-->\s*$")
# languages whose blocks a reader pastes into a shell or an image build: each needs a marker
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", "dockerfile"}
SKIP_KINDS = {
    "gpu": "runs kernels on NVIDIA GPUs",
    "server": "needs a running inference server (SGLang on GPUs)",
    "network": "downloads from the network (PyPI, GitHub)",
    "docker": "runs in a container image or `docker build`",
    "nvcc": "needs a CUDA toolkit that builds for the arch",
    "long": "takes longer than a test may (the whole test suite, a benchmark run)",
}
SETUPS = {
    "empty": "an empty folder",
    "home": "~/src/sglang (SGLang 0.5.9, a clone's layout), ~/src/flashinfer (FlashInfer 0.6.3), "
    "~/site (both, a site-packages); $SGLANG, $FLASHINFER, $SITE name them",
    "bundle": "home, and $BUNDLE: `sm120patch export ~/site --arch sm_120 -o $BUNDLE`",
    "repo": "a copy of this repository (tracked files; .venv linked)",
}


def rel(doc: Path) -> str:
    try:
        return doc.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(doc)


class MarkerError(ValueError):
    """A marker that does not parse: the message names the doc, the line and the fix."""


@dataclass
class Marker:
    kind: str  # run | output | skip
    setup: str = "empty"
    exits: tuple[int, ...] = (0,)
    each: bool = False
    slow: bool = False
    timeout: int = 300
    skip_kind: str = ""
    reason: str = ""


@dataclass
class Block:
    doc: Path
    line: int  # the fence's line, 1-based
    lang: str
    body: str
    marker: Marker | None
    marker_error: str = ""
    output: list[str] = field(default_factory=list)  # lines of the `output` fence that follows

    @property
    def where(self) -> str:
        return f"{rel(self.doc)}:{self.line}"

    def commands(self) -> list[str]:
        """The block's commands for `run each`: lines joined at a trailing backslash; blank lines,
        comment lines and trailing comments kept out of the count (a comment stays in the text)."""
        out: list[str] = []
        cur = ""
        for raw in self.body.splitlines():
            if not cur and (not raw.strip() or raw.lstrip().startswith("#")):
                continue
            cur += raw + "\n"
            if not raw.rstrip().endswith("\\"):
                out.append(cur)
                cur = ""
        if cur:
            out.append(cur)
        return out


def parse_marker(body: str, where: str) -> Marker:
    words = body.split()
    if not words:
        raise MarkerError(f"{where}: empty doctest marker; write `run`, `output` or `skip KIND: reason`")
    head = words[0]
    if head == "output" and len(words) == 1:
        return Marker("output")
    if head == "skip":
        m = re.fullmatch(r"skip\s+(\w+)\s*:\s*(\S.*)", body)
        if not m or m[1] not in SKIP_KINDS:
            raise MarkerError(
                f"{where}: `{body}`: write `skip KIND: reason`, KIND one of {', '.join(sorted(SKIP_KINDS))}"
            )
        return Marker("skip", skip_kind=m[1], reason=m[2].strip())
    if head != "run":
        raise MarkerError(f"{where}: `{body}`: a marker starts with `run`, `output` or `skip`")
    mk = Marker("run")
    for w in words[1:]:
        key, eq, val = w.partition("=")
        if w == "each":
            mk.each = True
        elif w == "slow":
            mk.slow = True
        elif key == "setup" and eq and val in SETUPS:
            mk.setup = val
        elif key == "exit" and eq and re.fullmatch(r"\d+(,\d+)*", val):
            mk.exits = tuple(int(x) for x in val.split(","))
        elif key == "timeout" and eq and val.isdigit():
            mk.timeout = int(val)
        else:
            raise MarkerError(
                f"{where}: `{w}` in `{body}`: run takes each, slow, setup=({'|'.join(SETUPS)}), "
                "exit=N[,N...], timeout=SECONDS"
            )
    if len(mk.exits) > 1 and not mk.each:
        raise MarkerError(f"{where}: `{body}`: several exit codes need `each` (one per command)")
    return mk


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker right above it (if any)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        fence = m["fence"]
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        body = "\n".join(lines[i + 1 : j]) + "\n"
        where = f"{rel(doc)}:{start + 1}"
        marker, err = None, ""
        mm = MARKER.match(lines[start - 1]) if start else None
        if mm:
            try:
                marker = parse_marker(mm["body"], where)
            except MarkerError as e:
                err = str(e)
        blk = Block(doc, start + 1, m["lang"].lower(), body, marker, err)
        if marker and marker.kind == "output":
            prev = next((b for b in reversed(out) if b.marker and b.marker.kind == "run"), None)
            if prev is None:
                blk.marker_error = f"{where}: an `output` block with no `run` block before it"
            else:
                prev.output = [x for x in body.splitlines() if x.strip()]
        out.append(blk)
        i = j + 1
    return out


def prose(doc: Path) -> str:
    """A doc's text with its fenced blocks left out (a shell `[ -f x ](...)` is not a link)."""
    out, fence = [], None
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if m and fence is None:
            fence = m["fence"]
        elif fence and line.startswith(fence):
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def all_blocks() -> list[Block]:
    return [b for d in docs() for b in blocks(d)]


def shows(output: str, expected: str) -> bool:
    """`expected` (one line the doc shows; `...` matches anything) is within a line of `output`,
    runs of whitespace counting as one space."""

    def norm(s: str) -> str:
        return " ".join(s.split())

    pat = ".*".join(re.escape(part.strip()) for part in norm(expected).split("..."))
    return any(re.search(pat, norm(line)) for line in output.splitlines())
