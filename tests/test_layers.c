/* test_layers.c — every Qwen2 layer's backward against central finite differences of its forward, plus the
 * properties that pin each layer to HF's definition (RoPE at position 0 is the identity, causal attention's first
 * token sees only itself, cross-entropy of uniform logits is log V). The loss of a layer is sum(out * R) for a
 * fixed random R, accumulated in double so the finite differences measure the layer, not rounding. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels/layers.h"
#include "core/base/rng.h"
#include "check_main.h"

/* Finite differences in float: eps 1e-2 on O(1) inputs keeps truncation error ~1e-4 and rounding error ~1e-5. */
#define FD_EPS 1e-2f
#define FD_TOLERANCE 2e-3
#define FD_SAMPLES 48

static void fill(float *x, size_t count, uint64_t stream, float scale) {
    for (size_t i = 0; i < count; i++) x[i] = scale * (2.0f * rng_uniform(77, stream, i) - 1.0f);
}
static float *random_array(size_t count, uint64_t stream, float scale) {
    float *x = malloc(count * sizeof(float));
    fill(x, count, stream, scale);
    return x;
}
static float *zeros(size_t count) { return calloc(count, sizeof(float)); }

static double dot(const float *a, const float *b, size_t count) {
    double sum = 0.0;
    for (size_t i = 0; i < count; i++) sum += (double)a[i] * b[i];
    return sum;
}

/* A layer under test: forward(state) returns sum(out * R). */
typedef double (*loss_fn)(void *state);

/* Compares analytic[i] with (L(x_i + eps) - L(x_i - eps)) / 2eps at FD_SAMPLES indices (all when fewer). */
static void check_gradient(const char *what, float *x, const float *analytic, size_t count, loss_fn loss, void *state) {
    size_t samples = count < FD_SAMPLES ? count : FD_SAMPLES;
    double worst = 0.0;
    size_t worst_index = 0;
    for (size_t s = 0; s < samples; s++) {
        size_t i = samples == count ? s : (size_t)(rng_bits(5, rng_stream_of(what), s) % count);
        float saved = x[i];
        x[i] = saved + FD_EPS;
        double plus = loss(state);
        x[i] = saved - FD_EPS;
        double minus = loss(state);
        x[i] = saved;
        double numeric = (plus - minus) / (2.0 * FD_EPS);
        double error = fabs(numeric - analytic[i]) / fmax(1.0, fabs(numeric));
        if (error > worst) {
            worst = error;
            worst_index = i;
        }
    }
    ck_assert_msg(worst <= FD_TOLERANCE, "%s: gradient at %zu off by %.3g (analytic %.6g)", what, worst_index, worst,
                  analytic[worst_index]);
}

/* ---- RMSNorm ---- */
typedef struct norm_state {
    int N, C;
    float *inp, *weight, *out, *rstd, *R;
} norm_state;
static double norm_loss(void *p) {
    norm_state *s = p;
    rmsnorm_forward(s->out, s->rstd, s->inp, s->weight, s->N, s->C, 1e-6f);
    return dot(s->out, s->R, (size_t)s->N * s->C);
}
START_TEST(test_rmsnorm_gradients) {
    norm_state s = {.N = 5, .C = 16};
    size_t count = (size_t)s.N * s.C;
    s.inp = random_array(count, 1, 1.0f), s.weight = random_array((size_t)s.C, 2, 1.0f), s.out = zeros(count);
    s.rstd = zeros((size_t)s.N), s.R = random_array(count, 3, 1.0f);
    float *dinp = zeros(count), *dweight = zeros((size_t)s.C);
    norm_loss(&s);
    rmsnorm_backward(dinp, NULL, dweight, s.R, s.inp, s.weight, s.rstd, s.N, s.C);
    check_gradient("rmsnorm dinp", s.inp, dinp, count, norm_loss, &s);
    check_gradient("rmsnorm dweight", s.weight, dweight, (size_t)s.C, norm_loss, &s);
    /* with a residual gradient: dinp = dresidual + the norm's, whether dresidual is its own buffer or dinp itself */
    float *dresidual = random_array(count, 4, 1.0f), *sum = zeros(count), *in_place = zeros(count);
    float *dweight_again = zeros((size_t)s.C);
    memcpy(in_place, dresidual, count * sizeof(float));
    rmsnorm_backward(sum, dresidual, dweight_again, s.R, s.inp, s.weight, s.rstd, s.N, s.C);
    rmsnorm_backward(in_place, in_place, dweight_again, s.R, s.inp, s.weight, s.rstd, s.N, s.C);
    for (size_t i = 0; i < count; i++) {
        ck_assert_float_eq(sum[i], dresidual[i] + dinp[i]); /* one float addition of the same two values */
        ck_assert_float_eq(in_place[i], sum[i]);
    }
    free(dresidual), free(sum), free(in_place), free(dweight_again);
    /* HF's definition: unit weight, constant row c → out = c / sqrt(c^2 + eps) */
    for (int c = 0; c < s.C; c++) s.weight[c] = 1.0f, s.inp[c] = 3.0f;
    rmsnorm_forward(s.out, s.rstd, s.inp, s.weight, 1, s.C, 1e-6f);
    ck_assert_double_eq_tol(s.out[0], 3.0 / sqrt(9.0 + 1e-6), 1e-6);
    free(s.inp), free(s.weight), free(s.out), free(s.rstd), free(s.R), free(dinp), free(dweight);
}
END_TEST

/* ---- Linear ---- */
typedef struct linear_state {
    int N, IC, OC;
    float *inp, *weight, *bias, *out, *R;
} linear_state;
static double linear_loss(void *p) {
    linear_state *s = p;
    linear_forward(s->out, s->inp, s->weight, s->bias, s->N, s->IC, s->OC);
    return dot(s->out, s->R, (size_t)s->N * s->OC);
}
START_TEST(test_linear_gradients) {
    linear_state s = {.N = 7, .IC = 12, .OC = 9};
    s.inp = random_array((size_t)s.N * s.IC, 4, 1.0f), s.weight = random_array((size_t)s.OC * s.IC, 5, 1.0f);
    s.bias = random_array((size_t)s.OC, 6, 1.0f), s.out = zeros((size_t)s.N * s.OC);
    s.R = random_array((size_t)s.N * s.OC, 7, 1.0f);
    float *dinp = zeros((size_t)s.N * s.IC), *dweight = zeros((size_t)s.OC * s.IC), *dbias = zeros((size_t)s.OC);
    linear_loss(&s);
    linear_backward(dinp, dweight, dbias, s.R, s.inp, s.weight, s.N, s.IC, s.OC);
    check_gradient("linear dinp", s.inp, dinp, (size_t)s.N * s.IC, linear_loss, &s);
    check_gradient("linear dweight", s.weight, dweight, (size_t)s.OC * s.IC, linear_loss, &s);
    check_gradient("linear dbias", s.bias, dbias, (size_t)s.OC, linear_loss, &s);
    /* out[n][o] = sum_i inp[n][i] weight[o][i] + bias[o], as nn.Linear */
    double expected = s.bias[2];
    for (int i = 0; i < s.IC; i++) expected += (double)s.inp[3 * s.IC + i] * s.weight[2 * s.IC + i];
    ck_assert_double_eq_tol(s.out[3 * s.OC + 2], expected, 1e-5);
    free(s.inp), free(s.weight), free(s.bias), free(s.out), free(s.R), free(dinp), free(dweight), free(dbias);
}
END_TEST

/* ---- RoPE ---- */
typedef struct rope_state {
    int B, T, H, D;
    float *x, *work, *cos_table, *sin_table, *R;
} rope_state;
static double rope_loss(void *p) {
    rope_state *s = p;
    size_t count = (size_t)s->B * s->T * s->H * s->D;
    memcpy(s->work, s->x, count * sizeof(float));
    rope_forward(s->work, s->cos_table, s->sin_table, s->B, s->T, s->H, s->D);
    return dot(s->work, s->R, count);
}
START_TEST(test_rope_gradient_and_definition) {
    rope_state s = {.B = 2, .T = 5, .H = 3, .D = 8};
    size_t count = (size_t)s.B * s.T * s.H * s.D;
    s.x = random_array(count, 8, 1.0f), s.work = zeros(count), s.R = random_array(count, 9, 1.0f);
    s.cos_table = zeros((size_t)s.T * s.D), s.sin_table = zeros((size_t)s.T * s.D);
    rope_tables(s.cos_table, s.sin_table, s.T, s.D, 10000.0f);
    float *dx = malloc(count * sizeof(float));
    memcpy(dx, s.R, count * sizeof(float));
    rope_backward(dx, s.cos_table, s.sin_table, s.B, s.T, s.H, s.D);
    check_gradient("rope dx", s.x, dx, count, rope_loss, &s);
    rope_loss(&s);
    /* position 0: identity; position t, pair i: angle t * theta^(-2i/D) with rotate_half = [-x2, x1] */
    for (int i = 0; i < s.H * s.D; i++) ck_assert_float_eq(s.work[i], s.x[i]);
    int t = 3, i = 1, half = s.D / 2;
    double angle = t * pow(10000.0, -2.0 * i / s.D);
    const float *x = s.x + (size_t)t * s.H * s.D;
    ck_assert_double_eq_tol(s.work[(size_t)t * s.H * s.D + i], x[i] * cos(angle) - x[i + half] * sin(angle), 1e-5);
    ck_assert_double_eq_tol(s.work[(size_t)t * s.H * s.D + i + half], x[i + half] * cos(angle) + x[i] * sin(angle),
                            1e-5);
    free(s.x), free(s.work), free(s.R), free(s.cos_table), free(s.sin_table), free(dx);
}
END_TEST

/* ---- Attention ---- */
typedef struct attention_state {
    int B, T, H, KVH, D;
    float *q, *k, *v, *out, *probs, *R;
} attention_state;
static double attention_loss(void *p) {
    attention_state *s = p;
    attention_forward(s->out, s->probs, s->q, s->k, s->v, s->B, s->T, s->H, s->KVH, s->D);
    return dot(s->out, s->R, (size_t)s->B * s->T * s->H * s->D);
}
START_TEST(test_attention_gradients_and_causality) {
    attention_state s = {.B = 2, .T = 5, .H = 4, .KVH = 2, .D = 8};
    size_t q_count = (size_t)s.B * s.T * s.H * s.D, kv_count = (size_t)s.B * s.T * s.KVH * s.D;
    s.q = random_array(q_count, 10, 1.0f), s.k = random_array(kv_count, 11, 1.0f),
    s.v = random_array(kv_count, 12, 1.0f);
    s.out = zeros(q_count), s.probs = zeros((size_t)s.B * s.H * s.T * s.T), s.R = random_array(q_count, 13, 1.0f);
    float *dq = zeros(q_count), *dk = zeros(kv_count), *dv = zeros(kv_count), *scratch = zeros((size_t)s.T * s.T);
    attention_loss(&s);
    attention_backward(dq, dk, dv, scratch, s.R, s.probs, s.q, s.k, s.v, s.B, s.T, s.H, s.KVH, s.D);
    check_gradient("attention dq", s.q, dq, q_count, attention_loss, &s);
    check_gradient("attention dk", s.k, dk, kv_count, attention_loss, &s);
    check_gradient("attention dv", s.v, dv, kv_count, attention_loss, &s);
    attention_loss(&s);
    /* token 0 attends only to itself: query head h outputs value head h / (H/KVH) at position 0 */
    for (int h = 0; h < s.H; h++)
        for (int d = 0; d < s.D; d++)
            ck_assert_float_eq_tol(s.out[(size_t)h * s.D + d], s.v[(size_t)(h / 2) * s.D + d], 1e-6);
    /* every probability row sums to 1 over the causal prefix, and is 0 after it */
    for (int t = 0; t < s.T; t++) {
        double sum = 0.0;
        for (int j = 0; j < s.T; j++) {
            float p = s.probs[(size_t)t * s.T + j];
            if (j > t) ck_assert_float_eq(p, 0.0f);
            sum += p;
        }
        ck_assert_double_eq_tol(sum, 1.0, 1e-6);
    }
    free(s.q), free(s.k), free(s.v), free(s.out), free(s.probs), free(s.R), free(dq), free(dk), free(dv), free(scratch);
}
END_TEST

/* ---- SwiGLU ---- */
typedef struct swiglu_state {
    int N, I;
    float *gate_up, *out, *R;
} swiglu_state;
static double swiglu_loss(void *p) {
    swiglu_state *s = p;
    swiglu_forward(s->out, s->gate_up, s->N, s->I);
    return dot(s->out, s->R, (size_t)s->N * s->I);
}
START_TEST(test_swiglu_gradients) {
    swiglu_state s = {.N = 4, .I = 10};
    size_t count = (size_t)s.N * s.I;
    s.gate_up = random_array(2 * count, 14, 3.0f), s.out = zeros(count), s.R = random_array(count, 16, 1.0f);
    float *dgate_up = zeros(2 * count);
    swiglu_backward(dgate_up, s.R, s.gate_up, s.N, s.I);
    check_gradient("swiglu dgate_up", s.gate_up, dgate_up, 2 * count, swiglu_loss, &s);
    swiglu_loss(&s);
    /* row 1, element 3: silu(gate) * up, with gate and up side by side in the row */
    float gate = s.gate_up[2 * s.I + 3], up = s.gate_up[2 * s.I + s.I + 3];
    ck_assert_double_eq_tol(s.out[s.I + 3], gate / (1.0 + exp(-gate)) * up, 1e-6);
    free(s.gate_up), free(s.out), free(s.R), free(dgate_up);
}
END_TEST

/* ---- Embedding ---- */
typedef struct embedding_state {
    int N, C, V;
    int *tokens;
    float *weight, *out, *R;
} embedding_state;
static double embedding_loss(void *p) {
    embedding_state *s = p;
    embedding_forward(s->out, s->tokens, s->weight, s->N, s->C);
    return dot(s->out, s->R, (size_t)s->N * s->C);
}
START_TEST(test_embedding_gradient_accumulates_repeated_tokens) {
    int tokens[] = {3, 1, 3, 0, 3};
    embedding_state s = {.N = 5, .C = 6, .V = 4, .tokens = tokens};
    s.weight = random_array((size_t)s.V * s.C, 17, 1.0f), s.out = zeros((size_t)s.N * s.C);
    s.R = random_array((size_t)s.N * s.C, 18, 1.0f);
    float *dweight = zeros((size_t)s.V * s.C);
    embedding_backward(dweight, s.R, s.tokens, s.N, s.C);
    check_gradient("embedding dweight", s.weight, dweight, (size_t)s.V * s.C, embedding_loss, &s);
    for (int c = 0; c < s.C; c++) ck_assert_float_eq(dweight[2 * s.C + c], 0.0f); /* token 2 unused */
    free(s.weight), free(s.out), free(s.R), free(dweight);
}
END_TEST

/* ---- Cross-entropy ---- */
typedef struct ce_state {
    int N, V;
    int *targets;
    float *logits;
} ce_state;
static double ce_loss(void *p) {
    ce_state *s = p;
    return cross_entropy_forward_backward(NULL, s->logits, s->targets, s->N, s->V, -100, NULL);
}
START_TEST(test_cross_entropy_gradient_mean_and_ignore_index) {
    int targets[] = {2, -100, 0, 6, 6};
    ce_state s = {.N = 5, .V = 7, .targets = targets};
    s.logits = random_array((size_t)s.N * s.V, 19, 2.0f);
    float *dlogits = zeros((size_t)s.N * s.V);
    int counted = 0;
    float loss = cross_entropy_forward_backward(dlogits, s.logits, targets, s.N, s.V, -100, &counted);
    ck_assert_int_eq(counted, 4);
    ck_assert_double_eq_tol(loss, ce_loss(&s), 1e-7);
    check_gradient("cross_entropy dlogits", s.logits, dlogits, (size_t)s.N * s.V, ce_loss, &s);
    for (int j = 0; j < s.V; j++) ck_assert_float_eq(dlogits[1 * s.V + j], 0.0f); /* ignored row */
    /* uniform logits: loss = log V */
    memset(s.logits, 0, (size_t)s.N * s.V * sizeof(float));
    ck_assert_double_eq_tol(ce_loss(&s), log(7.0), 1e-6);
    int all_ignored[] = {-100, -100, -100, -100, -100};
    ck_assert_float_eq(cross_entropy_forward_backward(dlogits, s.logits, all_ignored, s.N, s.V, -100, &counted), 0.0f);
    ck_assert_int_eq(counted, 0);
    free(s.logits), free(dlogits);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("layers");
    TCase *tc = tcase_create("forward/backward");
    tcase_add_test(tc, test_rmsnorm_gradients);
    tcase_add_test(tc, test_linear_gradients);
    tcase_add_test(tc, test_rope_gradient_and_definition);
    tcase_add_test(tc, test_attention_gradients_and_causality);
    tcase_add_test(tc, test_swiglu_gradients);
    tcase_add_test(tc, test_embedding_gradient_accumulates_repeated_tokens);
    tcase_add_test(tc, test_cross_entropy_gradient_mean_and_ignore_index);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
