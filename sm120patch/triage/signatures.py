"""The catalogue of known crash signatures (patches/signatures.toml), validated strictly.

Signatures are data, like recipes: a typo in the catalogue must fail loudly with
one line naming the file and the key, never turn into a pattern that silently
matches nothing. Regexes are compiled once at load time.

Each signature also says how sure it is that the cause is SM12x (`sm12x`): "yes" only
when the text itself names SM12x; "maybe" when the same text appears on other GPUs
(then `check` says how to tell); "no" for causes that are not about the architecture.
A captured architecture (`arch_group`) or a known value (`by_value`, e.g. a shared-memory
limit) can settle it per match (a known value can also say the line is then only a warning,
`fatal = false`), and `advice` gives the fix in each framework's own flags.
Each also names its cause class (`class`, one of triage_classes.CLASSES), so a named cause
and a structural one are scored and reported alike.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch.catalogue.datafile import check_table, fail, read_toml
from sm120patch.catalogue.recipes import default_recipe_dir
from sm120patch.errors import RecipeError
from sm120patch.triage.classes import CLASSES
from sm120patch.triage.logkind import FRAMEWORKS

FILE_NAME = "signatures.toml"
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_KEYS: dict[str, type] = {
    "id": str,
    "regex": str,
    "substring": str,
    "context": str,
    "fatal": bool,
    "meaning": str,
    "next_step": str,
    "sources": list,
    "sm12x": str,
    "check": str,
    "arch_group": str,
    "by_value": dict,
    "advice": dict,
    "class": str,
    "fixed_by": list,
    "any_level": bool,
}
_REQUIRED = ("id", "fatal", "meaning", "next_step", "sources", "sm12x", "class")
VERDICTS = ("yes", "maybe", "no")
_VALUE_KEYS: dict[str, type] = {"sm12x": str, "means": str, "fatal": bool}
ANY_VALUE = "*"
_ARCH_DIGITS = re.compile(r"(\d+)(?:\.(\d))?")


def arch_major(text: str) -> int | None:
    """The compute-capability major in `sm_120a`, `compute_86`, `120`, `12.0`; None if there is none."""
    m = _ARCH_DIGITS.search(text)
    if not m:
        return None
    if m.group(2) is not None:
        return int(m.group(1))
    digits = m.group(1)
    return int(digits[:-1]) if len(digits) >= 2 else None


@dataclass(frozen=True)
class ValueFact:
    """What one captured value means (a shared-memory limit: which GPUs have it)."""

    means: str
    sm12x: str | None = None
    # False: with this value the line is a warning, not the failure (a 12.1 GPU warned against a PyTorch built up
    # to 12.0 runs its sm_120 code): the error that stopped the run, if any, is answered on its own
    fatal: bool | None = None


@dataclass(frozen=True)
class Signature:
    """One known crash text: how to find it, what it means, what to do next."""

    id: str
    pattern: re.Pattern[str]
    fatal: bool
    meaning: str
    next_step: str
    sources: tuple[str, ...]
    context: re.Pattern[str] | None = None
    sm12x: str = "maybe"
    check: str = ""
    arch_group: str | None = None
    by_value: tuple[tuple[str, tuple[tuple[str, ValueFact], ...]], ...] = ()
    advice: tuple[tuple[str, str], ...] = ()
    cls: str = "other"  # the cause class (triage_classes.CLASSES)
    fixed_by: tuple[str, ...] = ()  # recipes whose gate or kernels this crash is about
    # an error path whatever level the library logs it at (NCCL prints ncclMaxSharedMem ... at INFO, then fails)
    any_level: bool = False

    def search(self, line: str) -> re.Match[str] | None:
        return self.pattern.search(line)

    def judge(self, details: dict[str, str]) -> str:
        """This match's verdict on SM12x; adds `<group>_means` to `details` for known values."""
        verdict = self.sm12x
        for group, _ in self.by_value:
            fact = self._value_fact(group, details)
            if fact is not None:
                details[f"{group}_means"] = fact.means
                verdict = fact.sm12x or verdict
        if self.arch_group and details.get(self.arch_group):  # a named architecture settles it
            major = arch_major(details[self.arch_group])
            if major is not None:
                verdict = "yes" if major == 12 else "no"
            fact = self._arch_fact(details)  # ... unless that very architecture is a known value (12.1, a 12.0 build)
            if fact is not None and fact.sm12x is not None:
                verdict = fact.sm12x
        return verdict

    def _value_fact(self, group: str, details: dict[str, str]) -> ValueFact | None:
        """The known-value fact for what this match captured in `group` (or the group's `*` fact), if any."""
        if group not in details:
            return None
        table = dict(next((facts for g, facts in self.by_value if g == group), ()))
        return table.get(details[group], table.get(ANY_VALUE))

    def _arch_fact(self, details: dict[str, str]) -> ValueFact | None:
        """The known-value fact for the architecture this match captured, if the catalogue has one."""
        return self._value_fact(self.arch_group, details) if self.arch_group else None

    def fatal_for(self, details: dict[str, str]) -> bool:
        """Whether this match is a failure: the signature's `fatal`, unless a known value it captured says the
        line is only a warning (by_value's `fatal = false`)."""
        for group, _ in self.by_value:
            fact = self._value_fact(group, details)
            if fact is not None and fact.fatal is not None:
                return fact.fatal
        return self.fatal

    def pinned(self, details: dict[str, str]) -> bool:
        """The architecture captured is itself a known value with a verdict: the GPU the log shows must not
        override it (a 12.1 GPU warned against a build up to 12.0 is SM12x, and still not proof that kernels
        are missing)."""
        fact = self._arch_fact(details) if self.arch_group else None
        return fact is not None and fact.sm12x is not None

    def next_step_for(self, framework: str | None) -> str:
        """The fix in the crashed framework's own flags, else the general one."""
        return dict(self.advice).get(framework or "", self.next_step)


def default_signatures_path() -> Path:
    """The catalogue next to the recipe packages (repo checkout or installed wheel)."""
    return default_recipe_dir() / FILE_NAME


def _compile(path: Path, key: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise fail(path, key, f"bad regex ({e})", "fix the pattern (TOML single quotes avoid escaping)") from None


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _load_one(path: Path, i: int, raw: Any) -> Signature:
    where = f"signature[{i}]"
    if not isinstance(raw, dict):
        raise fail(path, where, "is not a table", "write it as [[signature]]")
    check_table(path, where, raw, _KEYS)
    for k in _REQUIRED:
        if k not in raw:
            raise fail(path, f"{where}.{k}", "missing", "every signature needs " + ", ".join(_REQUIRED))
    sid = raw["id"]
    where = f"signature {sid!r}"
    if not _ID_RE.match(sid):
        raise fail(path, f"{where}.id", "is not lowercase-with-dashes", "rename it, e.g. cuda-out-of-memory")
    if ("regex" in raw) == ("substring" in raw):
        raise fail(path, where, "needs exactly one of 'regex' or 'substring'", "give one")
    if "regex" in raw:
        pattern = _compile(path, f"{where}.regex", raw["regex"])
    else:
        if not raw["substring"]:
            raise fail(path, f"{where}.substring", "is empty", "give the text to look for")
        pattern = re.compile(re.escape(raw["substring"]))
    context = _compile(path, f"{where}.context", raw["context"]) if "context" in raw else None
    groups = set(pattern.groupindex) | (set(context.groupindex) if context else set())
    for k in ("meaning", "next_step"):
        if not raw[k].strip():
            raise fail(path, f"{where}.{k}", "is empty", "write one sentence")
    sources = raw["sources"]
    if not sources or not all(isinstance(s, str) and s.startswith("https://") for s in sources):
        raise fail(path, f"{where}.sources", "must be a non-empty list of https:// URLs", "cite the public report")
    verdict = _verdict(path, f"{where}.sm12x", raw["sm12x"])
    if raw["class"] not in CLASSES:
        raise fail(path, f"{where}.class", f"is {raw['class']!r}", f"use one of {', '.join(CLASSES)}")
    if verdict == "maybe" and not raw.get("check", "").strip():
        raise fail(path, f"{where}.check", "missing", "a 'maybe' signature must say how to tell SM12x from the rest")
    fixed_by = raw.get("fixed_by", [])
    if not all(isinstance(r, str) and _ID_RE.match(r) for r in fixed_by):
        raise fail(
            path, f"{where}.fixed_by", "must be a list of recipe ids", 'e.g. fixed_by = ["sglang-moe-backend-sm120"]'
        )
    arch_group = raw.get("arch_group")
    if arch_group is not None and arch_group not in groups:
        raise fail(path, f"{where}.arch_group", f"names {arch_group!r}, which no regex captures", "fix it")
    by_value = _by_value(path, where, raw.get("by_value", {}), groups)
    advice = _advice(path, where, raw.get("advice", {}))
    texts = {k: raw[k] for k in ("meaning", "next_step", "check") if k in raw}
    texts.update({f"advice.{k}": v for k, v in advice})
    names = groups | {f"{g}_means" for g, _ in by_value}
    for key, text in texts.items():
        unknown = _placeholders(text) - names
        if unknown:
            raise fail(
                path,
                f"{where}.{key}",
                f"uses {{{sorted(unknown)[0]}}} which no named group captures",
                "add the group or drop the placeholder",
            )
    return Signature(
        id=sid,
        pattern=pattern,
        fatal=raw["fatal"],
        meaning=raw["meaning"].strip(),
        next_step=raw["next_step"].strip(),
        sources=tuple(sources),
        context=context,
        sm12x=verdict,
        check=" ".join(raw.get("check", "").split()),
        arch_group=arch_group,
        by_value=by_value,
        advice=advice,
        cls=raw["class"],
        fixed_by=tuple(fixed_by),
        any_level=raw.get("any_level", False),
    )


def _verdict(path: Path, key: str, value: str) -> str:
    if value not in VERDICTS:
        raise fail(path, key, f"is {value!r}", f"use one of {', '.join(VERDICTS)}")
    return value


def _by_value(
    path: Path, where: str, raw: dict[str, Any], groups: set[str]
) -> tuple[tuple[str, tuple[tuple[str, ValueFact], ...]], ...]:
    out = []
    for group, table in raw.items():
        key = f"{where}.by_value.{group}"
        if group not in groups:
            raise fail(path, key, "is not a named group of the regex", "capture it as (?P<name>...)")
        if not isinstance(table, dict) or not table:
            raise fail(path, key, "is not a table of values", 'write [signature.by_value.NAME."VALUE"] tables')
        facts = []
        for value, fact in table.items():
            vkey = f"{key}.{value}"
            if not isinstance(fact, dict):
                raise fail(path, vkey, "is not a table", "give means (and optionally sm12x)")
            check_table(path, vkey, fact, _VALUE_KEYS)
            if not fact.get("means", "").strip():
                raise fail(path, f"{vkey}.means", "missing", "say what the value means and which GPUs have it")
            verdict = _verdict(path, f"{vkey}.sm12x", fact["sm12x"]) if "sm12x" in fact else None
            facts.append((value, ValueFact(" ".join(fact["means"].split()), verdict, fact.get("fatal"))))
        out.append((group, tuple(facts)))
    return tuple(out)


def _advice(path: Path, where: str, raw: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    out = []
    for framework, text in raw.items():
        key = f"{where}.advice.{framework}"
        if framework not in FRAMEWORKS:
            raise fail(path, key, "is not a known framework", f"use one of {', '.join(FRAMEWORKS)}")
        if not isinstance(text, str) or not text.strip():
            raise fail(path, key, "is not a non-empty string", "write the fix in that framework's flags")
        out.append((framework, " ".join(text.split())))
    return tuple(out)


def load_signatures(path: Path | None = None) -> list[Signature]:
    """Every signature in the catalogue, in file order (most specific first)."""
    path = path or default_signatures_path()
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise RecipeError(f"{path}: cannot read ({e.strerror}); check the path or set SM120PATCH_RECIPES") from None
    data = read_toml(path, blob, "the signature catalogue")
    for k in data:
        if k != "signature":
            raise fail(path, k, "unknown key", "the file holds only [[signature]] tables")
    raw = data.get("signature", [])
    if not isinstance(raw, list) or not raw:
        raise fail(path, "signature", "no [[signature]] tables", "add at least one")
    sigs = [_load_one(path, i, r) for i, r in enumerate(raw)]
    seen: set[str] = set()
    for s in sigs:
        if s.id in seen:
            raise fail(path, f"signature {s.id!r}.id", "is used twice", "ids must be unique")
        seen.add(s.id)
    return sigs
