/* pickle.c — see pickle.h. Opcode meanings are Python's Lib/pickletools.py. */
#include "pickle.h"

enum {
    OPCODE_PROTO = 0x80,
    OPCODE_STOP = '.',
    OPCODE_MARK = '(',
    OPCODE_EMPTY_DICT = '}',
    OPCODE_SETITEMS = 'u',
    OPCODE_EMPTY_LIST = ']',
    OPCODE_APPENDS = 'e',
    OPCODE_BININT1 = 'K',
    OPCODE_BININT2 = 'M',
    OPCODE_BININT = 'J',
    OPCODE_LONG1 = 0x8a,
    OPCODE_BINUNICODE = 'X',
    OPCODE_NEWTRUE = 0x88,
    OPCODE_NEWFALSE = 0x89,
    OPCODE_NONE = 'N',
};

/* Python batches APPENDS / SETITEMS by 1000 items; so do we, which also keeps the JavaScript unpickler's
 * `push(...items)` far below the engine's limit on arguments. */
enum { BATCH_ITEMS = 1000 };

static void byte_put(pickle_writer *writer, int byte) { fputc(byte, writer->file); }

static void little_endian_put(pickle_writer *writer, uint64_t value, int byte_count) {
    for (int index = 0; index < byte_count; index++) byte_put(writer, (int)((value >> (8 * index)) & 0xff));
}

/* Called after each whole object: a dict's item is a key and a value, so it closes a batch every 2000 objects. */
static void object_done(pickle_writer *writer) {
    if (writer->depth == 0) return;
    int level = writer->depth - 1;
    size_t per_batch = writer->container[level] == 'd' ? 2 * BATCH_ITEMS : BATCH_ITEMS;
    if (++writer->pending[level] < per_batch) return;
    byte_put(writer, writer->container[level] == 'd' ? OPCODE_SETITEMS : OPCODE_APPENDS);
    byte_put(writer, OPCODE_MARK);
    writer->pending[level] = 0;
}

static void container_begin(pickle_writer *writer, char kind, int opcode) {
    if (writer->depth == PICKLE_MAX_DEPTH) {
        writer->misuse = 1;
        return;
    }
    byte_put(writer, opcode);
    byte_put(writer, OPCODE_MARK);
    writer->container[writer->depth] = kind;
    writer->pending[writer->depth] = 0;
    writer->depth++;
}

/* A dict ended after a key without its value would load as a shifted dict: counted as misuse. */
static void container_end(pickle_writer *writer, char kind, int opcode) {
    int level = writer->depth - 1;
    if (level < 0 || writer->container[level] != kind || (kind == 'd' && writer->pending[level] % 2 != 0)) {
        writer->misuse = 1;
        return;
    }
    byte_put(writer, opcode);
    writer->depth--;
    object_done(writer);
}

void pickle_begin(pickle_writer *writer, FILE *file) {
    *writer = (pickle_writer){.file = file};
    byte_put(writer, OPCODE_PROTO);
    byte_put(writer, 2);
}

void pickle_dict_begin(pickle_writer *writer) { container_begin(writer, 'd', OPCODE_EMPTY_DICT); }
void pickle_dict_end(pickle_writer *writer) { container_end(writer, 'd', OPCODE_SETITEMS); }
void pickle_list_begin(pickle_writer *writer) { container_begin(writer, 'l', OPCODE_EMPTY_LIST); }
void pickle_list_end(pickle_writer *writer) { container_end(writer, 'l', OPCODE_APPENDS); }

void pickle_string(pickle_writer *writer, const char *text) {
    size_t length = 0;
    while (text[length] != '\0') length++;
    byte_put(writer, OPCODE_BINUNICODE);
    little_endian_put(writer, (uint64_t)length, 4);
    fwrite(text, 1, length, writer->file);
    object_done(writer);
}

/* LONG1 holds the fewest little-endian two's-complement bytes whose top bit is the sign, as Python writes it. */
static void long1_put(pickle_writer *writer, int64_t value) {
    uint64_t bits = (uint64_t)value;
    int byte_count = 1;
    while (byte_count < 8) {
        int64_t top = value >> (8 * byte_count - 1);  /* all sign bits from the candidate top bit up */
        if (top == 0 || top == -1) break;
        byte_count++;
    }
    byte_put(writer, OPCODE_LONG1);
    byte_put(writer, byte_count);
    little_endian_put(writer, bits, byte_count);
}

void pickle_int(pickle_writer *writer, int64_t value) {
    if (value >= 0 && value < 256) {
        byte_put(writer, OPCODE_BININT1);
        byte_put(writer, (int)value);
    } else if (value >= 0 && value < 65536) {
        byte_put(writer, OPCODE_BININT2);
        little_endian_put(writer, (uint64_t)value, 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
        byte_put(writer, OPCODE_BININT);
        little_endian_put(writer, (uint64_t)(uint32_t)(int32_t)value, 4);
    } else {
        long1_put(writer, value);
    }
    object_done(writer);
}

void pickle_bool(pickle_writer *writer, int value) {
    byte_put(writer, value ? OPCODE_NEWTRUE : OPCODE_NEWFALSE);
    object_done(writer);
}

void pickle_none(pickle_writer *writer) {
    byte_put(writer, OPCODE_NONE);
    object_done(writer);
}

int pickle_end(pickle_writer *writer) {
    byte_put(writer, OPCODE_STOP);
    return writer->depth == 0 && !writer->misuse ? 0 : -1;
}
