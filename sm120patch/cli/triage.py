"""Click commands for crash triage: `sm120patch diagnose` and `sm120patch guard`.

Kept apart from the logic (triage/diagnose.py, triage/guard.py) so both stay testable without click,
and apart from cli/__init__.py so the engine can be wired in lazily: these commands only import
`sm120patch.engine.tree` when a --target is given, and still work (journal "unknown") while the
engine is missing or the journal is unreadable.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch import cli
from sm120patch.errors import TargetError, UserError
from sm120patch.hints import rollback_command
from sm120patch.triage import log_input

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe

RollbackFn = Callable[[Path, list[str]], list[str]]
AppliedFn = Callable[[Path], set[str]]


def engine_hooks() -> tuple[AppliedFn, RollbackFn]:
    """The engine's journal reader and rollback, imported late (the engine is optional here)."""
    from sm120patch.engine.tree import applied_recipes, rollback_recipes

    return applied_recipes, rollback_recipes


def load_recipes(directory: Path | None = None) -> list[Recipe]:
    """`recipes.load_recipes`, imported on first use: `sm120patch --help` does not need it."""
    from sm120patch.catalogue.recipes import load_recipes as load

    return load(directory)


def _recipes(directory: Path | None) -> list[Recipe]:
    """The recipe catalogue; a broken recipe must not stop triage of a crash, so warn and go on."""
    try:
        return load_recipes(directory)
    except UserError as e:
        click.echo(f"warning: recipes not loaded ({e}); matching known signatures only", err=True)
        return []


def _journal(target: Path | None) -> set[str] | None:
    if target is None:
        return None
    try:
        applied, _ = engine_hooks()
        return set(applied(target))
    except ImportError:
        click.echo("warning: the engine is not available; the journal is unknown", err=True)
    except TargetError:  # a wrong --target is the user's to fix: main says so
        raise
    except UserError as e:
        click.echo(f"warning: journal not read ({e}); treating it as unknown", err=True)
    return None


@click.command("diagnose", short_help=cli.summary("diagnose"))
@click.argument("logfile", required=False, default="-")
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    help="The SGLang/FlashInfer tree (or site-packages) the server ran: its journal says which recipes are "
    "applied, and the planner which sm120patch apply fixes the crash there.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (its shape: sm120patch/triage/diagnose.py)."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr (shown when reading takes over a second).")
@click.option("--recipes", "recipe_dir", type=click.Path(path_type=Path), hidden=True)
def diagnose_cmd(logfile: str, target: Path | None, as_json: bool, quiet: bool, recipe_dir: Path | None) -> int:
    """Name the cause of a server crash from its log (LOGFILE, or - for stdin).

    Exit 0: a cause was named (or the log shows no error); 1: the log shows a fatal
    error no known signature names (then the finding gives its cause class, from the
    traceback's library, the architectures and backend flags the log names, and says
    when that evidence is thin); 2: bad input (a missing, empty or binary file).

    With --target, a crash that an sm120patch recipe fixes gets the exact
    `sm120patch apply ...` command for that tree (e.g. the FlashInfer backport for the
    allreduce-fusion crash on SGLang 0.5.5-0.5.17 with its pinned FlashInfer).
    """
    from sm120patch.triage.diagnose import diagnose, read_lines
    from sm120patch.triage.signatures import load_signatures

    signatures = load_signatures(recipe_dir / "signatures.toml" if recipe_dir else None)
    _check_target(target)
    recipes = _recipes(recipe_dir)
    journal = _journal(target)
    try:
        stream = sys.stdin.buffer if logfile == "-" else open(logfile, "rb")  # noqa: SIM115
    except OSError as e:
        raise UserError(_unreadable(logfile, e)) from None
    name = "stdin" if logfile == "-" else logfile
    try:
        problem = log_input.check_head(log_input.head(stream), name)
        if problem:
            raise UserError(problem)
        lines = read_lines(stream)
        if not quiet:
            lines = log_input.with_progress(lines, stream, name, tty=sys.stderr.isatty())
        result = diagnose(lines, recipes, journal, signatures=signatures, target=target)
    except OSError as e:
        raise UserError(_unreadable(name, e)) from None
    finally:
        if logfile != "-":
            stream.close()
    from sm120patch.triage.advice import add_advice

    add_advice(result, recipes, target, warn=lambda message: click.echo(f"warning: {message}", err=True))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))  # ensure_ascii: every control character escaped
    else:
        click.echo(result.render())
    return result.exit_code


def _unreadable(name: str, e: OSError) -> str:
    return f"{name}: cannot read the log ({e.strerror}); give the server's log file or - for stdin"


def _check_target(target: Path | None) -> None:
    if target is not None and not target.exists():
        raise UserError(f"{target}: target not found; pass the tree sm120patch apply was run on")


# Guard's own options come before the server command (or `--`); the first argument that is not one of them starts
# the command, whose own options are never read as guard's. An unknown option before it is a usage error, not the
# server command (`guard --json -- CMD` once ran `--json` as the server).
@click.command("guard", context_settings={"allow_interspersed_args": False}, short_help=cli.summary("guard"))
@click.option("--target", type=click.Path(path_type=Path), help="Tree the recipes were applied to.")
@click.option("--restart", is_flag=True, help="After rolling back, start the server once more.")
@click.option("--ready-pattern", default=None, help="Regex of the output line that means ready.")
@click.option("--ready-url", default=None, help="URL that answers once ready, e.g. http://127.0.0.1:30000/health.")
@click.option("--timeout", type=float, default=None, help="Seconds to become ready (0: no limit). Default 1800.")
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL. Default 10.")
@click.option("--log", "log_path", type=click.Path(path_type=Path), help="Also append guard's log to this file.")
@click.option(
    "--canary",
    type=click.FloatRange(min=0.05),
    default=None,
    metavar="SECONDS",
    help="Once ready, send the canary prompt (greedy) this often and compare each answer with the server's own "
    "first valid one; on a collapse or a changed answer, stop the server, roll back the recipes marked "
    "changes_outputs (tactics first) and relaunch (docs/verify.md).",
)
@click.option("--canary-url", default=None, help="Server base URL for --canary [default: from --ready-url].")
@click.option("--canary-tokens", type=click.IntRange(1, 1 << 16), default=256, show_default=True, hidden=True)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Guard\'s own account on stderr as JSON lines: {"event": "log", "message": ...} as it happens, then '
    '{"event": "exit", "exit_code": N}; the server\'s output still passes through on stdout.',
)
@click.option("--recipes", "recipe_dir", type=click.Path(path_type=Path), hidden=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def guard_cmd(
    target: Path | None,
    restart: bool,
    ready_pattern: str | None,
    ready_url: str | None,
    timeout: float | None,
    grace: float | None,
    log_path: Path | None,
    canary: float | None,
    canary_url: str | None,
    canary_tokens: int,
    as_json: bool,
    recipe_dir: Path | None,
    command: tuple[str, ...],
) -> int:
    """Run a server (after --), roll back the recipe that crashes it on startup, optionally restart.

    Example: sm120patch guard --target ./sglang --restart -- python -m sglang.launch_server ...
    """
    from sm120patch.triage import guard
    from sm120patch.triage.signatures import load_signatures

    _check_target(target)
    signatures = load_signatures(recipe_dir / "signatures.toml" if recipe_dir else None)
    opts = guard.GuardOptions(
        command=list(command),
        target=target,
        ready_pattern=ready_pattern or guard.DEFAULT_READY,
        ready_url=ready_url,
        timeout=guard.DEFAULT_TIMEOUT if timeout is None else timeout,
        restart=restart,
        grace=guard.DEFAULT_GRACE if grace is None else grace,
        canary=_canary(canary, canary_url, ready_url, canary_tokens),
    )
    log = guard.GuardLog(stream=_JsonLines(guard.PREFIX) if as_json else _VisibleLines(), path=log_path)
    applied, rollback = _hooks_or_none(target)
    if target is not None:
        try:
            applied(target)  # a wrong --target is bad usage, found before the server starts
        except TargetError:
            raise
        except Exception:  # an unreadable journal is guard's to report, per launch
            pass
        _take_back_stale(target, rollback, log)
    try:
        code = guard.run_guard(
            opts,
            recipes=_recipes(recipe_dir),
            rollback=rollback,
            applied=applied,
            signatures=signatures,
            log=log,
        )
    finally:
        log.close()
    if as_json:
        _json_line({"event": "exit", "exit_code": code})
    return code


def _json_line(obj: dict[str, Any]) -> None:
    sys.stderr.write(json.dumps(obj) + "\n")
    sys.stderr.flush()


class _VisibleLines(io.TextIOBase):
    """stderr for guard's own account: the log lines it quotes (a crash line, the last error) may hold any
    control character; each is shown as its escape (sm120patch/visible.py), never sent to the terminal."""

    def __init__(self) -> None:
        self._pending = ""

    def write(self, text: str) -> int:
        from sm120patch.visible import visible

        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            sys.stderr.write(visible(line) + "\n")
        sys.stderr.flush()
        return len(text)


class _JsonLines(io.TextIOBase):
    """The stream guard's account is printed to, under --json: each `[sm120patch guard] MESSAGE` line it
    receives goes to stderr as {"event": "log", "message": MESSAGE}."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix + " "
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            _json_line({"event": "log", "message": line.removeprefix(self._prefix)})
        return len(text)


def _canary(interval: float | None, url: str | None, ready_url: str | None, tokens: int) -> Any:
    """The canary for --canary (imports httpx only then); its URL: --canary-url, else --ready-url's origin."""
    if interval is None:
        if url:
            raise UserError("--canary-url needs --canary SECONDS")
        return None
    if url is None and ready_url:
        from urllib.parse import urlsplit

        parts = urlsplit(ready_url)
        url = f"{parts.scheme}://{parts.netloc}"
    if not url or not url.startswith(("http://", "https://")):
        raise UserError("--canary needs the server's URL: --canary-url http://127.0.0.1:30000 (or --ready-url)")
    from sm120patch.verify.canary import Canary

    return Canary(url, interval, tokens)


def _take_back_stale(target: Path, rollback: RollbackFn, log: Any) -> None:
    """Before the first start: a recipe whose kernels are gone from the FlashInfer now under the
    tree (a `pip install` re-pinned it, a new image) would crash the server as the seed did."""
    try:
        from sm120patch.engine.tree import stale_recipes

        stale = stale_recipes(target)
    except Exception as e:  # the check must never keep the server from starting
        log(f"could not re-check the applied recipes' proofs ({type(e).__name__}: {e}); starting anyway")
        return
    for rid, why in stale.items():
        log(f"stale before start: {rid}: {why}")
    if stale:
        try:
            done = rollback(target, list(stale))
        except Exception as e:
            log(f"rollback of the stale recipes failed ({e}); run `{rollback_command(target)}` by hand")
            return
        log(f"rolled back {', '.join(done)} before starting the server")


def _hooks_or_none(target: Path | None) -> tuple[AppliedFn, RollbackFn]:
    """Engine hooks, or stand-ins that say the journal is unknown when the engine is missing."""
    try:
        return engine_hooks()
    except ImportError:
        if target is not None:
            click.echo("warning: the engine is not available; guard will report, not roll back", err=True)

        def no_journal(path: Path) -> set[str]:
            raise RuntimeError("the engine is not available")

        def no_rollback(path: Path, ids: list[str]) -> list[str]:
            raise RuntimeError("the engine is not available")

        return no_journal, no_rollback
