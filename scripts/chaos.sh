#!/usr/bin/env bash
# The chaos suite: every failure and attack probe of walrelay in one command (README, Security).
# Real PostgreSQL clusters and the real binary, as in scripts/test.sh; run after it has
# installed PostgreSQL.
#
#   scripts/chaos.sh                 # the whole suite
#   scripts/chaos.sh chaos spool     # only these test binaries (names from the list below)
#
# Each entry is a test binary of proxy/Cargo.toml and the tests of it that belong to the suite
# (all of them when none are named). Tests marked #[ignore] (slow ones kept out of CI, if any)
# run too (--include-ignored); the summary counts passed, failed and not run per binary, and
# the script fails unless every test ran and passed.
#
# Environment: CHAOS_THREADS (test threads per binary, default 2), TMPDIR, CARGO_TARGET_DIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
threads="${CHAOS_THREADS:-2}"

# binary: tests (libtest name filters; empty = all)
suite=(
    "chaos:"                # pre-auth exhaustion, stalled link TLS handshakes, saturated metrics port
    "security:"             # SCRAM, mutual TLS, link.peer_names, verified TLS
    "malformed:"            # garbage, absurd lengths, silent clients, commands during COPY, lying status updates
    "integrity:"            # bytes flipped on the link, either direction
    "spool:"                # kill -9 with a torn segment, a full spool
    "fanout:a_late_standby_catches_up_from_the_spool a_cut_link_ends_no_standby_session one_of_each_half_killed any_1_of_two_standbys_behind_one_downstream"
    "failover_conn:"        # the primary fails over, an upstream address refuses
    "sync_rep:"             # commits wait while the link is cut
    "ops:sigterm_during_streaming sigint_with_a_hung_link sigint_with_a_client_that_stopped_reading sighup_reloads check_config_and_run_refuse"
    "relay:standby_and_relay_restart_mid_load"
)

want=("$@")
selected() {
    [[ ${#want[@]} -eq 0 ]] && return 0
    local w
    for w in "${want[@]}"; do [[ "$w" == "$1" ]] && return 0; done
    return 1
}

cd "$root"
bins=()
for entry in "${suite[@]}"; do
    bin="${entry%%:*}"
    selected "$bin" && bins+=(--test "$bin")
done
[[ ${#bins[@]} -gt 0 ]] || { echo "chaos: no test binary of the suite matches: ${want[*]}" >&2; exit 2; }

echo "chaos: building $((${#bins[@]} / 2)) test binaries"
cargo test --locked -p walrelay "${bins[@]}" --no-run --quiet

started=$SECONDS
total_pass=0 total_fail=0 total_notrun=0 bad=0
summary=()
log_dir="$(mktemp -d "${TMPDIR:-/tmp}/walrelay-chaos.XXXXXX")"
for entry in "${suite[@]}"; do
    bin="${entry%%:*}"
    selected "$bin" || continue
    read -r -a filters <<<"${entry#*:}"
    log="$log_dir/$bin.log"
    echo "chaos: $bin ${filters[*]:-(all)}"
    t0=$SECONDS
    rc=0
    cargo test --locked -q -p walrelay --test "$bin" -- --include-ignored \
        --test-threads="$threads" "${filters[@]}" >"$log" 2>&1 || rc=$?
    # "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; ..."
    line=$(grep -E '^test result:' "$log" | tail -1 || true)
    pass=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line"); pass=${pass:-0}
    fail=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line"); fail=${fail:-0}
    ign=$(sed -nE 's/.* ([0-9]+) ignored.*/\1/p' <<<"$line"); ign=${ign:-0}
    if [[ $rc -ne 0 && $fail -eq 0 ]]; then fail=1; fi   # did not get to a result line
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail)); total_notrun=$((total_notrun + ign))
    status=ok
    if [[ $fail -gt 0 ]]; then status=FAILED; elif [[ $ign -gt 0 || $pass -eq 0 ]]; then status=INCOMPLETE; fi
    summary+=("$(printf '%-14s %-10s passed %3d  failed %3d  not run %3d  %4d s  %s' \
        "$bin" "$status" "$pass" "$fail" "$ign" $((SECONDS - t0)) "$log")")
    if [[ $status != ok ]]; then
        bad=1
        grep -E '^test .* FAILED|panicked at' "$log" | head -n 20 | sed 's/^/    /' || true
    fi
done

echo
echo "chaos: summary ($((SECONDS - started)) s; logs in $log_dir)"
printf '  %s\n' "${summary[@]}"
echo "chaos: $total_pass passed, $total_fail failed, $total_notrun not run"
[[ $bad -eq 0 && $total_pass -gt 0 ]]
