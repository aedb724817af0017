#!/usr/bin/env bash
# Fuzz smoke run of walrelay's parsers of network input (the cargo-fuzz project in fuzz/).
#
# Builds every fuzz target with libFuzzer's coverage instrumentation on the stable toolchain and
# runs each for a bounded time; exits non-zero if any target crashes (panic, failed assertion,
# per-input timeout, memory limit), printing the crash input's path, its bytes and the log.
#
#   scripts/fuzz-smoke.sh                      # every target, FUZZ_SECONDS (20) each
#   FUZZ_SECONDS=300 scripts/fuzz-smoke.sh scram link_codec
#
# scripts/fuzz.sh runs the same for longer (a time or a number of executions per target).
#
# Environment:
#   FUZZ_SECONDS   fuzzing time per target, seconds (default 20)
#   FUZZ_RUNS      instead of a time: executions per target (libFuzzer -runs=N), bounded by
#                  FUZZ_MAX_SECONDS (default 86400) per target
#   FUZZ_JOBS      targets fuzzed at once (default: number of cores)
#   FUZZ_PROFILE   cargo profile of the build: dev (default here; shares the test suite's
#                  compiled dependencies) or fuzz-opt (optimised, with debug assertions and
#                  overflow checks; scripts/fuzz.sh's default)
#   FUZZ_TARGETS   space-separated targets (default: all [[bin]] of fuzz/Cargo.toml; arguments
#                  take precedence)
#   CARGO_TARGET_DIR  where to build (default: the workspace's target/)
#
# How it builds: not through `cargo fuzz build`, which instruments every dependency (and wants
# AddressSanitizer), a 15+ minute build here, but with plain cargo and fuzz/rustc-sancov.sh as
# RUSTC_WRAPPER: walrelay and the targets get SanitizerCoverage, dependencies are built exactly
# as `cargo build`/`cargo test` build them, into the same target directory, so they are shared.
# For long runs with AddressSanitizer use cargo-fuzz itself (see fuzz/README.md).
#
# Corpora grow in fuzz/corpus/<target>/ (seeded here when empty), crashes land in
# fuzz/artifacts/<target>/; both are ignored by git.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fuzz="$root/fuzz"
seconds="${FUZZ_SECONDS:-20}"
runs="${FUZZ_RUNS:-}"
max_seconds="${FUZZ_MAX_SECONDS:-86400}"
label="${FUZZ_LABEL:-fuzz-smoke}"
jobs="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
profile="${FUZZ_PROFILE:-dev}"
case "$profile" in
    dev | fuzz-opt) ;;
    *) echo "$label: FUZZ_PROFILE must be dev or fuzz-opt, got '$profile'" >&2; exit 2 ;;
esac

if [[ $# -gt 0 ]]; then
    targets=("$@")
elif [[ -n "${FUZZ_TARGETS:-}" ]]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(sed -n '/^\[\[bin\]\]/{n;s/^name = "\(.*\)"$/\1/p}' "$fuzz/Cargo.toml")
fi
[[ ${#targets[@]} -gt 0 ]] || { echo "$label: no fuzz targets found in $fuzz/Cargo.toml" >&2; exit 1; }

started=$SECONDS

# --- build -------------------------------------------------------------------------------
# The fuzz project is its own workspace; its lock file starts from the main workspace's so that
# both resolve the same versions (and share compiled dependencies).
cp "$root/Cargo.lock" "$fuzz/Cargo.lock"
echo "$label: building ${#targets[@]} fuzz targets ($profile profile) into $target_dir"
bin_args=()
for t in "${targets[@]}"; do bin_args+=(--bin "$t"); done
RUSTC_WRAPPER="$fuzz/rustc-sancov.sh" cargo build --quiet --profile "$profile" \
    --manifest-path "$fuzz/Cargo.toml" --target-dir "$target_dir" "${bin_args[@]}"
bindir="$target_dir/debug"
[[ "$profile" == dev ]] || bindir="$target_dir/$profile"
echo "$label: built in $((SECONDS - started)) s"

# --- seeds -------------------------------------------------------------------------------
# Written only into an empty corpus directory. Binary helpers (bash strips NULs from command
# substitutions, so bodies go through files).
byte() { printf "\\$(printf '%03o' "$1")"; }
be32() { byte $(($1 >> 24 & 255)); byte $(($1 >> 16 & 255)); byte $(($1 >> 8 & 255)); byte $(($1 & 255)); }
be16() { byte $(($1 >> 8 & 255)); byte $(($1 & 255)); }
zeros() { head -c "$1" /dev/zero; }
# tagged TAG BODYFILE: a frontend/backend message.
tagged() { printf '%s' "$1"; be32 $(($(wc -c <"$2") + 4)); cat "$2"; }
# startup BODYFILE: a startup packet (protocol 3.0) with the given parameter list.
startup() { be32 $(($(wc -c <"$1") + 8)); be32 196608; cat "$1"; }

seed_pgwire_frontend() {
    local d=$1 tmp
    tmp=$(mktemp -d)
    printf 'user\0rep\0replication\0true\0application_name\0walreceiver\0\0' >"$tmp/params"
    startup "$tmp/params" >"$tmp/startup"
    printf 'IDENTIFY_SYSTEM\0' >"$tmp/q1"
    printf 'START_REPLICATION SLOT "s" 0/3000000 TIMELINE 1\0' >"$tmp/q2"
    { printf 'r'; zeros 33; } >"$tmp/status"
    { printf 'h'; zeros 24; } >"$tmp/hsfeedback"
    { printf 'w'; be32 0; be32 50331648; be32 0; be32 50331651; zeros 8; printf 'WAL'; } >"$tmp/xlogdata"
    : >"$tmp/empty"
    { printf 'SCRAM-SHA-256\0'; be32 28; printf 'n,,n=,r=rOprNGfwEbeRWgbNEkqO'; } >"$tmp/sasl"
    printf 'pencil\0' >"$tmp/password"
    { cat "$tmp/startup"; tagged Q "$tmp/q1"; tagged Q "$tmp/q2"; tagged d "$tmp/status"
      tagged d "$tmp/hsfeedback"; tagged c "$tmp/empty"; tagged X "$tmp/empty"; } >"$d/replication"
    { be32 8; be32 80877103; cat "$tmp/startup"; tagged p "$tmp/sasl"; } >"$d/ssl_sasl"
    { be32 16; be32 80877102; be32 4242; be32 123456789; } >"$d/cancel"
    { tagged d "$tmp/xlogdata"; tagged p "$tmp/password"; printf 'bad\0' >"$tmp/f"; tagged f "$tmp/f"; } >"$d/copy"
    printf 'SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user "rep"\0Hcheck it\0\0' >"$d/error_response"
    cp "$tmp/sasl" "$d/sasl_body"
    cp "$tmp/status" "$d/status_body"
    rm -rf "$tmp"
}

seed_replcmd() {
    local d=$1 i=0 c
    for c in 'IDENTIFY_SYSTEM' 'identify_system;' 'SHOW wal_segment_size' 'SHOW "a.b".c' \
        'TIMELINE_HISTORY 2' 'START_REPLICATION SLOT "s" 0/3000000 TIMELINE 1' \
        'START_REPLICATION PHYSICAL 16/B374D848' 'start_replication slot slot physical 0/0;' \
        'READ_REPLICATION_SLOT "x""y"' 'START_REPLICATION SLOT s LOGICAL 0/0' \
        'BASE_BACKUP (CHECKPOINT '"'"'fast'"'"')' $'\tSHOW\nserver_version\r\n'; do
        printf '%s' "$c" >"$d/cmd$i"
        i=$((i + 1))
    done
}

seed_scram() {
    local d=$1 key='AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA='
    { byte 0; printf 'n,,n=,r=rOprNGfwEbeRWgbNEkqO\0c=biws,r=%%N,p=%s' "$key"; } >"$d/exchange"
    { byte 1; printf 'n,,n=rep,r=fyko+d2lbbFgONRv9qkxdawL\0c=biws,r=%%N,p=%s' "$key"; } >"$d/mock_user"
    { byte 2; printf 'n,,n=,r=abc\0c=biws,r=%%N,p=%s' "$key"; } >"$d/other_mechanism"
    { byte 0; printf 'y,,n=,r=abc,e=ext\0c=eSws,r=%%N,p=%s,x=y' "$key"; } >"$d/extensions"
    { byte 4; printf 'pencil'; } >"$d/honest_client"
    { byte 12; printf 'correct horse battery staple'; } >"$d/honest_client_2"
    printf 'SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0c2FsdA==$%s:%s' "$key" "$key" >"$d/verifier"
}

seed_link_codec() {
    local d=$1
    { be32 5; zeros 8; be16 5; printf 'hello'; } >"$d/none_record"
    { be32 0; zeros 8; be16 0; be32 100; zeros 8; be16 4; printf '\050\265\057\375'; } >"$d/zstd_magic"
    printf 'WAL bytes WAL bytes WAL bytes' >"$d/round_trip"
}

seed_walcodec_roundtrip() {
    local d=$1 s
    # byte 0: 0x40 = shaped WAL, +3 = PG16; byte 1: cache slots; then the generator's input.
    for s in 0 3 67 195 83 99; do
        { byte "$s"; byte 4; seq -s, 1 250; } >"$d/seed$s"
    done
}

seed_walcodec_decode() {
    local d=$1 s
    for s in 64 67 195 75; do
        { byte "$s"; seq -s, 1 250; } >"$d/seed$s"
    done
    { byte 3; zeros 8; be32 0; be16 0; byte 1; zeros 5; } >"$d/garbage"
}

seed_generic() {
    printf 'walrelay' >"$1/seed"
}

# --- run ---------------------------------------------------------------------------------
run_one() {
    local t=$1 corpus="$fuzz/corpus/$1" artifacts="$fuzz/artifacts/$1"
    mkdir -p "$corpus" "$artifacts"
    if [[ -z "$(ls -A "$corpus")" ]]; then
        if declare -F "seed_$t" >/dev/null; then "seed_$t" "$corpus"; else seed_generic "$corpus"; fi
    fi
    local rc=0 wall=$((seconds + 120))
    local -a limit=("-max_total_time=$seconds")
    if [[ -n "$runs" ]]; then
        limit=("-runs=$runs" "-max_total_time=$max_seconds")
        wall=$((max_seconds + 120))
    fi
    RUST_BACKTRACE=0 timeout --kill-after=10 "$wall" "$bindir/$t" \
        "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "$corpus" >"$artifacts/last-run.log" 2>&1 || rc=$?
    echo "$rc" >"$artifacts/last-run.rc"
}

if [[ -n "$runs" ]]; then
    echo "$label: fuzzing ${targets[*]} for $runs executions each (at most $max_seconds s), $jobs at a time"
else
    echo "$label: fuzzing ${targets[*]} for ${seconds} s each, $jobs at a time"
fi
running=0
for t in "${targets[@]}"; do
    rm -f "$fuzz/artifacts/$t/last-run.rc"
    run_one "$t" &
    running=$((running + 1))
    if ((running >= jobs)); then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

passed=0
failed=0
for t in "${targets[@]}"; do
    log="$fuzz/artifacts/$t/last-run.log"
    rc=$(cat "$fuzz/artifacts/$t/last-run.rc" 2>/dev/null || echo missing)
    stats=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1 || true)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1 || true)
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -1)
    speed=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | tail -1)
    corpus_files=$(find "$fuzz/corpus/$t" -type f | wc -l)
    # Findings: inputs libFuzzer saved (crash-, timeout-, oom-, leak-, slow-unit-), this run and
    # earlier ones not yet removed.
    findings=$(find "$fuzz/artifacts/$t" -type f -regex '.*/\(crash\|timeout\|oom\|leak\|slow-unit\)-.*' | wc -l)
    echo "$label: $t: ${execs:-?} executions (${speed:-?}/s), corpus $corpus_files inputs, $findings findings in fuzz/artifacts/$t/"
    if [[ "$rc" == 0 ]]; then
        passed=$((passed + 1))
        echo "$label: $t ok: ${stats:-no stats} ($cov)"
    else
        failed=$((failed + 1))
        echo "$label: $t FAILED (exit $rc); log: $log"
        # The panic message (or libFuzzer's own report: timeout, out of memory...).
        { sed -n '/panicked at/,/^note: /p' "$log" | grep -v '^note: ' | head -n 20
          grep -E '^==[0-9]+== ERROR|^SUMMARY' "$log" || tail -n 20 "$log"; } | sed 's/^/    /'
        grep -oE 'Test unit written to [^ ]+' "$log" \
            | awk '{print $NF}' | while read -r a; do
            echo "    crash input: $a ($(wc -c <"$a") bytes), hex:"
            od -An -v -tx1 "$a" | head -n 16 | sed 's/^/     /'
            echo "    reproduce (with a backtrace): RUST_BACKTRACE=1 $bindir/$t $a"
        done
    fi
done
echo "$label: total $((SECONDS - started)) s"
echo "$label: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
