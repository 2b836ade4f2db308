/* test_data.c — the data side: byte tokenizer round trip, the built-in stories (deterministic, printable, separated),
 * the text and .bin loaders agreeing, token files with a header at 2 and 4 bytes an id and the old headerless ones,
 * their writer and their refusals, targets one token ahead, the global batch independent of the world size
 * (gathered from every rank and compared with a hand-computed table), shuffling that keeps it, and refusals that
 * name the path and the values. Runs at any world size; the hand-computed tables need it to divide 4. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/data/data.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

/* Token buffers come from the tracked allocator like every other buffer that holds tokens. */
static int *token_buffer(size_t count, const char *owner) {
    return mem_alloc(&ctx.mem, (count > 0 ? count : 1) * sizeof(int), MEM_DATA, owner);
}

/* A file name of this rank's own, so ranks never write each other's files. */
static void temp_path(char *path, size_t size, const char *name) {
    snprintf(path, size, "/tmp/fsdplab_test_data_%ld_%d_%s", (long)getpid(), ctx.rank, name);
}

static void write_file(const char *path, const void *bytes, size_t size) {
    FILE *file = fopen(path, "wb");
    ck_assert_msg(file != NULL, "rank %d: cannot create %s", ctx.rank, path);
    ck_assert_uint_eq(fwrite(bytes, 1, size, file), size);
    ck_assert_int_eq(fclose(file), 0);
}

/* ids as a raw little-endian uint16 file, the .bin format. */
static void write_bin(const char *path, const int *tokens, size_t count) {
    unsigned char *bytes = mem_alloc(&ctx.mem, 2 * count + 1, MEM_DATA, "test.bin_bytes");
    for (size_t i = 0; i < count; i++) {
        bytes[2 * i] = (unsigned char)(tokens[i] & 0xff);
        bytes[2 * i + 1] = (unsigned char)(tokens[i] >> 8);
    }
    write_file(path, bytes, 2 * count);
    mem_free(&ctx.mem, bytes);
}

static char *generate(uint64_t seed, int count, size_t *length) {
    *length = data_generate_stories(seed, count, NULL, 0);
    char *text = mem_alloc(&ctx.mem, *length + 1, MEM_DATA, "test.stories");
    ck_assert_uint_eq(data_generate_stories(seed, count, text, *length + 1), *length);
    return text;
}

static size_t count_of(const char *text, const char *needle) {
    size_t count = 0;
    for (const char *at = strstr(text, needle); at != NULL; at = strstr(at + 1, needle)) count++;
    return count;
}

START_TEST(test_tokenizer_round_trip) {
    /* Bytes of every kind, UTF-8 included, the marker at both ends, and near-misses that must stay plain bytes. */
    const char *text = "<|endoftext|>Once upon a time, caf\xc3\xa9.\n<|endoftext|><|endoftext|> <|endoftext| "
                       "<|end <<|endoftext|>>\t~<|endoftext|>";
    size_t length = strlen(text);
    int *tokens = token_buffer(length, "test.tokens");
    size_t count = data_encode(text, length, tokens);
    size_t markers = count_of(text, DATA_EOT_TEXT), eot_seen = 0;
    ck_assert_uint_eq(markers, 5);
    ck_assert_uint_eq(count, length - markers * (sizeof DATA_EOT_TEXT - 2));
    for (size_t i = 0; i < count; i++) {
        ck_assert_int_ge(tokens[i], 0);
        ck_assert_int_le(tokens[i], DATA_EOT);
        eot_seen += tokens[i] == DATA_EOT;
    }
    ck_assert_uint_eq(eot_seen, markers);
    ck_assert_int_eq(tokens[0], DATA_EOT);
    ck_assert_int_eq(tokens[1], 'O');
    ck_assert_int_eq(tokens[count - 1], DATA_EOT);
    ck_assert_int_eq(tokens[count - 2], '~');
    /* the two bytes of "é" are ids 195 and 169, not negative chars */
    const char *accent = strstr(text, "\xc3\xa9");
    ck_assert_int_eq(tokens[accent - text - 12], 0xc3);
    ck_assert_int_eq(tokens[accent - text - 11], 0xa9);

    char decoded[256];
    ck_assert_uint_eq(data_decode(tokens, count, decoded, sizeof decoded), length);
    ck_assert_str_eq(decoded, text);
    /* snprintf's contract: cut to the buffer, still NUL-terminated, the full length returned */
    char small[8];
    ck_assert_uint_eq(data_decode(tokens, count, small, sizeof small), length);
    ck_assert_str_eq(small, "<|endof");
    /* an id that is neither a byte nor the marker is shown, never dropped */
    int odd[] = {'a', 257, 'b', -3};
    ck_assert_uint_eq(data_decode(odd, 4, decoded, sizeof decoded), strlen("a<|token 257|>b<|token -3|>"));
    ck_assert_str_eq(decoded, "a<|token 257|>b<|token -3|>");
    mem_free(&ctx.mem, tokens);
}
END_TEST

START_TEST(test_stories_are_deterministic_printable_and_separated) {
    size_t length = 0, again_length = 0, other_length = 0, fewer_length = 0;
    char *text = generate(1234, 50, &length);
    char *again = generate(1234, 50, &again_length);
    char *other = generate(1235, 50, &other_length);
    char *fewer = generate(1234, 20, &fewer_length);
    ck_assert_uint_eq(length, again_length);
    ck_assert_msg(memcmp(text, again, length) == 0, "same seed, different text");
    ck_assert_msg(length != other_length || memcmp(text, other, length) != 0, "seeds 1234 and 1235 gave the same text");
    /* story i depends on (seed, i) only: fewer stories are a prefix of more */
    ck_assert_uint_lt(fewer_length, length);
    ck_assert_msg(memcmp(text, fewer, fewer_length) == 0, "20 stories are not a prefix of 50");
    ck_assert_uint_eq(count_of(text, DATA_EOT_TEXT), 50);
    ck_assert_uint_eq(count_of(text, "\n" DATA_EOT_TEXT "\n"), 50);
    ck_assert_msg(strstr(text, "{") == NULL, "a placeholder was left in: %s", strstr(text, "{"));
    for (size_t i = 0; i < length; i++)
        ck_assert_msg(text[i] == '\n' || (text[i] >= 0x20 && text[i] <= 0x7e), "byte %zu is 0x%02x", i,
                      (unsigned char)text[i]);
    /* a story is a few sentences, not a line and not a page */
    ck_assert_uint_gt(length / 50, 200);
    ck_assert_uint_lt(length / 50, 1500);
    /* a short buffer gets the same beginning */
    char start[100];
    ck_assert_uint_eq(data_generate_stories(1234, 50, start, sizeof start), length);
    ck_assert_msg(strlen(start) == sizeof start - 1 && memcmp(start, text, sizeof start - 1) == 0, "cut text differs");
    mem_free(&ctx.mem, fewer);
    mem_free(&ctx.mem, other);
    mem_free(&ctx.mem, again);
    mem_free(&ctx.mem, text);
}
END_TEST

/* Two loaders of the same stream and settings hand out the same `batches` batches. */
static void expect_same_batches(data_loader *a, data_loader *b, int batches) {
    size_t count = (size_t)a->micro_batch * a->seq_len;
    int *tokens_a = token_buffer(count, "test.batch"), *targets_a = token_buffer(count, "test.batch");
    int *tokens_b = token_buffer(count, "test.batch"), *targets_b = token_buffer(count, "test.batch");
    for (int batch = 0; batch < batches; batch++) {
        data_next_batch(a, tokens_a, targets_a);
        data_next_batch(b, tokens_b, targets_b);
        ck_assert_msg(memcmp(tokens_a, tokens_b, count * sizeof(int)) == 0, "batch %d tokens differ", batch);
        ck_assert_msg(memcmp(targets_a, targets_b, count * sizeof(int)) == 0, "batch %d targets differ", batch);
    }
    mem_free(&ctx.mem, tokens_a);
    mem_free(&ctx.mem, targets_a);
    mem_free(&ctx.mem, tokens_b);
    mem_free(&ctx.mem, targets_b);
}

/* Text through a BPE tokenizer (tests/data/tiny_ranks.tiktoken: the 256 bytes and "Hi" at 256, so the three
 * specials take 257-259): the stream holds exactly tok_encode's ids of each story alone, <|endoftext|> as one
 * special id between them, and the source says which tokenizer read it. A vocabulary smaller than the tokenizer's
 * ids is refused naming the id. */
START_TEST(test_text_through_a_bpe_tokenizer) {
    tok_tokenizer tokenizer;
    char error[512], path[256];
    ck_assert_msg(tok_load(&tokenizer, "tests/data/tiny_ranks.tiktoken", error, sizeof error) == 0, "%s", error);
    ck_assert_int_eq(tok_vocab_size(&tokenizer), 260);
    const char *text = "Hi. Hi!\n<|endoftext|>\nHi Hi Hi, said the cat.", *first = "Hi. Hi!";
    const char *second = "Hi Hi Hi, said the cat.";
    temp_path(path, sizeof path, "bpe.txt");
    write_file(path, text, strlen(text));
    tok_ids expected = {0};
    ck_assert_msg(tok_encode(&tokenizer, first, strlen(first), &expected, error, sizeof error) == 0, "%s", error);
    ck_assert_uint_lt(expected.count, expected.capacity); /* tok_encode left room: its capacity grows by doubling */
    expected.ids[expected.count++] = 257;
    ck_assert_msg(tok_encode(&tokenizer, second, strlen(second), &expected, error, sizeof error) == 0, "%s", error);
    data_loader loader;
    ck_assert_msg(data_loader_open_tokenized(&loader, &ctx, path, &tokenizer, 260, 1, 4, 1, 0) == 0, "%s", ctx.error);
    ck_assert_uint_eq(loader.token_count, expected.count);
    ck_assert_uint_lt(expected.count, strlen(text)); /* "Hi" merged: fewer ids than bytes */
    int saw_hi = 0, saw_eot = 0;
    for (size_t i = 0; i < expected.count; i++) {
        ck_assert_uint_eq(data_token(&loader, i), (uint32_t)expected.ids[i]);
        saw_hi += expected.ids[i] == 256, saw_eot += expected.ids[i] == 257;
    }
    ck_assert_int_eq(saw_hi, 5);
    ck_assert_int_eq(saw_eot, 1);
    ck_assert_msg(strstr(loader.source, "Qwen2 tokenizer") != NULL, "source: %s", loader.source);
    data_loader_close(&loader);
    ck_assert_int_eq(data_loader_open_tokenized(&loader, &ctx, path, &tokenizer, 257, 1, 4, 1, 0), -1);
    ck_assert_msg(strstr(ctx.error, "token id 257 at position") != NULL, "%s", ctx.error);
    tok_ids_free(&expected);
    tok_free(&tokenizer);
    remove(path);
}
END_TEST

/* The stories of a TinyStories text file as the dataset's loader (Python) gives them: universal newlines, split at
 * every <|endoftext|>, str.strip()'s whitespace (Unicode's too) removed, empty pieces dropped, inner newlines kept;
 * a sequence Python could not decode is never stripped. Then the loader's stream: the stories' bytes, DATA_EOT
 * between them, none at either end. (tests/check_stories.py checks the same against HF tokenizers with Qwen2's
 * vocabulary, and against Python's own strip.) */
START_TEST(test_stories_as_the_dataset_gives_them) {
    const char text[] =
        " Spot. Spot saw.\n<|endoftext|>\n"                    /* the file's first story starts with a space */
        "Tom ran.\n\n\nHe fell.\n \n\tThe end.\n\n<|endoftext|>" /* inner blank lines and a tab kept */
        "\r\nAnna jumped.\r\n\r\nThe end.\r\n<|endoftext|>\n"    /* CRLF: "\n" inside */
        "Old Mac.\rA cow.\r<|endoftext|>"                        /* a lone CR: "\n" */
        "\xc2\xa0\xe3\x80\x80Mia.\xe2\x80\x83\xc2\x85\x1c \n<|endoftext|>" /* NBSP, U+3000, U+2003, NEL, FS */
        "\n<|endoftext|>  \t\n<|endoftext|><|endoftext|>"        /* empty and blank pieces: no story */
        "End.<|endoftext|>Start.\n"                              /* a separator inside a line */
        "<|endoftext|>\xff \xe3\x80";                             /* bytes Python could not decode stay */
    const char *const stories[] = {"Spot. Spot saw.", "Tom ran.\n\n\nHe fell.\n \n\tThe end.",
                                   "Anna jumped.\n\nThe end.", "Old Mac.\nA cow.", "Mia.", "End.", "Start.",
                                   "\xff \xe3\x80"};
    size_t count = sizeof stories / sizeof stories[0], story_length = 0, total = 0;
    data_story_reader reader = data_story_reader_of(text, sizeof text - 1);
    for (size_t i = 0; i < count; i++) {
        const char *story = data_story_next(&reader, &story_length);
        ck_assert_msg(story != NULL, "story %zu missing", i);
        ck_assert_msg(story_length == strlen(stories[i]) && memcmp(story, stories[i], story_length) == 0,
                      "story %zu: '%.*s', want '%s'", i, (int)story_length, story, stories[i]);
        ck_assert_uint_eq(reader.stories, i + 1);
        total += story_length;
    }
    ck_assert_ptr_null(data_story_next(&reader, &story_length));
    ck_assert_int_eq(reader.out_of_memory, 0);
    data_story_reader_free(&reader);

    /* data_encode_stories: the bytes, DATA_EOT between; with a budget of 1 byte, one story a call */
    tok_ids ids = {0};
    reader = data_story_reader_of(text, sizeof text - 1);
    int calls = 0, more;
    while ((more = data_encode_stories(&reader, NULL, 1, &ids, ctx.error, sizeof ctx.error)) == 1) calls++;
    ck_assert_int_eq(more, 0);
    ck_assert_int_ge(calls, (int)count - 1);
    ck_assert_uint_eq(ids.count, total + count - 1);
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        if (i > 0) ck_assert_int_eq(ids.ids[at++], DATA_EOT);
        for (const char *c = stories[i]; *c; c++) ck_assert_int_eq(ids.ids[at++], (unsigned char)*c);
    }
    data_story_reader_free(&reader);

    /* the loader (DATA=<text>) holds exactly that stream */
    char path[256];
    temp_path(path, sizeof path, "dataset.txt");
    write_file(path, text, sizeof text - 1);
    data_loader loader;
    ck_assert_msg(data_loader_open(&loader, &ctx, path, 260, 1, 4, 1, 0) == 0, "%s", ctx.error);
    ck_assert_uint_eq(loader.token_count, ids.count);
    for (size_t i = 0; i < ids.count; i++) ck_assert_uint_eq(data_token(&loader, i), (uint32_t)ids.ids[i]);
    data_loader_close(&loader);
    tok_ids_free(&ids);

    /* text with no separator is one story; nothing but whitespace and separators is none */
    const char *one = "\n  One story.\n\n", *none = " \n<|endoftext|>\r\n";
    reader = data_story_reader_of(one, strlen(one));
    ck_assert_ptr_nonnull(data_story_next(&reader, &story_length));
    ck_assert_uint_eq(story_length, 10);
    ck_assert_ptr_null(data_story_next(&reader, &story_length));
    reader = data_story_reader_of(none, strlen(none));
    ck_assert_ptr_null(data_story_next(&reader, &story_length));
    ck_assert_uint_eq(reader.stories, 0);
    data_story_reader_free(&reader);
    remove(path);
}
END_TEST

START_TEST(test_text_and_bin_loaders_agree) {
    size_t data_before = ctx.mem.category_live_bytes[MEM_DATA];
    size_t length = 0;
    char *text = generate(77, 60, &length);
    int *stream = token_buffer(length, "test.stream");
    size_t raw = data_encode(text, length, stream), count = 0;
    /* read as a text file, the stories as the dataset gives them: each "\n<|endoftext|>\n" becomes DATA_EOT alone,
     * the last one goes (the generated stories hold no other whitespace at their edges) */
    for (size_t i = 0; i < raw; i++) {
        int separator_newline = stream[i] == '\n' && ((i + 1 < raw && stream[i + 1] == DATA_EOT) ||
                                                      (i > 0 && stream[i - 1] == DATA_EOT));
        if (!separator_newline && !(stream[i] == DATA_EOT && i + 2 == raw)) stream[count++] = stream[i];
    }
    ck_assert_uint_eq(count, raw - 3 * 60 + 59);
    char text_path[256], bin_path[256];
    temp_path(text_path, sizeof text_path, "stories.txt");
    temp_path(bin_path, sizeof bin_path, "stories.bin");
    write_file(text_path, text, length);
    write_bin(bin_path, stream, count);

    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        data_loader from_text, from_bin;
        ck_assert_msg(data_loader_open(&from_text, &ctx, text_path, 260, 2, 32, 5, shuffle) == 0, "%s", ctx.error);
        ck_assert_msg(data_loader_open(&from_bin, &ctx, bin_path, 260, 2, 32, 5, shuffle) == 0, "%s", ctx.error);
        ck_assert_uint_eq(from_text.token_count, count);
        ck_assert_uint_eq(from_bin.token_count, count);
        for (size_t i = 0; i < count; i++) {
            ck_assert_int_eq((int)data_token(&from_text, i), stream[i]);
            ck_assert_int_eq((int)data_token(&from_bin, i), stream[i]);
        }
        /* the stream is held once, as uint16, under its owner */
        const mem_block *block = mem_find(&ctx.mem, from_bin.tokens);
        ck_assert_ptr_nonnull(block);
        ck_assert_str_eq(block->owner, "data.tokens");
        ck_assert_int_eq(block->category, MEM_DATA);
        ck_assert_uint_eq(block->bytes, count * sizeof(uint16_t));

        expect_same_batches(&from_text, &from_bin, 40);
        data_loader_close(&from_text);
        data_loader_close(&from_bin);
    }
    remove(text_path);
    remove(bin_path);
    mem_free(&ctx.mem, stream);
    mem_free(&ctx.mem, text);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], data_before);
}
END_TEST

/* The default data: targets are each window's next tokens, windows are where the formula says, for every rank. */
START_TEST(test_default_stories_and_targets_one_ahead) {
    size_t data_before = ctx.mem.category_live_bytes[MEM_DATA];
    const int micro_batch = 3, T = 64;
    data_loader loader;
    ck_assert_msg(data_loader_open(&loader, &ctx, NULL, 260, micro_batch, T, 1234, 0) == 0, "%s", ctx.error);
    ck_assert_msg(strstr(loader.source, "generated stories") != NULL, "%s", loader.source);
    /* DATA_DEFAULT_STORIES is meant to make about 2 MB */
    ck_assert_uint_gt(loader.token_count, 1500000);
    ck_assert_uint_lt(loader.token_count, 2500000);
    ck_assert_uint_eq(loader.window_starts, loader.token_count - T);
    size_t eot_count = 0;
    for (size_t i = 0; i < loader.token_count; i++) eot_count += data_token(&loader, i) == DATA_EOT;
    ck_assert_uint_eq(eot_count, DATA_DEFAULT_STORIES);

    int *tokens = token_buffer((size_t)micro_batch * T, "test.batch");
    int *targets = token_buffer((size_t)micro_batch * T, "test.batch");
    uint64_t global_batch = (uint64_t)ctx.world_size * micro_batch;
    for (uint64_t g = 0; g < 5; g++) {
        data_next_batch(&loader, tokens, targets);
        for (int b = 0; b < micro_batch; b++) {
            uint64_t k = (uint64_t)ctx.rank * micro_batch + b;
            size_t start = ((g * global_batch + k) * T) % (loader.token_count - T);
            ck_assert_uint_eq(data_window_start(&loader, g * global_batch + k), start);
            for (int t = 0; t < T; t++) {
                ck_assert_int_eq(tokens[b * T + t], (int)data_token(&loader, start + t));
                ck_assert_int_eq(targets[b * T + t], (int)data_token(&loader, start + t + 1));
                if (t + 1 < T) ck_assert_int_eq(targets[b * T + t], tokens[b * T + t + 1]);
            }
        }
    }
    ck_assert_uint_eq(loader.next_global_micro, 5);
    /* far past the end the windows wrap and stay inside the stream */
    loader.next_global_micro = 1000000;
    data_next_batch(&loader, tokens, targets);
    for (int i = 0; i < micro_batch * T; i++) ck_assert_int_le(targets[i], DATA_EOT);
    mem_free(&ctx.mem, tokens);
    mem_free(&ctx.mem, targets);
    data_loader_close(&loader);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], data_before);
}
END_TEST

/* A stream whose token at position p is p, so a window's first token is where it starts. */
static void open_positions(data_loader *loader, int micro_batch, int shuffle, uint64_t seed) {
    enum { length = 100 };
    int positions[length];
    for (int p = 0; p < length; p++) positions[p] = p;
    char path[256];
    temp_path(path, sizeof path, "positions.bin");
    write_bin(path, positions, length);
    ck_assert_msg(data_loader_open(loader, &ctx, path, 1000, micro_batch, 8, seed, shuffle) == 0, "%s", ctx.error);
    remove(path);
}

/* Every rank's batch gathered in rank order: the global micro-batch, window k at gathered[k * T]. */
static void gather_global_batch(data_loader *loader, int *local_tokens, int *local_targets, int *tokens,
                                int *targets) {
    int local_count = loader->micro_batch * loader->seq_len;
    data_next_batch(loader, local_tokens, local_targets);
    WORLD_MPI(&ctx, MPI_Allgather(local_tokens, local_count, MPI_INT, tokens, local_count, MPI_INT, ctx.comm));
    WORLD_MPI(&ctx, MPI_Allgather(local_targets, local_count, MPI_INT, targets, local_count, MPI_INT, ctx.comm));
}

/* Global batch 4 windows of 8 tokens over a 100-token stream, at every world size that divides 4: micro_batch is
 * 4, 2 or 1. The table is worked out by hand: window j starts at (8 j) mod (100 - 8), so after 0, 8, ..., 88 the
 * next starts are 96 mod 92 = 4, then 12, 20, 28. The same table at world 1, 2 and 4 is the independence. */
START_TEST(test_global_batch_is_independent_of_world_size) {
    if (4 % ctx.world_size != 0) return;
    static const int expected_starts[4][4] = {{0, 8, 16, 24}, {32, 40, 48, 56}, {64, 72, 80, 88}, {4, 12, 20, 28}};
    const int global_batch = 4, T = 8, micro_batch = global_batch / ctx.world_size;
    data_loader loader;
    open_positions(&loader, micro_batch, 0, 1);
    int *local_tokens = token_buffer((size_t)micro_batch * T, "test.batch");
    int *local_targets = token_buffer((size_t)micro_batch * T, "test.batch");
    int *tokens = token_buffer((size_t)global_batch * T, "test.gathered");
    int *targets = token_buffer((size_t)global_batch * T, "test.gathered");
    for (int g = 0; g < 4; g++) {
        gather_global_batch(&loader, local_tokens, local_targets, tokens, targets);
        for (int k = 0; k < global_batch; k++) {
            for (int t = 0; t < T; t++) {
                CK_ASSERT_ALL(&ctx, tokens[k * T + t] == expected_starts[g][k] + t,
                              "world %d: global micro-batch %d window %d token %d is %d, expected %d",
                              ctx.world_size, g, k, t, tokens[k * T + t], expected_starts[g][k] + t);
                CK_ASSERT_ALL(&ctx, targets[k * T + t] == expected_starts[g][k] + t + 1,
                              "world %d: global micro-batch %d window %d target %d is %d, expected %d",
                              ctx.world_size, g, k, t, targets[k * T + t], expected_starts[g][k] + t + 1);
            }
        }
    }
    mem_free(&ctx.mem, local_tokens);
    mem_free(&ctx.mem, local_targets);
    mem_free(&ctx.mem, tokens);
    mem_free(&ctx.mem, targets);
    data_loader_close(&loader);
}
END_TEST

/* Shuffled, a pass (92 / 8 = 11 windows over the 100-token stream) visits the same windows as unshuffled, in an
 * order of its own per seed; the order depends on the global window index only. The table was recorded at world 1
 * (seed 9); world 2 and 4 must gather the same. */
START_TEST(test_shuffle_keeps_the_windows_and_the_world_size_independence) {
    if (4 % ctx.world_size != 0) return;
    static const int expected_starts[12] = {72, 16, 8, 24, 64, 56, 80, 40, 48, 0, 32, 68};
    const int global_batch = 4, T = 8, micro_batch = global_batch / ctx.world_size;
    data_loader loader, other_seed;
    open_positions(&loader, micro_batch, 1, 9);
    open_positions(&other_seed, micro_batch, 1, 10);
    ck_assert_uint_eq(loader.windows_per_pass, 11);
    int seen[11] = {0}, same_as_other_seed = 1, in_order = 1;
    for (uint64_t j = 0; j < 11; j++) {
        size_t start = data_window_start(&loader, j);
        ck_assert_uint_eq(start % 8, 0);
        ck_assert_uint_lt(start / 8, 11);
        seen[start / 8]++;
        same_as_other_seed &= start == data_window_start(&other_seed, j);
        in_order &= start == j * 8;
    }
    for (int w = 0; w < 11; w++)
        ck_assert_msg(seen[w] == 1, "window at %d seen %d times in the first pass", w * 8, seen[w]);
    ck_assert_msg(!in_order, "seed 9 left the first pass in order");
    ck_assert_msg(!same_as_other_seed, "seeds 9 and 10 gave the same order");

    int *local_tokens = token_buffer((size_t)micro_batch * T, "test.batch");
    int *local_targets = token_buffer((size_t)micro_batch * T, "test.batch");
    int *tokens = token_buffer((size_t)global_batch * T, "test.gathered");
    int *targets = token_buffer((size_t)global_batch * T, "test.gathered");
    for (int g = 0; g < 3; g++) {
        gather_global_batch(&loader, local_tokens, local_targets, tokens, targets);
        for (int k = 0; k < global_batch; k++) {
            int expected = expected_starts[g * global_batch + k];
            CK_ASSERT_ALL(&ctx, tokens[k * T] == expected && targets[k * T + T - 1] == expected + T,
                          "world %d: shuffled global micro-batch %d window %d starts at %d, expected %d",
                          ctx.world_size, g, k, tokens[k * T], expected);
        }
    }
    mem_free(&ctx.mem, local_tokens);
    mem_free(&ctx.mem, local_targets);
    mem_free(&ctx.mem, tokens);
    mem_free(&ctx.mem, targets);
    data_loader_close(&other_seed);
    data_loader_close(&loader);
}
END_TEST

/* Opens and expects a refusal whose message holds every one of `needles`; nothing may stay allocated. */
static void expect_refusal(const char *path, int vocab_size, int micro_batch, int seq_len, const char *const *needles) {
    size_t data_before = ctx.mem.category_live_bytes[MEM_DATA];
    data_loader loader;
    ctx.error[0] = '\0';
    ck_assert_msg(data_loader_open(&loader, &ctx, path, vocab_size, micro_batch, seq_len, 1, 0) == -1,
                  "%s was accepted", path);
    char rank_prefix[32];
    snprintf(rank_prefix, sizeof rank_prefix, "rank %d: ", ctx.rank);
    ck_assert_msg(strncmp(ctx.error, rank_prefix, strlen(rank_prefix)) == 0, "no rank in: %s", ctx.error);
    ck_assert_msg(strstr(ctx.error, path) != NULL, "no path in: %s", ctx.error);
    for (const char *const *needle = needles; *needle != NULL; needle++)
        ck_assert_msg(strstr(ctx.error, *needle) != NULL, "'%s' not in: %s", *needle, ctx.error);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], data_before);
}

START_TEST(test_refusals_name_path_and_values) {
    char path[256];
    temp_path(path, sizeof path, "missing.txt");
    expect_refusal(path, 260, 2, 8, (const char *const[]){"cannot open", "No such file", NULL});
    expect_refusal("/tmp", 260, 2, 8, (const char *const[]){"not a regular file", NULL});

    temp_path(path, sizeof path, "odd.bin");
    write_file(path, "\x01\x00\x02\x00\x03\x00\x04", 7);
    expect_refusal(path, 260, 2, 8, (const char *const[]){"7 bytes", "uint16", NULL});
    remove(path);

    int outside[] = {1, 2, 300, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    temp_path(path, sizeof path, "outside.bin");
    write_bin(path, outside, 12);
    expect_refusal(path, 260, 2, 8, (const char *const[]){"token id 300", "position 2", "vocab_size 260", NULL});
    remove(path);

    /* text with the marker needs a vocabulary that has id 256 */
    temp_path(path, sizeof path, "marker.txt");
    write_file(path, "Hi.\n<|endoftext|>\nBye.", 22); /* the stories "Hi." and "Bye.", <|endoftext|> between */
    expect_refusal(path, 256, 1, 4, (const char *const[]){"token id 256", "position 3", "vocab_size 256",
                                                          "<|endoftext|>", NULL});
    /* and 8 tokens cannot fill a window of 8 + 1 */
    expect_refusal(path, 260, 1, 8, (const char *const[]){"8 tokens", "seq_len + 1 = 9", NULL});
    expect_refusal(path, 260, 0, 4, (const char *const[]){"micro_batch 0", NULL});
    remove(path);

    int few[] = {1, 2, 3, 4, 5};
    temp_path(path, sizeof path, "short.bin");
    write_bin(path, few, 5);
    expect_refusal(path, 260, 2, 8, (const char *const[]){"5 tokens", "seq_len + 1 = 9", NULL});
    /* exactly seq_len + 1 tokens is one window, and every window is that one */
    data_loader loader;
    ck_assert_msg(data_loader_open(&loader, &ctx, path, 260, 2, 4, 1, 1) == 0, "%s", ctx.error);
    int *tokens = token_buffer(8, "test.batch"), *targets = token_buffer(8, "test.batch");
    data_next_batch(&loader, tokens, targets);
    data_next_batch(&loader, tokens, targets);
    ck_assert_int_eq(tokens[4], 1);
    ck_assert_int_eq(targets[7], 5);
    mem_free(&ctx.mem, tokens);
    mem_free(&ctx.mem, targets);
    data_loader_close(&loader);
    remove(path);
}
END_TEST

/* Bytes at `offset` of a file overwritten in place: a header field changed after data_write_tokens wrote it. */
static void patch_file(const char *path, long offset, const void *bytes, size_t size) {
    FILE *file = fopen(path, "r+b");
    ck_assert_msg(file != NULL, "rank %d: cannot open %s", ctx.rank, path);
    ck_assert_int_eq(fseek(file, offset, SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(bytes, 1, size, file), size);
    ck_assert_int_eq(fclose(file), 0);
}

static void write_tokens(const char *path, const int *ids, size_t count, int width) {
    ck_assert_msg(data_write_tokens(path, ids, count, width, ctx.error, sizeof ctx.error) == 0, "%s", ctx.error);
}

/* The loader's stream against the ids, held once in the narrowest width of the vocabulary. */
static void expect_stream(const char *path, int vocab_size, const int *ids, size_t count) {
    data_loader loader;
    ck_assert_msg(data_loader_open(&loader, &ctx, path, vocab_size, 1, 4, 1, 0) == 0, "%s", ctx.error);
    int width = vocab_size <= 65536 ? 2 : 4;
    ck_assert_int_eq(loader.token_width, width);
    ck_assert_uint_eq(loader.token_count, count);
    ck_assert_uint_eq(loader.token_bytes, count * (size_t)width);
    ck_assert_uint_eq(mem_find(&ctx.mem, loader.tokens)->bytes, count * (size_t)width);
    for (size_t i = 0; i < count; i++)
        ck_assert_msg(data_token(&loader, i) == (uint32_t)ids[i], "%s: id %zu is %u, expected %d", path, i,
                      data_token(&loader, i), ids[i]);
    data_loader_close(&loader);
}

/* Headered files at both widths read back exactly, into 2-byte ids when the vocabulary fits 16 bits (whatever the
 * file's width) and 4-byte ids past it; the file is the header then the ids little-endian; no .tmp stays; the old
 * headerless file of the same ids gives the same batches as the headered one. */
START_TEST(test_token_files_round_trip_at_both_widths) {
    size_t data_before = ctx.mem.category_live_bytes[MEM_DATA];
    enum { count = 300 };
    int small[count], large[count];
    for (int i = 0; i < count; i++) {
        small[i] = (i * 37) % 260;
        large[i] = i == 7 ? 151645 : (int)((uint32_t)i * 2654435761u % 151936u);
    }
    char path[256], old_path[256], tmp[300];
    temp_path(path, sizeof path, "tokens.bin");
    temp_path(old_path, sizeof old_path, "old.bin");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    for (int width = 2; width <= 4; width += 2) {
        write_tokens(path, small, count, width);
        ck_assert_int_eq(access(tmp, F_OK), -1); /* renamed away */
        FILE *file = fopen(path, "rb");
        unsigned char bytes[DATA_TOKENS_HEADER_BYTES + 8];
        ck_assert_uint_eq(fread(bytes, 1, sizeof bytes, file), sizeof bytes);
        ck_assert_int_eq(fseek(file, 0, SEEK_END), 0);
        ck_assert_int_eq(ftell(file), DATA_TOKENS_HEADER_BYTES + count * width);
        fclose(file);
        ck_assert_mem_eq(bytes, "FSDPTOKS\x01\0\0\0", 12);
        ck_assert_int_eq(bytes[12], width);
        ck_assert_int_eq(bytes[16] | bytes[17] << 8, count);
        ck_assert_int_eq(bytes[DATA_TOKENS_HEADER_BYTES + width], small[1]); /* id 1, little-endian */
        expect_stream(path, 260, small, count);     /* 2 bytes a token in memory, from either width */
        expect_stream(path, 151936, small, count);  /* 4 bytes a token: Qwen2's vocabulary */
    }
    write_tokens(path, large, count, 4);
    expect_stream(path, 151936, large, count);

    /* the old format and the headered one: the same batches */
    write_tokens(path, small, count, 2);
    write_bin(old_path, small, count);
    expect_stream(old_path, 260, small, count);
    data_loader headered, old;
    ck_assert_msg(data_loader_open(&headered, &ctx, path, 260, 2, 16, 3, 1) == 0, "%s", ctx.error);
    ck_assert_msg(data_loader_open(&old, &ctx, old_path, 260, 2, 16, 3, 1) == 0, "%s", ctx.error);
    expect_same_batches(&headered, &old, 10);
    data_loader_close(&headered);
    data_loader_close(&old);
    remove(path);
    remove(old_path);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], data_before);
}
END_TEST

/* The writer refuses what it cannot write, naming the path and the value; a failed write leaves no file. */
START_TEST(test_token_writer_refusals) {
    char path[256], tmp[300];
    temp_path(path, sizeof path, "refused.bin");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int ids[] = {1, 2, 70000, -5};
    struct { const int *ids; size_t count; int width; const char *needle; } cases[] = {
        {ids, 2, 3, "id width 3"},
        {ids, 3, 2, "id 70000 at position 2 does not fit in 2 bytes"},
        {ids, 4, 4, "id -5 at position 3 does not fit in 4 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_int_eq(data_write_tokens(path, cases[i].ids, cases[i].count, cases[i].width, ctx.error,
                                           sizeof ctx.error), -1);
        ck_assert_msg(strstr(ctx.error, path) && strstr(ctx.error, cases[i].needle), "%s", ctx.error);
        ck_assert_int_eq(access(path, F_OK), -1);
        ck_assert_int_eq(access(tmp, F_OK), -1);
    }
    const char *unwritable = "/nonexistent_fsdplab_dir/tokens.bin";
    ck_assert_int_eq(data_write_tokens(unwritable, ids, 2, 2, ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "cannot create /nonexistent_fsdplab_dir/tokens.bin.tmp"), "%s", ctx.error);
}
END_TEST

/* A headered file that lies is refused with the file and the values: version, width, count against the size (too
 * many ids, a cut file, a header cut short), an id past the vocabulary at either width (position named, and at
 * width 4 before it could be narrowed into 16 bits). A wrong magic is no header at all: the old format, whose first
 * "ids" are the magic's bytes, outside a small vocabulary. */
START_TEST(test_token_file_refusals) {
    char path[256];
    temp_path(path, sizeof path, "lying.bin");
    int ids[20];
    for (int i = 0; i < 20; i++) ids[i] = i + 1;
    unsigned char version[4] = {7, 0, 0, 0}, width[4] = {3, 0, 0, 0}, count[8] = {21, 0, 0, 0, 0, 0, 0, 0};
    write_tokens(path, ids, 20, 2);
    patch_file(path, 8, version, 4);
    expect_refusal(path, 260, 1, 8, (const char *const[]){"token file version 7", "reads version 1", NULL});
    write_tokens(path, ids, 20, 2);
    patch_file(path, 12, width, 4);
    expect_refusal(path, 260, 1, 8, (const char *const[]){"id width 3 in the header", "2 or 4", NULL});
    write_tokens(path, ids, 20, 4);
    patch_file(path, 16, count, 8);
    expect_refusal(path, 260, 1, 8,
                   (const char *const[]){"the header says 21 ids of 4 bytes", "80 bytes follow", NULL});
    write_tokens(path, ids, 20, 2);
    ck_assert_int_eq(truncate(path, DATA_TOKENS_HEADER_BYTES + 39), 0);
    expect_refusal(path, 260, 1, 8,
                   (const char *const[]){"the header says 20 ids of 2 bytes", "39 bytes follow", NULL});
    ck_assert_int_eq(truncate(path, 12), 0);
    expect_refusal(path, 260, 1, 8, (const char *const[]){"12 bytes", "needs 24", NULL});
    write_tokens(path, ids, 20, 2);
    patch_file(path, 7, "X", 1);
    expect_refusal(path, 260, 1, 8, (const char *const[]){"token id 21318 at position 0", NULL}); /* "FS" */

    ids[5] = 151646;
    write_tokens(path, ids, 20, 4);
    expect_refusal(path, 151646, 1, 8,
                   (const char *const[]){"token id 151646 at position 5", "vocab_size 151646", NULL});
    ids[5] = 6;
    ids[3] = 70000; /* past 16 bits: refused, not narrowed to 4464 */
    write_tokens(path, ids, 20, 4);
    expect_refusal(path, 260, 1, 8, (const char *const[]){"token id 70000 at position 3", "vocab_size 260", NULL});
    ids[3] = 300;
    write_tokens(path, ids, 20, 2);
    expect_refusal(path, 260, 1, 8, (const char *const[]){"token id 300 at position 3", NULL});
    remove(path);
}
END_TEST

/* A file only some ranks can read: every rank refuses, or the others would wait in the step's first collective. */
START_TEST(test_one_rank_failing_stops_every_rank) {
    if (ctx.world_size < 2) return;
    char path[256];
    temp_path(path, sizeof path, ctx.rank == 0 ? "present.txt" : "absent.txt");
    if (ctx.rank == 0) write_file(path, "a story long enough for one window", 34);
    /* rank 0 loaded its file, and reports the lowest failing rank's failure, rank 1's (world_all_true hands it over);
     * the others failed and report their own: rank, path and reason */
    data_loader loader;
    ck_assert_int_eq(data_loader_open(&loader, &ctx, path, 260, 1, 8, 1, 0), -1);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "rank %d: ", ctx.rank == 0 ? 1 : ctx.rank);
    ck_assert_msg(strncmp(ctx.error, prefix, strlen(prefix)) == 0 && strstr(ctx.error, "absent.txt: cannot open"),
                  "rank %d: %s", ctx.rank, ctx.error);
    remove(path);
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_data", "runs/check/test_data");
    Suite *suite = suite_create("data");
    TCase *tc = tcase_create("data");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tokenizer_round_trip);
    tcase_add_test(tc, test_stories_are_deterministic_printable_and_separated);
    tcase_add_test(tc, test_text_and_bin_loaders_agree);
    tcase_add_test(tc, test_text_through_a_bpe_tokenizer);
    tcase_add_test(tc, test_stories_as_the_dataset_gives_them);
    tcase_add_test(tc, test_default_stories_and_targets_one_ahead);
    tcase_add_test(tc, test_global_batch_is_independent_of_world_size);
    tcase_add_test(tc, test_shuffle_keeps_the_windows_and_the_world_size_independence);
    tcase_add_test(tc, test_refusals_name_path_and_values);
    tcase_add_test(tc, test_token_files_round_trip_at_both_widths);
    tcase_add_test(tc, test_token_writer_refusals);
    tcase_add_test(tc, test_token_file_refusals);
    tcase_add_test(tc, test_one_rank_failing_stops_every_rank);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
