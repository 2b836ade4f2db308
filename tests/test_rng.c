/* test_rng.c — the counter-based RNG: a value depends only on (seed, stream, index), so any range filled at once
 * equals the same elements made one by one (what lets every rank build its own shard alone), and the normals have
 * the asked mean and spread. No MPI needed. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "core/base/rng.h"
#include "check_main.h"

START_TEST(test_fill_equals_one_by_one_for_any_start_and_length) {
    uint64_t stream = rng_stream_of("model.layers.0.mlp.up_proj.weight");
    float filled[40];
    for (uint64_t first = 0; first < 5; first++)
        for (size_t count = 0; count <= 9; count++) {
            rng_fill_normal(42, stream, first, count, 0.5f, 2.0f, filled);
            for (size_t i = 0; i < count; i++)
                ck_assert_float_eq(filled[i], rng_normal(42, stream, first + i, 0.5f, 2.0f));
        }
}
END_TEST

START_TEST(test_values_depend_on_seed_stream_and_index_only) {
    ck_assert_float_eq(rng_normal(7, 3, 1000001, 0.0f, 1.0f), rng_normal(7, 3, 1000001, 0.0f, 1.0f));
    ck_assert_float_ne(rng_normal(7, 3, 10, 0.0f, 1.0f), rng_normal(8, 3, 10, 0.0f, 1.0f));
    ck_assert_float_ne(rng_normal(7, 3, 10, 0.0f, 1.0f), rng_normal(7, 4, 10, 0.0f, 1.0f));
    ck_assert_float_ne(rng_normal(7, 3, 10, 0.0f, 1.0f), rng_normal(7, 3, 11, 0.0f, 1.0f));
    for (uint64_t i = 0; i < 1000; i++) {
        float u = rng_uniform(1, 2, i);
        ck_assert(u >= 0.0f && u < 1.0f);
    }
}
END_TEST

START_TEST(test_normal_statistics) {
    enum { N = 200001 }; /* odd: the last pair is half used */
    float *values = malloc(N * sizeof *values);
    rng_fill_normal(3, rng_stream_of("x"), 0, N, 0.0f, 0.02f, values);
    double sum = 0, squares = 0, beyond_two_sigma = 0;
    for (int i = 0; i < N; i++) {
        sum += values[i], squares += (double)values[i] * values[i];
        beyond_two_sigma += fabs(values[i]) > 0.04;
    }
    double mean = sum / N, std = sqrt(squares / N - mean * mean);
    ck_assert_msg(fabs(mean) < 3 * 0.02 / sqrt(N) * 2 && fabs(std - 0.02) < 0.0002, "mean %g std %g", mean, std);
    ck_assert_msg(fabs(beyond_two_sigma / N - 0.0455) < 0.003, "%.4f beyond 2 sigma", beyond_two_sigma / N);
    free(values);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("rng");
    TCase *tc = tcase_create("counter-based");
    tcase_add_test(tc, test_fill_equals_one_by_one_for_any_start_and_length);
    tcase_add_test(tc, test_values_depend_on_seed_stream_and_index_only);
    tcase_add_test(tc, test_normal_statistics);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
