#!/usr/bin/env bash
# One Debian image without a registry: debootstrap a minimal Debian (Debian's package mirror is all it needs), let an
# optional script finish the tree, and `docker import` it. The sandbox, worker-base and Redis images are made this way.
#   usage: docker/debootstrap-image.sh IMAGE SUITE PACKAGES [FINISH] [-- DOCKER-IMPORT-CHANGES...]
#            PACKAGES  comma-separated, as debootstrap's --include
#            FINISH    a script run as `bash FINISH ROOT` on the tree before it is imported ("" for none)
#            after --, each argument is one `docker import --change` ('ENV A=b', 'USER redis', ...)
#   env:   PID_DEBIAN_MIRROR (default http://deb.debian.org/debian)
# The tree is slimmed (package caches, docs) and removed afterwards. Prints IMAGE.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 IMAGE SUITE PACKAGES [FINISH] [-- CHANGES...]" >&2; exit 2; }
image=$1 suite=$2 packages=$3
finish=${4:-}
shift $(( $# >= 4 ? 4 : 3 ))
[ "${1:-}" != "--" ] || shift
mirror=${PID_DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 2; }
command -v docker >/dev/null || { echo "docker is missing" >&2; exit 2; }

root=$(mktemp -d /tmp/pid-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $suite into $root ..." >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&2
[ -z "$finish" ] || bash "$finish" "$root" >&2
# Slim the tree: package caches and docs are dead weight in every container.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'ENV LANG=C.UTF-8')
for change in "$@"; do changes+=(--change "$change"); done
echo "importing as $image ..." >&2
tar -C "$root" -c . | docker import "${changes[@]}" - "$image" >&2
echo "$image"
