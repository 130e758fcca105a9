#!/bin/bash
# The GPU path for real, on a lent GPU machine (root, one NVIDIA GPU, its driver, a CUDA torch
# in its own Python; no Docker engine, no NVIDIA Container Toolkit, no network):
#   1. a Docker 26 engine from FETCHED/engine.tar.xz (see fetch.sh) with CDI on, its storage on
#      a tmpfs, no bridge and no iptables (sandboxes have no network anyway);
#   2. a CDI spec for the machine's GPUs (cdi_spec.py: what `nvidia-ctk cdi generate` writes);
#   3. the machine's own root filesystem, with its CUDA torch, imported as the reward-model image
#      (import_root.py), since no registry and no PyPI can be reached from there;
#   4. smoke checks of the engine (smoke.py), the GPU tests, and optionally the benchmark.
# From the repository root, FETCHED carried along:
#   FETCHED=.gpurig bash scripts/gpu-machine/run.sh
#   TESTS="tests/integration/test_reward_model_gpu.py" BENCH="1b:512 8b:256" SMOKE=0 ...
# Idempotent on a machine still warm from an earlier call: a live engine and the image are reused.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
HERE=$ROOT/scripts/gpu-machine
FETCHED=$(realpath "${FETCHED:-.gpurig}")
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 )) s] $*"; }

step machine
uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
command -v python3; python3 -V; df -h / /dev/shm | tail -2

step wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$FETCHED"/whl/*.whl 2>&1 | tail -3
export PYTHONPATH=$ROOT:$ROOT/client
python3 -c "import docker, grpc, math_verify, sandboxd, sandboxd_client; print('imports ok')" || exit 1

step engine
mkdir -p /opt/engine /var/lib/docker /etc/docker /etc/cdi && tar -C /opt/engine -xJf "$FETCHED/engine.tar.xz"
export PATH=/opt/engine/bin:$PATH
mountpoint -q /var/lib/docker || mount -t tmpfs -o size=90g tmpfs /var/lib/docker
python3 "$HERE/cdi_spec.py" >/etc/cdi/nvidia.json
if ! python3 -c "import docker; docker.from_env().ping()" 2>/dev/null; then
    pkill -9 dockerd; pkill -9 containerd; sleep 1
    rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
    echo '{"features": {"cdi": true}, "iptables": false, "ip6tables": false, "bridge": "none",
           "userland-proxy": false, "experimental": true}' >/etc/docker/daemon.json
    # setsid: the engine outlives this call while the machine stays warm.
    LD_LIBRARY_PATH=/opt/engine/lib setsid dockerd >/tmp/dockerd.log 2>&1 </dev/null &
fi
for _ in $(seq 60); do python3 -c "import docker; docker.from_env().ping()" 2>/dev/null && break; sleep 1; done
python3 -c "import docker; print('engine', docker.from_env().version()['Version'])" || { tail -40 /tmp/dockerd.log; exit 1; }

step image
export SANDBOXD_BASE_IMAGE=sandboxd-device/rootfs:gpu
if python3 -c "import docker, sys; docker.from_env().images.get(sys.argv[1])" "$SANDBOXD_BASE_IMAGE" 2>/dev/null; then
    echo "$SANDBOXD_BASE_IMAGE is there"
else
    timeout 420 python3 "$HERE/import_root.py" "$SANDBOXD_BASE_IMAGE" || { tail -20 /tmp/dockerd.log; exit 1; }
fi
# The image serves as python and reward-model under the tags this tree gives them, so that
# images.ensure_images() finds them and builds nothing.
for name in python reward-model; do
    ref=$(python3 -c "from sandboxd.images import image_tag; print(image_tag('$name'))")
    python3 -c "import docker; docker.APIClient().tag('$SANDBOXD_BASE_IMAGE', '${ref%:*}', '${ref##*:}')" \
        && echo "tagged $ref"
done

if [ "${SMOKE:-1}" = 1 ]; then
    step smoke
    timeout 300 python3 "$HERE/smoke.py" "$SANDBOXD_BASE_IMAGE"
fi

step tests
export PYTHONUNBUFFERED=1
# shellcheck disable=SC2086
timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -p no:cacheprovider -q -rs --basetemp=/tmp/pt \
    ${TESTS:-tests/integration/test_reward_model_gpu.py} 2>&1 | tee "$OUT/pytest.log" | tail -60
find /tmp/pt -name "*.log" -size -8M | head -20 | tar -czf "$OUT/daemon-logs.tar.gz" -T - 2>/dev/null
cp /tmp/dockerd.log "$OUT/" 2>/dev/null

if [ -n "${BENCH:-}" ]; then
    step bench
    for item in $BENCH; do  # SIZE:PAIRS
        timeout 400 python3 bench/rewardmodel.py --gpu 'cdi_devices = ["nvidia.com/gpu=0"]' --size "${item%:*}" \
            --dtype bfloat16 --pairs "${item#*:}" 2>&1 | grep -v "Loading weights\|Writing model shards" | tail -25
    done
fi
