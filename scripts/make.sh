#!/usr/bin/env bash
# The README's two commands, `bash scripts/make.sh run` and `bash scripts/make.sh test`: make's
# targets with nothing needed but bash. A fresh Debian has neither make nor sudo: make is
# installed when missing, and sudo is used only by a user who is not root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "make.sh: run as root (Docker, debootstrap and CRIU need it)" >&2; exit 1; }
    exec sudo -E bash "$0" "$@"
fi
if ! command -v make >/dev/null; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q make >/dev/null
fi
exec make "$@"
