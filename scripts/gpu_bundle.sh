#!/usr/bin/env bash
# Packs what the GPU machine lacks into one folder, to carry there for scripts/gpu_check.sh.
#
# The lent GPU machine (see docs/gpu.md) has the CUDA toolkit, NCCL and cuBLAS (pip's nvidia-*),
# Python with torch and transformers, and no OpenMPI, cJSON, Check, OpenBLAS, PCRE2, utf8proc or pkg-config; nothing
# can be downloaded there. This script, run on a machine with Debian's apt (this project's development machines),
# downloads those libraries as Debian packages (their runtime and -dev halves and the libraries OpenMPI loads) into
# DIR/debs, and copies Qwen2's vocabulary (data/qwen2, for MODEL=qwen2's tokenizer) into DIR/data. gpu_check.sh
# unpacks the packages with `dpkg -x` into a private root (never into /) and points PATH, the compiler's and
# linker's search paths, pkg-config and OpenMPI's OPAL_PREFIX there.
#
#   scripts/gpu_bundle.sh [DIR]      DIR defaults to .gpu_bundle (git-ignored); about 20 MB
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu_bundle}
packages=(
  # OpenMPI and what its libraries load
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libevent-2.1-7 libpmix2 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1 librdmacm1 libnl-3-200
  libnl-route-3-200 libnuma1 libmunge2 libltdl7 libpciaccess0 libxnvctrl0
  # the event schema's JSON, the unit tests' framework
  libcjson1 libcjson-dev check libsubunit0 libsubunit-dev
  # the CPU reference's BLAS (the GPU check compares against it)
  libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5
  # Qwen2's tokenizer: the pre-tokenizer regex and NFC
  libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libpcre2-dev libutf8proc2 libutf8proc-dev
  pkgconf pkgconf-bin libpkgconf3
)
command -v apt-get >/dev/null || {
  echo "gpu_bundle.sh: needs Debian's apt-get (run it on a development machine)" >&2
  exit 2
}
mkdir -p "$dir/debs" "$dir/data"
dir=$(cd "$dir" && pwd)
echo "gpu_bundle: downloading ${#packages[@]} Debian packages into $dir/debs"
(cd "$dir/debs" && apt-get download -q "${packages[@]}" >/dev/null 2>"$dir/download.log") || {
  # an outdated package list names versions the mirror no longer has: refresh it once and try again
  echo "gpu_bundle: apt-get download failed ($(tail -n 1 "$dir/download.log")); running apt-get update and retrying"
  apt-get update -qq
  (cd "$dir/debs" && apt-get download -q "${packages[@]}" >/dev/null)
}
if [ -d data/qwen2 ]; then cp -r data/qwen2 "$dir/data/"; else
  echo "gpu_bundle: data/qwen2 is missing (scripts/get_qwen2_tokenizer.sh fetches it); MODEL=qwen2 will need it" >&2
fi
echo "gpu_bundle: $(ls "$dir/debs" | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir"
