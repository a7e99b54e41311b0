#!/usr/bin/env bash
# Build the worker image (docker/Dockerfile.worker) without a registry: a local base image and a wheelhouse made on
# this host, so the build itself runs with no network at all. With a registry, a plain `docker build` does the same
# from python:3.11-slim-bookworm:
#   docker build -t pid-worker:latest -f docker/Dockerfile.worker .
#   usage: docker/build-worker.sh [--if-stale] [IMAGE]        (default pid-worker:latest)
#          --if-stale: only when IMAGE is missing or was built from other sources (its label pid.source)
#   env:   PID_WORKER_BASE  base image, default pid-worker-base:trixie, made here when missing by debootstrap
#                           (Debian trixie: Python 3.13, mkfs.ext4, mount); any local base with python3 (and its venv
#                           module) of 3.11.4 or later will do
#          PYTHON           the host Python whose pip makes the wheelhouse (default .venv/bin/python, else python3)
# The wheelhouse: pid's own wheel, built here, and every dependency as a wheel for the BASE's Python and machine
# (pip download --python-version/--platform), at the versions this host's environment has where it has them.
set -euo pipefail
cd "$(dirname "$0")/.."
if_stale=""; [ "${1:-}" != "--if-stale" ] || { if_stale=1; shift; }
image=${1:-pid-worker:latest}
# What the image is made of, as one digest: pid's code, its packaging and this Dockerfile.
source=$( { find pid sandbox jobs worker cli -type f \( -name '*.py' -o -name '*.sh' -o -name '*.lua' -o -name '*.c' \) | LC_ALL=C sort;
            echo pyproject.toml; echo docker/Dockerfile.worker; } | xargs sha256sum | sha256sum | cut -c1-16)
if [ -n "$if_stale" ] && [ "$(docker image inspect -f '{{index .Config.Labels "pid.source"}}' "$image" 2>/dev/null)" = "$source" ]; then
  echo "$image"; exit 0
fi
base=${PID_WORKER_BASE:-pid-worker-base:trixie}
python=${PYTHON:-}
[ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python || python=python3; }

if ! docker image inspect "$base" >/dev/null 2>&1; then
  [ -z "${PID_WORKER_BASE:-}" ] || { echo "base image $base is missing" >&2; exit 2; }
  echo "building the base $base with debootstrap ..." >&2
  bash docker/debootstrap-image.sh "$base" trixie python3,e2fsprogs,mount,ca-certificates "" -- \
    'LABEL pid.image=worker-base' >/dev/null
fi
want=$(docker run --rm --network none --entrypoint python3 "$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
  || { echo "base image $base has no python3" >&2; exit 2; }
# pid unpacks submitted workspaces with tarfile's extraction filters (Python 3.11.4 and later); Debian bookworm's
# 3.11.2 (pid-sandbox:latest) lacks them, so every submitted job would fail there with "unexpected keyword 'filter'".
docker run --rm --network none --entrypoint python3 "$base" -c 'import tarfile; tarfile.data_filter' 2>/dev/null || {
  echo "$base's Python lacks tarfile.data_filter (needs 3.11.4+): jobs would fail to unpack their workspace" >&2; exit 2; }

wheels=docker/wheels
arch=$(docker run --rm --network none --entrypoint uname "$base" -m)
find "$wheels" -name '*.whl' -delete
echo "building the wheelhouse for Python $want on $arch into $wheels ..." >&2
"$python" -m pip wheel -q --disable-pip-version-check --no-deps --wheel-dir "$wheels" . >&2
rm -rf build ./*.egg-info
pidwheel=$(ls "$wheels"/pid-*.whl)
constraints=$(mktemp /tmp/pid-constraints.XXXXXX)
trap 'rm -f "$constraints" "$wheels/drop" "$wheels/drop.so"' EXIT   # (a drop left here would go into a later registry build's image)
"$python" -m pip freeze --disable-pip-version-check --exclude-editable 2>/dev/null | grep -v -i '^pid[=@ ]' >"$constraints" || true
"$python" -m pip download -q --disable-pip-version-check --only-binary :all: --dest "$wheels" \
  --python-version "$want" --implementation cp \
  --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch" --platform "manylinux_2_28_$arch" \
  -c "$constraints" pip "$pidwheel" flower >&2
# pid's privilege drop, built by this host's compiler for the base's machine (the image has none: Dockerfile.worker)
rm -f "$wheels/drop" "$wheels/drop.so"
if [ "$(uname -m)" = "$arch" ]; then
  "$python" -m pid.sandbox.drop_helper build "$wheels/drop" >&2 ||
    echo "no privilege drop of pid's own in $image: its jobs' commands drop through setpriv" >&2
fi
echo "building $image from $base (no network) ..." >&2
previous=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
docker build -q --network none --build-arg BASE="$base" --label pid.source="$source" -t "$image" \
  -f docker/Dockerfile.worker . >&2
# The image it replaces, now untagged, goes (one per build would pile up, ~240 MB each); kept while a container uses it.
if [ -n "$previous" ] && [ "$(docker image inspect -f '{{len .RepoTags}}' "$previous" 2>/dev/null)" = 0 ]; then
  docker rmi "$previous" >/dev/null 2>&1 || true
fi
find "$wheels" -name '*.whl' -delete
echo "$image"
