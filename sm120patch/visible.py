"""Text from outside (log lines, names from recipes and journals) made safe to print on a terminal.

A log line may hold any control character: an OSC 52 clipboard write, a window title, DCS, the C1 CSI
U+009B, BS, CR, BEL. Printed raw, these act on the user's terminal; rendered as their Python escapes
(`\\x1b`, `\\x9b`, `\\r`) they are shown, never obeyed. One mechanism for error messages and reports.
"""

from __future__ import annotations


def visible(text: str) -> str:
    """TEXT with every character that is not printable (controls, C1, separators but space) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
