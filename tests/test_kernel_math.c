/* test_kernel_math.c — core/base/kernel_math.h, the per-element arithmetic the CPU loops and the CUDA kernels share,
 * each function against an independent formula: a double-precision reference of the same real-number expression, fed
 * the same float inputs, within a bound from standard forward error analysis; and the exact properties that pin a
 * formula (bfloat16 ties to even, RoPE's backward is the forward at -angle, softmax sums to 1, AdamW's padding
 * stays 0). No MPI needed.
 *
 * The bounds. u = 2^-24, a float's unit roundoff. An expression evaluated with n correctly rounded float operations
 * is within gamma(n) * M of its exact value, gamma(n) = n u / (1 - n u), where M is the same expression on the
 * absolute values of its inputs with every subtraction made an addition (Higham, Accuracy and Stability of
 * Numerical Algorithms, ch. 3). A library expf / exp is within one ulp: it counts as two roundings. Sums in double
 * add n 2^-53 relative, negligible beside u for the lengths here; each bound says where it is not. Below FLT_MIN
 * (gradual underflow) a rounding errs by up to 2^-150 absolute instead, then scaled by the factors that follow:
 * UNDERFLOW(n, K) adds n 2^-150 K for the bounds whose results can get that small. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/base/kernel_math.h"
#include "core/base/rng.h"
#include "check_main.h"

#define U 0x1p-24
static double gamma_n(int n) { return n * U / (1.0 - n * U); }
#define UNDERFLOW(n, K) ((n)*0x1p-150 * (K))

static float uniform(uint64_t stream, uint64_t index, float scale) {
    return scale * (2.0f * rng_uniform(2024, stream, index) - 1.0f);
}

/* |got - want| <= bound, with the values in the message. */
#define CHECK_WITHIN(what, got, want, bound)                                                                           \
    ck_assert_msg(fabs((double)(got) - (double)(want)) <= (bound),                                                     \
                  "%s: got %.9g, want %.9g, |diff| %.3g > bound %.3g", (what), (double)(got), (double)(want),          \
                  fabs((double)(got) - (double)(want)), (double)(bound))

/* ---- bfloat16 ---- */

/* The nearest bfloat16 by distances in double: the two candidates around |x| (truncated, and one bfloat16 ulp up,
 * that being infinity past the largest finite value, where the distance is to 2^128 as IEEE's overflow rule says),
 * the nearer wins, a tie goes to the even one. Independent of the bias trick in km_bf16_from_float. */
static uint16_t bf16_reference(float x) {
    uint32_t bits = km_float_bits(x), sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
    uint32_t low = magnitude & 0xffff0000u, high = low + 0x10000u;
    double value = fabs((double)x), low_value = (double)km_bits_float(low);
    double high_value = high >= 0x7f800000u ? ldexp(1.0, 128) : (double)km_bits_float(high);
    uint32_t chosen;
    if (value - low_value < high_value - value)
        chosen = low;
    else if (value - low_value > high_value - value)
        chosen = high;
    else
        chosen = (low & 0x10000u) ? high : low; /* the tie: the even one */
    return (uint16_t)((sign | chosen) >> 16);
}

START_TEST(test_bf16_round_to_nearest_even) {
    /* Every sign and exponent and top mantissa bits (the high half), with low halves at and around the tie. */
    const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff, 0x4000, 0xc000};
    long checked = 0;
    for (uint32_t high = 0; high <= 0xffff; high++) {
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
            uint32_t bits = high << 16 | lows[k];
            float x = km_bits_float(bits);
            if (isnan(x)) {
                uint16_t got = km_bf16_from_float(x);
                ck_assert_msg(isnan(km_bf16_to_float(got)) && (got & 0x0040u) && (got >> 15) == (bits >> 31),
                              "NaN 0x%08x -> 0x%04x: must stay a quiet NaN with its sign", bits, got);
                ck_assert_int_eq(km_is_finite(x), 0);
                continue;
            }
            ck_assert_msg(km_bf16_from_float(x) == bf16_reference(x), "0x%08x -> 0x%04x, nearest-even is 0x%04x", bits,
                          km_bf16_from_float(x), bf16_reference(x));
            ck_assert_int_eq(km_is_finite(x), isfinite(x) ? 1 : 0);
            checked++;
        }
    }
    ck_assert_int_gt(checked, 500000);
    /* The ties by name: 1 + 2^-8 to the even 1, 1 + 3 2^-8 to the even 1 + 2^-6. */
    ck_assert_uint_eq(km_bf16_from_float(km_bits_float(0x3f808000u)), 0x3f80);
    ck_assert_uint_eq(km_bf16_from_float(km_bits_float(0x3f818000u)), 0x3f82);
    /* bf16 -> float is exact and round trips; round = the two in a row. */
    for (uint32_t b = 0; b <= 0xffff; b++) {
        float x = km_bf16_to_float((uint16_t)b);
        ck_assert_uint_eq(km_float_bits(x), b << 16);
        if (!isnan(x)) ck_assert_uint_eq(km_float_bits(km_bf16_round(x)), b << 16);
    }
}
END_TEST

/* ---- RMSNorm ---- */

START_TEST(test_rmsnorm_elements) {
    for (int trial = 0; trial < 200; trial++) {
        int C = 1 + trial * 37 % 997;
        float eps = trial % 2 ? 1e-6f : 1e-5f, scale = trial % 3 ? 1.0f : 40.0f;
        float x[1000], w[1000], dy[1000];
        double sum_squares = 0.0, exact_sum = 0.0;
        for (int c = 0; c < C; c++) {
            x[c] = uniform(1, (uint64_t)trial * 1000 + c, scale);
            w[c] = uniform(2, (uint64_t)trial * 1000 + c, 1.5f);
            dy[c] = uniform(3, (uint64_t)trial * 1000 + c, 1.0f);
            sum_squares += km_square(x[c]);
            exact_sum += (double)x[c] * (double)x[c];
        }
        ck_assert(sum_squares == exact_sum); /* each square exact in double: the sum the same as the plain one */
        /* rstd: the double expression (error ~ 4 2^-53, rel) rounded to float once: within u relative. */
        double r_exact = 1.0 / sqrt(exact_sum / C + (double)eps);
        float r = km_rmsnorm_rstd(sum_squares, C, eps);
        CHECK_WITHIN("rstd", r, r_exact, U * r_exact * (1.0 + 1e-9));
        /* y = w (x r), two roundings, r taken as given. */
        for (int c = 0; c < C; c++) {
            double want = (double)w[c] * x[c] * r, m = fabs(want);
            CHECK_WITHIN("rmsnorm scale", km_rmsnorm_scale(x[c], w[c], r), want, gamma_n(2) * m);
        }
        /* Backward against the analytic gradient in double, with the float r: dx_c = r w_c dy_c - x_c r^3/C sum.
         * coefficient: the double sum (exact terms: w dy exact in double, times x one rounding in 2^-53), then
         * dot r r r / C in double, rounded to float once: u relative (plus ~6 2^-53). dx: r w dy (2 roundings),
         * x coefficient (1 rounding on top of the coefficient's u), the subtraction (1): gamma(4) on the magnitude
         * |r w dy| + |x coefficient|. dweight term dy x r: 2 roundings. */
        double dot = 0.0, dot_exact = 0.0;
        for (int c = 0; c < C; c++) {
            dot += km_rmsnorm_dot_term(w[c], dy[c], x[c]);
            dot_exact += (double)w[c] * dy[c] * x[c];
        }
        double coefficient_exact = dot_exact * r * r * r / C;
        float coefficient = km_rmsnorm_coefficient(dot, r, C);
        CHECK_WITHIN("rmsnorm coefficient", coefficient, coefficient_exact,
                     (U + 1e-12 + 8 * C * 0x1p-53) * fabs(coefficient_exact));
        for (int c = 0; c < C; c++) {
            double want = (double)r * w[c] * dy[c] - (double)x[c] * coefficient_exact;
            double m = fabs((double)r * w[c] * dy[c]) + fabs((double)x[c] * coefficient_exact);
            CHECK_WITHIN("rmsnorm dinp", km_rmsnorm_dinp(r, w[c], dy[c], x[c], coefficient), want, gamma_n(4) * m);
            double dw = (double)dy[c] * x[c] * r;
            CHECK_WITHIN("rmsnorm dweight", km_rmsnorm_dweight(dy[c], x[c], r), dw, gamma_n(2) * fabs(dw));
        }
    }
}
END_TEST

/* ---- RoPE ---- */

START_TEST(test_rope_rotation) {
    for (int i = 0; i < 20000; i++) {
        float x1 = uniform(4, i, 3.0f), x2 = uniform(5, i, 3.0f), angle = uniform(6, i, 4000.0f);
        float c = cosf(angle), s = sinf(angle);
        /* Forward against the exact rotation by the float (c, s): two products and a sum, gamma(2) on the
         * magnitude (|x1 c| + |x2 s|); `direction * x2` is exact. */
        float y1 = km_rope_first(x1, x2, c, s, 1.0f), y2 = km_rope_second(x1, x2, c, s, 1.0f);
        double m1 = fabs((double)x1 * c) + fabs((double)x2 * s), m2 = fabs((double)x2 * c) + fabs((double)x1 * s);
        CHECK_WITHIN("rope first", y1, (double)x1 * c - (double)x2 * s, gamma_n(2) * m1);
        CHECK_WITHIN("rope second", y2, (double)x2 * c + (double)x1 * s, gamma_n(2) * m2);
        /* Backward is the forward at -angle, to the bit: (-1 * x2) * (-s) = x2 s exactly. */
        ck_assert(km_float_bits(km_rope_first(x1, x2, c, -s, 1.0f)) ==
                  km_float_bits(km_rope_first(x1, x2, c, s, -1.0f)));
        ck_assert(km_float_bits(km_rope_second(x1, x2, c, -s, 1.0f)) ==
                  km_float_bits(km_rope_second(x1, x2, c, s, -1.0f)));
        /* Orthogonal: backward(forward(x)) = x. With c = cos(1 + d1), s = sin(1 + d2), c^2 + s^2 = 1 + e, |e| <= 2u
         * (+u^2); the forward's error (gamma(2) (|x1| + |x2|) per entry) passes through R^T (sum of both entries:
         * 4u), the backward adds gamma(2) (|y1| + |y2|) <= gamma(2) sqrt(2) (|x1| + |x2|) (1 + 2u): in all
         * (2 + 4 + 2 sqrt 2) u (|x1| + |x2|) < 9u (|x1| + |x2|). */
        float z1 = km_rope_first(y1, y2, c, s, -1.0f), z2 = km_rope_second(y1, y2, c, s, -1.0f);
        double round_trip = 9.0 * U * (1.0 + 1e-6) * (fabs(x1) + fabs(x2));
        CHECK_WITHIN("rope backward(forward) first", z1, x1, round_trip);
        CHECK_WITHIN("rope backward(forward) second", z2, x2, round_trip);
    }
}
END_TEST

/* ---- SiLU, SwiGLU ---- */

START_TEST(test_silu_swiglu) {
    for (int i = 0; i < 20000; i++) {
        float g = uniform(7, i, i % 4 ? 8.0f : 80.0f), up = uniform(8, i, 2.0f), dy = uniform(9, i, 1.0f);
        /* sigmoid: expf (1 ulp: 2 roundings), 1 + e, 1 / that: all terms positive, gamma(4) relative. */
        double e = exp(-(double)g), sigmoid = 1.0 / (1.0 + e);
        float s = km_sigmoid(g);
        CHECK_WITHIN("sigmoid", s, sigmoid, gamma_n(4) * sigmoid);
        /* silu(g) * up: one product on top of sigmoid's 4, one more for up. The argument of expf is exact (-g). */
        double silu = (double)g * sigmoid;
        CHECK_WITHIN("silu", km_silu(g), silu, gamma_n(5) * fabs(silu));
        CHECK_WITHIN("swiglu", km_silu(g) * up, silu * up, gamma_n(6) * fabs(silu * up));
        /* Backward with the float s given: dy up s (1 + g (1 - s)): 1 - s, g (1 - s), 1 + ., and 3 products:
         * gamma(6) on |dy up s| (1 + |g| |1 - s|) (the magnitude; |1 - s| <= 1 + |s|: use 1 + |s|). */
        double dgate = (double)dy * up * s * (1.0 + (double)g * (1.0 - s));
        double m = fabs((double)dy * up * s) * (1.0 + fabs((double)g) * (1.0 + fabs((double)s)));
        /* s can be as small as e^-90: products below FLT_MIN; each later factor is at most K. */
        double K = fmax(1.0, fabs((double)dy)) * fmax(1.0, fabs((double)up)) * (1.0 + fabs((double)g) * (1.0 + s));
        CHECK_WITHIN("swiglu dgate", km_swiglu_dgate(dy, up, s, g), dgate, gamma_n(6) * m + UNDERFLOW(6, K));
        double dup = (double)dy * g * s;
        CHECK_WITHIN("swiglu dup", km_swiglu_dup(dy, g, s), dup, gamma_n(2) * fabs(dup) + UNDERFLOW(2, K));
    }
    /* Past -88.7, expf(-g) overflows: sigmoid is exactly 0 (the true value is below 2^-128) and silu -0. */
    ck_assert(km_sigmoid(-89.0f) == 0.0f && km_silu(-89.0f) == 0.0f && km_sigmoid(89.0f) == 1.0f);
    /* The derivative formula itself (independent of the code): central differences of silu in double at 1e-4
     * agree with s (1 + g (1 - s)) to ~1e-8; checks the formula, not rounding. */
    for (int i = 0; i < 200; i++) {
        double g = uniform(10, i, 6.0f), h = 1e-4;
        double fd = ((g + h) / (1 + exp(-(g + h))) - (g - h) / (1 + exp(-(g - h)))) / (2 * h);
        float s = km_sigmoid((float)g);
        double analytic = km_swiglu_dgate(1.0f, 1.0f, s, (float)g);
        CHECK_WITHIN("silu derivative", analytic, fd, 1e-6 + 1e-6 * fabs(fd));
    }
}
END_TEST

/* ---- softmax and cross-entropy ---- */

START_TEST(test_softmax_pieces) {
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + trial * 53 % 700;
        float scale = trial % 3 ? 4.0f : 60.0f, row[700], max_value = -INFINITY, p[700];
        for (int j = 0; j < n; j++) {
            row[j] = uniform(11, (uint64_t)trial * 1000 + j, scale);
            max_value = km_max(max_value, row[j]);
        }
        double sum = 0.0, largest_gap = 0.0;
        for (int j = 0; j < n; j++) {
            p[j] = km_softmax_exp(row[j], max_value);
            /* expf of the rounded difference: the difference's rounding (u |d|) moves the exponent, then expf
             * (2 roundings): relative u |d| + gamma(2). */
            double d = (double)row[j] - max_value, want = exp(d);
            largest_gap = fmax(largest_gap, fabs(d));
            CHECK_WITHIN("softmax exp", p[j], want, (U * fabs(d) + gamma_n(2)) * want * (1.0 + 1e-6) + UNDERFLOW(2, 1));
            sum += p[j];
        }
        float inverse = km_softmax_inverse(sum);
        double total = 0.0;
        for (int j = 0; j < n; j++) total += p[j] * inverse;
        /* sum_j fl(e_j inv) = (1 + d_inv) sum_j (e_j / S)(1 + d_j): within 2u of 1 whatever the exps' own errors
         * (S is their sum), plus the double sums' n 2^-53 twice. */
        CHECK_WITHIN("softmax sums to 1", total, 1.0, gamma_n(2) + 2 * n * 0x1p-53);
        /* Backward per element: (float)dot, dp - that, p times that: gamma(3) on |p| (|dp| + |dot|). */
        double dot = 0.0;
        for (int j = 0; j < n; j++) {
            float dp = uniform(12, (uint64_t)trial * 1000 + j, 1.0f);
            dot += km_softmax_dot_term(p[j] * inverse, dp);
        }
        for (int j = 0; j < n; j++) {
            float pj = p[j] * inverse, dp = uniform(12, (uint64_t)trial * 1000 + j, 1.0f);
            double want = (double)pj * ((double)dp - dot);
            CHECK_WITHIN("softmax backward", km_softmax_backward(pj, dp, dot), want,
                         gamma_n(3) * fabs((double)pj) * (fabs((double)dp) + fabs(dot)) +
                             UNDERFLOW(3, 1.0 + fabs((double)dp) + fabs(dot)));
        }
        /* Cross-entropy of the row with target t: loss = log sum_j exp(x_j - x_t) in double with exact
         * differences. Ours rounds x_j - max in float: S's relative error <= u * largest |x_j - max| (the sum of
         * positive terms keeps each term's relative error), so log S is off by that, plus double rounding. */
        int target = trial * 7 % n;
        double cross_sum = 0.0, reference = 0.0;
        for (int j = 0; j < n; j++) cross_sum += km_cross_entropy_exp(row[j], max_value);
        double log_sum = km_cross_entropy_log_sum(cross_sum, max_value);
        for (int j = 0; j < n; j++) reference += exp((double)row[j] - (double)row[target]);
        CHECK_WITHIN("cross-entropy loss", log_sum - row[target], log(reference),
                     U * largest_gap * (1.0 + 1e-6) + 1e-13 * (1.0 + fabs(max_value)));
        /* dlogits: each softmax_j (double, then float: u) times inverse_count (u, and its own u): the row sums
         * to 1/count within (3u + the S error above); the target's entry is then lowered by inverse_count. */
        int count = 1 + trial % 9;
        float inverse_count = km_cross_entropy_inverse_count(count);
        CHECK_WITHIN("1/count", inverse_count, 1.0 / count, U / count);
        double dsum = 0.0;
        for (int j = 0; j < n; j++) {
            float d = km_cross_entropy_dlogit(row[j], log_sum, inverse_count);
            ck_assert(d >= 0.0f);
            dsum += d;
        }
        CHECK_WITHIN("dlogits sum to 1/count", dsum, 1.0 / count,
                     (gamma_n(3) + U * largest_gap * (1.0 + 1e-6) + 1e-13 + n * 0x1p-53) / count);
    }
    ck_assert_float_eq(km_max(1.0f, 2.0f), 2.0f);
    ck_assert_float_eq(km_max(-1.0f, -2.0f), -1.0f);
}
END_TEST

/* ---- AdamW ---- */

/* torch's _single_tensor_adam (decoupled weight decay) for one element in double from the same float inputs and
 * scalars: p * decay - step * m / (sqrt(v) / bc2 + eps), m = m + w (g - m), v = beta2 v + (1 - beta2) g^2. */
typedef struct adamw_double {
    double param, exp_avg, exp_avg_sq;
    double update_magnitude; /* |step * m / denom| */
    double sensitivity;      /* |step| / denom: how much an error in m moves the param */
} adamw_double;
static adamw_double adamw_reference(float param, float grad, float exp_avg, float exp_avg_sq, float decay, float w,
                                    float beta2, float one_minus_beta2, float bc2_sqrt, float eps, float nss) {
    adamw_double r;
    r.exp_avg = (double)exp_avg + (double)w * ((double)grad - exp_avg);
    r.exp_avg_sq = (double)beta2 * exp_avg_sq + (double)one_minus_beta2 * grad * grad;
    double denom = sqrt(r.exp_avg_sq) / bc2_sqrt + eps;
    r.param = (double)param * decay + (double)nss * r.exp_avg / denom;
    r.update_magnitude = fabs((double)nss * r.exp_avg / denom);
    r.sensitivity = fabs((double)nss) / denom;
    return r;
}

START_TEST(test_adamw_element) {
    for (int i = 0; i < 50000; i++) {
        float param = uniform(13, i, 1.0f), grad = uniform(14, i, i % 5 ? 0.01f : 3.0f);
        float exp_avg = uniform(15, i, 0.01f), exp_avg_sq = fabsf(uniform(16, i, 1e-4f));
        int step = 1 + i % 1000;
        double lr = i % 2 ? 1e-3 : 3e-4, beta1 = 0.9, beta2 = i % 3 ? 0.999 : 0.95, weight_decay = 0.01;
        float decay = (float)(1.0 - lr * weight_decay), w = (float)(1.0 - beta1);
        if (i % 7 == 0) w = 0.75f; /* lerp's other branch */
        float b2 = (float)beta2, one_minus_b2 = (float)(1.0 - beta2);
        float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step)), eps = 1e-8f;
        float nss = (float)(-lr / (1.0 - pow(beta1, step)));
        km_adamw_result got =
            km_adamw_element(param, grad, exp_avg, exp_avg_sq, decay, w, b2, one_minus_b2, bc2_sqrt, eps, nss);
        adamw_double want =
            adamw_reference(param, grad, exp_avg, exp_avg_sq, decay, w, b2, one_minus_b2, bc2_sqrt, eps, nss);
        /* m = fma(w, g - m0, m0) (first branch) or fma(w - 1, g - m0, g): g - m0 rounded, one fma rounding (w - 1
         * is exact for w in [0.5, 1]): within gamma(2) of |m0| + |w| (|g| + |m0|) (|g| in place of |m0| for the
         * second form, covered by the same sum plus |g|). */
        double m_bound = gamma_n(2) * (fabs((double)exp_avg) + fabs((double)grad) +
                                       fabs((double)w) * (fabs((double)grad) + fabs((double)exp_avg)));
        CHECK_WITHIN("adamw exp_avg", got.exp_avg, want.exp_avg, m_bound);
        /* v = fma((1 - beta2) g, g, v0 beta2): two products rounded, the fma once; all terms >= 0: gamma(2) v. */
        CHECK_WITHIN("adamw exp_avg_sq", got.exp_avg_sq, want.exp_avg_sq, gamma_n(2) * want.exp_avg_sq);
        /* denom = sqrt(v) / bc2 + eps: v's gamma(2) halves under sqrt, then sqrt, divide, add (positive): relative
         * gamma(1) + 3u. The update nss m / denom: 2 roundings, denom's 4u, m's error times |nss| / denom.
         * param = p decay (1 rounding) + update, then 1 rounding: gamma(1) |p decay| + u |param|. */
        double update_bound = gamma_n(7) * want.update_magnitude + want.sensitivity * m_bound;
        double param_bound = gamma_n(1) * fabs((double)param * decay) + update_bound + U * fabs(want.param);
        CHECK_WITHIN("adamw param", got.param, want.param, param_bound * (1.0 + 1e-6));
    }
    /* lerp's ends exactly: weight 0 gives start, weight 1 gives end (the second branch). */
    ck_assert_float_eq(km_lerp_like_torch(0.25f, 7.0f, 0.0f), 0.25f);
    ck_assert_float_eq(km_lerp_like_torch(0.25f, 7.0f, 1.0f), 7.0f);
    /* The padding: zero param and gradient stay zero, and so do the moments. */
    km_adamw_result zero =
        km_adamw_element(0.0f, 0.0f, 0.0f, 0.0f, 0.99999f, 0.1f, 0.999f, 0.001f, 0.0316f, 1e-8f, -1e-3f);
    ck_assert(zero.param == 0.0f && zero.exp_avg == 0.0f && zero.exp_avg_sq == 0.0f);
}
END_TEST

static Suite *kernel_math_suite(void) {
    Suite *suite = suite_create("kernel_math");
    TCase *tc = tcase_create("elements");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bf16_round_to_nearest_even);
    tcase_add_test(tc, test_rmsnorm_elements);
    tcase_add_test(tc, test_rope_rotation);
    tcase_add_test(tc, test_silu_swiglu);
    tcase_add_test(tc, test_softmax_pieces);
    tcase_add_test(tc, test_adamw_element);
    suite_add_tcase(suite, tc);
    return suite;
}

int main(void) { return check_run(kernel_math_suite()); }
