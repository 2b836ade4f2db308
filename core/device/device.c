/* device.c — a device's end. See device.h. */
#include "core/device/device.h"

#include <string.h>

void device_destroy(device *d) {
    if (d->destroy != NULL) d->destroy(d);
    memset(d, 0, sizeof *d);
}

size_t device_attention_forward_scratch_floats(int B, int T, int past, int H, int KVH, int D, int bf16) {
    size_t keys = (size_t)past + T, queries = (size_t)B * T * H * D, key_values = 2 * (size_t)B * keys * KVH * D;
    size_t rounded_probs = bf16 ? (size_t)B * H * T * keys : 0;
    return queries + key_values + rounded_probs;
}

size_t device_attention_backward_scratch_floats(int B, int T, int H, int KVH, int D) {
    size_t queries = (size_t)B * T * H * D, key_values = 2 * (size_t)B * T * KVH * D, dp = (size_t)B * H * T * T;
    size_t batched = 3 * queries + key_values + dp, per_head = 2 * (size_t)T * T + (size_t)T * D; /* the CPU's bf16 */
    return batched > per_head ? batched : per_head;
}
