/* env.h — settings from the environment, checked: a bad value stops every rank with a message that names the
 * variable, the value and what is allowed (`SEED='x' is not an integer in 0..2147483647`).
 *
 * Every function here is collective: the ranks first agree that each was given the same text (a hash compared,
 * then the texts when they differ), since mpirun may hand ranks different environments (an MPMD launch, a wrapper
 * script); a disagreement stops every rank naming the setting, two ranks and their values, instead of one rank
 * failing alone while the others wait in a collective. Then every rank reaches the same verdict on the value and
 * exits together; only rank 0 prints. Call them in the same order on every rank.
 */
#ifndef FSDPLAB_ENV_H
#define FSDPLAB_ENV_H

#include "core/runtime/context.h"

/* The text of variable `name` (NULL when unset), once every rank has the same (unset and empty count as equal). */
const char *env_text(context *ctx, const char *name);
/* The integer in variable `name`, or default_value when unset or empty; must lie in [min_value, max_value]. */
long env_int(context *ctx, const char *name, long default_value, long min_value, long max_value);
/* The real number in variable `name` (strtod syntax), or default_value; must lie in [min_value, max_value]. */
double env_real(context *ctx, const char *name, double default_value, double min_value, double max_value);
/* SEED, the one seed every lab's values come from (default 1234). */
uint64_t env_seed(context *ctx);
/* The value of `name`, which must be one of the NULL-terminated `choices`; default_value when unset or empty. */
const char *env_choice(context *ctx, const char *name, const char *default_value, const char *const *choices);

#endif
