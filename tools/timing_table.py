"""The kernel-timing table of a saved run verdict, for the GPU validation and docs/gpu-validation.md.

    python3 tools/timing_table.py VERDICT.json [--markdown]

VERDICT.json is what `sm120patch probe ... --probe run --json` or tools/run_only.py wrote; the
table is the one `probe --probe run` prints (or the same rows in Markdown).
"""

from __future__ import annotations

import sys

from sm120patch.probes.run.timing import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
