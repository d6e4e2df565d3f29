"""diagnose never sends a log's control characters to the terminal: an OSC 52 clipboard write, a window
title, DCS, the C1 CSI, BS, CR and BEL in a log line are shown as escapes in the report, as main shows them in
error messages; the JSON keeps the text exact, escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.visible import visible
from tests.unit.cli_entry import SM120PATCH

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # writes 'rm -rf ~' to the clipboard
TITLE = "\x1b]0;owned\x1b\\"
DCS = "\x1bP1$tx\x1b\\"
C1_CSI = "\x9b2J"  # clears the screen on terminals that read C1
TRICKS = [OSC52, TITLE, DCS, C1_CSI, "\x08\x08\x08", "\rERASED ", "\x07", "\x7f"]

LOG = (
    "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='m')\n"
    f"RuntimeError: CUDA error: no kernel image is available for execution on the device {OSC52}{TITLE}\n"
    f"ValueError: something went wrong {DCS}{C1_CSI}\x08\x08\x08\rERASED \x07\x7f\n"
)


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c != "\n" and not c.isprintable()]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "server.log"
    p.write_text(LOG, encoding="utf-8")
    return p


def test_report_shows_every_control_character_as_an_escape(log: Path) -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(log)])
    assert res.exit_code in (0, 1), res.output
    assert _raw_controls(res.stdout) == [], res.stdout
    assert "no kernel image is available" in res.stdout
    for shown in ("\\x1b]52;c;cm0gLXJmIH4=\\x07", "\\x1b]0;owned\\x1b\\", "\\x1bP1$tx", "\\x9b2J", "\\x08", "\\r"):
        assert shown in res.stdout, (shown, res.stdout)


def test_json_keeps_the_line_exact_and_escaped(log: Path) -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    assert res.exit_code in (0, 1), res.output
    assert _raw_controls(res.stdout) == [], res.stdout
    d = json.loads(res.stdout)
    texts = [f["line"] for f in d["findings"]] + [e["line"] for e in d["unnamed_errors"]]
    assert any(OSC52 in t for t in texts), texts  # the data is the log's own text, not a rendering of it
    assert any(C1_CSI in t and "\x7f" in t for t in texts), texts


@pytest.mark.parametrize("trick", TRICKS)
def test_visible_leaves_no_control_character(trick: str) -> None:
    shown = visible(f"a {trick} b")
    assert _raw_controls(shown) == [] and shown.startswith("a ") and shown.endswith(" b")


def test_visible_leaves_printable_text_alone() -> None:
    text = "RuntimeError：sm_120 ‘ü’ \\x1b already escaped"
    assert visible(text) == text
