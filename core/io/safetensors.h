/* safetensors.h — reading and writing HF's safetensors format (F32 tensors), so checkpoints move between fsdplab
 * and transformers.
 *
 *   [8 bytes: header length N, little-endian u64][N bytes: JSON header][data]
 *   header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
 *
 * Offsets are relative to the start of the data section. On open every entry is validated (dtype, shape against
 * byte length, offsets inside the file, no overlaps or holes) and a bad file is refused with a message naming the
 * tensor and the byte offsets. A tensor can be read whole or as a range of elements, so a rank can load just its
 * shard of a parameter without reading the rest.
 */
#ifndef FSDPLAB_SAFETENSORS_H
#define FSDPLAB_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ST_MAX_DIMS 4
#define ST_NAME_MAX 256

/* A tensor to write: the caller's data. */
typedef struct st_tensor_ref {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data;
} st_tensor_ref;

/* A tensor found in a file. */
typedef struct st_entry {
    char name[ST_NAME_MAX];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    uint64_t begin, end; /* byte offsets in the data section */
} st_entry;

typedef struct st_file {
    FILE *file;
    char path[1024];
    uint64_t data_start; /* 8 + header length */
    int count;
    st_entry *entries;   /* sorted by begin offset */
} st_file;

/* Writes the tensors (in the given order) to path. metadata_format may be NULL; HF writes {"format": "pt"}.
 * Returns 0, or -1 with a message in error. */
int st_write(const char *path, const st_tensor_ref *tensors, int count, const char *metadata_format, char *error,
             size_t error_size);
/* Opens and validates a file. Returns 0, or -1 with a message in error (and nothing to close). */
int st_open(st_file *st, const char *path, char *error, size_t error_size);
/* The entry called name, or NULL. */
const st_entry *st_find(const st_file *st, const char *name);
/* Reads elements [first, first + count) of tensor name into out. Returns 0, or -1 with a message naming the tensor
 * and the range. */
int st_read(const st_file *st, const char *name, size_t first, size_t count, float *out, char *error,
            size_t error_size);
void st_close(st_file *st);

#endif
