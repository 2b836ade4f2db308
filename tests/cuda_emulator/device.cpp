/* device.cpp — the CUDA emulator's stand-in for core/cuda/cuda_device.c: a "GPU" whose memory is host memory,
 * whose copies are memmove, with a reduction scratch, and cuda_ops_install's table (the real one). */
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "../../core/device.h"
}
#include "../../core/cuda/cuda_device.h"

extern "C" {
void cuda_check(int rank, cudaError_t status, const char *call, const char *file, int line) {
    if (status == cudaSuccess) return;
    fprintf(stderr, "rank %d: %s:%d: %s failed (%d)\n", rank, file, line, call, status);
    abort();
}
void cublas_check(int rank, cublasStatus_t status, const char *call, const char *file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "rank %d: %s:%d: %s failed (cuBLAS status %d)\n", rank, file, line, call, status);
    abort();
}

static void *segment_alloc(void *, size_t bytes) { return malloc(bytes); }
static void segment_free(void *, void *ptr, size_t) { free(ptr); }
static void copy(device *, void *dst, const void *src, size_t bytes, device_copy_kind) { memmove(dst, src, bytes); }
static void zero(device *, void *ptr, size_t bytes) { memset(ptr, 0, bytes); }
static void synchronize(device *) {}

int device_cuda_available(void) { return 1; }

int device_cuda_init(device *d, int local_rank, int local_size, char *error, size_t error_size) {
    (void)local_rank, (void)local_size, (void)error, (void)error_size;
    cuda_device_state *s = (cuda_device_state *)calloc(1, sizeof *s);
    s->scratch_bytes = 1 << 16;
    s->scratch = malloc(s->scratch_bytes);
    s->host_scratch = malloc(s->scratch_bytes);
    memset(d, 0, sizeof *d);
    d->name = "cuda (emulated on the CPU)";
    d->kind = DEVICE_CUDA;
    d->impl = s;
    d->segments.name = "emulated GPU memory";
    d->segments.segment_alloc = segment_alloc;
    d->segments.segment_free = segment_free;
    d->zero = zero;
    d->copy = copy;
    d->synchronize = synchronize;
    cuda_ops_install(d);
    return 0;
}

void device_destroy(device *d) {
    cuda_device_state *s = (cuda_device_state *)d->impl;
    if (s == NULL) return;
    free(s->scratch);
    free(s->host_scratch);
    free(s);
    d->impl = NULL;
}
}
