"""Watch a log's structure while diagnose reads it, and answer by cause class when no signature does.

Per line diagnose tells the watcher what kind of line it is: a fatal line no signature named
(its words may show a class; if not, the lines just before it may), or another line (which
answers a log without any fatal line only if it says a build or toolchain lacks the GPU, or, when
not logged at INFO/WARNING, shows an architecture class or OOM). At the end the strongest of
those becomes one answer, with the evidence it rests on ("class" or "thin") and an SM12x verdict
no stronger than the log (classes.py has the classes and the cues).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sm120patch.triage import classes as triage_classes
from sm120patch.triage import fatal
from sm120patch.triage.classes import StructureFinding
from sm120patch.triage.logkind import LogKind

SHOW_CHARS = 400
FRAMES_AFTER = 4  # C++ backtraces ("at lib::fn_sm120") and sanitizers name the code below the message
_TRACEBACK_HEAD = re.compile(r"^.{0,80}Traceback \(most recent call last\):?\s*$")
CUT_OFF_CHECK = (
    "the log ends inside a traceback, before its exception line, so the cause is not in it: paste the lines "
    "after the last frame (the traceback's last line names the error)"
)
CONTEXT_CUE_LINES = 12  # lines before a bare fatal line searched for the class its words do not show
CONTEXT_KEPT = 40  # lines before a structural cause kept with it (its traceback), as diagnose keeps them
# classes a line before a bare exception may show (NCCL INFO chatter and import noise are everywhere)
CONTEXT_CLASSES = frozenset(
    {
        "toolchain-lacks-arch",
        "binary-lacks-arch",
        "resource-limit",
        "arch-path-unsupported",
        "kernel-fault",
        "out-of-memory",
    }
)
FAULT_CAUSES = frozenset({"toolchain-lacks-arch", "binary-lacks-arch", "resource-limit", "arch-path-unsupported"})
BUILD_BOUND = frozenset({"tensorrt"})  # libraries whose arch support is fixed per release (no JIT, no other path)
WARNING_CLASSES = frozenset({"binary-lacks-arch", "toolchain-lacks-arch"})  # an INFO/WARNING line may show these
# which class answers when several lines show one (an architecture cause first: a missed SM12x crash is worse)
ORDER = (
    "toolchain-lacks-arch",
    "binary-lacks-arch",
    "resource-limit",
    "arch-path-unsupported",
    "kernel-fault",
    "out-of-memory",
    "communication",
    "environment",
    "other",
)
# a line that starts a new record rather than going on with the one before (a frame, a level, a timestamp)
_NEW_RECORD = re.compile(
    r"^\s*(?:File \"|Traceback|During handling|The above exception|\[?\d{4}-\d\d-\d\d|\(\w+ pid=\d+\)|"
    r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\b|[EWIF]\d{4} |\w+(?:\.\w+)*(?:Error|Exception|Warning):)"
)
JOIN_LINES = 3  # a message wrapped at a terminal's width is read as one over this many lines
# a name never bound (an if/elif chain on the arch with no branch for this GPU), or a lookup that missed
_UNBOUND = re.compile(r"\b(?:NameError|UnboundLocalError|KeyError)\b")
_PTX_ISA = re.compile(r"PTX ISA|\.version \d|PTX version")
# a failing line that names a GPU kernel operation (a GEMM, a MoE runner, a cubin, a quantized format's kernel):
# it comes from a kernel library even when no library is named, so it is read as one
KERNEL_OP = re.compile(
    r"\b(?:GEMMs?|[Gg]emm\w*|GEMV|[Gg]emv\w*|MoE|[Mm]oe_\w+|cubins?|CUTLASS|[Tt]actics?|NVFP4|MXFP4|FP4|FP8|"
    r"nvfp4|mxfp4|fp4|fp8|e2m1|e4m3|e5m2|mxfp6|mxfp8|[Gg]rouped[_ ][Gg]emm\w*|backends?)\b"
)
# a CUDA call in a kernel's own source (foo.cu:123) that returned "invalid argument": a launch the GPU refused,
# on SM12x most often a shared-memory size above its 99 KB per block
_CU_INVALID_ARGUMENT = re.compile(
    r"\.cuh?:\d+\b.{0,200}\b(?:invalid argument|cudaErrorInvalidValue|CUDA_ERROR_INVALID_VALUE)\b|"
    r"\b(?:invalid argument|cudaErrorInvalidValue|CUDA_ERROR_INVALID_VALUE)\b.{0,120}\.cuh?:\d+\b|"
    # a kernel launch the GPU refused with invalid argument (a launch's size or shared memory past what it has)
    r"\b(?:kernel launch|launch(?:ing)? (?:the |of )?(?:\w+ )?kernel|cuLaunchKernel\w*|cudaLaunchKernel\w*)\b.{0,120}"
    r"\b(?:invalid argument|cudaErrorInvalidValue|CUDA_ERROR_INVALID_VALUE)\b|"
    # a bare CUDA error with nothing but the runtime's "invalid argument" (no call, no GPU shown): said thinly
    r"\bCUDA[ _]?error\W{0,3}(?:\d+\W{0,3})?(?:invalid argument|cudaErrorInvalidValue)\W*$",
    re.I,
)
# an API server's tail after its engine, scheduler or worker process died: the cause is in that process's own
# lines, which the log does not hold; the answer says where to look instead of guessing a class
_ENGINE_DEAD = re.compile(
    r"\bEngineDeadError\b|\bEngineCore\w* encountered an (?:issue|error)\b|"
    # the same at startup: "Engine core initialization failed. See root cause above", a worker failed to start
    r"\b[Ee]ngine (?:core )?initiali[sz]ation failed\b|\bFailed core proc|"
    r"\b(?:worker|engine|process)e?s? (?:\w+ )?failed (?:during|at|on) (?:startup|start-up|initiali[sz]ation)\b|"
    r"\b(?:engine|engine core|scheduler|worker|detokenizer|model runner)(?: process)? (?:has )?"
    r"(?:died|is dead|exited unexpectedly|crashed)\b",
    re.I,
)
# a file the code tried to open and could not (an arch-specific kernel source or cubin the package lacks)
_MISSING_FILE = re.compile(r"(?i)\bfailed to open\b|no such file|cannot open|could not open|file not found")
GPU_CHECK = "nvidia-smi --query-gpu=name,compute_cap --format=csv (12.0 or 12.1 is SM12x)"
_FRAMEWORKS = (None, "torch", "vllm", "sglang")
_BARE_WORDS = ("ptxas", "nvcc", "nvrtc")  # a tool's name alone in a line that is not an error says nothing
# ... unless the line says something against it ("ptxas does not support CC 9.0", "ptxas too old")
_COMPLAINT = re.compile(
    r"(?i:too old|does not support|doesn't support|not support|unsupported|unknown|not defined|not recognized|"
    r"\berror\b|\bfatal\b|\bfailed\b|cannot|can't)"
)


def _clip(text: str) -> str:
    return text if len(text) <= SHOW_CHARS else text[: SHOW_CHARS - 3] + "..."


@dataclass
class Answer:
    """The structural answer, ready to become a finding."""

    pick: StructureFinding
    verdict: str
    check: str
    notes: list[str]

    @property
    def details(self) -> dict[str, str]:
        p = self.pick
        out = {"cue": p.cue} if p.cue else {}
        if p.library:
            out["library"] = p.library
        if p.flag:
            out["flag"] = f"{p.flag[0]} {p.flag[1]}"
        if p.archs:
            out["archs"] = ", ".join(p.archs)
        if p.cuda_error:
            out["cuda_error"] = p.cuda_error
        return out


@dataclass
class StructureWatcher:
    evidence: triage_classes.Evidence = field(default_factory=triage_classes.Evidence)
    _named: dict[str, StructureFinding] = field(default_factory=dict)  # class -> first fatal line showing it
    _before: dict[str, StructureFinding] = field(default_factory=dict)  # class shown just before a bare line
    _other: dict[str, StructureFinding] = field(default_factory=dict)  # class shown by a line that is not fatal
    _bare: tuple[int, str] | None = None  # the last fatal line whose words show no class
    _bare_lead: str = ""  # the line just before it (a message split over two fatal lines: "foo.cu:12" / "error")
    _joined: tuple[int, str, int] | None = None  # a bare line being joined with the lines after it: (no, text, n)
    _skipped: StructureFinding | None = None  # a build that skipped kernels for want of an arch (SKIPPED_BUILD)
    _dispatch: StructureFinding | None = None  # a name left unbound in code that picks by the arch
    _fault_cause: dict[str, StructureFinding] = field(default_factory=dict)  # arch class shown before a fault

    def feed(self, line_no: int, line: str) -> None:
        self.evidence.feed(line_no, line)

    def fatal_line(self, line_no: int, line: str, context: Sequence[str]) -> None:
        """A fatal line no signature named: keep the first per class its words (or the lines before) show."""
        body = fatal.unglue(fatal.strip_prefix(line)[0])  # "dtype=e2m1Aborted": the token before the fatal word
        got = triage_classes.classify_line(body)
        if got is not None:
            if got[0] not in self._named:
                thin = triage_classes.thin_cue(got[1])
                self._named[got[0]] = self._finding(got[0], got[1], line_no, line, context, thin=thin)
            if got[0] == "kernel-fault":  # a symptom: a line just before may name the arch path that faulted
                self._cause_before(line_no, line, context)
            return
        self._bare = (line_no, line)
        self._bare_lead = list(context)[-1].strip() if context else ""
        self._joined = (line_no, body.rstrip(), 1)
        if self._dispatch is None and _UNBOUND.search(line):
            code = [b for b in list(context)[-3:] if not b.lstrip().startswith(('File "', "Traceback"))]
            hit = next((m for b in reversed(code) for m in [triage_classes.ARCH_DISPATCH.search(b)] if m), None)
            if hit is not None:
                cue = f"a name left unset in code that picks by the arch ({hit.group(0)})"
                self._dispatch = self._finding("arch-path-unsupported", cue, line_no, line, context, thin=True)
        for before in reversed(list(context)[-CONTEXT_CUE_LINES:]):  # the lines that led up to it
            got = triage_classes.classify_line(fatal.strip_prefix(before)[0])
            if got is not None and got[0] in CONTEXT_CLASSES and got[0] not in self._before:
                cue = f"{got[1]} (in a line before it: {_clip(before.strip())[:160]})"
                self._before[got[0]] = self._finding(got[0], cue, line_no, line, context, thin=True)
                break

    def continuation(self, line_no: int, line: str, context: Sequence[str]) -> bool:
        """The lines right after a bare fatal line: a message wrapped or split ("Failed to set the allowed
        dynamic shared" / "memory size to 196608", or over three lines at a terminal's width) shows its class
        only when they are read as one. True while the next line may still go on with it."""
        if self._bare is None or self._joined is None or not line.strip() or _NEW_RECORD.match(line):
            return False
        bare_no, bare = self._bare
        start, text, n = self._joined
        if start != bare_no or bare_no + n != line_no:
            return False
        joined = text + " " + line.strip()
        self._joined = (start, joined, n + 1)
        got = triage_classes.classify_line(joined)
        if got is not None:
            if got[0] not in self._named:
                cue = f"{got[1]} (the message goes on in the next line{'s' if n > 1 else ''})"
                self._named[got[0]] = self._finding(got[0], cue, bare_no, bare, context, thin=False)
            return False
        return n + 1 < JOIN_LINES

    def _cause_before(self, line_no: int, line: str, context: Sequence[str]) -> None:
        """An architecture class shown, with an arch token, in the lines just before a kernel fault."""
        for before in reversed(list(context)[-CONTEXT_CUE_LINES:]):
            body = fatal.strip_prefix(before)[0]
            got = triage_classes.classify_line(body)
            if got is None or got[0] not in FAULT_CAUSES or not triage_classes.has_arch_token(body):
                continue
            if got[0] not in self._fault_cause:
                cue = f"{got[1]} (in a line before the fault: {_clip(before.strip())[:160]})"
                self._fault_cause[got[0]] = self._finding(got[0], cue, line_no, line, context, thin=False)
            return

    def other_line(self, line_no: int, line: str, context: Sequence[str]) -> None:
        """A line that is not fatal but says a build or toolchain lacks the GPU (bitsandbytes "compiled
        without GPU support", XLA "No PTX compilation provider"): the answer when no line is fatal."""
        if line.lstrip().startswith('File "'):
            return  # a traceback frame says where, not what
        body, quiet = fatal.strip_prefix(line)
        got = triage_classes.classify_line(body)
        if got is None or got[0] in self._other:
            return
        if got[1].lower() in _BARE_WORDS and not _COMPLAINT.search(body):
            return  # "Used ptxas at ptxas": the tool named, nothing said against it
        if triage_classes.SKIPPED_BUILD.search(body):  # a build for another GPU skips kernels too: only when the
            if self._skipped is None:  # log targets SM12x does it say the build lacks this GPU (answer() checks)
                cue = f"{got[1]} (a build that skipped kernels for want of a matching arch)"
                self._skipped = self._finding(got[0], cue, line_no, line, context, thin=True)
            return
        unreachable = got[0] == "environment" and triage_classes.driver_unreachable(body)  # "Setting the available
        # devices to be zero" in a warning: nothing after it can run on the GPU
        if got[0] not in WARNING_CLASSES and not unreachable and (quiet or got[0] not in CONTEXT_CLASSES):
            return
        cue = f"{got[1]} (in a line not logged as an error)"
        self._other[got[0]] = self._finding(got[0], cue, line_no, line, context, thin=True)

    def answer(self, kind: LogKind, context: Sequence[str]) -> Answer | None:
        """The strongest structural answer the log supports, or None when it shows no failure at all."""
        pick = _first(self._named) or _first(self._before)
        if pick is not None and pick.cls == "other" and pick.cue.startswith("'NoneType'"):
            pick = self._none_in_kernel_library(pick, kind) or pick
        if pick is not None and pick.cls == "kernel-fault" and self._fault_cause:
            pick = _first(self._fault_cause)  # the fault is where the arch path showed; its cause is the path
        path = self._named.get("arch-path-unsupported")
        if (
            pick is not None
            and pick.cls == "toolchain-lacks-arch"
            and path is not None
            and ("target" in path.cue or path.cue.startswith("Feature"))
            and not _PTX_ISA.search(pick.line)  # "requires PTX ISA .version 8.0": the toolchain is too old after all
        ):
            pick = path  # ptxas knows the arch; the code uses a feature it lacks ("not supported on .target")
        if pick is None and self._bare is None:
            pick = _first(self._other)
        if pick is None:  # a bare crash long after torch warned that its build lacks the GPU: that warning
            pick = _first({c: f for c, f in self._other.items() if c in WARNING_CLASSES})
        if pick is None and self._skipped is not None and (kind.gpu == "sm12x" or self.evidence.sm12x_target):
            pick = self._skipped  # kernels skipped by a build that targets SM12x: the build lacks them
        if pick is None and self._dispatch is not None:
            pick = self._dispatch
        last = self._bare or self.evidence.last_frame
        from_last = pick is None and last is not None
        cut_off = False
        if from_last:
            line_no, line = last
            frame = self.evidence.last_frame
            # the log ends inside a traceback: no exception line after its frames (a paste or a log cut short)
            cut_off = self._bare is None or bool(
                _TRACEBACK_HEAD.match(fatal.strip_prefix(line)[0]) and frame and frame[0] > line_no
            )
            archs = self.evidence.archs_near(line_no, window=12, after=FRAMES_AFTER)
            lib = triage_classes.library_in(line) or self.evidence.library_near(line_no, after=FRAMES_AFTER)
            # a kernel library's own check failed, on an SM12x GPU or one the log does not show: on SM12x most
            # often a path not written for it (said as thin, "maybe"; a GPU shown as another keeps it "other")
            on_sm12x = self._on_sm12x(kind, line_no)
            body = self._joined[1] if self._joined and self._joined[0] == line_no else line
            kernel_op = bool(KERNEL_OP.search(body))
            kernel_lib = lib not in _FRAMEWORKS or kernel_op
            if lib in _FRAMEWORKS and kernel_op:
                lib = lib or "a GPU kernel library"
            # an arch in the failing line itself or the kernel named just below it ("Kernel: bmm_..._sm100f")
            here = [a for a in self.evidence.archs_near(line_no, window=0, after=FRAMES_AFTER) if not _is_sm12x(a)]
            cls = "arch-path-unsupported" if (kernel_lib and (archs or on_sm12x)) or here else "other"
            if on_sm12x and self._bare is not None and _CU_INVALID_ARGUMENT.search(f"{self._bare_lead} {body}"):
                cls = "resource-limit"
                cue = "a CUDA call in a kernel's source returned invalid argument (on SM12x most often shared memory)"
            elif cls == "other":
                cue = (
                    "an engine or worker process that died (at startup or later); its own error lines, which hold "
                    "the cause, are not in the log (look above the server's traceback, or in that process's output)"
                    if _ENGINE_DEAD.search(body)
                    else ""
                )
            elif archs and any(_is_sm12x(a) for a in archs) and _MISSING_FILE.search(body):
                # a file named for this arch that the install does not carry: the package ships no SM12x variant
                cls, cue = "binary-lacks-arch", f"a {lib} file for {', '.join(archs)} that the install does not carry"
            elif archs:
                cue = f"a {lib} path naming {', '.join(archs)}"
            else:
                gpu = "an SM12x GPU" if kind.gpu == "sm12x" else "a GPU the log does not name"
                died = (fatal_class := fatal.classify(line)) is not None and fatal_class.id == "process-died"
                # a process that died with no error text: nothing says a check failed, only where the log points
                if died:
                    cue = f"the process died; the log points at {lib}"
                elif cut_off:
                    cue = f"a traceback that ends in {lib} without its exception line"
                else:
                    cue = f"a check in {lib} failed"
                cue += f" on {gpu}"
            pick = self._finding(cls, cue, line_no, line, context, thin=True)
            if self._bare is None:
                pick.line = _clip(line.strip()) + "  [traceback frames without an exception line: cut off?]"
        if pick is None:
            return None
        pick = self._kernel_below(pick)
        verdict, check, notes = self._verdict(pick, kind)
        if from_last and cut_off and verdict == "no" and kind.gpu != "other":
            # nothing in the log says what failed: it cannot say the architecture did not
            verdict, check = "maybe", CUT_OFF_CHECK
        return Answer(pick, verdict, check, notes)

    def _kernel_below(self, pick: StructureFinding) -> StructureFinding:
        """A fault read before the lines below it: the kernel a debugger or sanitizer names there is its library."""
        if pick.cls not in ("kernel-fault", "resource-limit") or pick.library not in (None, "torch"):
            return pick
        lib = self.evidence.library_near(pick.line_no, window=0, after=FRAMES_AFTER)
        if lib is None or lib == "torch":
            return pick
        flag = pick.flag or self.evidence.flag_for(lib, pick.line, pick.line)
        return replace(pick, library=lib, flag=flag, op=pick.op or triage_classes.op_kind(pick.line, lib, ""))

    def _on_sm12x(self, kind: LogKind, line_no: int) -> bool:
        """The log shows an SM12x GPU, none at all, or an SM12x token near the line: a kernel library's own failure
        there is most often a path not written for it (said thinly)."""
        return kind.gpu in ("sm12x", "unknown") or self.evidence.sm12x_token_near(line_no) is not None

    def _none_in_kernel_library(self, pick: StructureFinding, kind: LogKind) -> StructureFinding | None:
        """A value left None inside a kernel library (a trait or config its code picks per arch, unset for this
        GPU) on an SM12x GPU or one the log does not show: an arch path, thinly; elsewhere it stays "other"."""
        lib = triage_classes.library_in(pick.line) or self.evidence.library_near(pick.line_no, after=FRAMES_AFTER)
        if lib in _FRAMEWORKS or not self._on_sm12x(kind, pick.line_no):
            return None
        cue = f"a value left None in {lib}, whose code picks by the arch ({pick.cue})"
        return self._finding("arch-path-unsupported", cue, pick.line_no, pick.line, [], thin=True)

    def _finding(
        self, cls: str, cue: str, line_no: int, line: str, context: Sequence[str], thin: bool
    ) -> StructureFinding:
        ev = self.evidence
        around = line + "\n" + "\n".join(list(context)[-CONTEXT_CUE_LINES:])
        # a fault's kernel is named below it (cuda-gdb's "kernel: void ...", a sanitizer's "at ... in ...")
        below = FRAMES_AFTER if cls in ("kernel-fault", "resource-limit") else 0
        library = triage_classes.library_in(line) or ev.library_near(line_no, after=below)
        if cls == "arch-path-unsupported" and library in BUILD_BOUND:
            # TensorRT builds engines only for the archs its release knows: a refused arch is a release without it
            cls, cue = "binary-lacks-arch", f"{cue} (in {library}, whose release carries the archs it knows)"
        compiled = triage_classes.RUNTIME_COMPILE.search(around) if cls == "binary-lacks-arch" else None
        if compiled is not None:
            # code compiled at run time for this GPU that still has no code for it: the compiler (NVRTC, nvcc) that
            # built it does not know the arch and built for the newest one it knows
            cls, cue = "toolchain-lacks-arch", f"{cue} (in a module compiled at run time: {compiled.group(0)})"
        if library in (None, "torch"):  # a package no pattern knows is still where to act (unsloth, a node pack)
            library = ev.package_near(line_no, after=FRAMES_AFTER) or library
        return StructureFinding(
            cls=cls,
            line_no=line_no,
            line=_clip(line.strip()),
            cue=cue,
            library=library,
            archs=ev.archs_near(line_no),
            flag=ev.flag_for(library, around, line),
            cuda_error=triage_classes.cuda_error_of(line),
            sm12x_token=triage_classes.sm12x_token_in(around),
            thin=thin,
            context=tuple(context)[-CONTEXT_KEPT:],
            op=triage_classes.op_kind(line, library, around),
        )

    def _verdict(self, pick: StructureFinding, kind: LogKind) -> tuple[str, str, list[str]]:
        """Is a structural cause SM12x? Only a class of architecture causes can be, and only the log says so."""
        notes: list[str] = []
        if pick.cls not in triage_classes.SM12X_CLASSES:
            return "no", "", notes
        token = pick.sm12x_token or self.evidence.sm12x_token_near(pick.line_no)
        if kind.gpu == "other" and kind.other_gpu and not token:  # "requires 9.0, got 12.0" names no other GPU
            notes.append(
                f"the log shows a GPU that is not SM12x (line {kind.other_gpu.line_no}: {kind.other_gpu.line})"
            )
            return "no", "", notes
        shown = kind.gpu == "sm12x" and kind.sm12x_gpu is not None
        if shown:
            notes.append(f"the log shows an SM12x GPU (line {kind.sm12x_gpu.line_no}: {kind.sm12x_gpu.line})")
        if token:
            notes.append(f"the failing lines name SM12x ({token})")
        strong = pick.cls in ("arch-path-unsupported", "binary-lacks-arch", "toolchain-lacks-arch")
        listed = self.evidence.arch_list
        if pick.cls == "toolchain-lacks-arch" and token and not shown and listed is not None:
            # a compiler refusing an SM12x arch of a build's target list: the list names no GPU
            notes.append(f"the SM12x arch is one of a build's target list (line {listed[0]}), which names no GPU")
            token = None
        if not pick.thin and (token or (shown and strong)):
            return "yes", "", notes
        check = f"this class ({pick.cls}) happens on any GPU the code was not written or built for; {GPU_CHECK}"
        return "maybe", check, notes


def _is_sm12x(arch: str) -> bool:
    return arch.upper().replace("_", "").startswith(("SM12", "COMPUTE12"))


def _first(found: dict[str, StructureFinding]) -> StructureFinding | None:
    return next((found[c] for c in ORDER if c in found), None)
