/* plugins_none.c — the CPU build's list of plug-ins: none (core/runtime/plugin.h). `make CUDA=1` links
 * core/cuda/plugin.c instead, whose list holds the CUDA device. */
#include "core/runtime/plugin.h"

const plugin *const plugins_linked[] = {NULL};
