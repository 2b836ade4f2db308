/* hash.h — FNV-1a, the one hash of fsdplab: short keys (a setting's text, a unit's name, a tensor's name), parameter
 * bytes in the labs' "did anything change" checks, and the DCP checkpoint's file checksum.
 *
 * FNV-1a: state = (state ^ next) * prime, from a fixed start. Not cryptographic: it catches accidents (a torn file,
 * ranks given different settings), which is all it is asked to do.
 */
#ifndef FSDPLAB_HASH_H
#define FSDPLAB_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HASH_START 0xcbf29ce484222325ULL /* FNV-1a's 64-bit offset basis (14695981039346656037) */
#define HASH_PRIME 0x100000001b3ULL      /* FNV-1a's 64-bit prime (1099511628211) */

/* Continues `state` over `bytes` bytes, one byte at a time. */
static inline uint64_t hash_bytes(uint64_t state, const void *data, size_t bytes) {
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++) state = (state ^ p[i]) * HASH_PRIME;
    return state;
}

/* The hash of a text (NULL hashes as the empty text). */
static inline uint64_t hash_text(const char *text) {
    return text ? hash_bytes(HASH_START, text, strlen(text)) : HASH_START;
}

/* Continues `state` over the data taken as 8-byte little-endian words (the tail byte by byte): eight times fewer
 * multiplications than hash_bytes, for files of gigabytes (the DCP checksum, core/io/dcp.h). */
static inline uint64_t hash_words(uint64_t state, const void *data, size_t bytes) {
    const unsigned char *p = data;
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t word;
        memcpy(&word, p + 8 * i, 8);
        state = (state ^ word) * HASH_PRIME;
    }
    return hash_bytes(state, p + 8 * words, bytes - 8 * words);
}

#endif
