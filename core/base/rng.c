/* rng.c — counter-based random numbers. See rng.h. */
#include "core/base/rng.h"

#include <math.h>

#include "core/base/hash.h"

uint64_t rng_stream_of(const char *name) { return hash_text(name); }

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

/* The Box-Muller pair k: radius and angle from the uniforms at counters 2k and 2k+1, in double. */
static void normal_pair(uint64_t seed, uint64_t stream, uint64_t pair, double *cosine, double *sine) {
    double u1 = 1.0 - (double)rng_uniform(seed, stream, 2 * pair); /* in (0, 1]: the log is finite */
    double angle = 6.283185307179586 * (double)rng_uniform(seed, stream, 2 * pair + 1);
    double radius = sqrt(-2.0 * log(u1));
    *cosine = radius * cos(angle);
    *sine = radius * sin(angle);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index, float mean, float std) {
    double cosine, sine;
    normal_pair(seed, stream, index / 2, &cosine, &sine);
    return (float)((double)mean + (double)std * (index % 2 ? sine : cosine));
}

void rng_fill_normal(uint64_t seed, uint64_t stream, uint64_t first, size_t count, float mean, float std, float *out) {
    for (size_t i = 0; i < count;) {
        uint64_t index = first + i;
        double cosine, sine;
        normal_pair(seed, stream, index / 2, &cosine, &sine);
        if (index % 2 == 0) out[i++] = (float)((double)mean + (double)std * cosine);
        if (i < count) out[i++] = (float)((double)mean + (double)std * sine); /* index + 1 or an odd start */
    }
}
