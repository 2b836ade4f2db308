#!/usr/bin/env bash
# The lent GPU machine's environment, tried here: scripts/gpu_env.sh's gpu_env_setup must give a bare machine every
# library fsdplab builds and runs with from scripts/gpu_bundle.sh's packages, and find NCCL and cuBLAS in pip's
# nvidia-* packages where the toolkit lacks them. A lease is minutes long; this is where its set-up is debugged.
#
#   tests/gpu_env_check.sh [BUNDLE]     BUNDLE defaults to .gpu_bundle (made by scripts/gpu_bundle.sh when missing)
#
# Part 1, the bundle (GPU_ENV_BUNDLE=1: taken even though this machine has the libraries; unpacked into a fresh
# GPU_ENV_ROOT under runs/check/gpu_env): mpicc, mpirun and pkg-config's flags must come from the private root, and a
# program built the Makefile's way (mpicc, pkg-config's cflags and libs, LDFLAGS) using OpenMPI, cJSON, OpenBLAS, PCRE2
# and utf8proc must load every one of them from the root (ldd) and print the expected line on 2 ranks under the root's
# mpirun.
# Part 2, pip's libraries: with no toolkit (CUDA_HOME a missing folder, no nvcc on PATH) and a fake nvidia/ namespace
# package on PYTHONPATH holding nccl.h and libnccl.so.2, cublas_v2.h and libcublas.so.13, NCCL_HOME and CUBLAS_HOME
# must be homes whose include/ holds the header and lib/ the library with its unversioned link.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bundle=${1:-.gpu_bundle}
work=runs/check/gpu_env
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
if [ ! -d "$bundle/debs" ]; then
  scripts/gpu_bundle.sh "$bundle" >"$work/bundle.log" 2>&1 ||
    fail "scripts/gpu_bundle.sh: $(tail -n 2 "$work/bundle.log")"
fi

# ---- part 1: the bundle's libraries, in a shell of their own
cat >"$work/probe.c" <<'EOF'
#include <cblas.h>
#include <cjson/cJSON.h>
#include <mpi.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    float x[3] = {1, 2, 3};
    int total = 0, dot = (int)cblas_sdot(3, x, 1, x, 1);
    MPI_Allreduce(&dot, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    cJSON *object = cJSON_CreateObject();
    cJSON_AddNumberToObject(object, "sum", total);
    char *json = cJSON_PrintUnformatted(object);
    int error;
    PCRE2_SIZE offset;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "[0-9]+", PCRE2_ZERO_TERMINATED, 0, &error, &offset, NULL);
    pcre2_match_data *match = pcre2_match_data_create_from_pattern(re, NULL);
    int matched = pcre2_match(re, (PCRE2_SPTR)json, strlen(json), 0, 0, match, NULL);
    utf8proc_uint8_t *nfc = utf8proc_NFC((const utf8proc_uint8_t *)"e\xcc\x81");
    printf("rank %d of %d: %s matched %d nfc %zu bytes\n", rank, size, json, matched, strlen((char *)nfc));
    free(nfc);
    free(json);
    cJSON_Delete(object);
    pcre2_match_data_free(match);
    pcre2_code_free(re);
    MPI_Finalize();
    return 0;
}
EOF
(
  # a root of its own, fresh: nothing a former run unpacked or linked can stand in for what this one must make
  export GPU_ENV_BUNDLE=1 GPU_BUNDLE=$bundle GPU_ENV_ROOT=$(pwd)/$work/root
  unset FSDPLAB_GPU_ROOT
  . scripts/gpu_env.sh
  gpu_env_setup || fail "gpu_env_setup returned non-zero"
  root=${FSDPLAB_GPU_ROOT:-}
  [ "$root" = "$GPU_ENV_ROOT" ] || fail "FSDPLAB_GPU_ROOT is '$root', not $GPU_ENV_ROOT: the bundle was not unpacked"
  [ "$(command -v mpicc)" = "$root/usr/bin/mpicc" ] || fail "mpicc is $(command -v mpicc), not the root's"
  [ "$(command -v mpirun)" = "$root/usr/bin/mpirun" ] || fail "mpirun is $(command -v mpirun), not the root's"
  libs="libcjson openblas libpcre2-8 libutf8proc"
  # shellcheck disable=SC2086
  flags=$(pkg-config --cflags --libs $libs) || fail "pkg-config: $libs"
  [[ "$flags" == *"$root/usr/include/cjson"* ]] || fail "pkg-config's flags name no root include: $flags"
  # this machine has the headers and libraries in /usr too, so a build cannot show that these two are needed; a bare
  # machine's build fails without them
  [[ ":${CPATH:-}:" == *":$root/usr/include:"* ]] || fail "CPATH='${CPATH:-}' lacks $root/usr/include"
  [[ " ${LDFLAGS:-} " == *" -L$root/usr/lib/x86_64-linux-gnu "* ]] || fail "LDFLAGS='${LDFLAGS:-}' lacks the root's lib"
  # shellcheck disable=SC2086,SC2046
  mpicc -std=c11 -o "$work/probe" "$work/probe.c" $(pkg-config --cflags $libs) $LDFLAGS $(pkg-config --libs $libs) \
    >"$work/build.log" 2>&1 || fail "build: $(head -n 5 "$work/build.log")"
  ldd "$work/probe" >"$work/ldd.log"
  for library in libmpi.so libcjson.so libopenblas.so libpcre2-8.so libutf8proc.so; do
    where=$(awk -v l="$library" 'index($1, l) == 1 {print $3}' "$work/ldd.log")
    [[ "$where" == "$root/"* ]] || fail "$library loads from '${where:-nowhere}', not from $root"
  done
  mpirun --allow-run-as-root --oversubscribe -np 2 "$work/probe" </dev/null >"$work/run.log" 2>&1 ||
    fail "mpirun: $(tail -n 5 "$work/run.log")"
  for rank in 0 1; do
    grep -qx "rank $rank of 2: {\"sum\":28} matched 1 nfc 2 bytes" "$work/run.log" ||
      fail "rank $rank's line is missing or wrong: $(cat "$work/run.log")"
  done
  echo "bundle: mpicc, mpirun, pkg-config and 5 libraries from $root; 2 ranks ran"
) || exit 1

# ---- part 2: NCCL and cuBLAS from pip's nvidia-* packages (fakes with the real layout) when the toolkit lacks them
site=$(pwd)/$work/site
for package in "nccl nccl.h libnccl.so.2" "cublas cublas_v2.h libcublas.so.13"; do
  read -r name header library <<<"$package"
  mkdir -p "$site/nvidia/$name/include" "$site/nvidia/$name/lib"
  echo "/* fake $header */" >"$site/nvidia/$name/include/$header"
  : >"$site/nvidia/$name/lib/$library"
done
(
  export PYTHONPATH=$site CUDA_HOME=$(pwd)/$work/no_toolkit PATH=/usr/bin:/bin
  unset NCCL_HOME CUBLAS_HOME
  export GPU_ENV_LINKS=$(pwd)/$work/links # not /tmp's, which a real setup on this machine may be using
  . scripts/gpu_env.sh
  gpu_env_setup || fail "gpu_env_setup returned non-zero (pip's libraries)"
  [ -f "${NCCL_HOME:-}/include/nccl.h" ] || fail "NCCL_HOME='${NCCL_HOME:-}' has no include/nccl.h"
  [[ $NCCL_HOME == "$GPU_ENV_LINKS"/* && $CUBLAS_HOME == "$GPU_ENV_LINKS"/* ]] ||
    fail "NCCL_HOME=$NCCL_HOME, CUBLAS_HOME=$CUBLAS_HOME: not under GPU_ENV_LINKS=$GPU_ENV_LINKS"
  [ -e "$NCCL_HOME/lib/libnccl.so" ] && [ -e "$NCCL_HOME/lib/libnccl.so.2" ] ||
    fail "NCCL_HOME/lib lacks libnccl.so or libnccl.so.2: $(ls "$NCCL_HOME/lib")"
  [ -f "${CUBLAS_HOME:-}/include/cublas_v2.h" ] || fail "CUBLAS_HOME='${CUBLAS_HOME:-}' has no include/cublas_v2.h"
  [ -e "$CUBLAS_HOME/lib/libcublas.so" ] || fail "CUBLAS_HOME/lib lacks libcublas.so: $(ls "$CUBLAS_HOME/lib")"
  [[ ":$LD_LIBRARY_PATH:" == *":$NCCL_HOME/lib:"* ]] || fail "LD_LIBRARY_PATH lacks $NCCL_HOME/lib"
  echo "pip: NCCL_HOME=$NCCL_HOME CUBLAS_HOME=$CUBLAS_HOME, headers and unversioned links in place"
) || exit 1
echo "OK: gpu_env_setup gives a bare GPU machine its libraries"
