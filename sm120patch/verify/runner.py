"""Run the comparison: switch the tree, launch the server, drive the workload, decide, switch back.

The tree always ends in a known state. After the decision: the recipes under test that were kept,
nothing else of theirs. On Ctrl-C (SIGINT), SIGTERM, a crash of verify itself or a baseline that
will not start: the tree as it was when verify started. The server runs in its own process group
(guard's launcher), stopped with SIGTERM, then SIGKILL after the grace period, on every path; a
second Ctrl-C while the tree is being put back is ignored, so that restore finishes.

A launch that crashes or is not ready within the readiness timeout is stopped; its log (kept in
the output folder) goes through `diagnose`, and a candidate it happened with is rolled back.

A comparison needs answers. A baseline launch that serves but gives valid answers to fewer than
MIN_VALID of the requests at a concurrency (bad JSON, a stream that stalls or sends only blank
lines past --request-timeout, a load past --load-timeout) is a baseline that would not serve:
nothing is decided and the tree goes back as it started. Processes a launch left outside its
group (workers started with setsid) are found by the launch's mark (procs.py), stopped, and named.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sm120patch.catalogue.recipes import Recipe
from sm120patch.verify import arms as arms_mod
from sm120patch.verify import decide as decide_mod
from sm120patch.verify import metrics, procs, schedule, workload
from sm120patch.verify.tree import Tree

PREFIX = "[sm120patch verify]"
READY_POLL = 0.5  # the longest wait between readiness checks (they start at 50 ms and double)
MIN_VALID = decide_mod.MIN_VALID  # the share of a load's requests that must give a valid answer


class BaselineFailed(Exception):
    """The tree without the candidates does not serve: there is nothing to compare against."""


@dataclass
class Options:
    command: list[str]
    candidates: list[str]  # recipe ids under test
    base_url: str = "http://127.0.0.1:30000"
    concurrencies: list[int] = field(default_factory=lambda: [8, 32])
    output_len: int = 256
    requests: int | None = None  # per concurrency; default max(concurrency, number of prompts)
    repeats: int = 1
    one_at_a_time: bool = False
    ready_timeout: float = 1800.0
    warmup: int | None = None  # requests before measuring; default one per prompt
    grace: float = 10.0
    request_timeout: float = workload.REQUEST_TIMEOUT
    load_timeout: float = workload.LOAD_TIMEOUT
    noise_floor: float = schedule.NOISE_FLOOR
    min_effect: float = decide_mod.MIN_EFFECT
    if_inconclusive: str = "keep"  # keep | rollback
    logprobs: bool = False  # ask for the tokens (OpenAI logprobs) and compare answers by them
    backend: str = "sglang-oai"  # bench_serving's name: sglang-oai (/v1/completions) | sglang (/generate)
    model: str | None = None
    out_dir: Path = Path("sm120patch-verify")


@dataclass
class Launch:
    """One server start: whether it served, and if not, what the log says."""

    ok: bool
    seconds: float
    log: Path
    outcome: str = "ready"  # ready | crashed | not ready | fatal
    cause: str = ""
    diagnosis: dict[str, Any] | None = None
    server: Any = None


class Say:
    """verify's own account, on stderr, prefixed; also what a _Server logs."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr

    def __call__(self, message: str) -> None:
        for line in message.splitlines() or [""]:
            print(f"{PREFIX} {line}", file=self.stream, flush=True)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends verify the way Ctrl-C does: through the `finally` that restores the tree.

    SIGINT gets the same handler of our own: with Python's default one in place, `asyncio.run`
    installs its own, which only cancels the load's task; a request that absorbs the cancellation
    lets the load finish as if nothing happened, and verify went on to decide (exit 1, not 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """While the tree is put back: a second Ctrl-C must not leave it half restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Runner:
    def __init__(
        self,
        opts: Options,
        tree: Tree,
        recipes: Sequence[Recipe],
        say: Callable[[str], None] | None = None,
        prompts: list[workload.Prompt] | None = None,
        signatures: Sequence[Any] | None = None,
    ) -> None:
        self.opts, self.tree, self.recipes = opts, tree, list(recipes)
        self.signatures = signatures
        self.say = say or Say()
        self.prompts = prompts or workload.load_prompts()
        self.launches = 0
        self.server: Any = None
        self.model = opts.model or ""
        self._log_fh: IO[str] | None = None
        self._token = ""
        self.leftovers: list[dict[str, Any]] = []  # processes a launch left outside its group

    # --- the whole run ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Everything, or an exception after the tree was put back as it started."""
        opts = self.opts
        start = self.tree.applied()
        plan = arms_mod.build(opts.candidates, self.tree.stands_on(), start, one_at_a_time=True)
        for rid, why in plan.why.items():
            self.say(f"{rid}: {why}")
        self.tree.managed |= set(plan.candidates)
        units = plan.arms  # the graph's arms: what is measured, alone or in groups
        self._start, self._base = start, start - set(plan.candidates)
        self._runs: dict[str, list[decide_mod.Run]] = {schedule.BASELINE: []}
        self._failures: dict[str, dict[str, Any]] = {}
        self._launch_log: list[dict[str, Any]] = []
        self._wired: dict[str, set[str]] = {}  # arm -> its recipes whose patched code logs a taken line
        self._taken: dict[str, set[str]] = {}  # arm -> recipe ids its servers' logs say were taken
        self._steps: list[schedule.Step] = []
        self._arms: dict[str, list[str]] = {}
        self._refuse_busy_port()
        finished = False
        try:
            with _sigterm_as_interrupt():
                if opts.one_at_a_time or len(units) == 1:
                    decisions = self._one_by_one(units)
                else:
                    decisions = self._together_then_split(units)
                kept = {r for d in decisions if d.keep and d.verdict != "left as it was" for r in d.recipes}
                unjudged = {r for d in decisions if d.verdict == "left as it was" for r in d.recipes}
                final = self._base | kept | (unjudged & start)
                self.say(f"keeping: {', '.join(sorted(kept)) or 'none'}; rolling back the rest")
                self.tree.switch_to(final)
                finished = True
        finally:
            if finished:
                self._stop_server()
            else:  # a second Ctrl-C while the server stops or the tree is put back is ignored
                with _no_interrupts():
                    self._stop_server()
                    self.say("putting the tree back as it was when verify started")
                    self.tree.switch_to(start)
        return {
            "started_with": sorted(start),
            "candidates": list(plan.candidates),
            "arms": self._arms,
            "together": plan.why,
            "schedule": [{"arm": s.arm, "round": s.round} for s in self._steps],
            "launches": self._launch_log,
            "runs": {a: [_strip(r) for r in rs] for a, rs in self._runs.items()},
            "decisions": [d.to_dict() for d in decisions],
            "taken": sorted({r for d in decisions for r in d.taken}),
            "not_exercised": sorted({r for d in decisions for r in d.not_exercised}),
            "final": sorted(self.tree.applied()),
            "leftovers": self.leftovers,
            "options": _options_dict(opts),
        }

    # --- the two ways to judge ----------------------------------------------------------------

    def _one_by_one(self, arms: dict[str, list[str]]) -> list[decide_mod.Decision]:
        """A B1 A B2 A ..., `repeats` rounds: every arm judged on its own."""
        self._arms.update(arms)
        steps = schedule.interleave(list(arms), self.opts.repeats)
        for i, step in enumerate(steps):
            if step.arm in self._failures:
                continue
            if step.arm == schedule.BASELINE and i > 0 and steps[i - 1].arm in self._failures:
                continue  # it would bracket nothing
            self._step(step, arms.get(step.arm, []), len(steps))
        return [self._decide(name, ids) for name, ids in arms.items()]

    def _together_then_split(self, units: dict[str, list[str]]) -> list[decide_mod.Decision]:
        """All arms together (A B A); only if that breaks the rule, the culprits by halving the set
        (groups.py), then the kept arms together once more (the confirmation)."""
        from sm120patch.verify import groups

        self._step(schedule.Step(schedule.BASELINE, 0), [], 0)
        names = list(units)
        judged: dict[tuple[str, ...], decide_mod.Decision] = {}

        def measure(group: list[str], label: str) -> decide_mod.Decision:
            recipes = list(dict.fromkeys(r for u in group for r in units[u]))
            name = label if label else "+".join(group)
            self._arms[name] = recipes
            for r in range(self.opts.repeats):
                self._step(schedule.Step(name, r), recipes, 0)
                if name in self._failures:
                    break
                self._step(schedule.Step(schedule.BASELINE, r), [], 0)
            d = self._decide(name, recipes)
            judged[tuple(group)] = d
            self.say(f"{name}: {d.verdict}: {d.summary}")
            return d

        together = measure(names, "all")
        if together.keep and together.verdict != "left as it was":
            return [together]
        self.say("together they break the rule: looking for the culprit(s) by splitting the set")
        found = groups.search(names, lambda g: not measure(g, "").keep)
        out: list[decide_mod.Decision] = []
        for u in found.culprits:
            if (u,) in judged:
                d = judged[(u,)]
                out.append(
                    decide_mod.Decision(u, units[u], False, d.reasons or [d.summary], d.summary, launch=d.launch)
                )
            else:
                cleared = found.inferred.get(u, [])
                why = (
                    f"rolled back by elimination: {'+'.join(n for n in names if n not in cleared) or 'all'} "
                    f"broke the rule ({together.summary}) and {', '.join(cleared)} without it did not"
                )
                out.append(decide_mod.Decision(u, units[u], False, [why], why))
        rest = [u for u in names if u not in found.culprits]
        if rest:  # a kept set the search measured as it is already is its own confirmation
            confirm = judged.get(tuple(rest)) or measure(rest, "kept set")
            for u in rest:
                if confirm.keep:
                    why = f"kept: cleared by the search, then confirmed with {', '.join(rest)}: {confirm.summary}"
                    out.append(decide_mod.Decision(u, units[u], True, [], why, verdict=confirm.verdict))
                else:
                    why = f"the kept set together ({', '.join(rest)}) broke the rule: {confirm.summary}"
                    out.append(decide_mod.Decision(u, units[u], False, [why], why))
        return out

    def _decide(self, name: str, recipes: list[str]) -> decide_mod.Decision:
        opts = self.opts
        d = decide_mod.decide(
            name,
            recipes,
            self.prompts,
            self._runs[schedule.BASELINE],
            self._runs.get(name, []),
            self._failures.get(name),
            opts.noise_floor,
            opts.min_effect,
            opts.if_inconclusive,
        )
        return decide_mod.exercised(d, self._wired.get(name, set()), self._taken.get(name, set()))

    def _step(self, step: schedule.Step, recipes: list[str], total: int) -> None:
        """Switch the tree to this arm (or the baseline), launch, measure, record."""
        wanted = self._base if step.arm == schedule.BASELINE else self._base | set(recipes)
        switched = self.tree.switch_to(wanted)
        if switched.refused:
            why = "; ".join(f"{k}: {v}" for k, v in switched.refused.items())
            if step.arm == schedule.BASELINE:
                raise BaselineFailed(f"the baseline could not be built ({why})")
            if set(switched.refused) & self._start:  # applied when verify started: not judged
                why = f"the arm could not be built ({why}); left as it was"
                self.say(f"{step.arm}: {why}")
                self._failures[step.arm] = {"outcome": "not built", "cause": why}
            else:
                self.say(f"{step.arm}: not applied ({why})")
                self._failures[step.arm] = {"outcome": "not applied", "cause": why}
            return
        self._steps.append(step)
        if step.arm != schedule.BASELINE:
            self._wired.setdefault(step.arm, set()).update(r for r in recipes if self.tree.taken_wired(r))
        run, launch = self._one_launch(step, total)
        self._launch_log.append({"arm": step.arm, "round": step.round, **_launch_dict(launch)})
        if step.arm != schedule.BASELINE:  # the log is closed: the server has stopped
            from sm120patch.taken_line import taken_in_text

            try:
                text = launch.log.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            self._taken.setdefault(step.arm, set()).update(taken_in_text(text))
        if run is None:
            if step.arm == schedule.BASELINE:
                raise BaselineFailed(f"the baseline server {launch.outcome}: {launch.cause} (log {launch.log})")
            self._failures[step.arm] = {**_launch_dict(launch)}
            return
        if step.arm == schedule.BASELINE:
            why = _no_valid_answers(run)
            if why:
                raise BaselineFailed(f"the baseline server would not serve: {why} (log {launch.log})")
        self._runs.setdefault(step.arm, []).append(run)

    # --- one launch ---------------------------------------------------------------------------

    def _one_launch(self, step: schedule.Step, total: int) -> tuple[decide_mod.Run | None, Launch]:
        self.launches += 1
        n = self.launches
        label = f"launch {n}{f'/{total}' if total else ''} ({step.arm}, round {step.round + 1})"
        launch = self._launch(f"launch-{n}-{_safe(step.arm)}.log")
        if not launch.ok:
            self.say(f"{label}: server {launch.outcome}: {launch.cause}; log {launch.log}")
            return None, launch
        self.say(f"{label}: ready after {launch.seconds:.1f}s")
        run = self._measure(label)  # on an exception, run()'s `finally` stops it, interrupts held off
        self._stop_server()
        return run, launch

    def _launch(self, log_name: str) -> Launch:
        from sm120patch.triage import guard
        from sm120patch.triage.diagnose import Diagnoser

        opts = self.opts
        opts.out_dir.mkdir(parents=True, exist_ok=True)
        log_path = opts.out_dir / log_name
        fh = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in _stop_server
        self._log_fh = fh
        applied = self.tree.applied()
        roots = {t.root for t in self.tree.targets}
        diagnoser = Diagnoser(self.recipes, applied, self.signatures, next(iter(roots)) if len(roots) == 1 else None)
        gopts = guard.GuardOptions(command=list(opts.command), grace=opts.grace)
        started = time.monotonic()
        self._token = procs.new_token()
        with procs.marked(self._token):  # every process the launch starts carries the mark
            server = guard.Server(gopts, diagnoser, fh, self.say)  # type: ignore[arg-type]
        self.server = server
        deadline = started + opts.ready_timeout if opts.ready_timeout > 0 else None
        fatal: str | None = None
        poll = 0.05
        while True:
            with contextlib.suppress(Exception):
                while True:
                    kind, payload = server.events.get_nowait()
                    if kind == "fatal" and fatal is None:
                        fatal = f"line {payload.line_no}: {payload.signature}"
            if fatal is not None:
                outcome = "fatal"
                break
            if server.proc.poll() is not None:
                outcome = "crashed"
                break
            model = workload.ready(opts.base_url, timeout=2.0)
            if model is not None:
                self.model = opts.model or model
                return Launch(True, time.monotonic() - started, log_path, server=server)
            if deadline is not None and time.monotonic() > deadline:
                outcome = "not ready"
                break
            time.sleep(poll)
            poll = min(poll * 2, READY_POLL)
        self._stop_server()
        diag = server.diagnosis()
        cause = _cause(diag, outcome, opts.ready_timeout, server.proc.returncode, opts.base_url)
        if fatal and fatal not in cause:
            cause = f"{cause} ({fatal})"
        return Launch(False, time.monotonic() - started, log_path, outcome, cause, diag.to_dict())

    def _stop_server(self) -> None:
        """Stop the server's whole group; it stays `self.server` until it is gone, so a stop that
        an interrupt cut short is done again by run()'s `finally`."""
        server = self.server
        if server is not None:
            import signal as sig

            from sm120patch.triage import guard

            if server.proc.poll() is None or guard.group_members(server.pgid):
                server.stop(sig.SIGTERM)
            server.cleanup()
            self._stop_leftovers(server.pgid)
            self.server = None
        fh = getattr(self, "_log_fh", None)
        if fh is not None:
            fh.close()
            self._log_fh = None

    def _stop_leftovers(self, leader: int) -> None:
        """What the launch started outside its group (setsid workers): stopped, and named."""
        found = procs.find(self._token, leader)
        if not found:
            return
        names = ", ".join(f"{p.pid} ({p.command})" for p in found)
        self.say(f"launch {self.launches}: {len(found)} process(es) it started outlived its group: {names}; stopping")
        alive = procs.stop(found, self.opts.grace)
        if alive:
            self.say(f"still running after SIGKILL: {', '.join(str(p.pid) for p in alive)}; stop them by hand")
        self.leftovers.append(
            {
                "launch": self.launches,
                "processes": [{"pid": p.pid, "command": p.command} for p in found],
                "survived": [p.pid for p in alive],
            }
        )

    def _refuse_busy_port(self) -> None:
        """Anything that accepts a connection at --url's host and port (a server of any kind, an
        http.server) would answer verify's requests in place of the launched one, or keep it
        from binding: refused before the first launch, with the tree untouched."""
        from sm120patch.errors import UserError

        url = self.opts.base_url
        who = workload.listening(url)
        if who is not None:
            raise UserError(
                f"{url}: something already listens there ({who}); stop it first (verify starts its own server) "
                "or pass --url with the address the command serves on"
            )

    # --- measuring ----------------------------------------------------------------------------

    def _measure(self, label: str) -> decide_mod.Run:
        opts = self.opts
        model = self.model
        warm = len(self.prompts) if opts.warmup is None else opts.warmup
        if warm:
            c = min(8, max(opts.concurrencies))
            workload.run_load(
                opts.base_url,
                model,
                self.prompts,
                c,
                warm,
                16,
                opts.request_timeout,
                opts.load_timeout,
                opts.logprobs,
                opts.backend,
            )
        out: dict[int, dict[str, Any]] = {}
        for c in opts.concurrencies:
            n = opts.requests or max(c, len(self.prompts))
            load = workload.run_load(
                opts.base_url,
                model,
                self.prompts,
                c,
                n,
                opts.output_len,
                opts.request_timeout,
                opts.load_timeout,
                opts.logprobs,
                opts.backend,
            )
            summary = metrics.summarize(load)
            texts: dict[str, str] = {}
            tokens: dict[str, list[str | int]] = {}
            for r in load.results:
                if r.success and r.prompt_id not in texts:
                    texts[r.prompt_id] = r.text
                    if r.tokens is not None:
                        tokens[r.prompt_id] = r.tokens
            out[c] = {"summary": summary, "outputs": texts, "tokens": tokens}
            self.say(
                f"{label}: c={c}: {summary['output_throughput']:.1f} output tok/s, "
                f"TTFT median {summary['ttft_ms']['median']:.1f} ms, TPOT median {summary['tpot_ms']['median']:.2f} ms"
                + (f", {summary['failed']} failed" if summary["failed"] else "")
            )
        return out


def _no_valid_answers(run: decide_mod.Run) -> str | None:
    """Why one run gave too few valid answers to compare anything with, else None."""
    for c, v in sorted(run.items()):
        s = v["summary"]
        n = s["completed"] + s["failed"]
        if n and s["completed"] < MIN_VALID * n:
            first = f" (first error: {s['errors'][0]})" if s["errors"] else ""
            return f"only {s['completed']} of {n} requests at c={c} gave a valid answer{first}"
    return None


def _cause(diag: Any, outcome: str, timeout: float, rc: int | None, url: str) -> str:
    if diag.causes:
        f = diag.causes[0]
        recipes = f" (recipes: {', '.join(f.recipe_ids)})" if f.recipe_ids else ""
        return f"{f.signature}{recipes}: {f.meaning}"
    if outcome == "not ready":
        return (
            f"nothing answered at {url.rstrip('/')}{workload.MODELS} within {timeout:g}s "
            "(is --url where the command serves? a bigger --ready-timeout?)"
        )
    if diag.unnamed_errors:
        return f"exit status {rc}; last error line: {diag.unnamed_errors[-1].line}"
    return f"exit status {rc}; no error line in its output"


def _launch_dict(launch: Launch) -> dict[str, Any]:
    return {
        "outcome": launch.outcome,
        "seconds": round(launch.seconds, 3),
        "log": str(launch.log),
        "cause": launch.cause,
        "diagnosis": launch.diagnosis,
    }


def _strip(run: decide_mod.Run) -> dict[str, Any]:
    return {str(c): {k: v[k] for k in ("summary", "outputs", "tokens") if k in v} for c, v in run.items()}


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:80]


def _options_dict(opts: Options) -> dict[str, Any]:
    return {
        "command": opts.command,
        "url": opts.base_url,
        "concurrencies": opts.concurrencies,
        "output_len": opts.output_len,
        "requests": opts.requests,
        "repeats": opts.repeats,
        "one_at_a_time": opts.one_at_a_time,
        "ready_timeout": opts.ready_timeout,
        "request_timeout": opts.request_timeout,
        "load_timeout": opts.load_timeout,
        "noise_floor": opts.noise_floor,
        "min_effect": opts.min_effect,
        "if_inconclusive": opts.if_inconclusive,
        "logprobs": opts.logprobs,
        "backend": opts.backend,
    }
