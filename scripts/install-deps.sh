#!/usr/bin/env bash
# Makes a Debian 12 machine ready for walrelay's test suite, `walrelay demo` and `walrelay bench`:
#   - PostgreSQL server binaries (postgres, initdb, pg_ctl, pg_basebackup, pgbench, ...);
#   - the `postgres` OS user, which runs the servers when tests run as root
#     (initdb and postgres refuse to run as root);
#   - headless Chromium (Debian's `chromium`), which renders the status page in tests/metrics.rs.
#   - systemd-analyze, to verify the units in deploy/systemd/;
#   - the zstd command, which `walrelay bench` runs for its offline baselines.
# Finds PostgreSQL the way walrelay_harness::cluster::PgInstall::discover() does: $PG_BIN,
# `pg_config --bindir`, `pg_ctl` on PATH, the highest /usr/lib/postgresql/*/bin.
#
# Idempotent. Prints nothing when everything is already there, otherwise what it did.
# Needs root only when something has to be installed.
set -euo pipefail

say() { echo "install-deps: $*"; }
die() { echo "install-deps: error: $*" >&2; exit 1; }

usable_bindir() { [[ -x "$1/postgres" && -x "$1/initdb" ]]; }

# Prints the bin directory of a PostgreSQL server installation, or nothing.
find_pg_bindir() {
    if [[ -n "${PG_BIN:-}" ]]; then
        # An explicit choice that doesn't work is an error, as in discover().
        usable_bindir "$PG_BIN" || die "PG_BIN=$PG_BIN has no postgres and initdb; fix or unset it"
        echo "$PG_BIN"
        return
    fi
    local dir
    if command -v pg_config >/dev/null 2>&1; then
        dir=$(pg_config --bindir 2>/dev/null || true)
        if [[ -n "$dir" ]] && usable_bindir "$dir"; then echo "$dir"; return; fi
    fi
    if command -v pg_ctl >/dev/null 2>&1; then
        dir=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
        if usable_bindir "$dir"; then echo "$dir"; return; fi
    fi
    # Highest version first.
    local dirs=()
    shopt -s nullglob
    dirs=(/usr/lib/postgresql/*/bin)
    shopt -u nullglob
    [[ ${#dirs[@]} -gt 0 ]] || return 0
    while IFS= read -r dir; do
        if usable_bindir "$dir"; then echo "$dir"; return; fi
    done < <(printf '%s\n' "${dirs[@]}" | sort -t/ -k5,5Vr)
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_postgresql() {
    is_root || die "no PostgreSQL server binaries found and not root: run this script as root, \
install them yourself (Debian: apt-get install postgresql), or set PG_BIN to their bin directory"
    command -v apt-get >/dev/null 2>&1 || die "no PostgreSQL server binaries found and no apt-get: \
install PostgreSQL server binaries or set PG_BIN to their bin directory"

    say "PostgreSQL server binaries not found; installing them with apt-get"
    apt-get update -qq
    # Install postgresql-common first so the package's default cluster (15/main on port 5432,
    # started as a service) is not created: walrelay makes its own throw-away clusters.
    apt_install postgresql-common
    if [[ -f /etc/postgresql-common/createcluster.conf ]]; then
        sed -ri 's/^#?\s*create_main_cluster\s*=.*$/create_main_cluster = false/' \
            /etc/postgresql-common/createcluster.conf
    fi
    local policy
    policy=$(apt-cache policy postgresql-15 2>/dev/null || true)
    if [[ "$policy" =~ Candidate:\ [0-9] ]]; then
        say "installing postgresql-15 postgresql-contrib-15"
        apt_install postgresql-15 postgresql-contrib-15
    else
        say "postgresql-15 is not available; installing postgresql (the distribution's version)"
        apt_install postgresql postgresql-contrib
    fi
}

bindir=$(find_pg_bindir)
if [[ -z "$bindir" ]]; then
    install_postgresql
    bindir=$(find_pg_bindir)
    [[ -n "$bindir" ]] || die "installed PostgreSQL but still cannot find its server binaries"
    say "PostgreSQL server binaries: $bindir ($("$bindir/postgres" --version))"
fi

# As root, the servers run as `postgres`; as anyone else they run as that user.
if is_root && ! id -u postgres >/dev/null 2>&1; then
    useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
    say "created the postgres OS user"
fi

# The status page test renders GET / in headless Chromium and takes a screenshot.
if ! command -v chromium >/dev/null 2>&1; then
    is_root || die "chromium not found and not root: run this script as root or install Debian's chromium package"
    command -v apt-get >/dev/null 2>&1 || die "chromium not found and no apt-get: install Chromium (the chromium command)"
    say "chromium not found; installing it with apt-get (for the status page test)"
    apt-get update -qq
    apt_install chromium
    command -v chromium >/dev/null 2>&1 || die "installed chromium but the chromium command is still missing"
fi
# tests/deploy.rs checks the systemd units with `systemd-analyze verify` (package systemd;
# installing it does not start it).
if ! command -v systemd-analyze >/dev/null 2>&1; then
    is_root && command -v apt-get >/dev/null 2>&1 \
        || die "systemd-analyze not found: install the systemd package (Debian: apt-get install systemd)"
    say "installing systemd (for systemd-analyze verify of deploy/systemd/)"
    apt-get update -qq
    apt_install systemd
fi
# walrelay bench (and tests/bench.rs) compare the link with `zstd -3` and `zstd -19 --long=27`
# run over the same WAL.
if ! command -v zstd >/dev/null 2>&1; then
    is_root && command -v apt-get >/dev/null 2>&1 \
        || die "zstd not found: install the zstd command (Debian: apt-get install zstd)"
    say "installing zstd (for walrelay bench's offline baselines)"
    apt-get update -qq
    apt_install zstd
fi
