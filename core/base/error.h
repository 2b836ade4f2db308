/* error.h — how a function that can fail says why: it writes the message into the caller's buffer (usually
 * ctx->error) and returns -1, so the caller decides whether to print it, add to it, or agree on it with the other
 * ranks (core/runtime/world.h). Messages name the rank, the unit and the values:
 * "rank 1: unit layers.3: reduce_scatter of 1032 floats, expected 1024". */
#ifndef FSDPLAB_ERROR_H
#define FSDPLAB_ERROR_H

#include <stddef.h>

/* Writes the message into error (error_size bytes) and returns -1. */
int error_set(char *error, size_t error_size, const char *format, ...) __attribute__((format(printf, 3, 4)));

#endif
