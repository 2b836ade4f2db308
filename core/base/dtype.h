/* dtype.h — element types: float32 and bfloat16, their sizes, names and conversions, as torch has them.
 *
 *   float32   sign | 8 exponent bits | 23 mantissa bits      4 bytes   torch.float32
 *   bfloat16  sign | 8 exponent bits |  7 mantissa bits      2 bytes   torch.bfloat16  (the top half of a float32)
 *
 * bfloat16 keeps float32's range and 8 significant bits: a value rounded to it is off by at most u = 2^-8 relative
 * (round to nearest even), against float32's 2^-24. Mixed precision (torch's MixedPrecision) stores and moves
 * parameters and gradients in bfloat16 and keeps the optimizer's master copy in float32.
 *
 * The conversions are kernel_math.h's, static inline and callable on the GPU too, so every backend (the CPU loops
 * here, the CUDA kernels) rounds the same bits: float32 -> bfloat16 rounds to nearest, ties to even, and keeps a NaN
 * a (quiet) NaN, as c10::BFloat16's round_to_nearest_even; bfloat16 -> float32 is exact (the 16 bits become the top
 * half).
 */
#ifndef FSDPLAB_DTYPE_H
#define FSDPLAB_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/base/kernel_math.h"

/* DTYPE_FLOAT32 is 0, so a zeroed struct with a dtype field means float32 (every buffer before mixed precision).
 * The integer types only name what memory holds (token ids, file bytes): nothing computes or reduces in them. */
typedef enum dtype { DTYPE_FLOAT32 = 0, DTYPE_BFLOAT16 = 1, DTYPE_INT32 = 2, DTYPE_UINT16 = 3, DTYPE_UINT8 = 4 } dtype;
#define DTYPE_COUNT 5

typedef uint16_t bf16;

/* Bytes per element: 4, 2, 4, 2, 1. */
static inline size_t dtype_size(dtype type) {
    static const size_t sizes[DTYPE_COUNT] = {4, 2, 4, 2, 1};
    return (unsigned)type < DTYPE_COUNT ? sizes[type] : 0;
}
/* "float32", "bfloat16", "int32", "uint16", "uint8": the names torch prints after "torch." */
static inline const char *dtype_name(dtype type) {
    static const char *const names[DTYPE_COUNT] = {"float32", "bfloat16", "int32", "uint16", "uint8"};
    return (unsigned)type < DTYPE_COUNT ? names[type] : "invalid_dtype";
}
/* "float32"/"fp32", "bfloat16"/"bf16" -> the floating type; -1 when unknown (the settings name only these). */
static inline int dtype_from_name(const char *name) {
    if (strcmp(name, "float32") == 0 || strcmp(name, "fp32") == 0) return DTYPE_FLOAT32;
    if (strcmp(name, "bfloat16") == 0 || strcmp(name, "bf16") == 0) return DTYPE_BFLOAT16;
    return -1;
}

static inline uint32_t dtype_float_bits(float value) { return km_float_bits(value); }

/* float32 -> bfloat16, round to nearest even; NaN stays NaN (quiet, sign kept); infinities stay infinite. The bit
 * arithmetic is kernel_math.h's, which the CUDA kernels call too. */
static inline bf16 bf16_from_float(float value) { return km_bf16_from_float(value); }

/* bfloat16 -> float32, exact. */
static inline float bf16_to_float(bf16 value) { return km_bf16_to_float(value); }

/* The float32 nearest to value that bfloat16 can hold: what a round trip through a bfloat16 tensor gives. */
static inline float bf16_round(float value) { return km_bf16_round(value); }

/* bfloat16 sum of two bfloat16 values, as c10::BFloat16's operator+: computed in float32, rounded once. */
static inline bf16 bf16_add(bf16 a, bf16 b) { return bf16_from_float(bf16_to_float(a) + bf16_to_float(b)); }

/* count elements from src (type from) into dst (type to); the same type copies. */
static inline void dtype_convert(void *dst, dtype to, const void *src, dtype from, size_t count) {
    if (to == from) {
        memmove(dst, src, count * dtype_size(to));
    } else if (to == DTYPE_BFLOAT16) {
        const float *in = (const float *)src;
        bf16 *out = (bf16 *)dst;
        for (size_t i = 0; i < count; i++) out[i] = bf16_from_float(in[i]);
    } else {
        const bf16 *in = (const bf16 *)src;
        float *out = (float *)dst;
        for (size_t i = 0; i < count; i++) out[i] = bf16_to_float(in[i]);
    }
}

/* In place: every float32 rounded to the nearest bfloat16 value (a float32 buffer standing for a bfloat16 tensor). */
static inline void dtype_round_to(float *values, size_t count, dtype type) {
    if (type == DTYPE_BFLOAT16)
        for (size_t i = 0; i < count; i++) values[i] = bf16_round(values[i]);
}

#endif
