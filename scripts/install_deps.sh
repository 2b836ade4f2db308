#!/usr/bin/env bash
# Installs what fsdplab builds and tests with, only what is missing (safe to run again).
#   Debian packages: compiler toolchain, OpenMPI, cJSON, Check, OpenBLAS, pkg-config.
# Usage: scripts/install_deps.sh        (as root, or with sudo available)
set -euo pipefail

debian_packages=(build-essential pkg-config openmpi-bin libopenmpi-dev libcjson-dev check libopenblas-dev python3)

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
