#!/usr/bin/env bash
# Builds CRIU 4.1.x from Debian trixie's source tarball and installs it as PREFIX/criu.
#
# Why: bookworm's criu 3.17 fails `criu check` on recent kernels ("vdso: Unexpected rt
# vDSO area bounds"); trixie's 4.1.1 works and built in about 25 s on 2 cores (measured
# on the build machines). Only the source is taken from trixie: the binary is built
# against the host's own libraries, so this works on bookworm and Ubuntu.
#
# Usage: scripts/build-criu.sh [--prefix DIR] [--cache DIR] [--force]
#   --prefix DIR  install DIR/criu (default /usr/local/sbin)
#   --cache DIR   tarball and build tree (default /var/cache/sandboxd/criu); a tree
#                 already built from the same tarball is reused, so a re-run takes seconds
#   --force       rebuild even when the cached build is current
# Needs root (apt). Exits non-zero when the build or `criu check` fails.
set -euo pipefail

PREFIX=/usr/local/sbin
CACHE=/var/cache/sandboxd/criu
FORCE=0
SUITE=trixie
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
SRC_LIST=/etc/apt/sources.list.d/sandboxd-criu-src.sources
BUILD_DEPS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
    protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
    libnftables-dev libgnutls28-dev uuid-dev libdrm-dev xz-utils)

log() { echo "build-criu: $*"; }
die() { echo "build-criu: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --cache) CACHE=$2; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
done
[ "$(id -u)" -eq 0 ] || die "needs root (apt-get and the build dependencies)"
export DEBIAN_FRONTEND=noninteractive

missing_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

# The Debian mirror apt already uses (an Ubuntu host has none: use the CDN).
debian_mirror() {
    local uri
    uri=$(grep -hsE '^\s*(URIs:|deb\s)' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
            /etc/apt/sources.list.d/*.list \
        | grep -oE '(https?|file)://[^ ]+/debian/?(\s|$)' | head -n1 | tr -d '[:space:]' || true)
    echo "${uri:-http://deb.debian.org/debian}" | sed 's:/*$::'
}

# Only the upstream tarball (.orig.tar.*) is needed. apt-get exits non-zero when the
# mirror lacks the .dsc or the Debian diff, which happens behind the build machine's
# proxy, so success is judged by the tarball being there.
fetch_source() {
    (cd "$CACHE" && apt-get source --download-only "criu/$SUITE") >"$CACHE/apt-source.log" 2>&1 || true
    ls -1t "$CACHE"/criu_*.orig.tar.* 2>/dev/null | head -n1 || true
}

# The newest cached tarball that unpacks, else one fetched now (adding the deb-src entry when
# apt knows no source). A download cut short (a killed setup, a full disk) left a truncated
# tarball that every later run found and failed to unpack: CRIU was never built again until
# the cache was removed by hand. A damaged one is removed and the next looked at.
obtain_source() {
    local found
    while found=$(ls -1t "$CACHE"/criu_*.orig.tar.* 2>/dev/null | head -n1 || true); [ -n "$found" ]; do
        tar -tf "$found" >/dev/null 2>&1 && break
        log "the cached $(basename "$found") is damaged: fetching it again" >&2
        rm -f "$found"
    done
    [ -n "$found" ] || found=$(fetch_source)
    if [ -z "$found" ]; then
        if [ ! -f "$KEYRING" ]; then
            apt-get install -y -q debian-archive-keyring >/dev/null || die "cannot install debian-archive-keyring"
        fi
        if [ ! -f "$SRC_LIST" ]; then
            log "adding a deb-src entry for $SUITE: $SRC_LIST" >&2
            printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
                "$(debian_mirror)" "$SUITE" "$KEYRING" >"$SRC_LIST"
        fi
        log "refreshing the $SUITE source index" >&2
        # This one source only: fast, and leaves the host's other lists alone.
        apt-get update -q -o Dir::Etc::sourcelist="$SRC_LIST" -o Dir::Etc::sourceparts=- \
            -o APT::Get::List-Cleanup=0 >/dev/null || die "apt-get update of $SRC_LIST failed"
        found=$(fetch_source)
        [ -n "$found" ] || die "apt-get source criu/$SUITE fetched no criu_*.orig.tar.* (see $CACHE/apt-source.log)"
    fi
    tar -tf "$found" >/dev/null 2>&1 || die "$(basename "$found") as fetched does not unpack"
    echo "$found"
}

mkdir -p "$CACHE"
tarball=$(obtain_source)
version=$(basename "$tarball" | sed -E 's/^criu_([^.]+\.[^.]+(\.[0-9]+)?)\.orig\..*/\1/')
case "$version" in
    4.[1-9]*|[5-9].*|[1-9][0-9].*) ;;  # 4.1 and later (4.10 too), not 4.0
    *) die "criu $version from $SUITE is older than 4.1; a newer source is needed" ;;
esac
log "source: $(basename "$tarball") (CRIU $version)"

src="$CACHE/criu-$version"
binary="$src/criu/criu"
if [ "$FORCE" = 0 ] && [ -x "$binary" ] && [ "$binary" -nt "$tarball" ]; then
    log "reusing the build in $src"
else
    mapfile -t need < <(missing_packages "${BUILD_DEPS[@]}")
    if [ "${#need[@]}" -gt 0 ]; then
        log "installing build dependencies: ${need[*]}"
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null \
            || die "apt-get install of the build dependencies failed"
    fi
    log "building in $src (make -j$(nproc) criu, log $CACHE/build.log)"
    rm -rf "$src"
    mkdir -p "$src"
    tar -xf "$tarball" -C "$src" --strip-components=1
    started=$SECONDS
    if ! make -C "$src" -j"$(nproc)" criu >"$CACHE/build.log" 2>&1; then
        tail -n 20 "$CACHE/build.log" >&2
        die "make failed (full log: $CACHE/build.log)"
    fi
    touch "$binary"
    log "built in $((SECONDS - started)) s"
fi

install -D -m 0755 "$binary" "$PREFIX/criu"
if ! check=$("$PREFIX/criu" check 2>&1); then
    echo "$check" | tail -n 5 >&2
    die "$PREFIX/criu check failed"
fi
log "installed $PREFIX/criu ($("$PREFIX/criu" --version | head -n1)): $(echo "$check" | tail -n1)"
