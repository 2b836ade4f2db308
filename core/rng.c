/* rng.c — counter-based random numbers. See rng.h. */
#include "rng.h"

#include <math.h>

uint64_t rng_stream_of(const char *name) {
    uint64_t hash = 14695981039346656037ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) hash = (hash ^ *c) * 1099511628211ull;
    return hash;
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index) { return mix(mix(mix(seed) ^ stream) ^ index); }

float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (float)(rng_bits(seed, stream, index) >> 40) * (1.0f / 16777216.0f);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index, float mean, float std) {
    /* 1 - u lies in (0, 1], so the log is finite. Computed in double, then rounded once. */
    double u1 = 1.0 - (double)rng_uniform(seed, stream, 2 * index);
    double u2 = (double)rng_uniform(seed, stream, 2 * index + 1);
    double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    return (float)((double)mean + (double)std * z);
}
