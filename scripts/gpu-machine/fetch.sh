#!/bin/bash
# Gathers what scripts/gpu-machine/run.sh needs on a GPU machine that has no Docker engine and
# no network: a Docker 26 engine (Debian trixie's docker.io, containerd, runc, tini and the
# libraries they link) packed as engine.tar.xz, and the Python wheels the daemon and the tests
# need beyond that machine's own (cp312). Run here, where Debian's archive and PyPI answer:
#
#   bash scripts/gpu-machine/fetch.sh .gpurig      # about 52 MB, to carry to the GPU machine
#
# Docker 26 because CDI (`--device nvidia.com/gpu=0`, DeviceRequest driver "cdi") needs 25 or
# later; bookworm's docker.io is 20.10.
set -euo pipefail
DEST=$(realpath -m "${1:?usage: fetch.sh DEST}")
PYVER=${PYVER:-3.12}
mkdir -p "$DEST/whl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/lists/partial" "$work/debs" "$work/x" "$work/pkg/bin" "$work/pkg/lib"
echo "deb http://deb.debian.org/debian trixie main" >"$work/sources.list"
apt_opts=(-oDir::Etc::SourceList="$work/sources.list" -oDir::Etc::SourceParts=/dev/null
          -oDir::State::Lists="$work/lists" -oAPT::Architecture=amd64)
apt-get "${apt_opts[@]}" update -qq
packages=(docker.io containerd runc tini libsystemd0 libseccomp2 libcap2 libgcrypt20 liblzma5 libzstd1 liblz4-1
          libgpg-error0)
(cd "$work/debs" && apt-get "${apt_opts[@]}" download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed")
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/x"; done
cp "$work"/x/usr/sbin/dockerd "$work"/x/usr/bin/containerd "$work"/x/usr/bin/containerd-shim-runc-v2 \
   "$work"/x/usr/sbin/runc "$work/pkg/bin/"
cp "$work/x/usr/bin/tini-static" "$work/pkg/bin/docker-init"
cp -a "$work"/x/usr/lib/x86_64-linux-gnu/*.so* "$work/pkg/lib/"
tar -C "$work/pkg" -cJf "$DEST/engine.tar.xz" .

# The versions this tree is tested with; --target installs on the GPU machine shadow its own.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/whl" grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2 \
    docker==7.2.0 pytest-asyncio==1.5.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
    antlr4-python3-runtime==4.13.2 accelerate==1.15.0 psutil==7.2.2
du -sh "$DEST"/engine.tar.xz "$DEST"/whl
