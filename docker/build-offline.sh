#!/usr/bin/env bash
# Build the default sandbox image without a registry: debootstrap a minimal Debian into a folder,
# add the tools the agent expects, and `docker import` the tree. Air-gapped hosts and CI need this.
#   usage: docker/build-offline.sh [IMAGE]   (default pid-sandbox:latest)
#   env:   PID_DEBIAN_MIRROR (default http://deb.debian.org/debian), PID_DEBIAN_SUITE (default bookworm)
set -euo pipefail
image=${1:-pid-sandbox:latest}
suite=${PID_DEBIAN_SUITE:-bookworm}
mirror=${PID_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=bash,git,coreutils,ca-certificates,ripgrep,python3,procps,findutils,grep,sed,diffutils,patch,less

command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 2; }
command -v docker >/dev/null || { echo "docker is missing" >&2; exit 2; }

root=$(mktemp -d /tmp/pid-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $suite into $root ..." >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&2
# Slim the tree: package caches and docs are dead weight in every container.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
mkdir -p "$root/workspace"
echo "importing as $image ..." >&2
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'WORKDIR /workspace' \
  --change 'CMD ["/bin/bash"]' \
  --change 'LABEL pid.image=sandbox' \
  - "$image" >&2
echo "$image"
