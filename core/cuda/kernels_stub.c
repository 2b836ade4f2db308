/* kernels_stub.c — STAND-IN for core/cuda/kernels.cu until that file lands (the Makefile builds this file only when
 * kernels.cu is absent), so that `make CUDA=1` links: the CUDA device then has its memory functions and no layers.
 * It refuses to start rather than run a model without them. Delete it once kernels.cu is in the tree. */
#include "cuda_device.h"

void cuda_ops_install(device *d) {
    cuda_device_state *state = d->impl;
    cuda_check(state->rank, cudaErrorNotSupported, "cuda_ops_install (this build has no kernels: core/cuda/kernels.cu "
               "is missing)", __FILE__, __LINE__);
}
