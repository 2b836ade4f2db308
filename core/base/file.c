/* file.c — see file.h. */
#define _POSIX_C_SOURCE 200809L
#include "core/base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.h"

int file_make_directories(const char *path) {
    char partial[1024];
    size_t length = strlen(path);
    if (length == 0 || length >= sizeof partial) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(partial, path, length + 1);
    for (size_t i = 1; i <= length; i++) {
        if (partial[i] != '/' && partial[i] != '\0') continue;
        char saved = partial[i];
        partial[i] = '\0';
        if (mkdir(partial, 0755) != 0 && errno != EEXIST) return -1;
        partial[i] = saved;
    }
    struct stat info;
    if (stat(path, &info) != 0) return -1;
    if (!S_ISDIR(info.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int file_sync(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int status = fsync(fd);
    close(fd);
    return status;
}

int file_commit(const char *tmp, const char *path, char *error, size_t error_size) {
    if (file_sync(tmp) != 0) return error_set(error, error_size, "cannot flush %s to disk: %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0)
        return error_set(error, error_size, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    return 0;
}
