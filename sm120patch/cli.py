"""The `sm120patch` command: a thin click group over plain functions.

One module per group of commands (commands_tree, commands_info, commands_triage);
what they share lives in cli_common. Exit codes (stable, documented in README):
  0  done, including "nothing to do"
  1  a recipe failed, was blocked by its probe, or was reverted
  2  bad input or usage; nothing was written
  3  an internal error (a bug: please report it with SM120PATCH_DEBUG=1 output)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from sm120patch import __version__
from sm120patch.commands_bundle import export_cmd
from sm120patch.commands_info import preflight_cmd, probe_cmd, recipes_cmd
from sm120patch.commands_tree import apply_cmd, clone_cmd, plan_cmd, rollback_cmd, status_cmd
from sm120patch.commands_triage import diagnose_cmd, guard_cmd
from sm120patch.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UserError

EXIT_INTERNAL = 3


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sm120patch")
def cli() -> None:
    """Open SGLang/FlashInfer fast paths that are gated to SM90/SM100 on SM120/SM121 GPUs
    (RTX PRO 6000, RTX 5090, DGX Spark), only where the kernels behind them exist,
    and undo every change byte for byte.

    \b
    Typical session:
      sm120patch recipes                      what can be opened, and why
      sm120patch plan ~/src/sglang            dry run: statuses and diffs, nothing written
      sm120patch apply ~/src/sglang           write, probe, revert what the probe rejects
      sm120patch status ~/src/sglang          what is applied, what changed since
      sm120patch rollback ~/src/sglang        restore the original bytes

    PATH is a git clone (python/sglang/), an unpacked wheel or site-packages
    (sglang/), or the package folder itself; --installed finds the copy Python imports.

    \b
    Exit codes: 0 done (also "nothing to do"), 1 a recipe failed, was blocked or
    reverted, 2 bad input or usage (nothing written), 3 internal error, 130 Ctrl-C.
    """


for _command in (recipes_cmd, plan_cmd, apply_cmd, probe_cmd, preflight_cmd, rollback_cmd, status_cmd, clone_cmd):
    cli.add_command(_command)
cli.add_command(diagnose_cmd)
cli.add_command(guard_cmd)
cli.add_command(export_cmd)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: user mistakes end in one line and exit 2, never a traceback."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="sm120patch", standalone_mode=False)
    except UserError as e:
        # names from recipes or journals may hold control characters: keep the error one line
        msg = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(e))
        click.echo(f"sm120patch: error: {msg}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:  # click's form of Ctrl-C: the interrupt itself is the cause
        click.echo(f"sm120patch: {getattr(e.__cause__, 'message', 'interrupted')}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_USAGE if e.exit_code == 2 else e.exit_code)
    except KeyboardInterrupt as e:  # an Interrupted says whether the run's writes were put back
        click.echo(f"sm120patch: {getattr(e, 'message', 'interrupted')}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit:
        raise
    except BaseException as e:  # a bug, not the user's fault
        if os.environ.get("SM120PATCH_DEBUG"):
            raise
        click.echo(
            f"sm120patch: internal error: {type(e).__name__}: {e} (rerun with SM120PATCH_DEBUG=1 and report it)",
            err=True,
        )
        sys.exit(EXIT_INTERNAL)
    sys.exit(EXIT_OK)
