/* config.c — checked settings from the environment. See config.h. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

long cfg_env_int(context *ctx, const char *name, long default_value, long min_value, long max_value) {
    const char *text = getenv(name);
    if (text == NULL || text[0] == '\0') return default_value;
    errno = 0;
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min_value || value > max_value)
        ctx_exit_all(ctx, 2, "%s='%s' is not an integer in %ld..%ld", name, text, min_value, max_value);
    return value;
}

double cfg_env_real(context *ctx, const char *name, double default_value, double min_value, double max_value) {
    const char *text = getenv(name);
    if (text == NULL || text[0] == '\0') return default_value;
    char *end = NULL;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= min_value && value <= max_value))
        ctx_exit_all(ctx, 2, "%s='%s' is not a number in %g..%g", name, text, min_value, max_value);
    return value;
}

const char *cfg_env_choice(context *ctx, const char *name, const char *default_value, const char *const *choices) {
    const char *text = getenv(name);
    if (text == NULL || text[0] == '\0') return default_value;
    for (const char *const *choice = choices; *choice != NULL; choice++)
        if (strcmp(*choice, text) == 0) return *choice;
    char allowed[512] = "";
    for (const char *const *choice = choices; *choice != NULL; choice++) {
        if (choice != choices) strncat(allowed, ", ", sizeof allowed - strlen(allowed) - 1);
        strncat(allowed, *choice, sizeof allowed - strlen(allowed) - 1);
    }
    ctx_exit_all(ctx, 2, "%s='%s' is not allowed; choose one of: %s", name, text, allowed);
}

uint64_t cfg_env_seed(context *ctx) { return (uint64_t)cfg_env_int(ctx, "SEED", 1234, 0, 2147483647); }
