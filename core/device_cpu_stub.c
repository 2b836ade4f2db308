/* device_cpu_stub.c — STAND-IN for core/device_cpu.c until that file lands (the Makefile builds this file only when
 * core/device_cpu.c is absent): the CPU device's memory functions and segments, no layer functions (nothing on this
 * branch calls them yet). Delete it once core/device_cpu.c is in the tree. */
#include "device.h"

#include <string.h>

static void stub_zero(device *d, void *ptr, size_t bytes) {
    (void)d;
    memset(ptr, 0, bytes);
}

static void stub_copy(device *d, void *dst, const void *src, size_t bytes, device_copy_kind kind) {
    (void)d, (void)kind;
    memcpy(dst, src, bytes);
}

static void stub_synchronize(device *d) { (void)d; }

void device_cpu_init(device *d) {
    memset(d, 0, sizeof *d);
    d->name = "cpu";
    d->kind = DEVICE_CPU;
    d->segments = allocator_host_backend;
    d->host_segments = allocator_host_backend;
    d->zero = stub_zero;
    d->copy = stub_copy;
    d->synchronize = stub_synchronize;
}
