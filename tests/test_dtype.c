/* test_dtype.c — core/base/dtype.h: float32 -> bfloat16 rounds to nearest even as c10::BFloat16 does (ties, carries
 * into the exponent, overflow to infinity), NaN stays NaN, every bfloat16 survives the round trip, names and sizes as
 * torch prints them. No MPI needed. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/base/dtype.h"
#include "check_main.h"

static float from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

START_TEST(test_round_to_nearest_even) {
    ck_assert_uint_eq(bf16_from_float(1.0f), 0x3f80);
    ck_assert_uint_eq(bf16_from_float(from_bits(0x3f808000)), 0x3f80); /* 1 + 2^-8: a tie, to the even 1 */
    ck_assert_uint_eq(bf16_from_float(from_bits(0x3f818000)), 0x3f82); /* 1 + 3 2^-8: a tie, to the even 1 + 2^-6 */
    ck_assert_uint_eq(bf16_from_float(from_bits(0x3f808001)), 0x3f81); /* just above the tie: up */
    ck_assert_uint_eq(bf16_from_float(from_bits(0x3f807fff)), 0x3f80); /* just below: down */
    ck_assert_uint_eq(bf16_from_float(from_bits(0x3fffffff)), 0x4000); /* the carry goes into the exponent */
    ck_assert_uint_eq(bf16_from_float(-0.0f), 0x8000);                 /* the sign of zero kept */
    ck_assert_uint_eq(bf16_from_float(FLT_MAX), 0x7f80);               /* rounds past the largest: infinity */
    ck_assert_uint_eq(bf16_from_float(-INFINITY), 0xff80);
    ck_assert_float_eq(bf16_round(0.1f), from_bits(0x3dcd0000));       /* 0x3dcccccd rounds up */
}
END_TEST

START_TEST(test_nan_stays_nan) {
    const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0xffc00001, 0x7fffffff, 0x7f80ffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        bf16 rounded = bf16_from_float(from_bits(nans[i]));
        ck_assert_msg(isnan(bf16_to_float(rounded)), "NaN 0x%08x became 0x%04x", nans[i], rounded);
        ck_assert_uint_eq(rounded >> 15, nans[i] >> 31); /* the sign kept */
    }
}
END_TEST

START_TEST(test_every_bfloat16_round_trips) {
    for (uint32_t bits = 0; bits <= 0xffff; bits++) {
        float value = bf16_to_float((bf16)bits);
        if (isnan(value)) continue;
        ck_assert_uint_eq(bf16_from_float(value), bits);
    }
}
END_TEST

START_TEST(test_add_and_convert) {
    bf16 one = bf16_from_float(1.0f), tiny = bf16_from_float(0x1p-9f);
    ck_assert_uint_eq(bf16_add(one, tiny), one);                         /* 1 + 2^-9 rounds back to 1 */
    ck_assert_float_eq(bf16_to_float(bf16_add(one, one)), 2.0f);
    float values[5] = {1.0f, 0.1f, -3.14159f, 65504.0f, 1e-30f}, back[5];
    bf16 low[5];
    dtype_convert(low, DTYPE_BFLOAT16, values, DTYPE_FLOAT32, 5);
    dtype_convert(back, DTYPE_FLOAT32, low, DTYPE_BFLOAT16, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_float_eq(back[i], bf16_round(values[i]));
        ck_assert_msg(fabsf(back[i] - values[i]) <= 0x1p-8f * fabsf(values[i]), "%g -> %g", values[i], back[i]);
    }
    dtype_round_to(values, 5, DTYPE_BFLOAT16);
    ck_assert_int_eq(memcmp(values, back, sizeof back), 0);
}
END_TEST

START_TEST(test_names_and_sizes) {
    ck_assert_str_eq(dtype_name(DTYPE_FLOAT32), "float32");
    ck_assert_str_eq(dtype_name(DTYPE_BFLOAT16), "bfloat16");
    ck_assert_uint_eq(dtype_size(DTYPE_FLOAT32), 4);
    ck_assert_uint_eq(dtype_size(DTYPE_BFLOAT16), 2);
    ck_assert_uint_eq(dtype_size(DTYPE_UINT8), 1);
    ck_assert_int_eq(dtype_from_name("bf16"), DTYPE_BFLOAT16);
    ck_assert_int_eq(dtype_from_name("float32"), DTYPE_FLOAT32);
    ck_assert_int_eq(dtype_from_name("fp16"), -1);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("dtype");
    TCase *tc = tcase_create("bfloat16");
    tcase_add_test(tc, test_round_to_nearest_even);
    tcase_add_test(tc, test_nan_stays_nan);
    tcase_add_test(tc, test_every_bfloat16_round_trips);
    tcase_add_test(tc, test_add_and_convert);
    tcase_add_test(tc, test_names_and_sizes);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
