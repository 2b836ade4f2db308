/* test_safetensors.c — F32 safetensors: round trip, ranged reads, and refusal (with tensor name and byte offsets)
 * of truncated or inconsistent files. No MPI needed. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/io/safetensors.h"
#include "check_main.h"

static char directory[] = "/tmp/fsdplab_test_st_XXXXXX";
static char path[256];
static char error[1024];

static float embed[6 * 4], norm[4], bias[3];
static const st_tensor_ref tensors[] = {
    {"model.embed_tokens.weight", 2, {6, 4}, embed},
    {"model.norm.weight", 1, {4}, norm},
    {"model.layers.0.self_attn.q_proj.bias", 1, {3}, bias},
};

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(directory));
    snprintf(path, sizeof path, "%s/model.safetensors", directory);
    for (int i = 0; i < 24; i++) embed[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 4; i++) norm[i] = 1.0f + (float)i;
    for (int i = 0; i < 3; i++) bias[i] = -(float)i;
}

static void teardown(void) {
    unlink(path);
    rmdir(directory);
}

/* Writes raw bytes: an 8-byte little-endian header length, the header text, then data_bytes bytes of zeros. */
static void write_raw(const char *header, size_t data_bytes) {
    FILE *file = fopen(path, "wb");
    ck_assert_ptr_nonnull(file);
    uint64_t length = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)((length >> (8 * i)) & 0xff), file);
    fputs(header, file);
    for (size_t i = 0; i < data_bytes; i++) fputc(0, file);
    fclose(file);
}

START_TEST(test_round_trip) {
    ck_assert_msg(st_write(path, tensors, 3, "pt", error, sizeof error) == 0, "%s", error);
    st_file st;
    ck_assert_msg(st_open(&st, path, error, sizeof error) == 0, "%s", error);
    ck_assert_int_eq(st.count, 3);
    ck_assert_uint_eq(st.data_start % 8, 0); /* header padded to 8 bytes, as HF writes it */
    const st_entry *entry = st_find(&st, "model.embed_tokens.weight");
    ck_assert_ptr_nonnull(entry);
    ck_assert_int_eq(entry->ndim, 2);
    ck_assert_int_eq(entry->shape[0], 6);
    ck_assert_int_eq(entry->shape[1], 4);
    float whole[24], part[5];
    ck_assert_msg(st_read(&st, "model.embed_tokens.weight", 0, 24, whole, error, sizeof error) == 0, "%s", error);
    ck_assert_mem_eq(whole, embed, sizeof embed);
    ck_assert_msg(st_read(&st, "model.embed_tokens.weight", 7, 5, part, error, sizeof error) == 0, "%s", error);
    ck_assert_mem_eq(part, embed + 7, sizeof part); /* a shard's slice, without reading the rest */
    float read_bias[3];
    ck_assert_int_eq(st_read(&st, "model.layers.0.self_attn.q_proj.bias", 0, 3, read_bias, error, sizeof error), 0);
    ck_assert_mem_eq(read_bias, bias, sizeof bias);
    ck_assert_ptr_null(st_find(&st, "lm_head.weight"));
    st_close(&st);
}
END_TEST

START_TEST(test_reads_outside_a_tensor_are_refused) {
    ck_assert_int_eq(st_write(path, tensors, 3, NULL, error, sizeof error), 0);
    st_file st;
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), 0);
    float out[8];
    ck_assert_int_eq(st_read(&st, "model.norm.weight", 2, 3, out, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "'model.norm.weight' has 4 elements; cannot read [2, 5)"), "%s", error);
    ck_assert_int_eq(st_read(&st, "missing", 0, 1, out, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "no tensor named 'missing'"), "%s", error);
    st_close(&st);
}
END_TEST

START_TEST(test_truncated_file_names_the_tensor) {
    ck_assert_int_eq(st_write(path, tensors, 3, "pt", error, sizeof error), 0);
    FILE *file = fopen(path, "rb");
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fclose(file);
    ck_assert_int_eq(truncate(path, size - 5), 0);
    st_file st;
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "'model.layers.0.self_attn.q_proj.bias' ends at data byte 124") &&
                      strstr(error, "only 119 data bytes"),
                  "%s", error);
    ck_assert_int_eq(truncate(path, 4), 0);
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "too short"), "%s", error);
}
END_TEST

START_TEST(test_inconsistent_headers_are_refused) {
    st_file st;
    write_raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20);
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "'w': data_offsets [0, 20) hold 20 bytes, but shape needs 6 x 4 = 24"), "%s", error);

    write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24);
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "'b' starts at data byte 8, expected 16 (overlaps"), "%s", error);

    write_raw("{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "'h' has dtype F16"), "%s", error);

    write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12);
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "8 data bytes after the last tensor"), "%s", error);

    write_raw("[1, 2]", 0);
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "not a JSON object"), "%s", error);
}
END_TEST

START_TEST(test_header_length_beyond_the_file) {
    FILE *file = fopen(path, "wb");
    for (int i = 0; i < 8; i++) fputc(i == 1 ? 1 : 0, file); /* claims a 256-byte header */
    fputs("{}", file);
    fclose(file);
    st_file st;
    ck_assert_int_eq(st_open(&st, path, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "header length 256 does not fit in the file's 10 bytes"), "%s", error);
}
END_TEST

START_TEST(test_duplicate_names_are_not_written) {
    st_tensor_ref twice[] = {tensors[1], tensors[1]};
    ck_assert_int_eq(st_write(path, twice, 2, NULL, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "'model.norm.weight' given twice"), "%s", error);
}
END_TEST

/* A file written by HF's own safetensors package (tests/data/make_hf_fixture.py): values i * 0.25 - 1. */
START_TEST(test_reads_a_file_written_by_hf_safetensors) {
    st_file st;
    ck_assert_msg(st_open(&st, "tests/data/hf_written.safetensors", error, sizeof error) == 0, "%s", error);
    ck_assert_int_eq(st.count, 3);
    const char *names[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.bias", "model.norm.weight"};
    const size_t sizes[] = {12, 5, 4};
    for (int t = 0; t < 3; t++) {
        float values[12];
        ck_assert_msg(st_read(&st, names[t], 0, sizes[t], values, error, sizeof error) == 0, "%s", error);
        for (size_t i = 0; i < sizes[t]; i++) ck_assert_float_eq(values[i], (float)i * 0.25f - 1.0f);
    }
    ck_assert_int_eq(st_find(&st, "model.embed_tokens.weight")->shape[0], 3);
    st_close(&st);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("safetensors");
    TCase *tc = tcase_create("F32 files");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_reads_outside_a_tensor_are_refused);
    tcase_add_test(tc, test_truncated_file_names_the_tensor);
    tcase_add_test(tc, test_inconsistent_headers_are_refused);
    tcase_add_test(tc, test_header_length_beyond_the_file);
    tcase_add_test(tc, test_duplicate_names_are_not_written);
    tcase_add_test(tc, test_reads_a_file_written_by_hf_safetensors);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
