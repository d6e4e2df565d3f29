"""Check patches/fixed_versions.toml's library rows against the real wheels, and record what they carry.

A row that says "the first <wheel> with sm_120 code is <version>" names the PyPI wheel and the release `before`
it. This downloads both for the row's platform (tools/wheels.py, cached), reads the CUDA code every shared object
carries with the census (fatbin headers, no GPU needed), and writes one entry per wheel into
tests/data/versions/wheels.json: the loader's verdict on sm_120 and sm_121 ("ok": SASS that runs; "jit": only
PTX to compile; "none"), the SM12x SASS and the PTX it holds. tests/unit/test_diagnose_versions.py holds the
table to that record without a download: the row's version runs on its archs from SASS, the release before does
not. Run it after adding or changing a row:

    python tools/calibrate_versions.py            # every row with a wheel; --only DIST for one
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sm120patch import census  # noqa: E402
from sm120patch.arch import Arch  # noqa: E402
from sm120patch.triage import versions  # noqa: E402
from tools import wheels  # noqa: E402

RECORD = REPO / "tests" / "data" / "versions" / "wheels.json"
GPUS = (Arch(12, 0), Arch(12, 1))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _torch_pin(whl: Path) -> str:
    """The torch requirement in the wheel's METADATA ("" if none): a wheel with SM12x kernels that pins a torch
    whose PyPI build has none still fails at torch."""
    with zipfile.ZipFile(whl) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = z.read(meta).decode("utf-8", "replace") if meta else ""
    pins = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist: torch")]
    return next((p for p in pins if p.startswith(("torch=", "torch<", "torch>", "torch ", "torch;"))), "")


def measure(dist: str, version: str, platform: str) -> dict[str, Any]:
    """What the wheel of `dist==version` for `platform` carries, read by the census."""
    whl = wheels.wheel(dist, version, platform)
    digest = _sha256(whl)
    site = wheels.census_site(dist, version, platform)
    with tempfile.TemporaryDirectory() as cache:
        report = census.census([site], list(GPUS), cache_root=Path(cache), env={})
    key = dist.lower().replace("_", "-")
    rows = [r for r in report["distributions"] if r["name"].lower().replace("_", "-") == key]
    entry: dict[str, Any] = {"dist": dist, "version": version, "platform": platform, "file": whl.name}
    entry["sha256"] = digest
    entry["requires_torch"] = _torch_pin(whl)
    if not rows:  # no CUDA code at all: a CPU build, or a package that loads its kernels from elsewhere
        entry.update(status={g.name: "no-cuda-code" for g in GPUS}, sass_sm12x=[], sass=[], ptx=[], modules=0)
        return entry
    row = rows[0]
    entry["status"] = {g.name: row["gpus"][g.name]["status"] for g in GPUS}
    entry["sass_sm12x"] = sorted(s for s in row["sass"] if s.startswith("sm_12"))
    entry["sass"] = sorted(row["sass"])
    entry["ptx"] = sorted(row["ptx"])
    entry["modules"] = len(row["modules"])
    return entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", default=[], help="calibrate only the rows of this wheel (repeatable)")
    p.add_argument("--record", type=Path, default=RECORD, help="the record to update (default: %(default)s)")
    args = p.parse_args(argv)
    rows = [r for r in versions.load() if r.wheel and (not args.only or r.wheel in args.only)]
    try:
        old = json.loads(args.record.read_text()) if args.record.exists() else {"wheels": []}
    except (OSError, ValueError) as e:
        why = f"not a record this tool wrote ({e}); move it aside to start anew"
        print(f"calibrate: {args.record}: {why}", file=sys.stderr)
        return 2
    if not rows:
        wanted = ", ".join(args.only)
        print(f"calibrate: no row of patches/fixed_versions.toml names the wheel {wanted}", file=sys.stderr)
        return 2
    entries = {(e["dist"], e["version"], e["platform"]): e for e in old.get("wheels", [])}
    failed = 0
    for row in rows:
        for version in (row.before, row.version):
            try:
                e = measure(row.wheel, version, row.platform)
            except RuntimeError as err:
                print(f"calibrate: {row.wheel} {version}: {err}", file=sys.stderr)
                failed += 1
                continue
            entries[(e["dist"], e["version"], e["platform"])] = e
            print(f"{row.wheel} {version} ({row.platform}): {e['status']} sm12x SASS {e['sass_sm12x'] or '-'}")
    record = {
        "what": "the CUDA code real wheels carry, read by sm120patch's census; written by tools/calibrate_versions.py",
        "recorded": datetime.date.today().isoformat(),
        "wheels": sorted(entries.values(), key=lambda e: (e["dist"], e["platform"], e["version"])),
    }
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
