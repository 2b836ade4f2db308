/* rng.h — a counter-based random number generator: a value depends only on (seed, stream, index).
 *
 * No state, no order: rank 3 can make element 1,000,000 of a parameter without making the 999,999 before it, so
 * any rank builds any shard alone, and the same seed gives the same weights at any world size
 * (docs/architecture.md §5). The stream is usually rng_stream_of(parameter name). Mixing is SplitMix64's finaliser,
 * applied three times.
 */
#ifndef FSDPLAB_RNG_H
#define FSDPLAB_RNG_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a of a name: the stream of a named tensor. */
uint64_t rng_stream_of(const char *name);
uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1), 24 random bits (exactly representable as float). */
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Normal(mean, std) by Box-Muller: elements 2k and 2k+1 are the cosine and sine halves of the pair made from the
 * uniforms at counters 2k and 2k+1, so a fill computes one logarithm per two values. */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index, float mean, float std);
/* out[i] = rng_normal(seed, stream, first + i, mean, std) for i < count, twice as fast as one by one. */
void rng_fill_normal(uint64_t seed, uint64_t stream, uint64_t first, size_t count, float mean, float std, float *out);

#endif
