#!/usr/bin/env bash
# Build the default sandbox image without a registry: debootstrap a minimal Debian into a folder,
# add the tools the agent expects, and `docker import` the tree (docker/debootstrap-image.sh). Air-gapped hosts and
# CI need this.
#   usage: docker/build-offline.sh [IMAGE]   (default pid-sandbox:latest)
#   env:   PID_DEBIAN_MIRROR (default http://deb.debian.org/debian), PID_DEBIAN_SUITE (default bookworm)
set -euo pipefail
cd "$(dirname "$0")"
image=${1:-pid-sandbox:latest}
suite=${PID_DEBIAN_SUITE:-bookworm}
packages=bash,git,coreutils,ca-certificates,ripgrep,python3,procps,findutils,grep,sed,diffutils,patch,less
finish=$(mktemp /tmp/pid-sandbox-finish.XXXXXX)
trap 'rm -f "$finish"' EXIT
echo 'mkdir -p "$1/workspace"' >"$finish"
bash debootstrap-image.sh "$image" "$suite" "$packages" "$finish" -- \
  'WORKDIR /workspace' 'CMD ["/bin/bash"]' 'LABEL pid.image=sandbox'
