"""Preprocessor `__CUDA_ARCH__` ranges in CUDA sources (FlashInfer's data/include and data/csrc).

`#if __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200` compiles a kernel body in for some
architectures and out for the rest; the kernel still builds and launches where it is out, and
computes nothing (FlashInfer PR 3903). Each `#if`/`#elif` that compares `__CUDA_ARCH__` is a site;
its condition is evaluated per architecture with a small parser for the preprocessor's expression
language (`defined`, `!`, `&&`, `||`, comparisons, parentheses). Other macros may be either (WILD);
`__CUDA_ARCH_FEAT_SM100_ALL` is defined only when building that arch's `a` target.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from sm120patch.arch import Arch
from sm120patch.gates.evaluate import ARCHS, UNK, WILD, names
from sm120patch.gates.site import Site

SUFFIXES = (".cuh", ".cu", ".h", ".hpp", ".cpp")
_DIRECTIVE = re.compile(r"^\s*#\s*(if|elif)\b(.*)$")
_TOKEN = re.compile(r"\s*(\d+[uUlL]*|[A-Za-z_]\w*|&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|\S)")
_FEAT = re.compile(r"__CUDA_ARCH_FEAT_SM(\d+)_ALL")
_FN = re.compile(r"([A-Za-z_]\w*)\s*\(")
_KEYWORDS = frozenset({"if", "for", "while", "switch", "return", "sizeof", "defined", "static_assert"})
_TYPE = re.compile(r"\b(?:struct|class|namespace)\s+([A-Za-z_]\w*)")


class _Parser:
    """Recursive descent over one condition, evaluated for one arch (three-valued)."""

    def __init__(self, tokens: list[str], arch: Arch) -> None:
        self.t, self.i, self.arch = tokens, 0, arch

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str:
        tok = self.t[self.i]
        self.i += 1
        return tok

    def parse(self) -> object:
        v = self.or_()
        return v if self.peek() is None else UNK

    def or_(self) -> object:
        vals = [self.and_()]
        while self.peek() == "||":
            self.take()
            vals.append(self.and_())
        if len(vals) == 1:
            return vals[0]
        if any(v not in (WILD, UNK) and v for v in vals):
            return True
        return UNK if UNK in vals else WILD if WILD in vals else False

    def and_(self) -> object:
        vals = [self.cmp()]
        while self.peek() == "&&":
            self.take()
            vals.append(self.cmp())
        if len(vals) == 1:
            return vals[0]
        if any(v not in (WILD, UNK) and not v for v in vals):
            return False
        return UNK if UNK in vals else WILD if WILD in vals else True

    def cmp(self) -> object:
        left = self.unary()
        while self.peek() in ("==", "!=", "<", ">", "<=", ">="):
            op = self.take()
            right = self.unary()
            if left is UNK or right is UNK:
                left = UNK
            elif left is WILD or right is WILD:
                left = WILD
            else:
                a, b = int(left), int(right)  # type: ignore[call-overload]
                left = {"==": a == b, "!=": a != b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        return left

    def unary(self) -> object:
        tok = self.peek()
        if tok is None:
            return UNK
        if tok == "!":
            self.take()
            v = self.unary()
            return v if v in (WILD, UNK) else not v
        if tok == "(":
            self.take()
            v = self.or_()
            if self.peek() == ")":
                self.take()
            return v
        if tok == "defined":
            self.take()
            paren = self.peek() == "("
            if paren:
                self.take()
            name = self.take() if self.peek() else ""
            if paren and self.peek() == ")":
                self.take()
            return self._defined(name)
        self.take()
        if tok[0].isdigit():
            return int(tok.rstrip("uUlL"))
        if tok == "__CUDA_ARCH__":
            return self.arch.major * 100 + self.arch.minor * 10
        return WILD

    def _defined(self, name: str) -> object:
        if name == "__CUDA_ARCH__":
            return True
        m = _FEAT.fullmatch(name)
        if m:
            return WILD if int(m.group(1)) == self.arch.major * 10 + self.arch.minor else False
        return WILD


def evaluate(condition: str) -> frozenset[Arch] | None:
    """The archs whose device pass can take the branch; None when the condition does not parse."""
    tokens = [m.group(1) for m in _TOKEN.finditer(condition)]
    out = set()
    for arch in ARCHS:
        v = _Parser(tokens, arch).parse()
        if v is UNK:
            return None
        if v is WILD or v:
            out.add(arch)
    return frozenset(out)


@dataclass
class _Directive:
    line: int
    end_line: int
    kind: str
    condition: str
    scope: str


def _strip(line: str) -> str:
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    return line.split("//", 1)[0]


def directives(text: str) -> list[_Directive]:
    """`#if`/`#elif` lines (continuations joined) with the function or type they sit in."""
    out: list[_Directive] = []
    lines = text.splitlines()
    stack: list[str | None] = []
    pending: str | None = None
    in_comment = False
    i = 0
    while i < len(lines):
        raw = lines[i]
        start = i
        m = _DIRECTIVE.match(raw)
        if m:
            cond = m.group(2)
            while cond.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cond = cond.rstrip()[:-1] + " " + lines[i]
            cond = re.sub(r"/\*.*?\*/", " ", cond).split("//", 1)[0]
            scope = next((s for s in reversed(stack) if s), "")
            out.append(_Directive(start + 1, i + 1, m.group(1), cond.strip(), scope))
            i += 1
            continue
        line = raw
        if in_comment:
            if "*/" not in line:
                i += 1
                continue
            line = line.split("*/", 1)[1]
            in_comment = False
        line = re.sub(r"/\*.*?\*/", " ", line)
        if "/*" in line:
            line, in_comment = line.split("/*", 1)[0], True
        line = _strip(line)
        if not line.lstrip().startswith("#"):
            for tok_match in re.finditer(r"[{};]|\b(?:struct|class|namespace)\s+[A-Za-z_]\w*|[A-Za-z_]\w*\s*\(", line):
                tok = tok_match.group(0)
                if tok == "{":
                    stack.append(pending)
                    pending = None
                elif tok == "}":
                    if stack:
                        stack.pop()
                    pending = None
                elif tok == ";":
                    pending = None
                elif pending is None:
                    t = _TYPE.match(tok) or _FN.match(tok)
                    if t and t.group(1) not in _KEYWORDS and not t.group(1).startswith("__"):  # __launch_bounds__
                        pending = t.group(1)
        i += 1
    return out


def scan_text(package: str, rel: str, text: str) -> list[Site]:
    sites = []
    for d in directives(text):
        if "__CUDA_ARCH__" not in d.condition or not re.search(
            r"__CUDA_ARCH__\s*[<>=!]|[<>=!]=?\s*__CUDA_ARCH__", d.condition
        ):
            continue
        admits = evaluate(d.condition)
        norm = " ".join(d.condition.split())
        sites.append(
            Site(
                package=package,
                file=rel,
                function=d.scope or "<file>",
                line=d.line,
                end_line=d.end_line,
                test=f"#{d.kind} {norm}",
                kind="cuda-arch",
                admits=names(admits),
                path=names(admits),
                norm_test=f"cuda-arch:{norm}",
                norm_body=hashlib.sha1(f"{d.scope}".encode()).hexdigest()[:16],
                context=d.scope,
            )
        )
    return sites
