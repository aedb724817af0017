#!/usr/bin/env bash
# walrelay's demo on a fresh Debian machine with the Rust toolchain: installs PostgreSQL if
# missing, builds walrelay (release), and runs `walrelay demo` (a throw-away primary and
# standby streaming through both halves under pgbench load). Arguments go to the demo,
# e.g. `scripts/demo.sh --seconds 60`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# `cargo run` finds the binary wherever cargo puts it (CARGO_TARGET_DIR, build.target-dir),
# and execs it: Ctrl-C reaches the demo, which removes what it started.
exec cargo run --release --locked -p walrelay --bin walrelay -- demo "$@"
