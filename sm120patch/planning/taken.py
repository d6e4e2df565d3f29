"""The taken line: patched code says, once per process, that a recipe's gate was taken.

A recipe's `[[taken]]` names an expression of the patched code (`anchor`, in `functions`,
optionally only in statements whose own arm mentions `near`) that runs when the gate's path
is chosen. After the recipe's edits, each occurrence in the files the recipe changed becomes
`_sm120patch_taken("<recipe-id>", <anchor>)` (with a third argument where the entry's `logs_if` is
not "true"), and the module gains, once, the helper `_sm120patch_taken(recipe_id, value, logs_if=True)`:
the first time a process evaluates it for a recipe with the value that takes the gate (true; false
for `logs_if = "false"`; any value for "reached"), so an H100 that evaluates the SM12x test and gets
False says nothing, it logs `sm120patch: <recipe-id> taken` at INFO on the `sm120patch` logger and writes the same
line to stderr (the logger may have no handler); it never raises and always
returns `value`, so the patched code means what it meant. verify, diagnose and guard read the
line back (sm120patch/taken_line.py). On a real SGLang 0.5.17 launch on an H200 the line came out
twice, through SGLang's root handler with its timestamp and then bare on stderr; the reader counts
it once (tests/data/real-launch/). An anchor a release does not have costs only the line:
the recipe still applies, and where none of its anchors is found its reason says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst as cst

    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.planning.plan import Workspace

HELPER = "_sm120patch_taken"

# one statement, self-contained: its seen-set hangs on the `sm120patch` logger, so a recipe whose
# gate sits in two modules still logs once per process. No token spans lines (a one-line docstring):
# libcst writes every line break in the module's own newline (CRLF files stay CRLF)
HELPER_CODE = '''def _sm120patch_taken(recipe_id, value, logs_if=True):
    """sm120patch: log `sm120patch: <recipe-id> taken` once per process and recipe when value takes the gate."""
    try:
        import logging
        import sys

        if logs_if is not None and bool(value) != logs_if:
            return value
        logger = logging.getLogger("sm120patch")
        seen = logger.__dict__.setdefault("_sm120patch_taken", set())
        if recipe_id not in seen:
            seen.add(recipe_id)
            line = "sm120patch: %s taken" % (recipe_id,)
            logger.info(line)
            sys.stderr.write(line + "\\n")
            sys.stderr.flush()
    except Exception:
        pass
    return value
'''


def add_taken(ws: Workspace, recipe: Recipe, paths: Iterable[Path]) -> str:
    """Wrap every `[[taken]]` anchor found in `paths` (the files this recipe changed) and add the
    helper to each module that got one. Returns "" when an entry was found, else a note for
    the plan's reason. Never fails the recipe: an error here only loses the line."""
    from sm120patch.transforms.wrap_expression import WrapExpression

    missing: list[str] = []
    wrapped: set[Path] = set()
    for entry in recipe.taken:
        extra = {"true": "", "false": ", False", "reached": ", None"}[entry.logs_if]
        params = {"anchor": entry.anchor, "template": f'{HELPER}("{recipe.id}", __anchor__{extra})'}
        if entry.near:
            params["near"] = entry.near
        found = False
        for path in sorted(paths):
            transform = WrapExpression(params, entry.functions)
            try:
                out = transform.apply(ws.module(path))
            except Exception:  # an anchor we cannot place costs the line, never the recipe
                continue
            if out.satisfied:
                found = True
            if out.module is None or out.notes:
                continue
            code = ws.code(path, out.module)
            if ws.compiles(path, code) is not None:
                continue
            ws.set(path, code, out.module)
            wrapped.add(path)
            found = True
        if not found:
            missing.append(f"`{entry.anchor}` in {'/'.join(entry.functions)}")
    for path in sorted(wrapped):
        module = ws.module(path)
        if _defines(module, HELPER):
            continue
        new = _with_helper(module)
        code = ws.code(path, new)
        if ws.compiles(path, code) is not None:
            continue
        ws.set(path, code, new)
    if len(missing) < len(recipe.taken):  # one anchor found is a taken line (an optional part may lack its own)
        return ""
    return f" (no taken line on this release: {'; '.join(missing)} not found)"


def marked_files(recipe: Recipe, before: dict[str, bytes]) -> list[str]:
    """The files (of `before`: rel path -> bytes) that already carry this recipe's taken call."""
    needle = f'{HELPER}("{recipe.id}",'.encode()
    return sorted(rel for rel, data in before.items() if needle in data)


def _defines(module: cst.Module, name: str) -> bool:
    import libcst as cst

    return any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in module.body)


def _with_helper(module: cst.Module) -> cst.Module:
    """The helper right after the module's leading docstring and imports (so `from __future__`
    stays first), set off by two blank lines."""
    import libcst as cst

    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom))
            or (isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString)))
            for s in stmt.body
        ):
            at = i + 1
            continue
        break
    blank = [cst.EmptyLine(indent=False)] * 2
    helper = cst.parse_statement(HELPER_CODE).with_changes(leading_lines=blank)
    if at < len(body):
        nxt = body[at]
        comments = [ln for ln in nxt.leading_lines if ln.comment is not None]
        body[at] = nxt.with_changes(leading_lines=[*blank, *comments])
    body.insert(at, helper)
    return module.with_changes(body=body)
