#!/usr/bin/env bash
# Fuzzing at scale: every fuzz target (or the ones named) for a time or a number of
# executions each, with the persistent corpora of fuzz/corpus/<target>/ (kept between runs,
# ignored by git); prints executions, speed, corpus size and findings per target and fails
# if a target crashed. Same build and runner as scripts/fuzz-smoke.sh (see there and
# fuzz/README.md).
#
#   scripts/fuzz.sh                        # every target, 300 s each
#   scripts/fuzz.sh 3600                   # every target, an hour each
#   scripts/fuzz.sh -runs=10000000         # every target, ten million executions each
#   scripts/fuzz.sh 600 scram replcmd      # these targets, 600 s each
#
# FUZZ_JOBS (targets at once, default: the number of cores) and the other variables of
# fuzz-smoke.sh apply.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FUZZ_LABEL=fuzz
# Optimised build with debug assertions and overflow checks (fuzz/Cargo.toml [profile.fuzz-opt]):
# about 20x the executions of the smoke run's dev build. FUZZ_PROFILE=dev to share the test
# suite's build instead.
export FUZZ_PROFILE="${FUZZ_PROFILE:-fuzz-opt}"
case "${1:-}" in
    -runs=*)
        export FUZZ_RUNS="${1#-runs=}"
        [[ "$FUZZ_RUNS" =~ ^[0-9]+$ ]] || { echo "fuzz: -runs= needs a number, got ${1}" >&2; exit 2; }
        shift
        ;;
    '' | *[!0-9]*) export FUZZ_SECONDS="${FUZZ_SECONDS:-300}" ;;
    *)
        export FUZZ_SECONDS="$1"
        shift
        ;;
esac
exec "$root/scripts/fuzz-smoke.sh" "$@"
