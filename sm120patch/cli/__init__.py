"""The `sm120patch` command: a thin click group over plain functions.

One module per group of commands (cli/tree.py, info.py, triage.py, bundle.py, verify.py), imported only
when one of its commands runs; what they share lives in cli/common.py and cli/options.py. In pre-commit's
manner each command returns its exit code and raises `UserError` for a mistake the user can fix; `run` is
the one error path (one line, no traceback) and `main` the one place that exits. Exit codes (stable,
documented in README):
  0  done, including "nothing to do"
  1  a recipe failed, was blocked by its probe, or was reverted
  2  bad input or usage; nothing was written
  3  an internal error (a bug: please report it with SM120PATCH_DEBUG=1 output)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from sm120patch import __version__
from sm120patch.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UserError

EXIT_INTERNAL = 3

# The command table, in pip's manner: name -> (module:attribute, one-line summary). A command's
# module is imported only when that command runs, so `sm120patch --help` imports click alone.
# The summary is what `--help` lists (click would cut the docstring's first sentence off).
COMMANDS: dict[str, tuple[str, str]] = {
    "recipes": (
        "sm120patch.cli.info:recipes_cmd",
        "The recipe catalogue: what each opens, for which releases, why.",
    ),
    "preflight": (
        "sm120patch.cli.info:preflight_cmd",
        "This box: GPUs, CUDA, torch, SGLang, FlashInfer, verdicts.",
    ),
    "census": (
        "sm120patch.cli.census:census_cmd",
        "Can these GPUs run the installed CUDA code?",
    ),
    "plan": ("sm120patch.cli.tree:plan_cmd", "Dry run: each recipe's status on PATH and its diff."),
    "apply": ("sm120patch.cli.tree:apply_cmd", "Probe each recipe, then journal and write what was proven."),
    "status": ("sm120patch.cli.tree:status_cmd", "What is applied to PATH, what changed since, proofs."),
    "rollback": ("sm120patch.cli.tree:rollback_cmd", "Restore the original bytes (all, or --recipe ID)."),
    "probe": ("sm120patch.cli.info:probe_cmd", "Climb the probe ladder for kernels, for an arch."),
    "clone": ("sm120patch.cli.tree:clone_cmd", "Make a fresh git clone of a release to patch."),
    "export": ("sm120patch.cli.bundle:export_cmd", "Write what apply would do as a bundle of git patches."),
    "diagnose": ("sm120patch.cli.triage:diagnose_cmd", "Name the cause of a server crash from its log."),
    "guard": ("sm120patch.cli.triage:guard_cmd", "Run a server; roll back the recipe that crashes it."),
    "gates": ("sm120patch.cli.gates:gates_cmd", "Every architecture gate in a release; what changed since the last."),
    "verify": (
        "sm120patch.cli.verify:verify_cmd",
        "A/B on your server: keep what is faster and answers the same.",
    ),
}


def summary(name: str) -> str:
    """A command's one-line summary from the table: its `short_help`, and what `--help` lists."""
    return COMMANDS[name][1]


class LazyGroup(click.Group):
    """A click group that imports a command's module only when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        where, summary = COMMANDS[cmd_name]
        module, attr = where.split(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the table's summaries without importing a single command module."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sm120patch")
def cli() -> None:
    """Open SGLang/FlashInfer fast paths that are gated to SM90/SM100 on SM120/SM121 GPUs
    (RTX PRO 6000, RTX 5090, DGX Spark), only where the kernels behind them exist,
    and undo every change byte for byte.

    \b
    Typical session:
      sm120patch recipes                      what can be opened, and why
      sm120patch plan ~/src/sglang            dry run: statuses and diffs, nothing written
      sm120patch apply ~/src/sglang           probe, then write what the probe proved
      sm120patch status ~/src/sglang          what is applied, what changed since
      sm120patch rollback ~/src/sglang        restore the original bytes

    PATH is a git clone (python/sglang/), an unpacked wheel or site-packages
    (sglang/), or the package folder itself; --installed finds the copy Python imports.

    \b
    Exit codes: 0 done (also "nothing to do"), 1 a recipe failed, was blocked,
    untested, stale or reverted, 2 bad input or usage (nothing written),
    3 internal error, 130 Ctrl-C.
    """


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code: the one place errors become a line on stderr.

    A user's mistake (`UserError`) is one line and its code (2), click's usage errors are click's
    own message and 2, Ctrl-C is 130, anything else is a bug: one line and 3, never a traceback
    (SM120PATCH_DEBUG=1 shows it)."""
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name="sm120patch", standalone_mode=False)
    except UserError as e:
        # names from recipes or journals may hold control characters: keep the error one line
        from sm120patch.visible import visible  # on the error path only: `--help` imports nothing more

        click.echo(f"sm120patch: error: {visible(str(e))}", err=True)
        return e.exit_code
    except click.exceptions.Abort as e:  # click's form of Ctrl-C: the interrupt itself is the cause
        click.echo(f"sm120patch: {getattr(e.__cause__, 'message', 'interrupted')}", err=True)
        return EXIT_INTERRUPTED
    except click.ClickException as e:
        e.show()
        return EXIT_USAGE if e.exit_code == 2 else e.exit_code
    except KeyboardInterrupt as e:  # an Interrupted says whether the run's writes were put back
        click.echo(f"sm120patch: {getattr(e, 'message', 'interrupted')}", err=True)
        return EXIT_INTERRUPTED
    except SystemExit:
        raise
    except BaseException as e:  # a bug, not the user's fault
        if os.environ.get("SM120PATCH_DEBUG"):
            raise
        click.echo(
            f"sm120patch: internal error: {type(e).__name__}: {e} (rerun with SM120PATCH_DEBUG=1 and report it)",
            err=True,
        )
        return EXIT_INTERNAL
    # a command returns its code; --help, --version and a group without a command return None or 0
    return EXIT_OK if code is None else int(code)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point (the console script, `python -m sm120patch`): the only place that exits."""
    sys.exit(run(argv))
