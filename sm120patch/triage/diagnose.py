"""Crash triage: name the cause of a server crash from its log, and the next command to run.

The log is read as a stream, one bounded line at a time, keeping only a short
window of preceding lines (to name e.g. the JIT module from the traceback), so
a multi-gigabyte log costs constant memory. Recipe crash signatures are checked
first: a recipe is implicated only when the journal says it is applied, or,
without journal information, flagged as "unknown" and said so. Then the
catalogue (patches/signatures.toml; per line the first matching signature wins).
A fatal line nothing names is answered from the log's structure (classes.py:
the cause class its words show, the library in the traceback, the architectures and
backend flags the log names), with exit 1 and a word on how thin that evidence is: a
fatal log is never answered with silence. Lines no matcher could care about are
skipped by one keyword search (prefilter.py). Each finding says whether the cause is SM12x
("yes" only on evidence that does not fit other GPUs, "maybe" with how to tell),
and its next step is in the flags of the framework that wrote the log (logkind.py).

JSON shape (`sm120patch diagnose --json`, `Diagnosis.to_dict()`):

    {
      "cause_found": bool,          # a fatal signature (or recipe) named the cause
      "exit_code": 0 | 1,           # 0 cause found or no fatal line; 1 only a class answers it
      "lines_read": int,
      "target": str | null,         # --target, used in the rollback commands
      "journal": "read" | "unknown",
      "framework": "sglang" | "vllm" | "tensorrt-llm" | "pytorch" | null,
      "gpu": {"gpu": "sm12x" | "other" | "mixed" | "unknown",
              "sm12x_evidence": {"line_no": int, "line": str} | null,
              "other_evidence": {"line_no": int, "line": str} | null},
      "findings": [                 # fatal first, then by line
        {
          "source": "recipe" | "catalogue" | "structure",
          "signature": str,         # catalogue id, the recipe's signature text, or "class:<class>"
          "class": str,             # cause class (classes.CLASSES)
          "evidence": "signature" | "class" | "thin",  # what the cause rests on
          "fatal": bool,
          "sm12x": "yes" | "maybe" | "no",  # is the cause SM12x, on this log's evidence
          "check": str,             # how to tell, when "maybe" (else "")
          "recipe_ids": [str],      # implicated recipes (empty for catalogue-only)
          "journal": "applied" | "unknown" | null,
          "meaning": str,           # one sentence
          "next_step": str,         # exact command or launch flag, for "framework"
          "line_no": int,           # 1-based, first occurrence
          "line": str,              # that line (ANSI colours stripped, clipped; render() shows its other
                                    # control characters as escapes, JSON escapes them all)
          "count": int,             # occurrences (ranks repeat the same error)
          "details": {str: str},    # named captures, e.g. majors, module; for "structure":
                                    # cue, library, flag, archs, cuda_error (those the log shows)
          "sources": [str],
          "notes": [str]
        }
      ],
      "unnamed_errors": [{"line_no": int, "line": str, "class": str}],  # last fatal lines nothing named
      "taken": [str],               # recipes whose `sm120patch: <id> taken` line the log holds, first taken first
      "taken_before_crash": [str],  # those taken before the first fatal line (empty without one); the
                                    # last is the gate whose path was running when it crashed
      "notes": [str]
    }
"""

from __future__ import annotations

import copy
import html
import re
import shlex
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from sm120patch import hints
from sm120patch.catalogue.recipes import Recipe
from sm120patch.errors import EXIT_FAILED, EXIT_OK
from sm120patch.status import APPLIED
from sm120patch.taken_line import taken_id
from sm120patch.triage import classes as triage_classes
from sm120patch.triage import fatal
from sm120patch.triage.logkind import LogKind
from sm120patch.triage.memo import LineMemo
from sm120patch.triage.prefilter import Prefilter
from sm120patch.triage.signatures import Signature, load_signatures
from sm120patch.triage.structure import StructureWatcher
from sm120patch.visible import visible

MAX_LINE = 64 * 1024  # bytes read per line; the rest of a longer line is skipped
CONTEXT_LINES = 40  # preceding lines kept to resolve a signature's context
SHOW_CHARS = 400  # characters of a log line kept in a finding
MAX_UNNAMED = 5
AFTER_LINES = 4  # non-empty lines kept after a fatal line: cuda-gdb and sanitizers name the kernel below the fault
AFTER_SPAN = 8  # ... within this many lines
MAX_AFTER_WATCH = 1024  # fatal lines whose following lines are kept (the first ones: a crash loop repeats them)
FULL_KIND_LINES = 5000  # lines whose framework marks are counted even when the prefilter skips them
MISSING = "not named in the log"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STRENGTH = {"no": 0, "maybe": 1, "yes": 2}
NO_GPU_INFO: dict[str, Any] = {"gpu": "unknown", "sm12x_evidence": None, "other_evidence": None}
GPU_CHECK = "nvidia-smi --query-gpu=name,compute_cap --format=csv (12.0 or 12.1 is SM12x)"
LOOK_FOR = (
    "the last 'Traceback (most recent call last)' block and the exception line under it",
    "lines with 'CUDA error', 'NCCL', 'Unsupported architecture' or 'supported on SM'",
    "rerun with CUDA_LAUNCH_BLOCKING=1 so the failing kernel is reported where it fails",
    "if it is an SM12x problem, add its text to patches/signatures.toml",
)


@dataclass
class LogLine:
    line_no: int
    line: str
    cls: str = ""  # generic class label, e.g. "CUDA error"


@dataclass
class Finding:
    """One named cause (or warning), first seen at `line_no`."""

    source: str  # "recipe" | "catalogue"
    signature: str
    fatal: bool
    meaning: str
    next_step: str
    line_no: int
    line: str
    recipe_ids: list[str] = field(default_factory=list)
    journal: str | None = None  # "applied" | "unknown" for recipe findings
    count: int = 1
    details: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sm12x: str = "maybe"  # "yes" | "maybe" | "no": is the cause SM12x, on this log's evidence
    check: str = ""  # how to tell, when "maybe"
    cls: str = "other"  # the cause class (classes.CLASSES)
    evidence: str = "signature"  # "signature" | "class" | "thin": what the cause rests on
    sig: Signature | None = field(default=None, repr=False, compare=False)
    # the log lines just before it (its traceback), kept once per finding: advice reads where it failed
    context: tuple[str, ...] = field(default=(), repr=False, compare=False)
    # the non-empty lines just after it: a debugger or sanitizer names the faulting kernel there
    after: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "signature": self.signature,
            "class": self.cls,
            "evidence": self.evidence,
            "fatal": self.fatal,
            "sm12x": self.sm12x,
            "check": self.check,
            "recipe_ids": list(self.recipe_ids),
            "journal": self.journal,
            "meaning": self.meaning,
            "next_step": self.next_step,
            "line_no": self.line_no,
            "line": self.line,
            "count": self.count,
            "details": dict(self.details),
            "sources": list(self.sources),
            "notes": list(self.notes),
        }


@dataclass
class Diagnosis:
    findings: list[Finding]
    lines_read: int
    unnamed_errors: list[LogLine]
    journal: str  # "read" | "unknown"
    target: Path | None = None
    notes: list[str] = field(default_factory=list)
    framework: str | None = None
    gpu: dict[str, Any] = field(default_factory=lambda: dict(NO_GPU_INFO))
    taken_lines: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, recipe id): the taken lines

    @property
    def crash_line(self) -> int | None:
        """The first fatal line (a fatal finding's or one no signature names), None without one."""
        lines = [f.line_no for f in self.findings if f.fatal] + [e.line_no for e in self.unnamed_errors]
        return min(lines) if lines else None

    @property
    def taken(self) -> list[str]:
        return list(dict.fromkeys(rid for _, rid in self.taken_lines))

    @property
    def taken_before_crash(self) -> list[str]:
        """Recipes whose gate was taken before the crash, first taken first (sm120patch/taken_line.py)."""
        crash = self.crash_line
        if crash is None:
            return []
        return list(dict.fromkeys(rid for n, rid in self.taken_lines if n < crash))

    @property
    def last_taken_before_crash(self) -> tuple[int, str] | None:
        """(line, id) of the last taken line before the crash: the gate whose path was running."""
        crash = self.crash_line
        before = [t for t in self.taken_lines if crash is not None and t[0] < crash]
        return before[-1] if before else None

    @property
    def causes(self) -> list[Finding]:
        return [f for f in self.findings if f.fatal]

    @property
    def cause_found(self) -> bool:
        """A signature or recipe named the cause (a structural class alone is not a named cause)."""
        return any(f.source != "structure" for f in self.causes)

    @property
    def implicated_recipes(self) -> list[str]:
        """Recipes to roll back: implicated by a fatal finding and applied per the journal."""
        ids: list[str] = []
        for f in self.causes:
            if f.journal == APPLIED:
                ids.extend(r for r in f.recipe_ids if r not in ids)
        return ids

    @property
    def exit_code(self) -> int:
        """0: a signature named the cause, or the log shows no failure; 1: only a class (or nothing) answers it."""
        if self.cause_found:
            return EXIT_OK
        return EXIT_FAILED if self.unnamed_errors or self.causes else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause_found": self.cause_found,
            "exit_code": self.exit_code,
            "lines_read": self.lines_read,
            "target": str(self.target) if self.target else None,
            "journal": self.journal,
            "framework": self.framework,
            "gpu": dict(self.gpu),
            "findings": [f.to_dict() for f in self.findings],
            "unnamed_errors": [{"line_no": e.line_no, "line": e.line, "class": e.cls} for e in self.unnamed_errors],
            "taken": self.taken,
            "taken_before_crash": self.taken_before_crash,
            "notes": list(self.notes),
        }

    def render(self) -> str:
        """Human-readable report: each finding with its line, meaning, SM12x verdict and next command."""
        out: list[str] = []
        n = len(self.findings)
        if n:
            fw = f" ({self.framework} log)" if self.framework else ""
            out.append(f"{n} finding{'s' if n > 1 else ''} in {self.lines_read} log lines{fw}:")
        for f in self.findings:
            label = "FATAL" if f.fatal else "warning"
            if f.source == "structure":
                label += ", by class" + (" (thin evidence)" if f.evidence == "thin" else "")
            seen = f", seen {f.count}x" if f.count > 1 else ""
            out.append(f"[{label}] {f.signature} (line {f.line_no}{seen})")
            out.append(f"  log:     {f.line}")
            if f.recipe_ids:
                state = "applied, per the journal" if f.journal == APPLIED else "journal unknown"
                out.append(f"  recipe:  {', '.join(f.recipe_ids)} ({state})")
            out.append(f"  class:   {f.cls}")
            out.append(f"  meaning: {f.meaning}")
            out.append(f"  SM12x:   {_verdict_text(f)}")
            out.append(f"  next:    {f.next_step}")
            if f.details:
                out.append("  details: " + " ".join(f"{k}={v}" for k, v in f.details.items()))
            for note in f.notes:
                out.append(f"  note:    {note}")
            if f.sources:
                out.append(f"  sources: {' '.join(f.sources)}")
        if self.unnamed_errors:
            if self.cause_found:
                out.append("Fatal lines no signature names (see the cause above first):")
            else:
                out.append(
                    f"No known crash signature names the fatal error in {self.lines_read} "
                    "log lines; the last fatal lines, by generic class:"
                )
            out.extend(f"  line {e.line_no} [generic: {e.cls}]: {e.line}" for e in self.unnamed_errors)
        elif not self.cause_found:
            out.append(f"No known crash signature and no fatal lines in {self.lines_read} log lines.")
        if not self.cause_found:
            out.append("Look for:")
            out.extend(f"  - {hint}" for hint in LOOK_FOR)
        last = self.last_taken_before_crash
        if last is not None:
            others = [r for r in self.taken_before_crash if r != last[1]]
            also = f" (taken before it: {', '.join(others)})" if others else ""
            out.append(
                f"taken:   {last[1]} was the last gate taken before the crash (its taken line {last[0]}, "
                f"the crash line {self.crash_line}): its path was running{also}"
            )
        out.extend(f"note: {note}" for note in self.notes)
        # log text may hold any control character (OSC, DCS, C1 CSI, BS, CR, BEL): shown, never sent raw
        return "\n".join(visible(line) for line in out)


# A log as pasted into a forum or scraped from a page: Markdown-escaped underscores (sm\_120), HTML entities,
# non-breaking spaces and full-width colons ("RuntimeError：") are read as the text they stand for.
_ENTITY = re.compile(r"&(?:quot|#39|#x27|apos|gt|lt|amp|nbsp);")
_WIDE = str.maketrans({"\u00a0": " ", "\uff1a": ":", "\u3000": " ", "\uff08": "(", "\uff09": ")"})


def _normalize(line: str) -> str:
    if "\\_" in line:
        line = line.replace("\\_", "_")
    if "&" in line and _ENTITY.search(line):
        line = html.unescape(line)
    if not line.isascii():
        line = line.translate(_WIDE)
    return line


def _verdict_text(f: Finding) -> str:
    if f.sm12x == "yes":
        return "yes, an SM12x (SM120/SM121) problem"
    if f.sm12x == "no":
        return "no, not an SM12x architecture problem"
    return f"could be SM12x, or another GPU; how to tell: {f.check or GPU_CHECK}"


def _clip(text: str) -> str:
    return text if len(text) <= SHOW_CHARS else text[: SHOW_CHARS - 3] + "..."


def _fill(template: str, details: dict[str, str]) -> str:
    class _Default(dict):
        def __missing__(self, key: str) -> str:
            return MISSING

    return template.format_map(_Default(details))


def rollback_command(target: Path | None, recipe_ids: Sequence[str]) -> str:
    """The exact rollback command(s) for the recipes, one per recipe joined with &&."""
    if target is None:  # a placeholder the user fills in: not quoted
        return " && ".join(f"sm120patch rollback TARGET --recipe {shlex.quote(r)}" for r in recipe_ids)
    return " && ".join(hints.rollback_command(target, [r]) for r in recipe_ids)


class Diagnoser:
    """Incremental matcher: feed lines one at a time (guard watches a live server this way)."""

    def __init__(
        self,
        recipes: Iterable[Recipe],
        journal_applied: set[str] | None,
        signatures: Sequence[Signature] | None = None,
        target: Path | None = None,
        prefilter: bool = True,
    ) -> None:
        self.applied = journal_applied
        self.target = target
        self.signatures = list(load_signatures() if signatures is None else signatures)
        self.kind = LogKind()
        self._recipes = {r.id: r for r in recipes}
        self._recipe_sigs = [(r.id, s) for r in self._recipes.values() for s in r.crash_signatures]
        self._context: deque[str] = deque(maxlen=CONTEXT_LINES)
        self._findings: dict[tuple[str, str, tuple[str, ...]], Finding] = {}
        self._errors: deque[LogLine] = deque(maxlen=MAX_UNNAMED)
        self._notes: list[str] = []
        self.lines_read = 0
        self._after_fatal = False
        self.structure = StructureWatcher()
        self._line_matches = LineMemo(self._matches)  # a crash loop's log repeats its lines
        words = [text for _, text in self._recipe_sigs] + list(triage_classes.LIBRARY_WORDS)
        self._prefilter = Prefilter(words) if prefilter else None
        self._taken: list[tuple[int, str]] = []  # (line, recipe id) of each taken line
        self._after: dict[int, list[str]] = {}  # fatal line number -> the lines after it (AFTER_LINES)
        self._collecting: list[tuple[list[str], list[int]]] = []  # (lines, [lines still to read]) still open

    def feed(self, raw: str) -> list[Finding]:
        """Match one log line; returns findings seen for the first time on this line."""
        self.lines_read += 1
        line = raw.rstrip("\r\n")
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        line = _normalize(line)
        if self._collecting:
            self._collect_after(line)
        if "sm120patch: " in line and "taken" in line:
            rid = taken_id(line)
            if rid is not None:
                self._taken.append((self.lines_read, rid))
                self._context.append(line)
                return []
        after_fatal, self._after_fatal = self._after_fatal, False
        if after_fatal:  # a fatal message may go on in this line (and the next), whatever words it has
            self._after_fatal = self.structure.continuation(self.lines_read, line, self._context)
        if self._prefilter is not None and not self._prefilter.passes(line):
            if self.lines_read <= FULL_KIND_LINES:
                self.kind.feed_marks(line)  # framework marks are in every line of some logs
            self._context.append(line)
            return []
        self.kind.feed(self.lines_read, line)
        self.structure.feed(self.lines_read, line)
        new: list[Finding] = []
        catalogue, hit_recipes = self._line_matches(line)
        implicated, absent = self._split_by_journal(hit_recipes)
        if implicated:
            new += self._add_recipe_finding(line, implicated, catalogue)
        else:
            for sig, match in catalogue:
                new += self._add_catalogue_finding(line, sig, match, absent)
            if absent and not catalogue:
                self._note_once(
                    f"line {self.lines_read} matches the crash signature of "
                    f"{', '.join(absent)}, which the journal shows is not applied"
                )
        if not catalogue and not implicated:
            cls = fatal.classify(line)
            if cls is not None:
                self._errors.append(LogLine(self.lines_read, _clip(line.strip()), cls.label))
                self.structure.fatal_line(self.lines_read, line, self._context)
                self._after_fatal = True
                self._watch_after()
            else:
                self.structure.other_line(self.lines_read, line, self._context)
        if new:
            self._watch_after()
        self._context.append(line)
        return new

    def _watch_after(self) -> None:
        """Keep the lines that follow this one (the first MAX_AFTER_WATCH fatal lines only: bounded memory)."""
        if len(self._after) < MAX_AFTER_WATCH and self.lines_read not in self._after:
            kept: list[str] = []
            self._after[self.lines_read] = kept
            self._collecting.append((kept, [AFTER_SPAN]))

    def _collect_after(self, line: str) -> None:
        text = _clip(line.strip())
        still = []
        for kept, left in self._collecting:
            if text:
                kept.append(text)
            left[0] -= 1
            if left[0] > 0 and len(kept) < AFTER_LINES:
                still.append((kept, left))
        self._collecting = still

    def result(self) -> Diagnosis:
        """The diagnosis so far; verdicts and advice use everything the log has shown."""
        framework = self.kind.framework
        resolved = [self._resolve(f, framework) for f in self._findings.values()]
        errors, structure = list(self._errors), self.structure
        if not any(f.fatal for f in resolved) and not errors:
            errors, structure = self._tail_failure()
        if not any(f.fatal for f in resolved):
            resolved += self._structural_findings(structure)
        elif all(f.cls not in triage_classes.SM12X_CLASSES for f in resolved if f.fatal):
            # the catalogue named only a symptom (an import error, NCCL): a fatal line that says in so many
            # words that an SM12x arch path failed is the cause too
            resolved += [f for f in self._structural_findings() if f.sm12x == "yes" and f.evidence == "class"]
        findings = sorted(resolved, key=lambda f: (not f.fatal, f.line_no))
        notes = list(self._notes)
        if self.applied is None and self._recipe_sigs:
            notes.append(
                "no journal information: recipes matching the log are flagged 'journal unknown'; "
                "pass --target PATH to check which are applied"
            )
        info = self.kind.to_dict()
        return Diagnosis(
            findings=findings,
            lines_read=self.lines_read,
            unnamed_errors=errors,
            journal="unknown" if self.applied is None else "read",
            target=self.target,
            notes=notes,
            framework=framework,
            gpu={k: info[k] for k in ("gpu", "sm12x_evidence", "other_evidence")},
            taken_lines=list(self._taken),
        )

    # -- internals -------------------------------------------------------

    def _matches(self, line: str) -> tuple[list[tuple[Signature, re.Match[str]]], list[str]]:
        """The catalogue match and the recipes whose crash signature the line holds: a function of the text."""
        return self._match(line), sorted({rid for rid, text in self._recipe_sigs if text in line})

    def _match(self, line: str) -> list[tuple[Signature, re.Match[str]]]:
        """The first catalogue signature (file order: most specific first) that matches.

        A line logged at INFO/WARNING level is never a fatal cause (vLLM warns "CUDA out of
        memory occurred when warming up" on runs that go on): guard must not stop a server for it.
        """
        _, quiet = fatal.strip_prefix(line)
        for sig in self.signatures:
            if quiet and sig.fatal and not sig.any_level:
                continue
            m = sig.search(line)
            if m:
                return [(sig, m)]
        return []

    def _tail_failure(self) -> tuple[list[LogLine], StructureWatcher]:
        """No line was fatal, but the log ends on one that says the run failed ("status: 1", "returned -6"): it
        is a fatal error nothing names (exit 1), answered by class from a copy of the watcher (result() may be
        asked again while the log goes on)."""
        last = list(self._context)
        i = fatal.tail_failure(last)
        if i is None:
            return [], self.structure
        line_no, line = self.lines_read - (len(last) - 1 - i), last[i]
        structure = copy.deepcopy(self.structure)
        structure.fatal_line(line_no, line, last[:i])
        return [LogLine(line_no, _clip(line.strip()), "the log ends on an error nothing names")], structure

    def _structural_findings(self, structure: StructureWatcher | None = None) -> list[Finding]:
        """No signature named a fatal line: answer from the log's structure, at the level it supports."""
        a = (structure or self.structure).answer(self.kind, self._context)
        if a is None:
            return []
        p = a.pick
        return [
            Finding(
                source="structure",
                signature=f"class:{p.cls}",
                fatal=True,
                meaning=p.meaning(),
                next_step=triage_classes.next_step(p.cls, p.library, p.flag, p.op, self.kind.framework),
                line_no=p.line_no,
                line=p.line,
                details=a.details,
                notes=a.notes,
                sm12x=a.verdict,
                check=a.check,
                cls=p.cls,
                evidence="thin" if p.thin else "class",
                context=p.context,
                after=tuple(self._after.get(p.line_no, ())),
            )
        ]

    def _resolve(self, f: Finding, framework: str | None) -> Finding:
        """Settle "maybe" with the GPU the log shows, and put the advice in the framework's flags."""
        verdict, notes = f.sm12x, list(f.notes)
        if f.source == "recipe" and f.journal == APPLIED:
            verdict = "yes"  # the journal shows sm120patch opened an SM12x gate there
        elif verdict == "yes" and f.cls == "toolchain-lacks-arch" and self.kind.gpu != "sm12x":
            verdict, why = self._compile_target(f)
            if why:
                notes.append(why)
        elif verdict == "maybe" and not (f.sig is not None and f.sig.pinned(f.details)):
            gpu = self.kind.gpu
            if f.cls not in triage_classes.SM12X_CLASSES:
                pass  # NCCL, OOM, a missing module: the GPU shown does not make them an architecture cause
            elif gpu == "sm12x" and self.kind.sm12x_gpu:
                ev = self.kind.sm12x_gpu
                notes.append(f"the log shows an SM12x GPU (line {ev.line_no}: {ev.line})")
                if f.cls != "kernel-fault" or self.structure.evidence.sm12x_token_near(f.line_no):
                    verdict = "yes"
                else:  # a faulting kernel on an RTX 5090 is as often a plain bug as an SM12x path
                    notes.append("a kernel fault happens on any GPU: the GPU alone does not make it an SM12x cause")
            elif gpu == "other" and self.kind.other_gpu and not self.structure.evidence.sm12x_token_near(f.line_no):
                verdict = "no"
                ev = self.kind.other_gpu
                notes.append(f"the log shows a GPU that is not SM12x (line {ev.line_no}: {ev.line})")
        sig = f.sig
        details = dict(f.details)
        if sig is not None:
            sig.judge(details)  # adds the {group}_means texts the templates may use
            if sig.pinned(f.details):  # say why the verdict stays as the value has it
                notes += [v for k, v in details.items() if k.endswith("_means") and v not in f.meaning]
        step = f.next_step if f.source == "recipe" or sig is None else _fill(sig.next_step_for(framework), details)
        shown = dict(f.details)
        if f.fatal and f.source == "catalogue" and "library" not in shown:
            # the library whose frame or .so the failing line (or the traceback above it) names: where to act
            lib = triage_classes.library_in(f.line) or self.structure.evidence.library_near(f.line_no, after=2)
            if lib in (None, "torch", "vllm", "sglang"):
                lib = self.structure.evidence.package_near(f.line_no, after=2) or lib
            if lib is not None and lib not in ("torch", "vllm", "sglang"):
                shown["library"] = lib
        check = ""
        if verdict == "maybe":
            check = _fill(sig.check, details) if sig is not None and sig.check else GPU_CHECK
        after = tuple(self._after.get(f.line_no, ()))
        return replace(f, sm12x=verdict, next_step=step, check=check, notes=notes, details=shown, after=after)

    def _compile_target(self, f: Finding) -> tuple[str, str]:
        """A compiler refusing an SM12x arch names what the build targets, not the GPU it runs on: a build's
        arch list may hold 12.x on any machine. Kept "yes" unless the log shows another GPU or such a list."""
        ev = self.kind.other_gpu
        if self.kind.gpu == "other" and ev is not None:
            return "no", f"the SM12x arch is a compile target; the log shows a GPU that is not SM12x ({ev.line})"
        listed = self.structure.evidence.arch_list
        if listed is not None:
            return "maybe", (
                f"the SM12x arch is one of a build's target list (line {listed[0]}: {listed[1][:120]}), "
                "which names no GPU: the toolchain lacks it whatever the GPU is"
            )
        return "yes", ""

    def _split_by_journal(self, ids: list[str]) -> tuple[list[str], list[str]]:
        if self.applied is None:
            return ids, []
        return [r for r in ids if r in self.applied], [r for r in ids if r not in self.applied]

    def _note_once(self, note: str) -> None:
        if note not in self._notes and len(self._notes) < 20:
            self._notes.append(note)

    def _details(self, line: str, sig: Signature, match: re.Match[str]) -> tuple[dict[str, str], str]:
        """Named captures (and context captures), and this match's SM12x verdict."""
        details = {k: v.strip() for k, v in match.groupdict().items() if v}
        if sig.context is not None:
            for text in (line, *reversed(self._context)):
                m = sig.context.search(text)
                if m:
                    details.update({k: v for k, v in m.groupdict().items() if v and k not in details})
                    break
        verdict = sig.judge(details)
        return details, verdict

    @staticmethod
    def _shown(details: dict[str, str]) -> dict[str, str]:
        """Captures as shown in a finding: the value explanations are already in its meaning."""
        return {k: v for k, v in details.items() if not k.endswith("_means")}

    def _bump(self, key: tuple[str, str, tuple[str, ...]], make: Any, verdict: str | None = None) -> list[Finding]:
        found = self._findings.get(key)
        if found is not None:
            found.count += 1
            if verdict is not None and _STRENGTH[verdict] > _STRENGTH[found.sm12x]:
                found.sm12x = verdict  # a later line of the same cause says more (it names sm_120)
            return []
        finding = make()
        self._findings[key] = finding
        return [finding]

    def _add_recipe_finding(
        self, line: str, ids: list[str], catalogue: list[tuple[Signature, re.Match[str]]]
    ) -> list[Finding]:
        sig, match = catalogue[0] if catalogue else (None, None)
        text = next(t for rid, t in self._recipe_sigs if rid in ids and t in line)
        name = sig.id if sig else text
        journal = "unknown" if self.applied is None else APPLIED

        def make() -> Finding:
            details, verdict = self._details(line, sig, match) if sig and match else ({}, "maybe")
            titles = ", ".join(f"{r} ({self._recipes[r].title})" for r in ids)
            meaning = (
                _fill(sig.meaning, details)
                if sig
                else (
                    f"The crash signature of {titles} matched: the gate it opened has no working kernels on this GPU."
                )
            )
            command = rollback_command(self.target, ids)
            if journal == APPLIED:
                step = command
            else:
                hint = "" if self.target else " (add --target PATH to check the journal)"
                step = f"If you applied {', '.join(ids)}: {command}{hint}"
            notes = [f"implicated recipe: {titles}"]
            notes += [f"{r}: {' '.join(self._recipes[r].advice.split())}" for r in ids if self._recipes[r].advice]
            return Finding(
                source="recipe",
                signature=name,
                fatal=True,
                meaning=meaning,
                next_step=step,
                line_no=self.lines_read,
                line=_clip(line.strip()),
                recipe_ids=list(ids),
                journal=journal,
                details=self._shown(details),
                sources=list(sig.sources) if sig else [],
                notes=notes,
                sm12x=verdict,
                cls=sig.cls if sig else "arch-path-unsupported",
                sig=sig,
                context=tuple(self._context),
            )

        return self._bump(("recipe", name, tuple(ids)), make)

    def _add_catalogue_finding(
        self, line: str, sig: Signature, match: re.Match[str], absent: list[str]
    ) -> list[Finding]:
        details, verdict = self._details(line, sig, match)

        def make() -> Finding:
            notes = [f"also the crash signature of recipe {r}, which the journal shows is not applied" for r in absent]
            return Finding(
                source="catalogue",
                signature=sig.id,
                fatal=sig.fatal_for(details),
                meaning=_fill(sig.meaning, details),
                next_step=_fill(sig.next_step, details),
                line_no=self.lines_read,
                line=_clip(line.strip()),
                details=self._shown(details),
                sources=list(sig.sources),
                notes=notes,
                sm12x=verdict,
                cls=sig.cls,
                sig=sig,
                context=tuple(self._context),
            )

        return self._bump(("catalogue", sig.id, ()), make, verdict)


def diagnose(
    lines: Iterable[str],
    recipes: Iterable[Recipe],
    journal_applied: set[str] | None,
    *,
    signatures: Sequence[Signature] | None = None,
    target: Path | None = None,
    prefilter: bool = True,
) -> Diagnosis:
    """Diagnose a whole log, streaming: `lines` may be an open file of any size."""
    d = Diagnoser(recipes, journal_applied, signatures, target, prefilter=prefilter)
    for line in lines:
        d.feed(line)
    return d.result()


def read_lines(stream: IO[bytes], max_line: int = MAX_LINE) -> Iterator[str]:
    """Decode a binary stream line by line, never holding more than `max_line` bytes of one line.

    A longer line yields its first `max_line` bytes; the rest is skipped.
    """
    while True:
        chunk = stream.readline(max_line)
        if not chunk:
            return
        if not chunk.endswith(b"\n") and len(chunk) == max_line:
            rest = chunk
            while rest and not rest.endswith(b"\n"):
                rest = stream.readline(max_line)
        yield chunk.decode("utf-8", errors="replace")
