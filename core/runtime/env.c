/* env.c — checked settings from the environment. See env.h. */
#include "core/runtime/env.h"
#include "core/base/hash.h"
#include "core/runtime/world.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "'value'" or "unset", for messages. */
static const char *shown(const char *text, char *out, size_t size) {
    if (text[0] == '\0') snprintf(out, size, "unset");
    else snprintf(out, size, "'%s'", text);
    return out;
}

const char *env_text(context *ctx, const char *name) {
    const char *text = getenv(name);
    const char *mine = text ? text : ""; /* unset and empty both mean the default */
    if (ctx->world_size == 1) return text;
    uint64_t hash = hash_text(mine);
    uint64_t *hashes = malloc(sizeof *hashes * (size_t)ctx->world_size);
    if (hashes == NULL) world_fatal(ctx, "out of memory agreeing on %s", name);
    WORLD_MPI(ctx, MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, ctx->comm));
    int other = -1;
    for (int rank = 1; rank < ctx->world_size && other < 0; rank++)
        if (hashes[rank] != hashes[0]) other = rank;
    free(hashes);
    if (other < 0) return text;
    /* They differ: every rank learns rank 0's and the first other rank's text, so every rank says the same. */
    enum { SHOWN = 120 };
    char texts[2][SHOWN] = {{0}}, first[SHOWN + 8], second[SHOWN + 8];
    if (ctx->rank == 0) snprintf(texts[0], SHOWN, "%s", mine);
    if (ctx->rank == other) snprintf(texts[1], SHOWN, "%s", mine);
    WORLD_MPI(ctx, MPI_Bcast(texts[0], SHOWN, MPI_CHAR, 0, ctx->comm));
    WORLD_MPI(ctx, MPI_Bcast(texts[1], SHOWN, MPI_CHAR, other, ctx->comm));
    world_exit_all(ctx, 2, "%s differs between ranks: rank 0 has %s, rank %d has %s; every rank must be given the same "
                 "settings", name, shown(texts[0], first, sizeof first), other, shown(texts[1], second, sizeof second));
}

long env_int(context *ctx, const char *name, long default_value, long min_value, long max_value) {
    const char *text = env_text(ctx, name);
    if (text == NULL || text[0] == '\0') return default_value;
    errno = 0;
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min_value || value > max_value)
        world_exit_all(ctx, 2, "%s='%s' is not an integer in %ld..%ld", name, text, min_value, max_value);
    return value;
}

double env_real(context *ctx, const char *name, double default_value, double min_value, double max_value) {
    const char *text = env_text(ctx, name);
    if (text == NULL || text[0] == '\0') return default_value;
    char *end = NULL;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= min_value && value <= max_value))
        world_exit_all(ctx, 2, "%s='%s' is not a number in %g..%g", name, text, min_value, max_value);
    return value;
}

const char *env_choice(context *ctx, const char *name, const char *default_value, const char *const *choices) {
    const char *text = env_text(ctx, name);
    if (text == NULL || text[0] == '\0') return default_value;
    for (const char *const *choice = choices; *choice != NULL; choice++)
        if (strcmp(*choice, text) == 0) return *choice;
    char allowed[512] = "";
    for (const char *const *choice = choices; *choice != NULL; choice++) {
        if (choice != choices) strncat(allowed, ", ", sizeof allowed - strlen(allowed) - 1);
        strncat(allowed, *choice, sizeof allowed - strlen(allowed) - 1);
    }
    world_exit_all(ctx, 2, "%s='%s' is not allowed; choose one of: %s", name, text, allowed);
}

uint64_t env_seed(context *ctx) { return (uint64_t)env_int(ctx, "SEED", 1234, 0, 2147483647); }
