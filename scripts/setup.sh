#!/usr/bin/env bash
# Prepares a Debian/Ubuntu host to run and test sandboxd. Idempotent: every step checks
# first and is skipped when already satisfied, so a second run takes seconds.
#
#   1. apt packages: docker.io (only when no engine and no dockerd), debootstrap,
#      python3-venv, iproute2, debian-archive-keyring (non-Debian hosts), nodejs and npm
#   2. Docker engine running with experimental features (checkpoint/restore needs them)
#   3. CRIU that passes `criu check` (built from source by scripts/build-criu.sh if not)
#   4. .venv with the client and daemon installed editable, with the test extras
#      (torch 2.13.0 first: the CPU wheel on the local disk, never a CUDA build from PyPI)
#   5. .venv-verl: verl 0.9.1 (torch 2.13.0 CPU first) and the client, for the tests that run verl's
#      own code (it cannot share .venv: verl pins transformers 5.10.4, TRL's extra needs 5.23)
#   6. .venv-checkov: checkov, the security linter tests/test_deploy.py runs on deploy/kubernetes/ (it cannot
#      share .venv: it pins packaging 23.2 and networkx 2.6, older than .venv's)
#   7. Math-Verify's sdist (its tests/, for the math verifier's agreement test), cached in
#      /var/cache/sandboxd/math-verify-sdist
#   8. the Node.js example client's packages (examples/node, npm ci), for its test
#   9. sandbox images (python -m sandboxd.images build)
#
# Usage: sudo scripts/setup.sh [--no-criu] [--no-images] [--images "NAME..."]
#   --no-criu      skip step 3 (sandboxd then cold-starts every sandbox)
#   --no-images    skip step 9 (also SANDBOXD_SKIP_IMAGES=1)
#   --images LIST  images to build (default: python langs; add reward-model for the
#                  heavy torch image; also SANDBOXD_IMAGES)
# Environment: PYTHON (interpreter for the venv, default python3), and the SANDBOXD_*
# variables of sandboxd/images.py (SANDBOXD_BASE_IMAGE, SANDBOXD_CA_BUNDLE, ...).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
DOCKERD_LOG=/var/log/sandboxd-dockerd.log
DOCKER_PIDFILE=/var/run/docker.pid
CONTAINERD_PIDFILE=/var/run/docker/containerd/containerd.pid
DAEMON_JSON=/etc/docker/daemon.json
DOCKER_WAIT_S=60
SKIP_CRIU=${SANDBOXD_SKIP_CRIU:-0}
SKIP_IMAGES=${SANDBOXD_SKIP_IMAGES:-0}
IMAGES=${SANDBOXD_IMAGES:-}
# verl's environment (.venv-verl): the release the docs are checked against, and the torch of .venv.
VERL_VERSION=0.9.1
VERL_TORCH=2.13.0
# The security linter of the Kubernetes manifests (.venv-checkov): a release whose checks the manifests pass.
CHECKOV_VERSION=3.3.30
# criu and dockerd live in sbin, which a non-login root shell may lack.
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
export DEBIAN_FRONTEND=noninteractive

step() { echo "==> $*"; }
say() { echo "    $*"; }
warn() { echo "setup: WARNING: $*" >&2; }
die() { echo "setup: error: $*" >&2; exit 1; }

# Kept for the re-run under sudo below: the loop shifts them away.
ARGS=("$@")
while [ $# -gt 0 ]; do
    case "$1" in
        --no-criu) SKIP_CRIU=1; shift ;;
        --no-images) SKIP_IMAGES=1; shift ;;
        --images) IMAGES=$2; shift 2 ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "must run as root (Docker, debootstrap and CRIU need it)"
    exec sudo -E PATH="$PATH" bash "$0" "${ARGS[@]}"
fi
started=$SECONDS
cd "$REPO"

docker_ok() { docker info >/dev/null 2>&1; }
docker_experimental() { [ "$(docker version -f '{{.Server.Experimental}}' 2>/dev/null)" = true ]; }
systemd_docker() { [ -d /run/systemd/system ] && systemctl cat docker.service >/dev/null 2>&1; }
# Process $1 runs, and is named $2 if given. A killed one not yet reaped (a zombie, state Z or X)
# keeps its name in /proc; one stopped under a tracer (t) is alive.
pid_alive() {
    local state
    state=$(sed -n 's/^State:[[:space:]]*\([A-Za-z]\).*/\1/p' "/proc/$1/status" 2>/dev/null)
    case $state in Z|X|x|"") return 1 ;; esac
    [ -z "${2:-}" ] || [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
# A process named $1 runs. A zombie dockerd was taken for a live engine, so none was started and
# the wait for it timed out.
process_alive() {
    local comm pid
    for comm in /proc/[0-9]*/comm; do
        [ "$(cat "$comm" 2>/dev/null)" = "$1" ] || continue
        pid=${comm#/proc/}
        pid_alive "${pid%/comm}" && return 0
    done
    return 1
}
dockerd_alive() { process_alive dockerd; }
# A virtual environment whose interpreter runs (a venv outlives the python it was made with, which an upgrade removes).
venv_ok() { [ -x "$1/bin/python" ] && "$1/bin/python" -c '' 2>/dev/null; }
# Make the virtual environment $1 with $PYTHON unless it is venv_ok.
ensure_venv() {
    venv_ok "$1" && return 0
    say "creating $1 with $("$PYTHON" --version 2>&1)"
    rm -rf "$1"
    "$PYTHON" -m venv "$1" || die "$PYTHON -m venv $1 failed"
}
is_debian() { grep -qs '^ID=debian' /etc/os-release; }
json_has_experimental() {
    [ -f "$DAEMON_JSON" ] && "$PYTHON" -c 'import json,sys; sys.exit("experimental" not in json.load(open(sys.argv[1])))' \
        "$DAEMON_JSON" 2>/dev/null
}
# Sets "experimental": true in daemon.json, keeping its other keys; succeeds only if it changed the file.
enable_experimental_json() {
    mkdir -p "$(dirname "$DAEMON_JSON")"
    "$PYTHON" - "$DAEMON_JSON" <<'EOF'
import json, os, sys
path = sys.argv[1]
config = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
if config.get("experimental") is True:
    sys.exit(1)
config["experimental"] = True
with open(path, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
EOF
}
wait_for_docker() {
    local deadline=$((SECONDS + DOCKER_WAIT_S))
    until docker_ok; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            [ -f "$DOCKERD_LOG" ] && tail -n 5 "$DOCKERD_LOG" >&2
            die "Docker engine did not answer within ${DOCKER_WAIT_S} s (log: $1)"
        fi
        sleep 1
    done
}

step "apt packages"
need=()
docker_ok || command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v ip >/dev/null || need+=(iproute2)
# Ubuntu's debootstrap needs Debian's archive key to verify the bookworm rootfs.
is_debian || [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ ! -x .venv/bin/python ] && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    need+=(python3-venv)
fi
# The Node.js client test (tests/integration/test_node_client.py) calls the daemon from Node; the langs
# image's build fetches its Node.js release with npm (sandboxd.images.fetch_node).
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null \
        || die "apt-get install ${need[*]} failed"
else
    say "all present"
fi

step "Docker engine"
if docker_ok; then
    say "running ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
else
    if systemd_docker; then
        enable_experimental_json && say "enabled experimental features in $DAEMON_JSON"
        say "starting docker.service"
        systemctl start docker || die "systemctl start docker failed (journalctl -u docker)"
        wait_for_docker "journalctl -u docker"
    else
        if dockerd_alive; then
            say "a dockerd process is alive but not answering yet; waiting"
        else
            # A killed dockerd leaves its pid file, and the next one refuses to start
            # ("pid file found, ensure docker is not running").
            if [ -f "$DOCKER_PIDFILE" ]; then
                say "removing stale $DOCKER_PIDFILE (pid $(cat "$DOCKER_PIDFILE" 2>/dev/null), no dockerd alive)"
                rm -f "$DOCKER_PIDFILE"
            fi
            # The containerd a killed dockerd started may be gone or a zombie too: its pid file
            # would send the next dockerd to it instead of starting its own. A pid file whose pid
            # is now another process's is stale too.
            if [ -f "$CONTAINERD_PIDFILE" ] && ! pid_alive "$(cat "$CONTAINERD_PIDFILE" 2>/dev/null)" containerd; then
                say "removing stale $CONTAINERD_PIDFILE (pid $(cat "$CONTAINERD_PIDFILE" 2>/dev/null) not alive)"
                rm -f "$CONTAINERD_PIDFILE"
            fi
            # dockerd refuses a setting given both as a flag and in daemon.json.
            flags=()
            json_has_experimental || flags+=(--experimental)
            say "starting dockerd${flags[*]:+ ${flags[*]}} in the background (log $DOCKERD_LOG)"
            setsid nohup dockerd "${flags[@]}" >>"$DOCKERD_LOG" 2>&1 </dev/null &
        fi
        wait_for_docker "$DOCKERD_LOG"
    fi
    say "running ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
fi
if ! docker_experimental; then
    warn "the Docker engine runs without experimental features: docker checkpoint (CRIU snapshots) needs them"
    enable_experimental_json && say "set \"experimental\": true in $DAEMON_JSON"
    if systemd_docker; then
        say "restarting docker.service to apply it (running containers without live-restore stop)"
        systemctl restart docker || die "systemctl restart docker failed (journalctl -u docker)"
        wait_for_docker "journalctl -u docker"
        docker_experimental || warn "still not experimental after the restart; check $DAEMON_JSON"
    else
        warn "restart this engine yourself to apply $DAEMON_JSON; until then sandboxd cold-starts sandboxes"
    fi
else
    say "experimental features on (checkpoint/restore available)"
fi

step "CRIU"
if [ "$SKIP_CRIU" = 1 ]; then
    say "skipped (--no-criu)"
elif command -v criu >/dev/null && criu check >/dev/null 2>&1; then
    say "$(command -v criu): $(criu --version | head -n1), criu check passes"
else
    say "no working criu (criu check fails or criu is missing): building CRIU 4.1 from source"
    if ! bash "$REPO/scripts/build-criu.sh"; then
        warn "############################################################"
        warn "CRIU build failed: sandboxd will run without snapshots (cold starts only)"
        warn "############################################################"
    fi
fi

step "Python environment (.venv)"
ensure_venv .venv
stamp=.venv/.sandboxd-installed
want=$( { find protos -name '*.proto' | LC_ALL=C sort; \
          cat pyproject.toml client/pyproject.toml client/setup.py; \
          find protos -name '*.proto' | LC_ALL=C sort | xargs cat; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -d client/sandboxd_client/_proto ]; then
    say "up to date"
else
    # The test extra pins torch==2.13.0 (TRL and reward-model tests). Installed on its own
    # first, so pip takes the CPU wheel from the local disk (PIP_FIND_LINKS) and the
    # resolve below finds it satisfied: a bare `torch` would pull a CUDA build of several GB.
    if .venv/bin/python -c 'import sys, torch; sys.exit(not torch.__version__.startswith("2.13.0"))' 2>/dev/null; then
        say "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') present"
    else
        say "pip install torch==2.13.0 (CPU)"
        .venv/bin/python -m pip install -q torch==2.13.0 || die "pip install torch==2.13.0 failed"
    fi
    say "pip install -e ./client -e '.[test]'"
    .venv/bin/python -m pip install -q -e ./client -e '.[test]' || die "pip install into .venv failed"
    echo "$want" >"$stamp"
fi

step "verl environment (.venv-verl, for tests/integration/test_verl.py)"
# verl runs its own code in the tests, in an environment of its own: it pins transformers 5.10.4, TRL's test
# extra needs 5.23. torch first, from the local CPU wheel, as for .venv; then verl with its default
# dependencies; then the client, editable. About a minute and 2 GB, once.
verl_stamp=.venv-verl/.sandboxd-installed
verl_want=$( { echo "torch==$VERL_TORCH verl==$VERL_VERSION cachetools uvicorn fastapi"; cat client/pyproject.toml client/setup.py; \
               find protos -name '*.proto' | LC_ALL=C sort | xargs cat; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$verl_stamp" 2>/dev/null)" = "$verl_want" ] && venv_ok .venv-verl; then
    say "up to date (verl $VERL_VERSION)"
else
    ensure_venv .venv-verl
    say "pip install torch==$VERL_TORCH (CPU), verl==$VERL_VERSION, -e ./client into .venv-verl"
    .venv-verl/bin/python -m pip install -q "torch==$VERL_TORCH" || die "pip install torch into .venv-verl failed"
    # cachetools, uvicorn, fastapi: verl's agent loop (verl.experimental.agent_loop, the tool tests) imports them
    # without requiring them (vLLM and SGLang bring them to a GPU install).
    .venv-verl/bin/python -m pip install -q "verl==$VERL_VERSION" cachetools uvicorn fastapi || die "pip install verl==$VERL_VERSION failed"
    .venv-verl/bin/python -m pip install -q -e ./client || die "pip install -e ./client into .venv-verl failed"
    echo "$verl_want" >"$verl_stamp"
fi

step "checkov environment (.venv-checkov, for tests/test_deploy.py)"
# Pinned: a new release may bring new checks, which should land as a change (and a line in docs/deploy.md's
# table), not break CI. Its own environment: it pins packaging and networkx below what .venv holds.
checkov_stamp=.venv-checkov/.sandboxd-installed
if [ "$(cat "$checkov_stamp" 2>/dev/null)" = "checkov==$CHECKOV_VERSION" ] && venv_ok .venv-checkov; then
    say "up to date (checkov $CHECKOV_VERSION)"
else
    ensure_venv .venv-checkov
    say "pip install checkov==$CHECKOV_VERSION into .venv-checkov"
    .venv-checkov/bin/python -m pip install -q "checkov==$CHECKOV_VERSION" || die "pip install checkov==$CHECKOV_VERSION failed"
    echo "checkov==$CHECKOV_VERSION" >"$checkov_stamp"
fi

step "Math-Verify's test suite (tests/verifiers/math/test_agreement.py)"
# The sdist of the math-verify the images pin carries its tests/, which the agreement test reads.
mv_version=$(sed -n 's/^math-verify\(\[[^]]*\]\)\{0,1\}==\([^ ;]*\).*/\2/p' images/python/requirements.txt)
mv_cache=/var/cache/sandboxd/math-verify-sdist
mv_sdist=$mv_cache/math_verify-$mv_version.tar.gz
if [ -z "$mv_version" ]; then
    warn "no math-verify==X pin in images/python/requirements.txt: the agreement test will skip"
elif tar -tzf "$mv_sdist" >/dev/null 2>&1; then
    say "math_verify-$mv_version.tar.gz cached in $mv_cache"
else
    mkdir -p "$mv_cache"
    rm -f "$mv_sdist"  # a download cut short
    if .venv/bin/python -m pip download -q --no-deps --no-binary :all: "math-verify==$mv_version" -d "$mv_cache"; then
        say "downloaded math_verify-$mv_version.tar.gz into $mv_cache"
    else
        warn "could not download the math-verify $mv_version sdist (offline?): the agreement test tries again, or skips"
    fi
fi

step "Node.js example client (examples/node)"
node_stamp=examples/node/node_modules/.sandboxd-installed
node_want=$(cat examples/node/package.json examples/node/package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat "$node_stamp" 2>/dev/null)" = "$node_want" ]; then
    say "up to date ($(node --version))"
else
    say "npm ci in examples/node ($(node --version), npm $(npm --version 2>/dev/null))"
    # --ignore-scripts: pure-JS packages; nothing of theirs needs to run at install.
    (cd examples/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) \
        || die "npm ci in examples/node failed"
    echo "$node_want" >"$node_stamp"
fi

step "sandbox images"
if [ "$SKIP_IMAGES" = 1 ]; then
    say "skipped (--no-images / SANDBOXD_SKIP_IMAGES=1)"
else
    # shellcheck disable=SC2086  # IMAGES is a list of names
    .venv/bin/python -m sandboxd.images build $IMAGES || die "building the sandbox images failed (output above)"
fi

echo "==> setup done in $((SECONDS - started)) s"
