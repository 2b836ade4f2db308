# shellcheck shell=bash disable=SC2034
# gpu_env.sh — what every GPU script needs before it builds or runs, in one place. Sourced, not run, by
# scripts/gpu_check.sh, scripts/gpu_bench.sh and scripts/gpu_lease.sh:
#
#   . scripts/gpu_env.sh
#   gpu_env_setup || exit 1     # the libraries and the CUDA homes, exported
#   gpu_peaks                   # gpu_name, peak_fp32 (fp32_name), peak_bf16 in TFLOP/s (0: unknown)
#   gpu_seconds DEADLINE [CAP]  # a timeout's seconds before a deadline (gpu_lease.sh's, gpu_bench.sh's)
#
# gpu_env_setup: OpenMPI, cJSON, Check, OpenBLAS, PCRE2 and utf8proc from the system, or else from the Debian packages
# scripts/gpu_bundle.sh packed into .gpu_bundle/ (GPU_BUNDLE=DIR names another), unpacked with `dpkg -x` (or ar and tar
# where there is no dpkg) into a private root (GPU_ENV_ROOT, an absolute path, default /tmp/fsdplab-root; never into /),
# with PATH, the compiler's and linker's paths, pkg-config and OpenMPI's OPAL_PREFIX pointed there; Qwen2's vocabulary
# from the bundle into data/ when data/qwen2 is missing. Then the CUDA toolkit (CUDA_HOME, default /usr/local/cuda, or
# the one whose nvcc is on PATH), and NCCL and cuBLAS from the toolkit or else pip's nvidia-* packages (NCCL_HOME,
# CUBLAS_HOME: homes of links made under GPU_ENV_LINKS, default /tmp). Everything is exported, so a script the caller
# runs next finds it all at once and unpacks nothing twice. GPU_ENV_BUNDLE=1 takes the bundle even where the system has
# the libraries: how a development machine tries the lent machine's path (tests/gpu_env_check.sh). Returns 1 with one
# line on stderr when the libraries are missing and there is no bundle.
#
# gpu_peaks: the dense peaks (no sparsity) of the GPU nvidia-smi names first, from NVIDIA's datasheets (H100: "NVIDIA
# H100 Tensor Core GPU" datasheet, SXM and PCIe columns; H200: "NVIDIA H200 Tensor Core GPU" datasheet, SXM; A100:
# "NVIDIA A100 Tensor Core GPU" datasheet, SXM), the sparsity figures they print halved:
#   H100 SXM, H200 SXM: BF16 989, TF32 494, FP32 67 TFLOP/s     H100 PCIe: BF16 756, TF32 378, FP32 51
#   A100 SXM: BF16 312, TF32 156, FP32 19.5
# A float32 run is compared with FP32's peak (fsdplab's GEMMs are exact float32 unless ALLOW_TF32=1, and torch's
# default is the same); with ALLOW_TF32=1 in the environment, with TF32's (fp32_name says which). PEAK_TFLOPS_FP32 /
# PEAK_TFLOPS_BF16 override them (for any other GPU; 0 where unknown).

gpu_env_setup() {
  local need_bundle=${GPU_ENV_BUNDLE:-0}
  command -v mpicc >/dev/null 2>&1 || need_bundle=1
  pkg-config --exists libcjson check openblas libpcre2-8 libutf8proc 2>/dev/null || need_bundle=1
  if [ "$need_bundle" = 1 ] && [ "${FSDPLAB_GPU_ROOT:-}" = "" ]; then
    local bundle=${GPU_BUNDLE:-.gpu_bundle} root=${GPU_ENV_ROOT:-/tmp/fsdplab-root} deb lib
    if [ ! -d "$bundle/debs" ]; then
      echo "gpu_env: no OpenMPI/cJSON/OpenBLAS here and no $bundle/debs (run scripts/gpu_bundle.sh on a" \
        "development machine and carry $bundle)" >&2
      return 1
    fi
    mkdir -p "$root"
    for deb in "$bundle"/debs/*.deb; do
      if command -v dpkg >/dev/null 2>&1; then dpkg -x "$deb" "$root" || return 1
      else (cd "$(mktemp -d)" && ar x "$(cd "$OLDPWD" && realpath "$deb")" && tar -xf data.tar.* -C "$root") || return 1
      fi
    done
    lib=$root/usr/lib/x86_64-linux-gnu
    # Debian's alternatives are links its installer makes; a private root gets them here
    ln -sf mpicc.openmpi "$root/usr/bin/mpicc"
    ln -sf mpirun.openmpi "$root/usr/bin/mpirun"
    ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
    export FSDPLAB_GPU_ROOT=$root PATH=$root/usr/bin:$PATH OPAL_PREFIX=$root/usr
    # PMIx looks for its plugins where Debian installs them; a machine with another PMIx there would lend it its own
    export PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
    export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # -L, not LIBRARY_PATH: Debian's and Ubuntu's gcc search a LIBRARY_PATH entry only with its multiarch suffix
    # ($lib/x86_64-linux-gnu/), after the system's own folder
    export LDFLAGS="-L$lib -L$lib/openblas-pthread${LDFLAGS:+ $LDFLAGS}"
    export CPATH=$root/usr/include${CPATH:+:$CPATH}
    export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$root/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$root
    if [ -d "$bundle/data/qwen2" ] && [ ! -d data/qwen2 ]; then mkdir -p data && cp -r "$bundle/data/qwen2" data/; fi
  fi
  local cuda_home=${CUDA_HOME:-/usr/local/cuda} home
  # no toolkit there: the one whose nvcc is on PATH
  if [ ! -x "$cuda_home/bin/nvcc" ] && command -v nvcc >/dev/null 2>&1; then
    cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
  fi
  export CUDA_HOME=$cuda_home
  case ":$PATH:" in *":$cuda_home/bin:"*) ;; *) export PATH=$cuda_home/bin:$PATH ;; esac
  if [ -z "${NCCL_HOME:-}" ] && ! { [ -f "$cuda_home/include/nccl.h" ] && gpu_env_has_library "$cuda_home" libnccl; }
  then
    NCCL_HOME=$(gpu_env_pip_library libnccl nccl.h) && export NCCL_HOME
  fi
  if [ -z "${CUBLAS_HOME:-}" ] && ! gpu_env_has_library "$cuda_home" libcublas; then
    CUBLAS_HOME=$(gpu_env_pip_library libcublas cublas_v2.h) && export CUBLAS_HOME
  fi
  # the labs find them through their rpath; LD_LIBRARY_PATH for anything else that loads them
  for home in "${NCCL_HOME:-}" "${CUBLAS_HOME:-}"; do
    [ -n "$home" ] || continue
    case ":${LD_LIBRARY_PATH:-}:" in
      *":$home/lib:"*) ;;
      *) export LD_LIBRARY_PATH=$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
    esac
  done
  return 0
}

gpu_env_has_library() { ls "$1"/lib64/"$2".so* "$1"/lib/"$2".so* >/dev/null 2>&1; }

# gpu_env_pip_library NAME HEADER: a home (DIR/include/HEADER, DIR/lib/NAME.so*) for a library the toolkit lacks, made
# of links to pip's nvidia-* package that ships it (a namespace package: searched under every sys.path entry), with the
# unversioned NAME.so the linker looks for
gpu_env_pip_library() {
  local found home=${GPU_ENV_LINKS:-/tmp}/fsdplab-$1
  found=$(python3 - "$1" "$2" <<'PY'
import glob, os, sys
name, header = sys.argv[1], sys.argv[2]
for entry in sys.path:
    for h in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "**", "include", header), recursive=True)):
        lib = os.path.join(os.path.dirname(os.path.dirname(h)), "lib")
        if glob.glob(os.path.join(lib, name + ".so*")):
            print(os.path.dirname(os.path.dirname(h)))
            sys.exit(0)
PY
  ) || return 1
  [ -n "$found" ] || return 1
  mkdir -p "$home/lib"
  ln -sfn "$found/include" "$home/include"
  ln -sf "$found"/lib/"$1".so* "$home/lib/"
  [ -e "$home/lib/$1.so" ] || ln -sf "$(ls "$found"/lib/"$1".so.* | head -n 1)" "$home/lib/$1.so"
  echo "$home"
}

# gpu_seconds DEADLINE [CAP]: a timeout's seconds: what is left before DEADLINE (epoch seconds; empty: no deadline),
# at most CAP when given, and at least 1 (`timeout 0` would mean no limit at all)
gpu_seconds() {
  local seconds=${2:-} left
  if [ -n "$1" ]; then
    left=$(($1 - $(date +%s)))
    if [ -z "$seconds" ] || [ "$left" -lt "$seconds" ]; then seconds=$left; fi
  fi
  echo $((seconds > 1 ? seconds : 1))
}

gpu_peaks() {
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  case "$gpu_name" in
    *H100*PCIe*) peak_fp32=51 peak_tf32=378 peak_bf16=756 ;;
    *H100* | *H200*) peak_fp32=67 peak_tf32=494 peak_bf16=989 ;;
    *A100*) peak_fp32=19.5 peak_tf32=156 peak_bf16=312 ;;
    *) peak_fp32=0 peak_tf32=0 peak_bf16=0 ;;
  esac
  fp32_name=FP32
  if [ "${ALLOW_TF32:-0}" = 1 ]; then peak_fp32=$peak_tf32 fp32_name=TF32; fi
  peak_fp32=${PEAK_TFLOPS_FP32:-$peak_fp32} peak_bf16=${PEAK_TFLOPS_BF16:-$peak_bf16}
}
