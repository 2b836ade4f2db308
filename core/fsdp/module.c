/* module.c — the parts of a model every model shares: numel, and units built from a wrap assignment. See module.h. */
#include "core/fsdp/module.h"
#include "core/runtime/world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t module_param_numel(const module_param *param) {
    size_t numel = 1;
    for (int d = 0; d < param->ndim; d++) numel *= (size_t)param->shape[d];
    return numel;
}

void module_tree_free(module_tree *tree) {
    free(tree->nodes);
    free(tree->params);
    memset(tree, 0, sizeof *tree);
}

/* "root" for unit 0; otherwise the deepest node holding all of the unit's parameters, `strip` removed: "layers.3"
 * for a decoder layer, "layers.3.mlp" for an MLP wrapped alone; "layers.3-5" when only a list holds them all (the
 * numbers are the list's children that own them). */
static void unit_name(const module_tree *tree, const int *unit_of_param, int unit, const char *strip, char *name,
                      size_t size) {
    if (unit == 0) {
        snprintf(name, size, "root");
        return;
    }
    char common[MODULE_NAME_MAX] = "";
    int have = 0;
    for (int p = 0; p < tree->param_count; p++) {
        if (unit_of_param[p] != unit) continue;
        const char *node = tree->nodes[tree->params[p].module].name;
        if (!have) snprintf(common, sizeof common, "%s", node), have = 1;
        size_t length = 0; /* shrink `common` to the longest shared prefix that ends at a '.' boundary */
        while (common[length] && common[length] == node[length]) length++;
        if (common[length] != '\0' || (node[length] != '\0' && node[length] != '.')) {
            while (length > 0 && common[length] != '.') length--;
            common[length] = '\0';
        }
    }
    /* Below a list, the children's indices: "layers" + [3, 5] → "layers.3-5". */
    int first = -1, last = -1;
    size_t common_length = strlen(common);
    for (int p = 0; p < tree->param_count && common_length > 0; p++) {
        if (unit_of_param[p] != unit) continue;
        const char *rest = tree->nodes[tree->params[p].module].name + common_length;
        if (rest[0] != '.' || rest[1] < '0' || rest[1] > '9') continue;
        int child = atoi(rest + 1);
        if (first < 0 || child < first) first = child;
        if (child > last) last = child;
    }
    size_t strip_length = strip ? strlen(strip) : 0;
    const char *shown = strip_length && strncmp(common, strip, strip_length) == 0 ? common + strip_length : common;
    if (first >= 0 && first != last) snprintf(name, size, "%s.%d-%d", shown, first, last);
    else snprintf(name, size, "%s", shown[0] ? shown : "model");
}

void module_units_free(flat_param *units, int unit_count, module_location *locations) {
    for (int unit = 0; units != NULL && unit < unit_count; unit++)
        if (units[unit].ctx != NULL) flat_param_free(&units[unit]);
    free(units);
    free(locations);
}

int module_units_build(context *ctx, const module_tree *tree, const int *unit_of_param, int unit_count, int replicated,
                       const char *strip, flat_param_fill_fn fill, void *fill_user, flat_param **units_out,
                       module_location **locations_out) {
    *units_out = NULL, *locations_out = NULL;
    for (int p = 0; p < tree->param_count; p++) {
        if (unit_of_param[p] < 0 || unit_of_param[p] >= unit_count) {
            snprintf(ctx->error, sizeof ctx->error,
                     "rank %d: parameter '%s' assigned to unit %d, but there are %d units", ctx->rank,
                     tree->params[p].name, unit_of_param[p], unit_count);
            return -1;
        }
    }
    flat_param *units = calloc((size_t)unit_count, sizeof *units);
    module_location *locations = calloc((size_t)tree->param_count, sizeof *locations);
    flat_param_tensor_spec *specs = calloc((size_t)tree->param_count + 1, sizeof *specs);
    if (units == NULL || locations == NULL || specs == NULL) world_fatal(ctx, "out of memory for %d units", unit_count);
    *units_out = units, *locations_out = locations;
    for (int unit = 0; unit < unit_count; unit++) {
        int count = 0;
        for (int p = 0; p < tree->param_count; p++) {
            if (unit_of_param[p] != unit) continue;
            const module_param *param = &tree->params[p];
            specs[count] = (flat_param_tensor_spec){param->name, param->ndim, {0}};
            for (int d = 0; d < param->ndim && d < FLAT_PARAM_MAX_DIMS; d++) specs[count].shape[d] = param->shape[d];
            locations[p] = (module_location){unit, count++};
        }
        char name[64];
        unit_name(tree, unit_of_param, unit, strip, name, sizeof name);
        int status = replicated ? flat_param_init_replicated(&units[unit], ctx, name, specs, count)
                                : flat_param_init(&units[unit], ctx, name, specs, count);
        if (status != 0) {
            free(specs);
            return -1;
        }
        if (fill != NULL) flat_param_fill_local_shard(&units[unit], fill, fill_user);
    }
    free(specs);
    return 0;
}
