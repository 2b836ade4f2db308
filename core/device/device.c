/* device.c — a device's end. See device.h. */
#include "core/device/device.h"

#include <string.h>

void device_destroy(device *d) {
    if (d->destroy != NULL) d->destroy(d);
    memset(d, 0, sizeof *d);
}
