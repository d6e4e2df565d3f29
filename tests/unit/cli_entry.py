"""`sm120patch ARGS` for click's CliRunner, through the real entry point.

Commands return their exit code and raise `UserError`; only `sm120patch.cli.main` prints the
one-line error and exits. `CliRunner().invoke(SM120PATCH, ["diagnose", ...])` runs that `main`
inside CliRunner's stdin/stdout/stderr, so a test sees what a shell sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sm120patch.cli import main


class _Entry:
    """What `CliRunner.invoke` calls on a command: `name` and `main(args=..., prog_name=...)`."""

    name = "sm120patch"

    def main(self, args: Sequence[str] = (), prog_name: str | None = None, **extra: Any) -> None:
        main([str(a) for a in args])


SM120PATCH: Any = _Entry()
