#!/usr/bin/env bash
# One step of `make demo`: demo_step.sh EXPECTED WHY -- COMMAND...
# Runs COMMAND; when it exits EXPECTED (a step may exit 1 by design: a recipe stays blocked),
# says so in words, and any other exit code fails the demo (instead of make's "Error 1 (ignored)").
set -u
expected=$1 why=$2
shift 2
[ "${1:-}" = "--" ] && shift
"$@"
code=$?
if [ "$code" -eq "$expected" ]; then
    [ "$expected" -ne 0 ] && echo "   -> exit $code, as expected: $why"
    exit 0
fi
echo "demo: this step should exit $expected ($why), it exited $code: $*" >&2
exit 1
