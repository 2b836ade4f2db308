/* tokenize_tool.c — core/tokenizer from the command line, for the parity check and the benchmark.
 *
 *   tokenize_tool [--vocab PATH] encode [FILE]         text (FILE or stdin) → ids, space-separated, one line
 *   tokenize_tool [--vocab PATH] decode [FILE]         ids as text → the bytes they stand for
 *   tokenize_tool [--vocab PATH] encode-batch [FILE]   records "<byte count>\n<bytes>" → one line of ids each
 *   tokenize_tool [--vocab PATH] decode-batch [FILE]   lines of ids → records "<byte count>\n<bytes>"
 *   tokenize_tool [--vocab PATH] bench FILE SECONDS    encodes FILE whole, again and again for about SECONDS (the
 *                                                      pre-token cache warm after the first, as HF's is), prints
 *                                                      "tokens N bytes N seconds S tokens_per_second R"
 *   tokenize_tool stories COUNT [SEED]                 data_generate_stories' text, to stdout (no vocabulary read)
 *   tokenize_tool [--vocab PATH|bytes] write-tokens TEXT OUT.bin [PIECE_BYTES]
 *                                                      TEXT, a TinyStories text file, tokenized story by story as the
 *                                                      dataset gives them (Qwen2's BPE, or byte ids with --vocab
 *                                                      bytes), <|endoftext|> between stories (data.h:
 *                                                      data_encode_stories), into a token file (core/data/data.h's
 *                                                      format: 2-byte ids when they fit, else 4), with progress on
 *                                                      stderr every PIECE_BYTES of text (default 16 MB); what
 *                                                      scripts/prepare_tinystories.sh runs
 *   tokenize_tool [--vocab PATH|bytes] load-text TEXT IDS
 *                                                      the ids lab 05's loader holds after reading TEXT (DATA=TEXT)
 *                                                      into IDS, on one line (MPI, one rank; OUT: default
 *                                                      runs/tokenize_tool)
 * --vocab defaults to tok_load's default ($QWEN2_TOKENIZER, else data/qwen2/qwen.tiktoken). Exit 0, or 1 with the
 * reason on stderr. */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/data/data.h"
#include "core/data/tokenizer.h"
#include "core/runtime/session.h"
#include "core/runtime/world.h"

static int read_all(const char *path, char **text, size_t *length) {
    FILE *file = path == NULL || strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (file == NULL) {
        perror(path);
        return -1;
    }
    size_t capacity = 1 << 16, used = 0, got;
    char *buffer = malloc(capacity + 1);
    while (buffer != NULL && (got = fread(buffer + used, 1, capacity - used, file)) > 0) {
        used += got;
        if (used == capacity) {
            char *grown = realloc(buffer, 2 * capacity + 1);
            if (grown == NULL) free(buffer);
            buffer = grown, capacity *= 2;
        }
    }
    if (file != stdin) fclose(file);
    if (buffer == NULL) {
        fprintf(stderr, "tokenize_tool: out of memory reading %s\n", path != NULL ? path : "stdin");
        return -1;
    }
    buffer[used] = '\0';
    *text = buffer, *length = used;
    return 0;
}

static void print_ids(const tok_ids *ids) {
    for (size_t i = 0; i < ids->count; i++) printf(i > 0 ? " %d" : "%d", ids->ids[i]);
    putchar('\n');
}

/* Ids in `line` (spaces between) into `ids`; returns -1 on anything that is not an integer. */
static int parse_ids(char *line, tok_ids *ids) {
    ids->count = 0;
    for (char *token = strtok(line, " \t\r\n"); token != NULL; token = strtok(NULL, " \t\r\n")) {
        char *end;
        long id = strtol(token, &end, 10);
        if (*end != '\0' || id < 0 || id > 0x7fffffff) {
            fprintf(stderr, "tokenize_tool: '%s' is not an id\n", token);
            return -1;
        }
        if (ids->count == ids->capacity) {
            ids->capacity = ids->capacity > 0 ? 2 * ids->capacity : 256;
            int *grown = realloc(ids->ids, sizeof *grown * ids->capacity);
            if (grown == NULL) return -1;
            ids->ids = grown;
        }
        ids->ids[ids->count++] = (int)id;
    }
    return 0;
}

static int write_decoded(const tok_tokenizer *t, const tok_ids *ids, int as_record) {
    size_t length = tok_decode(t, ids->ids, ids->count, NULL, 0);
    char *text = malloc(length + 1);
    if (text == NULL) return -1;
    tok_decode(t, ids->ids, ids->count, text, length + 1);
    if (as_record) printf("%zu\n", length);
    fwrite(text, 1, length, stdout);
    free(text);
    return 0;
}

static double now(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return (double)time.tv_sec + 1e-9 * (double)time.tv_nsec;
}

static int run(const char *vocab, const char *command, const char *path, const char *seconds_text) {
    char error[1024];
    char *text;
    size_t length;
    tok_tokenizer t;
    tok_ids ids = {0};
    if (tok_load(&t, vocab, error, sizeof error) != 0) {
        fprintf(stderr, "tokenize_tool: %s\n", error);
        return -1;
    }
    if (read_all(path, &text, &length) != 0) {
        tok_free(&t);
        return -1;
    }
    int status = 0;
    if (strcmp(command, "encode") == 0) {
        if ((status = tok_encode(&t, text, length, &ids, error, sizeof error)) == 0) print_ids(&ids);
    } else if (strcmp(command, "decode") == 0) {
        status = parse_ids(text, &ids) == 0 ? write_decoded(&t, &ids, 0) : -1;
    } else if (strcmp(command, "encode-batch") == 0) {
        for (size_t at = 0; status == 0 && at < length;) {
            char *end;
            size_t record = strtoull(text + at, &end, 10);
            if (*end != '\n' || end == text + at || record > length - (size_t)(end + 1 - text)) {
                fprintf(stderr, "tokenize_tool: a record at byte %zu is not '<byte count>\\n<bytes>'\n", at);
                status = -1;
                break;
            }
            ids.count = 0;
            if ((status = tok_encode(&t, end + 1, record, &ids, error, sizeof error)) == 0) print_ids(&ids);
            at = (size_t)(end + 1 - text) + record;
        }
    } else if (strcmp(command, "decode-batch") == 0) {
        for (char *line = text, *newline; status == 0 && line < text + length; line = newline + 1) {
            if ((newline = strchr(line, '\n')) == NULL) newline = text + length;
            *newline = '\0';
            status = parse_ids(line, &ids) == 0 ? write_decoded(&t, &ids, 1) : -1;
        }
    } else if (strcmp(command, "bench") == 0 && seconds_text != NULL) {
        double seconds = atof(seconds_text), elapsed = 0;
        size_t tokens = 0, bytes = 0;
        while (status == 0 && (elapsed == 0 || elapsed < seconds)) {
            double encode_start = now();
            ids.count = 0;
            status = tok_encode(&t, text, length, &ids, error, sizeof error);
            elapsed += now() - encode_start;
            tokens += ids.count, bytes += length;
        }
        if (status == 0)
            printf("tokens %zu bytes %zu seconds %.3f tokens_per_second %.0f\n", tokens, bytes, elapsed,
                   (double)tokens / elapsed);
    } else {
        fprintf(stderr, "tokenize_tool: unknown command '%s' (encode, decode, encode-batch, decode-batch, bench FILE "
                        "SECONDS)\n", command);
        status = -2;
    }
    if (status == -1 && error[0] != '\0') fprintf(stderr, "tokenize_tool: %s\n", error);
    free(text);
    free(ids.ids);
    tok_free(&t);
    return status;
}

/* write-tokens: the text's stories as the dataset gives them, <|endoftext|> between them (data.h:
 * data_encode_stories, what lab 05's loader does with DATA=<text>), encoded about `piece` bytes of text at a time
 * with progress on stderr. */
static int write_tokens(const char *vocab, const char *text_path, const char *out_path, size_t piece) {
    char error[1024];
    char *text;
    size_t length;
    int bytes = vocab != NULL && strcmp(vocab, "bytes") == 0;
    tok_tokenizer t;
    if (!bytes && tok_load(&t, vocab, error, sizeof error) != 0) {
        fprintf(stderr, "tokenize_tool: %s\n", error);
        return -1;
    }
    if (read_all(text_path, &text, &length) != 0) {
        if (!bytes) tok_free(&t);
        return -1;
    }
    tok_ids ids = {0};
    data_story_reader reader = data_story_reader_of(text, length);
    int more = 1, status = 0, max_id = 0;
    double start = now();
    while (more == 1) {
        more = data_encode_stories(&reader, bytes ? NULL : &t, piece, &ids, error, sizeof error);
        fprintf(stderr, "\rtokenize_tool: %.1f of %.1f MB, %zu stories, %zu tokens, %.1f s", (double)reader.at / 1e6,
                (double)length / 1e6, reader.stories, ids.count, now() - start);
    }
    fprintf(stderr, "\n");
    if (more < 0) status = -1;
    data_story_reader_free(&reader);
    for (size_t i = 0; i < ids.count; i++) max_id = ids.ids[i] > max_id ? ids.ids[i] : max_id;
    int width = max_id > 65535 ? 4 : 2;
    if (status == 0) status = data_write_tokens(out_path, ids.ids, ids.count, width, error, sizeof error);
    if (status == 0)
        printf("%s: %zu tokens of %d bytes (largest id %d) from %s: %zu stories (%s)\n", out_path, ids.count, width,
               max_id, text_path, reader.stories, bytes ? "byte ids" : t.source);
    else
        fprintf(stderr, "tokenize_tool: %s: %s\n", text_path, error);
    free(text);
    free(ids.ids);
    if (!bytes) tok_free(&t);
    return status;
}

/* load-text: the stream lab 05's loader holds after reading TEXT (data_loader_open_tokenized at world size 1, the
 * loader every rank runs), into IDS as ids on one line. A session of its own (MPI, OUT: default runs/tokenize_tool). */
static int load_text(int *argc, char ***argv, const char *vocab, const char *text_path, const char *ids_path) {
    context ctx;
    session_open(&ctx, argc, argv, "tokenize_tool", "runs/tokenize_tool");
    world_require_size(&ctx, 1, 1);
    char error[1024];
    tok_tokenizer t, *tokenizer = NULL;
    int status = 0;
    if (vocab == NULL || strcmp(vocab, "bytes") != 0) {
        if (tok_load(&t, vocab, error, sizeof error) != 0) {
            fprintf(stderr, "tokenize_tool: %s\n", error);
            status = -1;
        } else {
            tokenizer = &t;
        }
    }
    data_loader loader;
    if (status == 0 && data_loader_open_tokenized(&loader, &ctx, text_path, tokenizer,
                                                  tokenizer != NULL ? tok_vocab_size(tokenizer) : 260, 1, 1, 0, 0)
                           != 0) {
        fprintf(stderr, "tokenize_tool: %s\n", ctx.error);
        status = -1;
    }
    if (status == 0) {
        FILE *out = fopen(ids_path, "w");
        int ok = out != NULL;
        for (size_t i = 0; ok && i < loader.token_count; i++)
            ok = fprintf(out, i > 0 ? " %u" : "%u", data_token(&loader, i)) > 0;
        if (out != NULL && (fputc('\n', out) == EOF || fclose(out) != 0)) ok = 0;
        if (!ok) fprintf(stderr, "tokenize_tool: cannot write %s: %s\n", ids_path, strerror(errno));
        else printf("%s: %zu ids of %s\n", ids_path, loader.token_count, loader.source);
        status = ok ? 0 : -1;
        data_loader_close(&loader);
    }
    if (tokenizer != NULL) tok_free(tokenizer);
    int closed = session_close(&ctx);
    return status != 0 ? status : closed;
}

int main(int argc, char **argv) {
    const char *vocab = NULL;
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--vocab") == 0) vocab = argv[2], first = 3;
    if (argc > first + 1 && strcmp(argv[first], "stories") == 0) {
        int count = atoi(argv[first + 1]);
        uint64_t seed = argc > first + 2 ? strtoull(argv[first + 2], NULL, 10) : 0;
        size_t length = data_generate_stories(seed, count, NULL, 0);
        char *text = malloc(length + 1);
        if (count <= 0 || text == NULL) {
            fprintf(stderr, "tokenize_tool: stories COUNT: a count above 0 (got '%s')\n", argv[first + 1]);
            free(text);
            return 1;
        }
        data_generate_stories(seed, count, text, length + 1);
        fwrite(text, 1, length, stdout);
        free(text);
        return 0;
    }
    if ((argc == first + 3 || argc == first + 4) && strcmp(argv[first], "write-tokens") == 0) {
        /* PIECE_BYTES (default 16 MB): how much text to encode between two progress lines */
        char *end = NULL;
        unsigned long long piece = argc == first + 4 ? strtoull(argv[first + 3], &end, 10) : 16ull << 20;
        if (piece == 0 || (end != NULL && *end != '\0')) {
            fprintf(stderr, "tokenize_tool: write-tokens PIECE_BYTES '%s' is not a count of bytes above 0\n",
                    argv[first + 3]);
            return 1;
        }
        return write_tokens(vocab, argv[first + 1], argv[first + 2], (size_t)piece) == 0 ? 0 : 1;
    }
    if (argc == first + 3 && strcmp(argv[first], "load-text") == 0)
        return load_text(&argc, &argv, vocab, argv[first + 1], argv[first + 2]) == 0 ? 0 : 1;
    if (argc <= first) {
        fprintf(stderr, "usage: tokenize_tool [--vocab PATH] encode|decode|encode-batch|decode-batch [FILE] | "
                        "bench FILE SECONDS\n");
        return 1;
    }
    return run(vocab, argv[first], argc > first + 1 ? argv[first + 1] : NULL, argc > first + 2 ? argv[first + 2] : NULL)
                   == 0
               ? 0
               : 1;
}
