"""The first-release table's record (tests/data/versions/wheels.json) is what the real wheels carry: the smallest
calibrated row's two wheels are downloaded again (cached in ~/.cache/sm120patch/pypi) and measured afresh by
tools/calibrate_versions.py's own measure, which must give the recorded file, sha256, SM12x SASS and verdicts.
The unit tests hold the table to the record without a download; this holds the record to PyPI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sm120patch.triage.versions import load
from tests.conftest import unavailable
from tools import calibrate_versions

pytestmark = pytest.mark.releases
RECORD = Path(__file__).resolve().parents[1] / "data" / "versions" / "wheels.json"
ROW = "jax-cuda12-plugin"  # 15 MB a wheel: the smallest row to measure again


@pytest.mark.parametrize("which", ["before", "version"])
def test_the_record_is_what_pypi_serves(which: str) -> None:
    (row,) = [r for r in load() if r.wheel == ROW]
    version = getattr(row, which)
    recorded = next(
        w
        for w in json.loads(RECORD.read_text())["wheels"]
        if (w["dist"], w["version"], w["platform"]) == (row.wheel, version, row.platform)
    )
    try:
        fresh = calibrate_versions.measure(row.wheel, version, row.platform)
    except RuntimeError as e:
        unavailable(str(e))
    keys = ("file", "sha256", "status", "sass_sm12x", "ptx", "requires_torch")
    assert {k: fresh[k] for k in keys} == {k: recorded[k] for k in keys}
