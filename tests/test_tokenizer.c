/* test_tokenizer.c — core/tokenizer without Qwen2's vocabulary: tiny ranks files written here (the 256 bytes, then a
 * few merges) show merging by rank, special tokens, NFC, pre-token boundaries, decoding, the tokenizer.json loader,
 * and that a bad file is refused naming the file and the line. tests/check_tokenizer_parity.py checks the real
 * vocabulary against HF tokenizers. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/tokenizer.h"
#include "check_main.h"

static void base64(const char *bytes, size_t length, char *out) {
    const char *digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < length; i += 3) {
        unsigned group = (unsigned char)bytes[i] << 16 | (i + 1 < length ? (unsigned char)bytes[i + 1] << 8 : 0) |
                         (i + 2 < length ? (unsigned char)bytes[i + 2] : 0);
        *out++ = digits[group >> 18 & 63], *out++ = digits[group >> 12 & 63];
        *out++ = i + 1 < length ? digits[group >> 6 & 63] : '=';
        *out++ = i + 2 < length ? digits[group & 63] : '=';
    }
    *out = '\0';
}

/* A ranks file: the 256 bytes (ranks 0..255) unless `bytes_too` is 0, then `merged` tokens from rank 256 on, then
 * `extra` lines as they are. Returns the path (static buffer per call site is enough: one file per test). */
static const char *write_ranks(char *path, const char *const *merged, int merged_count, int bytes_too,
                               const char *extra) {
    strcpy(path, "/tmp/test_tokenizer_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *file = fdopen(fd, "w");
    char line[64];
    for (int byte = 0; bytes_too && byte < 256; byte++) {
        char c = (char)byte;
        base64(&c, 1, line);
        fprintf(file, "%s %d\n", line, byte);
    }
    for (int i = 0; i < merged_count; i++) {
        base64(merged[i], strlen(merged[i]), line);
        fprintf(file, "%s %d\n", line, 256 + i);
    }
    fputs(extra, file);
    fclose(file);
    return path;
}

/* cd before bc; "abc" from a + bc; " a" for pre-tokens; "é" composed. */
static const char *const MERGED[] = {"cd", "bc", "abc", " a", "\xc3\xa9", "ab"};
enum { CD = 256, BC, ABC, SPACE_A, E_ACUTE, AB, ENDOFTEXT, IM_START, IM_END };

static tok_tokenizer load_small(char *path) {
    tok_tokenizer t;
    char error[512];
    write_ranks(path, MERGED, 6, 1, "");
    ck_assert_msg(tok_load(&t, path, error, sizeof error) == 0, "%s", error);
    return t;
}

static void assert_ids(tok_tokenizer *t, const char *text, size_t length, const int *expected, size_t count) {
    tok_ids ids = {0};
    char error[256];
    ck_assert_msg(tok_encode(t, text, length, &ids, error, sizeof error) == 0, "%s", error);
    ck_assert_msg(ids.count == count, "'%s': %zu ids, expected %zu", text, ids.count, count);
    for (size_t i = 0; i < count; i++) ck_assert_msg(ids.ids[i] == expected[i], "'%s': id %zu is %d, expected %d",
                                                     text, i, ids.ids[i], expected[i]);
    tok_ids_free(&ids);
}
#define ASSERT_IDS(t, text, ...)                                                                                      \
    do {                                                                                                              \
        const int expected[] = {__VA_ARGS__};                                                                         \
        assert_ids(t, text, sizeof text - 1, expected, sizeof expected / sizeof expected[0]);                       \
    } while (0)

START_TEST(test_merges_follow_rank_not_position) {
    char path[64];
    tok_tokenizer t = load_small(path);
    ck_assert_int_eq(tok_vocab_size(&t), IM_END + 1);
    ASSERT_IDS(&t, "bcd", 'b', CD);    /* cd (256) before bc (257), though bc comes first */
    ASSERT_IDS(&t, "abc", ABC);        /* bc, then a + bc */
    ASSERT_IDS(&t, "abcd", AB, CD);    /* cd first; then ab (261) as a + b, since "abcd" is no token */
    ASSERT_IDS(&t, "bcbc", BC, BC);    /* equal ranks: leftmost first, then no "bcbc" */
    ASSERT_IDS(&t, "xyz", 'x', 'y', 'z');
    tok_free(&t);
    unlink(path);
}
END_TEST

START_TEST(test_specials_pre_tokens_and_nfc) {
    char path[64];
    tok_tokenizer t = load_small(path);
    ck_assert_int_eq(tok_special_id(&t, TOK_ENDOFTEXT), ENDOFTEXT);
    ck_assert_int_eq(tok_special_id(&t, TOK_IM_END), IM_END);
    ck_assert_int_eq(tok_special_id(&t, "<|nope|>"), -1);
    ASSERT_IDS(&t, "c<|endoftext|>d<|im_start|><|im_end|>", 'c', ENDOFTEXT, 'd', IM_START, IM_END);
    ASSERT_IDS(&t, "<|endoftext", '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'); /* not whole: text */
    /* " a" is one pre-token, so it merges; "c d" is "c" | " d", and " d" is no token. */
    ASSERT_IDS(&t, "a a", 'a', SPACE_A);
    ASSERT_IDS(&t, "c d", 'c', ' ', 'd');
    ASSERT_IDS(&t, "1cd", '1', CD); /* a digit is a pre-token of its own */
    ASSERT_IDS(&t, "e\xcc\x81", E_ACUTE); /* e + combining acute: NFC makes é */
    ASSERT_IDS(&t, "\x00" "cd", 0, CD);   /* a NUL is text */
    tok_free(&t);
    unlink(path);
}
END_TEST

START_TEST(test_decode) {
    char path[64], out[64];
    tok_tokenizer t = load_small(path);
    int ids[] = {ABC, ENDOFTEXT, SPACE_A, 999999, E_ACUTE};
    const char *expected = "abc<|endoftext|> a<|token 999999|>\xc3\xa9";
    ck_assert_uint_eq(tok_decode(&t, ids, 5, out, sizeof out), strlen(expected));
    ck_assert_str_eq(out, expected);
    ck_assert_uint_eq(tok_decode(&t, ids, 5, out, 6), strlen(expected)); /* snprintf-like: cut, NUL-terminated */
    ck_assert_str_eq(out, "abc<|");
    size_t length;
    ck_assert_ptr_null(tok_token_bytes(&t, ENDOFTEXT, &length));
    ck_assert_ptr_nonnull(tok_token_bytes(&t, CD, &length));
    ck_assert_uint_eq(length, 2);
    tok_free(&t);
    unlink(path);
}
END_TEST

START_TEST(test_encode_refuses_invalid_utf8) {
    char path[64], error[256];
    tok_tokenizer t = load_small(path);
    tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(&t, "ab<|im_end|>c\xc3(", 15, &ids, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "invalid UTF-8 at byte 13") != NULL, "%s", error);
    ck_assert_uint_eq(ids.count, 0);
    tok_ids_free(&ids);
    tok_free(&t);
    unlink(path);
}
END_TEST

static void assert_refused(const char *extra, int bytes_too, const char *expected) {
    char path[64], error[512], message[600];
    tok_tokenizer t;
    write_ranks(path, MERGED, 2, bytes_too, extra);
    ck_assert_int_eq(tok_load(&t, path, error, sizeof error), -1);
    snprintf(message, sizeof message, "%s%s", path, expected);
    ck_assert_msg(strstr(error, message) != NULL, "error '%s' lacks '%s'", error, message);
    unlink(path);
}

START_TEST(test_bad_files_name_file_and_line) {
    assert_refused("YWJj x\n", 1, ":259: rank 'x' is not a number");
    assert_refused("YWJj -4\n", 1, ":259: rank '-4' is not a number");
    assert_refused("!!!! 300\n", 1, ":259: '!!!! 300' is not 'base64token rank'");
    assert_refused("YWJj\n", 1, ":259: 'YWJj' is not 'base64token rank'");
    assert_refused("YWJj 256\n", 1, ":259: id 256 is given twice");
    assert_refused("\nYWJj 300\n", 1, ":259: empty line");
    assert_refused("YQ== 300\n", 1, ": ids 97 and 300 are the same token");
    assert_refused("YWJj 1\n", 0, ": no token for the byte 0x00");
    char error[512];
    tok_tokenizer t;
    ck_assert_int_eq(tok_load(&t, "/nonexistent/qwen.tiktoken", error, sizeof error), -1);
    ck_assert_msg(strstr(error, "/nonexistent/qwen.tiktoken: No such file") != NULL, "%s", error);
}
END_TEST

/* The same tokens as HF writes them: tokenizer.json with byte-level strings and merges in rank order. */
START_TEST(test_tokenizer_json_loads_like_ranks) {
    char directory[] = "/tmp/test_tokenizer_json_XXXXXX", path[128], error[512];
    ck_assert_ptr_nonnull(mkdtemp(directory));
    snprintf(path, sizeof path, "%s/tokenizer.json", directory);
    FILE *file = fopen(path, "w");
    fputs("{\"added_tokens\": [{\"id\": 300, \"content\": \"<|endoftext|>\"}], \"model\": {\"type\": \"BPE\", "
          "\"vocab\": {", file);
    for (int byte = 0; byte < 256; byte++) {
        uint32_t code_point = tok_byte_to_unicode((uint8_t)byte);
        char utf8[4] = {0};
        if (code_point < 0x80) utf8[0] = (char)code_point;
        else utf8[0] = (char)(0xC0 | code_point >> 6), utf8[1] = (char)(0x80 | (code_point & 63));
        fprintf(file, "%s\"%s%s\": %d", byte > 0 ? ", " : "", code_point == '"' || code_point == '\\' ? "\\" : "",
                utf8, byte);
    }
    fputs(", \"cd\": 256, \"bc\": 257, \"abc\": 258, \"\xc4\xa0" "a\": 259}, "
          "\"merges\": [\"c d\", [\"b\", \"c\"], \"a bc\", \"\xc4\xa0 a\"]}}", file);
    fclose(file);
    tok_tokenizer t;
    ck_assert_msg(tok_load(&t, directory, error, sizeof error) == 0, "%s", error);
    ck_assert_int_eq(tok_vocab_size(&t), 301);
    ASSERT_IDS(&t, "bcd", 'b', CD);
    ASSERT_IDS(&t, "abc a<|endoftext|>", ABC, SPACE_A, 300);
    tok_free(&t);
    unlink(path);
    rmdir(directory);
}
END_TEST

START_TEST(test_byte_to_unicode_table) {
    ck_assert_uint_eq(tok_byte_to_unicode('A'), 'A');
    ck_assert_uint_eq(tok_byte_to_unicode(' '), 0x120); /* "Ġ" */
    ck_assert_uint_eq(tok_byte_to_unicode(0), 0x100);   /* "Ā" */
    ck_assert_uint_eq(tok_byte_to_unicode('\n'), 0x10A); /* "Ċ" */
    ck_assert_uint_eq(tok_byte_to_unicode(0xAD), 0x143);
    ck_assert_uint_eq(tok_byte_to_unicode(0xFF), 0xFF);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("tokenizer");
    TCase *tc = tcase_create("byte-level BPE");
    tcase_add_test(tc, test_merges_follow_rank_not_position);
    tcase_add_test(tc, test_specials_pre_tokens_and_nfc);
    tcase_add_test(tc, test_decode);
    tcase_add_test(tc, test_encode_refuses_invalid_utf8);
    tcase_add_test(tc, test_bad_files_name_file_and_line);
    tcase_add_test(tc, test_tokenizer_json_loads_like_ranks);
    tcase_add_test(tc, test_byte_to_unicode_table);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
