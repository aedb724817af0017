#!/bin/sh
# RUSTC_WRAPPER used by scripts/fuzz-smoke.sh: compiles walrelay's pure crates and the fuzz targets with
# libFuzzer's coverage instrumentation (SanitizerCoverage, the flags `cargo fuzz build` uses,
# minus -Zsanitizer), and every other crate exactly as a plain `cargo build` would, so the
# dependencies are shared with the main workspace's target directory instead of being
# rebuilt with instrumentation. Needs only the stable toolchain.
#
# Cargo calls it as: rustc-sancov.sh <path to rustc> <rustc args...>
rustc="$1"
shift
case "${CARGO_PKG_NAME:-}" in
walrelay-wal | walrelay-pgwire | walrelay-fuzz)
    exec "$rustc" "$@" \
        -Cpasses=sancov-module \
        -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares \
        --cfg fuzzing
    ;;
*)
    exec "$rustc" "$@"
    ;;
esac
