"""Several targets in one run: an SGLang tree and the FlashInfer it runs on.

SGLang pins FlashInfer exactly, so opening an SGLang gate can need a FlashInfer recipe
first (the SM12x allreduce kernels backported to the FlashInfer a release pins). Order is
what makes that safe:

- plan and apply FlashInfer targets first; every FlashInfer recipe is probed on an overlay
  of the patched sources (`overlay.py`) before a byte is written, and the SGLang recipes'
  probes then judge that patched FlashInfer (the same overlay, in `plan` and in `apply`: a
  proof made there stands for the real FlashInfer, `FlashInferEnv.identity`);
- write FlashInfer, then SGLang; roll back SGLang, then FlashInfer. A kill at any moment
  leaves one of: nothing, FlashInfer patched (harmless alone: it only adds SM12x kernels),
  or both; never an SGLang gate open over a FlashInfer without its kernels;
- an SGLang recipe proven on a FlashInfer recipe is recorded as its dependent; rolling the
  FlashInfer recipe back rolls the dependent back first, and says so. A dependency this run
  did not record (the trees were patched in separate runs) is still caught: the SGLang
  recipe's proof no longer holds, so it is `stale` everywhere it is checked.

`reconcile` decides the whole change first (the plans, and the actions as data: `actions.py`);
`execute` carries the actions out in one pass; `apply` is the two under one lock, `plan` the first
alone, so an apply does what the plan printed for the same inputs.

One journal per tree root: when both packages sit in one site-packages they share it (one
lock). Every layout (one tree, a pair, one site-packages holding both; `engine.apply` and
`engine.rollback` too) runs the one pipeline below, so no layout skips a rule: what pip
changed is retired first (`pipstate`), the dependents rule holds wherever the trees are, and
a command is one transaction over every journal it touches: an error (exit 2) or Ctrl-C puts
back every byte it wrote in every target before it exits.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.catalogue.recipes import Recipe
from sm120patch.engine import steps
from sm120patch.engine.actions import Action, ActionKind
from sm120patch.engine.journal import Applied, Dependent, Journal
from sm120patch.engine.pipstate import obsolete, retire
from sm120patch.errors import JournalError, UserError
from sm120patch.hints import rollback_command
from sm120patch.planning.plan import (
    APPLICABLE,
    APPLIED,
    EXCLUDED,
    FAILED,
    NOT_APPLICABLE,
    REVERTED,
    RecipePlan,
    plan,
)
from sm120patch.planning.targets import Target
from sm120patch.probes.environment.flashinfer import FlashInferEnv, from_tree
from sm120patch.probes.environment.overlay import overlay
from sm120patch.probes.evidence import Recheck, stands_on

MakeProbe = Callable[[Sequence[Arch], Any, str], "steps.Probe | None"]
Planner = Callable[..., list[RecipePlan]]  # `planning.plan.plan`'s signature


@dataclass
class RunSettings:
    """What every target of one command shares."""

    archs: list[Arch]
    fi: FlashInferEnv | None  # the FlashInfer the probes judge before any FlashInfer recipe
    level: str
    make_probe: MakeProbe
    allow_untested: bool = False
    fixed: bool = False  # make_probe ignores the FlashInfer it is given (a caller's own probe)
    exclude: frozenset[str] = frozenset()  # --exclude: recipes never probed nor written (export reads it here)

    def probe(self, fi: FlashInferEnv | None) -> steps.Probe | None:
        return self.make_probe(self.archs, fi, self.level)

    @classmethod
    def with_probe(cls, archs: Sequence[Arch], probe: steps.Probe | None, allow_untested: bool = False) -> RunSettings:
        """A run whose probe is given (engine.apply's callers): no FlashInfer is resolved or mirrored."""
        return cls(list(archs), None, "given", lambda a, f, lv: probe, allow_untested, fixed=True)

    @classmethod
    def probing(
        cls,
        targets: Sequence[Target],
        archs: Sequence[Arch],
        level: str,
        flashinfer: Path | None,
        python: str | None,
        allow_untested: bool = False,
    ) -> RunSettings:
        """What one plan/apply/export shares: the catalogue's probe at `level`, judging the FlashInfer
        the targets run on (--flashinfer, else beside them, else what `python` imports; none at `none`)."""
        from sm120patch.engine import which_flashinfer
        from sm120patch.probes import recipe_probe

        fi = None if level == "none" else which_flashinfer.resolve_flashinfer(targets, flashinfer, python)
        return cls(list(archs), fi, level, lambda a, f, lv: recipe_probe.make_probe(a, f, lv), allow_untested)


def ordered(targets: Sequence[Target]) -> list[Target]:
    """FlashInfer targets first: their recipes change what the SGLang recipes' probes see."""
    return sorted(targets, key=lambda t: t.package != "flashinfer")


def _package_changes(t: Target, plans: Sequence[RecipePlan]) -> dict[str, bytes]:
    """The bytes the planned recipes leave, by path inside the package (the last writer wins)."""
    out: dict[str, bytes] = {}
    for p in plans:
        for rel, (_, after) in p.changes.items():
            out[(t.root / rel).relative_to(t.package_dir).as_posix()] = after
    return out


def _fi_of(t: Target, run: RunSettings) -> FlashInferEnv | None:
    if run.fixed:
        return None
    return from_tree(t.package_dir, python=run.fi.python if run.fi else None)


@dataclass
class Choice:
    """Which recipes a command may write: `--recipe` (only these) and `--exclude` (never these)."""

    only: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()

    @classmethod
    def of(cls, only: Sequence[str] | None = None, exclude: Sequence[str] | None = None) -> Choice:
        return cls(frozenset(only or ()), frozenset(exclude or ()))

    def wants(self, recipe_id: str) -> bool:
        return (not self.only or recipe_id in self.only) and recipe_id not in self.exclude


def plan_target(
    t: Target,
    recipes: Sequence[Recipe],
    run: RunSettings,
    journal: Journal,
    fi_new: FlashInferEnv | None,
    choice: Choice = Choice(),  # noqa: B008 - frozen
    planner: Planner = plan,
    checks_out: dict[str, Recheck] | None = None,
    without: frozenset[str] = frozenset(),
) -> tuple[list[RecipePlan], FlashInferEnv | None, dict[str, Any]]:
    """One target's plan, the same for every layout and every command. New recipes are probed on
    FlashInfer as it will be: a FlashInfer target's own recipes on an overlay of the sources they
    leave, an SGLang target's on `fi_new` (the FlashInfer the FlashInfer recipes of this run leave);
    applied ones (stale or not) on the FlashInfer they will run on: a FlashInfer target's on disk
    now, an SGLang target's on `fi_new`. Returns the plans, the FlashInfer
    after them, and the proofs of the recipes that may be written. `planner` plans non-FlashInfer
    targets (preflight passes the plan-result cache's; a FlashInfer target always gets `plan`: its
    overlay needs the bytes). `checks_out` receives the applied recipes' rechecks. `without`: applied
    recipes planned as if rolled back first (the reconciler's view of what apply takes back)."""
    is_fi = t.package == "flashinfer"
    base = _fi_of(t, run) if is_fi else fi_new
    applied = steps.applied_reasons(journal, t)
    planner = plan if is_fi else planner
    rolled: dict[str, bytes] = {}  # the files the rollback of `without` rewrites (by path in the tree)
    if without & set(applied):
        rolled = _after_rollback(journal, t, recipes, applied, without)
        planner = functools.partial(plan, read=_reader(t, rolled))
        applied = {k: v for k, v in applied.items() if k not in without}
    plans = planner(t, recipes, run.archs, applied=applied, allow_untested=run.allow_untested)
    if choice.only or choice.exclude:
        # plan the chosen ones on their own, so their before-bytes are the tree's and not another
        # recipe's output; the others are still reported
        ids = {p.recipe.id for p in plans if choice.wants(p.recipe.id)}
        plans = steps.replan(t, recipes, run.archs, applied, plans, ids, run.allow_untested, planner)
        for p in plans:
            if p.recipe.id in choice.exclude and p.status != APPLIED:
                p.mark(EXCLUDED, f"excluded (--exclude): {p.reason}")
    todo = [p for p in plans if p.status == APPLICABLE and choice.wants(p.recipe.id)]
    seen = is_fi and not run.fixed and run.level != "none" and base is not None  # FlashInfer as it will be
    after = overlay(base, _package_paths(t, rolled)) if seen and rolled else base
    proofs: dict[str, Any] = {}
    if todo:
        if seen:
            after = overlay(base, {**_package_paths(t, rolled), **_package_changes(t, todo)})
        proofs = steps.block_failing(todo, run.probe(after))
        keep = {p.recipe.id for p in todo if p.status == APPLICABLE}
        if len(keep) < len(todo):  # without the blocked ones, a shared file's bytes chain differently
            plans = steps.replan(t, recipes, run.archs, applied, plans, keep, run.allow_untested, planner)
            if seen:
                kept = [p for p in plans if p.recipe.id in keep]
                after = overlay(base, {**_package_paths(t, rolled), **_package_changes(t, kept)})
    checks = steps.mark_stale(plans, journal, t, run.probe(_fi_of(t, run) if is_fi else fi_new))
    if checks_out is not None:
        checks_out.update(checks)
    return plans, after, proofs


def _after_rollback(
    journal: Journal, t: Target, recipes: Sequence[Recipe], applied: dict[str, str], without: frozenset[str]
) -> dict[str, bytes]:
    """The files the rollback of the recipes in `without` rewrites, as they will read (the kept
    ones replayed over the originals, as `steps.rollback_locked` writes them), by path in the tree;
    nothing is written."""
    entries = [a.raw for a in journal.entries(t.package) if a.id in applied]
    touched = sorted({rel for a in entries if a["id"] in without for rel in a.get("files") or ()})
    keep = [a for a in entries if a["id"] not in without]
    return steps.replay(journal, t, recipes, None, keep, touched)


def _reader(t: Target, new: dict[str, bytes]) -> Callable[[Path], bytes]:
    """How a planner reads the tree once `new` (by path in the tree) is written."""

    def read(path: Path) -> bytes:
        rel = t.rel(path)
        return new[rel] if rel in new else path.read_bytes()

    return read


def _package_paths(t: Target, by_tree_path: dict[str, bytes]) -> dict[str, bytes]:
    """Tree paths -> paths inside the package (what an overlay takes)."""
    return {(t.root / rel).relative_to(t.package_dir).as_posix(): b for rel, b in by_tree_path.items()}


def note_shadowing_builds(t: Target, plans: Sequence[RecipePlan]) -> None:
    """A FlashInfer recipe only counts once FlashInfer compiles the patched sources: name any
    compiled copy of the module it would load instead (an AOT module, a JIT build that never
    rebuilds), with the fix, in the recipe's reason (`compiled_cache.py` says why each one shadows)."""
    from sm120patch.catalogue.kernels import load_kernels
    from sm120patch.probes.environment.compiled_cache import cached_builds

    kernels = load_kernels()
    for p in plans:
        if p.status not in (APPLICABLE, APPLIED):
            continue
        patched = [t.root / rel for rel in p.files]
        for need in p.recipe.needs:
            for module in kernels[need].jit_modules if need in kernels else ():
                for b in cached_builds(t.package_dir, module, patched):
                    if b.shadows:
                        p.reason += (
                            f"; WARNING: {b.path} would be used instead of the patched sources: {b.why}; {b.fix}"
                        )


def _note_obsolete(journal: Journal, t: Target, plans: Sequence[RecipePlan]) -> None:
    """Say, on each recipe pip made obsolete, what pip did (a dry run reports; apply retires)."""
    from sm120patch.engine.pipstate import obsolete

    said = {r.id: r for r in obsolete(journal, t)}
    for p in plans:
        if p.recipe.id in said:
            p.reason += f" [{said[p.recipe.id].state}: {said[p.recipe.id].why}]"


@dataclass
class TargetWork:
    """One target's part of a reconciliation: what the executor carries out there, beside the
    actions that say it. `plans` are the plans apply reports (made on the bytes the target's
    rollbacks leave), `write` the recipes to write with their `proofs`, `renew` the rechecks whose
    new proof is recorded, `taken` why each recipe rolled back here goes."""

    target: Target
    actions: list[Action] = field(default_factory=list)  # this target's section, in order
    plans: list[RecipePlan] = field(default_factory=list)
    write: list[RecipePlan] = field(default_factory=list)
    proofs: dict[str, Any] = field(default_factory=dict)
    renew: dict[str, Recheck] = field(default_factory=dict)
    taken: dict[str, str] = field(default_factory=dict)
    stands_on: dict[str, list[str]] = field(default_factory=dict)  # SGLang id -> the FlashInfer recipes its proof read


@dataclass
class Reconciliation:
    """What a plan decided: each recipe's plan (what `plan` reports) and the actions an apply with
    the same inputs carries out, in order (`actions.py`): first the prelude (what pip replaced, and
    the SGLang recipes standing on it), then each target's section (`work`, in apply's order)."""

    plans: list[RecipePlan]
    prelude: list[Action]
    work: list[TargetWork]
    choice: Choice = field(default_factory=Choice)

    @property
    def actions(self) -> list[Action]:
        return [*self.prelude, *(a for w in self.work for a in w.actions)]

    @property
    def stands_on(self) -> dict[str, list[str]]:
        """Each SGLang recipe this change writes -> the FlashInfer recipes (applied, or written by
        it) its proof stands on: what preflight's advice names, what apply records as dependents."""
        return {i: on for w in self.work for i, on in w.stands_on.items()}

    def writes(self, package: str) -> set[str]:
        return {a.recipe for a in self.actions if a.kind is ActionKind.WRITE and a.package == package}

    def of(self, tree: str, package: str) -> TargetWork:
        return next(w for w in self.work if str(w.target.root) == tree and w.target.package == package)


def plan_many(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    run: RunSettings,
    *,
    only: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    planner: Planner = plan,
) -> list[RecipePlan]:
    """The dry run over every target, in order; nothing is written: `reconcile`'s plans."""
    return reconcile(targets, recipes, run, only=only, exclude=exclude, planner=planner).plans


def reconcile(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    run: RunSettings,
    *,
    only: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    commit: bool = False,
    planner: Planner = plan,
    journals: dict[Path, Journal] | None = None,
) -> Reconciliation:
    """The whole change an apply with these inputs makes, decided from what is on disk (journals,
    pip's versions and bytes, git) and what is wanted, writing nothing: the plans and the actions
    in apply's order, which `execute` carries out. Takes back what pip replaced or what went
    stale, with the SGLang recipes standing on it, then writes and records what the probe proves,
    every probe judging FlashInfer as this change leaves it (an overlay until it is written).
    `journals`: apply's, opened under its lock (else opened here, read only); `planner`: see
    `plan_target`."""
    fi = run.fi
    choice = Choice.of(only, [*(exclude or ()), *run.exclude])
    journals = journals if journals is not None else {t.root: Journal.open(t.root) for t in targets}
    out: list[RecipePlan] = []
    order = ordered(targets)
    work = {(t.root, t.package): TargetWork(t) for t in order}
    retired = {(t.root, t.package): obsolete(journals[t.root], t) for t in order}
    prelude = [
        Action(ActionKind.RETIRE, str(t.root), t.package, r.id, r.why, tuple(r.entry.get("files") or ()))
        for t in order
        for r in retired[(t.root, t.package)]
    ]
    dropped: dict[tuple[Path, str], set[str]] = {k: {r.id for r in rs} for k, rs in retired.items()}

    def take_back_dependents(
        fi_target: Target, entries: Sequence[dict[str, Any]], why: str, into: list[Action]
    ) -> None:
        for sg, ids in _dependents_of(journals, targets, fi_target, entries).items():
            gone = dropped.setdefault((sg.root, sg.package), set())
            files = {a.id: a.files for a in journals[sg.root].entries("sglang")}
            for i in [i for i in ids if i not in gone]:
                gone.add(i)
                work[(sg.root, sg.package)].taken[i] = why
                into.append(Action(ActionKind.ROLLBACK_DEPENDENT, str(sg.root), sg.package, i, why, files[i]))

    for t in [t for t in targets if t.package == "flashinfer"]:
        mine = [r.entry for r in retired[(t.root, t.package)]]
        take_back_dependents(t, mine, f"proven on FlashInfer recipes pip replaced in {t.root}", prelude)
    fi_applied: dict[str, dict[str, set[str]]] = {}  # FlashInfer location -> its recipes -> files changed
    for t in order:
        journal = journals[t.root]
        w = work[(t.root, t.package)]
        checks: dict[str, Recheck] = {}
        plans, after, proofs = plan_target(t, recipes, run, journal, fi, choice, planner, checks)
        gone = dropped.get((t.root, t.package), set())
        entries = {a.id: a for a in journal.entries(t.package)}
        stale = [i for i, c in checks.items() if not c.holds and i not in gone and i in entries]
        for i, c in checks.items():
            if c.holds and c.probe is not None and i not in gone:
                w.renew[i] = c
                w.actions.append(Action(ActionKind.RECORD_PROOF, str(t.root), t.package, i, f"renewed: {c.reason}"))
        for i in stale:
            w.taken[i] = checks[i].reason
            w.actions.append(
                Action(ActionKind.ROLLBACK_STALE, str(t.root), t.package, i, checks[i].reason, entries[i].files)
            )
        if t.package == "flashinfer" and stale:
            why = f"proven on FlashInfer recipes taken back as stale in {t.root}"
            take_back_dependents(t, [entries[i].raw for i in stale], why, w.actions)
        taken = frozenset(gone | set(stale)) & set(entries)
        w.plans = plans
        if taken:  # what apply plans once those are rolled back: the tree's bytes after the rollback
            w.plans, after, proofs = plan_target(t, recipes, run, journal, fi, choice, planner, without=taken)
            _note_obsolete(journal, t, w.plans)
        w.write = [p for p in w.plans if p.status == APPLICABLE and choice.wants(p.recipe.id)]
        w.proofs = proofs
        if t.package == "sglang":
            w.stands_on = {
                p.recipe.id: on
                for p in w.write
                if p.recipe.id in proofs and (on := _stands_on_of(p.probe, fi_applied, fi.identity if fi else None))
            }
        w.actions += _write_actions(t, w.write, proofs, run, commit, w.stands_on)
        if t.package == "flashinfer":
            fi = after
            if fi is not None and not run.fixed:  # what the SGLang proofs stand on
                held = {p.recipe.id for p in plans if p.status == APPLIED} - gone - set(stale)
                files = {a.id: _changed_in_package(t, a) for a in journal.entries(t.package) if a.id in held}
                files.update(
                    {
                        p.recipe.id: {(t.root / r).relative_to(t.package_dir).as_posix() for r in p.files}
                        for p in w.write
                    }
                )
                fi_applied[fi.identity] = files
            note_shadowing_builds(t, plans)
            if w.plans is not plans:
                note_shadowing_builds(t, w.plans)
        _note_obsolete(journal, t, plans)
        out += plans
    return Reconciliation(out, prelude, list(work.values()), choice)


def _write_actions(
    t: Target,
    todo: Sequence[RecipePlan],
    proofs: dict[str, Any],
    run: RunSettings,
    commit: bool,
    stands_on: dict[str, list[str]],
) -> list[Action]:
    """One target's writes, the proofs kept with them (an SGLang proof names the FlashInfer recipes
    it stands on: `_record_dependents` records them), and with --commit on git, its commits."""
    out = [Action(ActionKind.WRITE, str(t.root), t.package, p.recipe.id, p.reason, tuple(p.files)) for p in todo]
    for p in todo:
        if p.recipe.id in proofs:
            on = stands_on.get(p.recipe.id, [])
            why = proofs[p.recipe.id].reason + (f"; stands on {', '.join(on)}" if on else "")
            out.append(Action(ActionKind.RECORD_PROOF, str(t.root), t.package, p.recipe.id, why))
    if commit and t.is_git:
        branch = f"sm120patch/{'+'.join(a.name for a in run.archs)}"
        out += [
            Action(ActionKind.COMMIT, str(t.root), t.package, p.recipe.id, f"on {branch}", tuple(p.files)) for p in todo
        ]
    return out


def _stands_on_of(
    verdicts: Sequence[dict[str, Any]], fi_applied: dict[str, dict[str, set[str]]], proven_on: str | None
) -> list[str]:
    """The FlashInfer recipes (applied, or written by this run) a proof made on `proven_on` read."""
    return [
        i
        for where, held in fi_applied.items()
        for i, changed in held.items()
        if stands_on(verdicts, changed, proven_on or where)
    ]


@contextlib.contextmanager
def _locked(roots: Sequence[Path], wait_s: float):  # noqa: ANN202
    """Every tree's journal, locked in one order (sorted roots) so two runs never deadlock."""
    journals: dict[Path, Journal] = {}
    with contextlib.ExitStack() as stack:
        for root in sorted(set(roots)):
            j = Journal.open(root)
            stack.enter_context(j.lock(wait_s))
            j.recovered = j.recover()
            journals[root] = j
        yield journals
        for j in journals.values():  # a command that leaves nothing applied leaves no journal
            j.remove_if_empty()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command's writes, after every file it wrote was put back (or not: `undo`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@contextlib.contextmanager
def all_or_nothing(journals: Sequence[Journal]):  # noqa: ANN201
    """One transaction over every journal a command touches. On any error or Ctrl-C, every byte
    written in every target is put back before the exception goes on (a second Ctrl-C waits:
    SIGINT is held while undoing). Journals commit in the order given: apply passes FlashInfer's
    first, rollback SGLang's first, so a kill between two commits leaves FlashInfer patched under
    an SGLang gate that is shut or proven on it, never the other way round."""
    import signal

    for j in journals:
        j.begin()
    try:
        yield
    except BaseException as e:
        held = _hold_sigint(signal)
        failed: list[str] = []
        try:
            for j in reversed(journals):
                try:
                    j.abandon()
                    j.remove_if_empty()
                except (OSError, UserError):
                    failed.append(str(j.root))
        finally:
            _release_sigint(signal, held)
        if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
            if failed:
                raise Interrupted(
                    f"interrupted while writing; undo not finished: run `{rollback_command(failed[0])}`"
                ) from None
            raise Interrupted("interrupted; every file this run had written was put back") from None
        raise
    for j in journals:
        j.commit()


def _hold_sigint(signal: Any) -> Any:
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)


def _release_sigint(signal: Any, held: Any) -> None:
    if held is not None:
        signal.signal(signal.SIGINT, held)


def _journal_order(journals: dict[Path, Journal], targets: Sequence[Target]) -> list[Journal]:
    """Journals in commit order: those of FlashInfer targets first (a kill between two commits
    leaves FlashInfer patched, harmless alone; never an SGLang gate over an unpatched one)."""
    out: list[Journal] = []
    for t in ordered(targets):
        if journals[t.root] not in out:
            out.append(journals[t.root])
    return out


def apply_many(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    run: RunSettings,
    *,
    force: bool = False,
    commit: bool = False,
    wait_s: float = 0.0,
    only: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    log: list[Action] | None = None,
) -> list[RecipePlan]:
    """apply over every target: `reconcile` decides under the journals' lock (what `plan` prints
    for the same inputs), then `execute` carries the actions out, all of it one transaction.
    `log` receives the actions carried out, in order."""
    roots = [t.root for t in targets]
    if commit:  # before a byte is written: a commit that cannot be made must not leave files changed
        from sm120patch.gitops import identity_problem

        for t in [t for t in targets if t.is_git]:
            problem = identity_problem(t.root)
            if problem:
                raise UserError(problem)
    with _locked(roots, wait_s) as journals, all_or_nothing(_journal_order(journals, targets)):
        decided = reconcile(targets, recipes, run, only=only, exclude=exclude, commit=commit, journals=journals)
        return execute(decided, journals, recipes, run, force=force, commit=commit, log=log)


def execute(
    decided: Reconciliation,
    journals: dict[Path, Journal],
    recipes: Sequence[Recipe],
    run: RunSettings,
    *,
    force: bool = False,
    commit: bool = False,
    log: list[Action] | None = None,
) -> list[RecipePlan]:
    """Carry out a reconciliation's actions in order, inside the caller's transaction (apply's):
    the prelude, then each target's section. Nothing is decided here: every action's payload
    (the plan to write, its proof, the recheck to record) is the one `reconcile` made. Returns
    the plans apply reports; `log` receives each action once carried out."""
    did: list[Action] = [] if log is None else log
    _carry_out(decided, decided.prelude, journals, recipes, run, force, commit, did)
    out: list[RecipePlan] = []
    for w in decided.work:
        t = w.target
        writes = next((k for k, a in enumerate(w.actions) if a.kind is ActionKind.WRITE), len(w.actions))
        _carry_out(decided, w.actions[:writes], journals, recipes, run, force, commit, did)
        _name_conflicts(journals[t.root], t, w.plans, decided.choice, run.archs)
        _carry_out(decided, w.actions[writes:], journals, recipes, run, force, commit, did)
        if t.package == "sglang":  # its applied recipes whose proofs read a FlashInfer recipe's files
            _record_dependents(journals, t, w.plans, _fi_recipes(decided, journals, run))
        for p in w.plans:
            why = w.taken.get(p.recipe.id)
            if why is not None and p.status != APPLIED:
                p.mark(REVERTED, f"reverted: {why}")
            elif why is not None:
                p.reason += f" (rolled back first: {why}; then proven again and applied)"
        out += w.plans
    return out


def _carry_out(
    decided: Reconciliation,
    actions: Sequence[Action],
    journals: dict[Path, Journal],
    recipes: Sequence[Recipe],
    run: RunSettings,
    force: bool,
    commit: bool,
    did: list[Action],
) -> None:
    """Run of actions of one kind on one tree and package at a time (one rollback replays every
    recipe it keeps once; one write is one journaled transaction), in order."""
    for (kind, tree, package), group in itertools.groupby(actions, key=lambda a: (a.kind, a.tree, a.package)):
        acts = list(group)
        w = decided.of(tree, package)
        t, journal, ids = w.target, journals[w.target.root], [a.recipe for a in acts]
        if kind is ActionKind.RETIRE:
            retire(journal, t, ids)
        elif kind in (ActionKind.ROLLBACK_DEPENDENT, ActionKind.ROLLBACK_STALE):
            steps.rollback_locked(journal, t, recipes, None, ids, force=False)
        elif kind is ActionKind.RECORD_PROOF:
            renewed = [i for i in ids if i in w.renew]
            for a in [a for a in journal.applied if a["id"] in renewed and a.get("package") == t.package]:
                probe = w.renew[a["id"]].probe
                assert probe is not None
                a["evidence"] = probe.record()
            if renewed:
                journal.note("recheck", renewed=renewed)
                journal.save()
            # a written recipe's proof was kept by its write; what it stands on, once the section is done
        elif kind is ActionKind.WRITE:
            todo = [p for i in ids for p in w.write if p.recipe.id == i]
            steps.write_proven(journal, t, recipes, run.archs, todo, w.proofs, force=force, commit=commit)
        elif kind is not ActionKind.COMMIT:  # a commit is made with its write (one step, undone together)
            raise RuntimeError(f"sm120patch: no executor for {kind}")
        did += acts


def _fi_recipes(
    decided: Reconciliation, journals: dict[Path, Journal], run: RunSettings
) -> dict[str, tuple[Target, list[str]]]:
    """FlashInfer location -> (its target, the recipes applied there now): what SGLang proofs stand on."""
    out: dict[str, tuple[Target, list[str]]] = {}
    for w in [w for w in decided.work if w.target.package == "flashinfer"]:
        fi = _fi_of(w.target, run)
        if fi is not None:
            out[fi.location] = (
                w.target,
                [a["id"] for a in journals[w.target.root].applied if a.get("package") == "flashinfer"],
            )
    return out


def _edit_files(t: Target, recipe: Recipe) -> set[str]:
    """The files a recipe's edits would change, as the journal names them: a diff's `+++ b/`
    paths, a transform's hinted files."""
    out: set[str] = set()
    for e in recipe.edits:
        rels = list(e.files)
        if e.diff_path is not None and e.diff_path.is_file():
            lines = e.diff_path.read_text(errors="replace").splitlines()
            rels += [x[6:].strip() for x in lines if x.startswith("+++ b/")]
        out.update(t.rel(t.package_dir / r) for r in rels)
    return out


def _name_conflicts(
    journal: Journal, t: Target, plans: Sequence[RecipePlan], choice: Choice, archs: Sequence[Arch]
) -> None:
    """A recipe whose edit does not fit the tree but fits the release's own bytes of a file
    another recipe changed (applied before, or by this run) conflicts with that recipe, and says
    so; named with --recipe it fails (exit 1): the user asked for it and nothing of it is
    written. Unnamed, it stays not applicable. A recipe that fits neither is left as it was."""
    holders: dict[str, str] = {}  # file -> the recipe that changes it
    for a in journal.applied:
        holders.update({f: a["id"] for f in a.get("files") or ()})
    for p in plans:
        if p.status == APPLICABLE and choice.wants(p.recipe.id):
            holders.update({f: p.recipe.id for f in p.files})
    for p in plans:
        if p.status != NOT_APPLICABLE or not any(e.outcome == "missing" for e in p.edits):
            continue
        mine = {f: holders[f] for f in sorted(_edit_files(t, p.recipe)) if f in holders and holders[f] != p.recipe.id}
        if not mine or not _fits_the_release(journal, t, p.recipe, archs):
            continue
        ids = sorted(set(mine.values()))
        why = (
            f"conflicts with {', '.join(ids)}, which changed {', '.join(mine)}: nothing of it was written; "
            f"roll {'them' if len(ids) > 1 else 'it'} back first ({rollback_command(t.root, ids)}) to apply this one"
        )
        p.mark(FAILED if choice.only and p.recipe.id in choice.only else NOT_APPLICABLE, why)


def _fits_the_release(journal: Journal, t: Target, recipe: Recipe, archs: Sequence[Arch]) -> bool:
    """Whether the recipe's edits fit the files as the release had them (the journal's originals)."""

    def read(path: Path) -> bytes:
        return journal.original(t.rel(path))

    try:
        (alone,) = plan(t, [recipe], archs, read=read, allow_untested=True)
    except (JournalError, OSError):  # an original the journal lost: no claim either way
        return False
    return alone.status != NOT_APPLICABLE


def _record_dependents(
    journals: dict[Path, Journal],
    t: Target,
    plans: Sequence[RecipePlan],
    fi_recipes: dict[str, tuple[Target, list[str]]],
) -> dict[str, list[str]]:
    """Note, in the FlashInfer journal, each SGLang recipe whose proof read files a FlashInfer recipe
    of this run changed: it stands on that recipe, and goes when it goes. Returns {SGLang id: the
    FlashInfer recipes it stands on}."""
    done = {p.recipe.id for p in plans if p.status == APPLIED}
    out: dict[str, list[str]] = {}
    for entry in [e for e in journals[t.root].entries(t.package) if e.id in done]:
        for where, (fi_target, ids) in fi_recipes.items():
            fi_journal = journals[fi_target.root]
            for a in fi_journal.entries("flashinfer"):
                if a.id in ids and stands_on(entry.verdicts, _changed_in_package(fi_target, a), where):
                    a.add_dependent(Dependent(t.root, t.package, entry.id))
                    out.setdefault(entry.id, []).append(a.id)
            fi_journal.save()
    return out


def _changed_in_package(fi_target: Target, entry: Applied) -> set[str]:
    return {(fi_target.root / rel).relative_to(fi_target.package_dir).as_posix() for rel in entry.files}


def _dependents_of(
    journals: dict[Path, Journal],
    targets: Sequence[Target],
    fi_target: Target,
    entries: Sequence[dict[str, Any]],
) -> dict[Target, list[str]]:
    """The SGLang recipes standing on these FlashInfer journal entries, among the SGLang targets in
    view: recorded as dependents at apply, or (trees patched in separate runs) whose proof read
    files those recipes changed. The rule is the same for two trees and for one site-packages."""
    typed = [Applied(a) for a in entries]
    changed = set().union(*(_changed_in_package(fi_target, a) for a in typed)) if typed else set()
    deps = {(d.root, d.id) for a in typed for d in a.dependents}
    out: dict[Target, list[str]] = {}
    for sg in [t for t in targets if t.package == "sglang" and t.root in journals]:
        ids = [
            a.id
            for a in journals[sg.root].entries("sglang")
            if (sg.root, a.id) in deps or stands_on(a.verdicts, changed, fi_target.package_dir)
        ]
        if ids:
            out[sg] = ids
    return out


def rollback_many(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    *,
    ids: Sequence[str] | None = None,
    force: bool = False,
    wait_s: float = 0.0,
    missing_ok: bool = False,
) -> list[dict[str, Any]]:
    """Roll back SGLang targets first, then FlashInfer ones (all recipes, or `ids` wherever they
    are applied); a FlashInfer recipe's dependents (in any tree: recorded at apply, or found by
    what their proof read) go before it, said so. What pip made obsolete is retired, not written.
    `missing_ok`: ids applied nowhere are skipped instead of refused."""
    named = {(t.root, t.package) for t in targets}
    targets = _with_dependent_trees(list(targets))
    results: dict[tuple[Path, str], dict[str, Any]] = {}
    with _locked([t.root for t in targets], wait_s) as journals:
        recovered = {root: j.recovered for root, j in journals.items()}
        retired = {(t.root, t.package): retire(journals[t.root], t) for t in ordered(targets)}
        if ids:
            known = {a["id"] for j in journals.values() for a in j.applied}
            known |= {r.id for rs in retired.values() for r in rs}
            unknown = [i for i in ids if i not in known]
            if unknown and not missing_ok:
                where = ", ".join(str(t.root) for t in targets)
                held = ", ".join(a["id"] for j in journals.values() for a in j.applied) or "none"
                raise UserError(f"{', '.join(unknown)}: not applied here ({where}); applied: {held}")
        drop: dict[tuple[Path, str], list[str]] = {}
        because: dict[tuple[Path, str], str] = {}
        for t in ordered(targets):
            mine = [a["id"] for a in journals[t.root].applied if a.get("package", t.package) == t.package]
            asked = (t.root, t.package) in named  # a tree found through a dependent: only the dependents
            drop[(t.root, t.package)] = [i for i in mine if asked and (not ids or i in ids)]
        for t in [t for t in targets if t.package == "flashinfer"]:
            key = (t.root, t.package)
            entries = [a for a in journals[t.root].applied if a.get("package") == "flashinfer" and a["id"] in drop[key]]
            entries += [r.entry for r in retired[key] if not ids or r.id in ids]
            for sg, dep_ids in _dependents_of(journals, targets, t, entries).items():
                sk = (sg.root, sg.package)
                extra = [i for i in dep_ids if i not in drop[sk]]
                if extra:
                    drop[sk] += extra
                    because[sk] = f"proven on FlashInfer recipes at {t.root}"
        with all_or_nothing(_journal_order(journals, targets)[::-1]):
            for t in reversed(ordered(targets)):
                key = (t.root, t.package)
                r: dict[str, Any] = {"rolled_back": [], "kept_copies": [], "remaining": [], "files": []}
                if drop[key]:
                    r = steps.rollback_locked(journals[t.root], t, recipes, None, drop[key], force=force)
                else:
                    r["remaining"] = [
                        a["id"] for a in journals[t.root].applied if a.get("package", t.package) == t.package
                    ]
                r["recovered"] = [rel for rel in recovered.get(t.root, []) if _in_package(t, rel)]
                r["retired"] = [x.to_dict() for x in retired[key]]
                results[key] = {"target": t.to_dict(), **r}
                if key in because:
                    results[key]["because"] = because[key]
    order = [(t.root, t.package) for t in reversed(ordered(targets))]
    return [results[k] for k in order if k in named or results[k]["rolled_back"]]


def _in_package(t: Target, rel: str) -> bool:
    return (t.root / rel).is_relative_to(t.package_dir)


def _with_dependent_trees(targets: list[Target]) -> list[Target]:
    """The targets named, plus the SGLang trees the FlashInfer journals name as dependents' homes."""
    from sm120patch.planning.targets import discover

    out = list(targets)
    seen = {(t.root, t.package) for t in targets}
    for t in [t for t in targets if t.package == "flashinfer"]:
        try:
            applied = Journal.open(t.root).applied
        except UserError:
            continue
        for a in applied:
            for d in a.get("dependents") or []:
                root = Path(d["root"])
                if (root, "sglang") in seen or not root.is_dir():
                    continue
                try:
                    found = discover(root, "sglang")
                except UserError:
                    continue
                for sg in found:
                    if (sg.root, sg.package) not in seen:
                        seen.add((sg.root, sg.package))
                        out.append(sg)
    return out
