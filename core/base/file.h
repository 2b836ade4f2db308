/* file.h — the file system steps every writer of fsdplab shares: making a directory path, and committing a file
 * atomically (write <path>.tmp, flush it to the disk, rename it over <path>), so that a full disk or a kill -9 never
 * leaves a partial file under the real name: a reader sees the old file or the new one. */
#ifndef FSDPLAB_FILE_H
#define FSDPLAB_FILE_H

#include <stddef.h>

/* mkdir -p. Returns 0 or -1 with errno set. */
int file_make_directories(const char *path);
/* Flushes a written file (or a directory's entries: the renames in it) to the disk. 0, or -1 with errno set. */
int file_sync(const char *path);
/* The atomic commit: flushes `tmp` to the disk and renames it to `path`. 0, or -1 with a message in error. */
int file_commit(const char *tmp, const char *path, char *error, size_t error_size);

#endif
