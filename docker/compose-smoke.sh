#!/usr/bin/env bash
# docker/compose.yaml run for real, end to end, as docs/deploy.md says (CI runs it: docker/setup.sh).
#   usage: bash docker/compose-smoke.sh            (as root: it bind-mounts the shared PID_HOME, as a deployment does)
#
# Builds what is missing (a Redis image where redis:7 cannot be had, the worker image when it is missing or was built
# from other sources), brings up Redis, 2 worker replicas and Flower, and runs a scripted model server in a container
# on the stack's network (tests/compose_model.py, as http://model:8000/v1). Then, through the compose `client`
# service: 3 jobs submitted at once, one with --check, waited for; their artifacts, as the client downloaded them,
# checked against their result.json's digests; Flower's API lists the 3 tasks; a worker container killed with
# `docker kill` during a job, whose job then completes once, on the other replica. Last, `docker compose down -v`,
# and no container, loop device, mount, network or volume of the run may be left.
#
# One line per step; on failure one line naming the step (exit 1; 2: a tool is missing), the run's log kept in
# /tmp/pid-compose-smoke.log. Everything the run made is removed whatever happens. Its project, ports and directories are its own: it runs beside anything.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
started=$(date +%s)
step=setup
work=$(mktemp -d /tmp/pid-smoke.XXXXXX)
log=$work/smoke.log
home=$work/home
client=$work/client
project=pidsmoke$$
model=$project-model
worker_image=${PID_WORKER_IMAGE:-pid-worker:latest}
down=""

kept_log=/tmp/pid-compose-smoke.log   # a failed run's log is kept here

say() { echo "[compose-smoke] $*" >&2; }
# fail [CODE] WHY: the one line naming the step, then the exit (cleanup follows)
fail() {
  local code=1; [[ "$1" =~ ^[0-9]+$ ]] && { code=$1; shift; }
  failed_said=1
  echo "[compose-smoke] FAILED at step '$step': $* (log: $kept_log)" >&2
  exit "$code"
}
cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ] && [ -z "$failed_said" ]; then
    echo "[compose-smoke] FAILED at step '$step' (exit $rc) (log: $kept_log)" >&2
  fi
  if [ -z "$down" ]; then
    docker rm -f "$model" >>"$log" 2>&1
    [ -z "${compose[*]:-}" ] || "${compose[@]}" -f docker/compose.yaml down -v >>"$log" 2>&1
    for job in ${jobs:-}; do docker ps -aq --filter "label=pid.job=$job" | xargs -r docker rm -f >>"$log" 2>&1; done
    grep -F " $home/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l >>"$log" 2>&1
    losetup -a | grep -F "($home/" | cut -d: -f1 | xargs -r -n1 losetup -d >>"$log" 2>&1
    umount "$home" >>"$log" 2>&1
  fi
  [ "$rc" -eq 0 ] || cp "$log" "$kept_log" 2>/dev/null
  rm -rf "$work"
}
failed_said=""
trap cleanup EXIT
run() { "$@" >>"$log" 2>&1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# -- tools ------------------------------------------------------------------------------------------------------------
step=tools
[ "$(id -u)" = 0 ] || fail 2 "run it as root (it bind-mounts the shared PID_HOME)"
{ command -v docker >/dev/null && docker info >/dev/null 2>&1; } || fail 2 "no Docker engine answers"
if docker compose version >/dev/null 2>&1; then compose=(docker compose)
elif command -v docker-compose >/dev/null; then compose=(docker-compose)
else fail 2 "no compose tool (docker compose, or apt-get install docker-compose)"
fi
say "compose tool: ${compose[*]} ($("${compose[@]}" version --short 2>/dev/null || echo '?'))"

# -- images: built only when missing ----------------------------------------------------------------------------------
step=images
if docker image inspect redis:7 >/dev/null 2>&1 || run timeout 120 docker pull redis:7; then
  export PID_REDIS_IMAGE=redis:7
else   # no registry: Debian's Redis 7, debootstrapped (docker/build-redis.sh)
  export PID_REDIS_IMAGE=pid-redis:7
  docker image inspect "$PID_REDIS_IMAGE" >/dev/null 2>&1 || run bash docker/build-redis.sh "$PID_REDIS_IMAGE" \
    || fail "docker/build-redis.sh could not build $PID_REDIS_IMAGE"
fi
run bash docker/build-worker.sh --if-stale "$worker_image" || fail "docker/build-worker.sh could not build $worker_image"
export PID_WORKER_IMAGE=$worker_image
say "images: $PID_REDIS_IMAGE, $PID_WORKER_IMAGE"

# -- the host's side: the shared PID_HOME (a shared mount at the same path inside), the client's directory ----------
step=host
mkdir -p -m 700 "$home" "$client/repo"
mount --bind "$home" "$home" && mount --make-rshared "$home" || fail "cannot make $home a shared mount"
git -C "$client/repo" init -q && printf '# smoke\n' >"$client/repo/README.md" &&
  git -C "$client/repo" -c user.name=smoke -c user.email=smoke@localhost add -A &&
  git -C "$client/repo" -c user.name=smoke -c user.email=smoke@localhost commit -qm init || fail "cannot make the repository"
export COMPOSE_PROJECT_NAME=$project PID_SHARED_HOME=$home PID_CLIENT_DIR=$client PID_WORKERS=2 PID_CONCURRENCY=2
export PID_REDIS_PORT=$(free_port) PID_FLOWER_PORT=$(free_port) FLOWER_UNAUTHENTICATED_API=true

# -- up ---------------------------------------------------------------------------------------------------------------
step=up
run "${compose[@]}" -f docker/compose.yaml up -d || fail "compose up"
for _ in $(seq 1 120); do
  ready=$("${compose[@]}" -f docker/compose.yaml logs worker 2>/dev/null | grep -c "pid worker ready" || true)
  [ "$ready" -ge 2 ] && break
  sleep 0.5
done
[ "$ready" -ge 2 ] || fail "2 workers did not start (ready: $ready)"
! "${compose[@]}" -f docker/compose.yaml logs worker 2>/dev/null | grep "no privilege drop of pid's own" ||
  fail "the worker image has no privilege drop of pid's own (build-worker.sh builds one into it)"
network=$(docker network ls -q --filter "label=com.docker.compose.project=$project")
[ -n "$network" ] || fail "no network of project $project"
run docker run -d --name "$model" --network "$network" --network-alias model -v "$root/tests:/src/tests:ro" -w /src \
  --entrypoint python3 "$worker_image" -m tests.compose_model --port 8000 || fail "the model server did not start"
say "up: Redis, 2 workers, Flower, the model server"

client_pid() { "${compose[@]}" -f docker/compose.yaml run --rm client "$@" 2>>"$log"; }

# -- 3 jobs through the client, one with --check ---------------------------------------------------------------------
step=jobs
for n in 1 2 3; do
  check=(); [ "$n" != 3 ] || check=(--check "grep -q smoke-3 smoke-3.txt")
  "${compose[@]}" -f docker/compose.yaml run --rm client submit --wait --out /work/out --model m \
    --base-url http://model:8000/v1 "smoke-$n" --repo /work/repo "${check[@]}" >"$work/submit-$n.out" 2>&1 &
  pids[$n]=$!
done
for n in 1 2 3; do wait "${pids[$n]}" || { cat "$work/submit-$n.out" >>"$log"; fail "submit --wait of smoke-$n exited non-zero"; }; done
cat "$work"/submit-*.out >>"$log"
jobs=$(ls "$client/out")
[ "$(echo "$jobs" | wc -w)" = 3 ] || fail "the client downloaded $(echo "$jobs" | wc -w) jobs, not 3"
say "3 jobs completed: $(echo $jobs)"

# -- their artifacts as the client downloaded them --------------------------------------------------------------------
step=artifacts
python3 - "$client/out" >>"$log" 2>&1 <<'EOF' || fail "a downloaded artifact does not match its job's result.json (see the log)"
import hashlib, json, os, sys
out = sys.argv[1]
for job in sorted(os.listdir(out)):
    result = json.load(open(os.path.join(out, job, "result.json")))
    assert result["status"] == "completed", (job, result["status"], result.get("error"))
    digests = result["artifacts"]["digests"]
    assert {"patch.diff", "session.jsonl"} <= set(digests), (job, digests)
    for name, digest in digests.items():
        with open(os.path.join(out, job, name), "rb") as f:
            assert "sha256:" + hashlib.sha256(f.read()).hexdigest() == digest, (job, name)
    task = result["task"]
    assert f"+{task}" in open(os.path.join(out, job, "patch.diff")).read(), (job, task)
    if task == "smoke-3":
        assert result["check"]["passed"] is True, (job, result["check"])
    print(job, task, "ok:", ", ".join(sorted(digests)))
EOF
say "artifacts: every digest matches result.json's; the --check passed"

# -- Flower ---------------------------------------------------------------------------------------------------------
step=flower
for _ in $(seq 1 60); do
  listed=$(curl -s -m 5 "http://127.0.0.1:$PID_FLOWER_PORT/api/tasks" 2>/dev/null | python3 -c '
import json, sys
tasks = json.load(sys.stdin)
print(" ".join(sorted(k for k, v in tasks.items() if v.get("name") == "pid.run_job" and v.get("state") == "SUCCESS")))
' 2>/dev/null || true)
  missing=0; for job in $jobs; do [[ " $listed " == *" $job "* ]] || missing=1; done
  [ "$missing" = 0 ] && break
  sleep 0.5
done
[ "$missing" = 0 ] || fail "Flower's API does not list the 3 tasks (it lists: ${listed:-nothing})"
say "Flower's API lists the 3 tasks"

# -- a worker killed during a job -------------------------------------------------------------------------------------
step=kill
slow=$(client_pid submit --model m --base-url http://model:8000/v1 smoke-slow --repo /work/repo | tail -n 1)
jobs="$jobs $slow"
for _ in $(seq 1 120); do
  owner=$(client_pid status --json "$slow" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print((r.get("owner") or "").split(":")[0] if "running bash" in (r.get("activity") or "") else "")' || true)
  [ -n "$owner" ] && break
  sleep 0.5
done
[ -n "$owner" ] || fail "job $slow did not start its command"
victim=""
for c in $(docker ps -q --filter "label=com.docker.compose.project=$project" --filter label=com.docker.compose.service=worker); do
  [ "$(docker inspect -f '{{.Config.Hostname}}' "$c")" = "$owner" ] && victim=$c
done
[ -n "$victim" ] || fail "no worker container is $owner"
run docker kill "$victim" || fail "docker kill $victim"
say "killed worker $owner during job $slow"
client_pid result "$slow" --wait --json >"$work/slow.json" || fail "job $slow did not complete after its worker was killed"
client_pid logs "$slow" >"$work/slow.log" || fail "pid logs $slow"
cat "$work/slow.json" "$work/slow.log" >>"$log"
python3 - "$work/slow.json" "$work/slow.log" "$owner" >>"$log" 2>&1 <<'EOF' || fail "job $slow did not complete once, on the other replica (see the log)"
import json, re, sys
result, lines, killed = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), sys.argv[3]
assert (result["status"], result["exit_reason"]) == ("completed", "stop"), result
assert [a["attempt"] for a in result["per_attempt"]] == [1, 2], result.get("per_attempt")
hosts = re.findall(r"attempt (\d+) started on (\S+)", lines)
assert [(n, h == killed) for n, h in hosts] == [("1", True), ("2", False)], hosts
assert len(re.findall(r"completed \(stop\)", lines)) == 1, lines
print("the killed worker's job completed once, on", hosts[1][1])
EOF
[ -z "$(docker ps -aq --filter "label=pid.job=$slow")" ] || fail "job $slow's containers are left"
say "job $slow completed once, on the other replica; nothing of the killed attempt is left"

# -- down, and nothing left -------------------------------------------------------------------------------------------
step=down
run docker rm -f "$model" || fail "docker rm $model"
run "${compose[@]}" -f docker/compose.yaml down -v || fail "compose down -v"
down=1
[ -z "$(docker ps -aq --filter "label=com.docker.compose.project=$project")" ] || fail "containers of $project are left"
for job in $jobs; do [ -z "$(docker ps -aq --filter "label=pid.job=$job")" ] || fail "job $job's containers are left"; done
[ -z "$(docker network ls -q --filter "label=com.docker.compose.project=$project")" ] || fail "the network of $project is left"
[ -z "$(docker volume ls -q --filter "label=com.docker.compose.project=$project")" ] || fail "the volume of $project is left"
! losetup -a | grep -qF "($home/" || fail "loop devices are left: $(losetup -a | grep -F "($home/" | cut -d: -f1 | xargs)"
! grep -qF " $home/" /proc/self/mountinfo || fail "mounts are left under $home"
umount "$home" || fail "cannot unmount $home"
! grep -qF " $home " /proc/self/mountinfo || fail "$home is still mounted"
say "down: no container, loop device, mount, network or volume left"
say "passed in $(( $(date +%s) - started ))s"
