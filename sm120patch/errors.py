"""Errors a user can act on, and the exit codes the CLI promises.

A `UserError` is always the user's to fix (bad path, bad recipe, dirty tree):
the CLI prints its one line and exits 2, never a traceback.
"""

from __future__ import annotations

EXIT_OK = 0  # done, including "nothing to do"
EXIT_FAILED = 1  # a recipe failed, was blocked or was reverted
EXIT_USAGE = 2  # bad input or usage: nothing was written
EXIT_INTERRUPTED = 130  # Ctrl-C


class UserError(Exception):
    """A problem with the user's input; `str()` is one line naming the file and the fix."""

    exit_code = EXIT_USAGE


class RecipeError(UserError):
    """A recipe file is malformed."""


class TargetError(UserError):
    """A target tree is missing, unreadable or holds no known package."""


class JournalError(UserError):
    """The journal is missing, corrupt or disagrees with the tree."""
