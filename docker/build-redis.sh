#!/usr/bin/env bash
# A Redis image without a registry, for hosts where `redis:7` cannot be pulled: Debian bookworm's redis-server (7.0)
# debootstrapped and imported. It behaves as the official image does for docker/compose.yaml: the command
# `redis-server ARGS...`, the data in /data (the working directory, owned by the redis user it runs as), protected
# mode off (the official image builds Redis so; without it Redis refuses every client from another container),
# `redis-cli` for the health check.
#   usage: docker/build-redis.sh [IMAGE]   (default pid-redis:7)
#   env:   PID_DEBIAN_MIRROR, as docker/debootstrap-image.sh
set -euo pipefail
cd "$(dirname "$0")"
image=${1:-pid-redis:7}
finish=$(mktemp /tmp/pid-redis-finish.XXXXXX)
trap 'rm -f "$finish"' EXIT
cat >"$finish" <<'FINISH'
set -eu
root=$1
mkdir -p "$root/data"
chroot "$root" chown redis:redis /data
cat >"$root/usr/local/bin/docker-entrypoint.sh" <<'ENTRY'
#!/bin/sh
# `redis-server ARGS...` listens to other containers, as the official image's does; later ARGS may say otherwise.
if [ "${1:-}" = redis-server ]; then shift; set -- redis-server --protected-mode no "$@"; fi
exec "$@"
ENTRY
chmod 755 "$root/usr/local/bin/docker-entrypoint.sh"
FINISH
exec bash debootstrap-image.sh "$image" bookworm redis-server "$finish" -- \
  'USER redis' 'WORKDIR /data' 'VOLUME /data' 'EXPOSE 6379' \
  'ENTRYPOINT ["docker-entrypoint.sh"]' 'CMD ["redis-server"]' 'LABEL pid.image=redis'
