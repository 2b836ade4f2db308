/* device_select.c — which compute devices this build has, and a device's end. See device.h.
 *
 * The CPU build (`make`) has the CPU device only: asked for the CUDA device it says how to get one. The CUDA build
 * (`make CUDA=1`, FSDPLAB_CUDA defined) has both, and core/cuda/cuda_device.c makes the CUDA one. */
#include "device.h"

#include <stdio.h>
#include <string.h>

#ifdef FSDPLAB_CUDA
#include "cuda/cuda_device.h"

int device_cuda_available(void) { return 1; }
#else
int device_cuda_available(void) { return 0; }

int device_cuda_init(device *d, int local_rank, int local_size, char *error, size_t error_size) {
    (void)local_rank, (void)local_size;
    memset(d, 0, sizeof *d);
    snprintf(error, error_size, "this build has no CUDA device: build with make CUDA=1");
    return -1;
}
#endif

void device_destroy(device *d) {
#ifdef FSDPLAB_CUDA
    if (d->kind == DEVICE_CUDA) cuda_device_destroy(d);
#endif
    memset(d, 0, sizeof *d);
}
