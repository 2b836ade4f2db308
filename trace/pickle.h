/* pickle.h — a small writer of Python pickles, protocol 2, for the memory_viz snapshot (snapshot.h).
 *
 * Only what a snapshot holds: dicts, lists, str, int, bool and None, streamed straight to a file in the order
 * written. Containers are begun and ended like brackets; a dict's entries are written key, value, key, value.
 * The opcodes are the ones Python's own pickler uses at protocol 2 (EMPTY_DICT/EMPTY_LIST, MARK ... SETITEMS /
 * APPENDS in batches of 1000, BININT1/BININT2/BININT/LONG1, BINUNICODE, NEWTRUE/NEWFALSE, NONE), which both
 * Python's `pickle` and the JavaScript unpickler of pytorch.org/memory_viz read. Nothing is memoized: a snapshot
 * has no shared objects, and an unmemoized pickle loads the same.
 */
#ifndef FSDPLAB_PICKLE_H
#define FSDPLAB_PICKLE_H

#include <stdint.h>
#include <stdio.h>

enum { PICKLE_MAX_DEPTH = 32 };

typedef struct pickle_writer {
    FILE *file;
    int depth;                            /* open containers */
    char container[PICKLE_MAX_DEPTH];     /* 'd' dict or 'l' list, per open container */
    size_t pending[PICKLE_MAX_DEPTH];     /* objects written since that container's last MARK */
    int misuse;                           /* a container ended that was not open, or nesting too deep */
} pickle_writer;

/* Writes the protocol header. */
void pickle_begin(pickle_writer *writer, FILE *file);
void pickle_dict_begin(pickle_writer *writer);
void pickle_dict_end(pickle_writer *writer);
void pickle_list_begin(pickle_writer *writer);
void pickle_list_end(pickle_writer *writer);
void pickle_string(pickle_writer *writer, const char *text);
void pickle_int(pickle_writer *writer, int64_t value);
void pickle_bool(pickle_writer *writer, int value);
void pickle_none(pickle_writer *writer);

/* Writes STOP. Returns 0, or -1 when containers were left open or misused (the pickle would not load). */
int pickle_end(pickle_writer *writer);

#endif
