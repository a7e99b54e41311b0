#!/usr/bin/env bash
# Build the worker image (docker/Dockerfile.worker) without a registry: a local base image and a wheelhouse made on
# this host, so the build itself runs with no network at all. With a registry, a plain `docker build` does the same:
#   docker build -t pid-worker:latest -f docker/Dockerfile.worker .
#   usage: docker/build-worker.sh [IMAGE]        (default pid-worker:latest)
#   env:   PID_WORKER_BASE  base image, default pid-sandbox:latest (the offline-built Debian bookworm: Python 3.11,
#                           mkfs.ext4, mount); it must be present locally and have python3 with the venv module
#          PID_WORKER_ANY_PYTHON=1  build even when the base's Python is older than 3.11.4 (see below)
#          PYTHON           the host Python that builds the wheels (default .venv/bin/python, else python3); its
#                           major.minor must be the base's, since compiled wheels are built for it
set -euo pipefail
cd "$(dirname "$0")/.."
image=${1:-pid-worker:latest}
base=${PID_WORKER_BASE:-pid-sandbox:latest}
python=${PYTHON:-}
[ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python || python=python3; }

docker image inspect "$base" >/dev/null 2>&1 || { echo "base image $base is missing (bash docker/setup.sh builds pid-sandbox:latest)" >&2; exit 2; }
want=$(docker run --rm --network none --entrypoint python3 "$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
  || { echo "base image $base has no python3" >&2; exit 2; }
have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$want" = "$have" ] || { echo "$python is Python $have but $base has $want: set PYTHON to a Python $want" >&2; exit 2; }
# pid unpacks submitted workspaces with tarfile's extraction filters (Python 3.11.4 and later); Debian bookworm's
# 3.11.2 (pid-sandbox:latest) lacks them, so every submitted job would fail there with "unexpected keyword 'filter'".
if ! docker run --rm --network none --entrypoint python3 "$base" -c 'import tarfile; tarfile.data_filter' 2>/dev/null \
   && [ -z "${PID_WORKER_ANY_PYTHON:-}" ]; then
  echo "$base's Python lacks tarfile.data_filter (needs 3.11.4+): jobs would fail to unpack their workspace." >&2
  echo "Use a newer base (PID_WORKER_BASE=python:3.11-slim-bookworm) or PID_WORKER_ANY_PYTHON=1 to build anyway." >&2
  exit 2
fi

wheels=docker/wheels
find "$wheels" -name '*.whl' -delete
echo "building wheels into $wheels ..." >&2
# async-timeout: redis needs it below Python 3.11.3 (Debian's 3.11.2), a marker a newer host Python skips.
"$python" -m pip wheel -q --wheel-dir "$wheels" pip setuptools wheel async-timeout '.[redis]' flower >&2
rm -rf build ./*.egg-info
echo "building $image from $base (no network) ..." >&2
docker build -q --network none --build-arg BASE="$base" -t "$image" -f docker/Dockerfile.worker . >&2
find "$wheels" -name '*.whl' -delete
echo "$image"
