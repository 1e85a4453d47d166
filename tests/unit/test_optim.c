/* test_optim.c: optimizer kernels against hand-computed updates, every compiled body of them
 * against the baseline reference bit for bit, plus the lr schedule, the initial state and add. */
#include "optim.h"
#include "optim_impl.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * Every hand-computed test starts from P0 with zero state and applies GRADS[t - 1] at steps
 * t = 1, 2, 3 with grad_scale 1. The expected values were computed in double precision from
 * the float inputs (0.1f is 0.100000001, 0.9f is 0.899999976), which is why some of them end
 * in ...9999; the arithmetic is written out above each test, rounded for reading.
 *
 * The three elements are repeated LEN times over, so each check covers both the vectorized
 * body of a kernel's loop and its scalar remainder.
 */
#define N 3
#define STEPS 3
#define LEN 37
#define RTOL 1e-6

static const float P0[N] = {0.5f, -1.25f, 2.0f};
static const float GRADS[STEPS][N] = {
    {0.1f, -0.2f, 0.4f},
    {0.2f, -0.1f, 0.3f},
    {0.05f, -0.3f, 0.25f},
};

/* p[LEN] = P0 repeated; s[2 * LEN] = 0. */
static void fill_start(float *p, float *s)
{
    for (size_t i = 0; i < LEN; i++)
        p[i] = P0[i % N];
    memset(s, 0, 2 * LEN * sizeof(float));
}

/* g[LEN] = GRADS[t - 1] repeated, times mult. */
static void fill_grad(float *g, uint64_t t, float mult)
{
    for (size_t i = 0; i < LEN; i++)
        g[i] = GRADS[t - 1][i % N] * mult;
}

/* Three in-place steps from the start; p[LEN], s[2 * LEN] (NULL state for plain SGD). */
static void run_steps(const psk_optim_t *o, float *p, float *s)
{
    float g[LEN];
    float *state = psk_optim_state_count(o->kind) > 0 ? s : NULL;

    fill_start(p, s);
    for (uint64_t t = 1; t <= STEPS; t++) {
        fill_grad(g, t, 1.0f);
        psk_optim_apply_cpu(p, state, p, state, g, 1.0f, LEN, t, o);
    }
}

/* got[LEN] against want[N] repeated: |got - want| <= RTOL * |want|. */
static void expect_close(const char *what, const float *got, const double want[N])
{
    for (size_t i = 0; i < LEN; i++) {
        double w = want[i % N];
        ck_assert_msg(fabs((double)got[i] - w) <= RTOL * fabs(w), "%s[%zu] = %.9g, want %.9g",
                      what, i, (double)got[i], w);
    }
}

/*
 * sgd, lr 0.1: g = grad; p -= 0.1 * g
 *   t1: p = 0.5 - 0.01 = 0.49;         -1.25 + 0.02 = -1.23;  2 - 0.04 = 1.96
 *   t2: p = 0.49 - 0.02 = 0.47;        -1.23 + 0.01 = -1.22;  1.96 - 0.03 = 1.93
 *   t3: p = 0.47 - 0.005 = 0.465;      -1.22 + 0.03 = -1.19;  1.93 - 0.025 = 1.905
 */
START_TEST(test_sgd)
{
    psk_optim_t o = {.kind = PSK_SGD, .lr = 0.1f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.464999999, -1.19, 1.905});
}
END_TEST

/*
 * sgd, lr 0.1, wd 0.01: g = grad + 0.01 * p; p -= 0.1 * g
 *   t1: g = 0.1 + 0.005 = 0.105,          p = 0.5 - 0.0105 = 0.4895
 *       g = -0.2 - 0.0125 = -0.2125,      p = -1.25 + 0.02125 = -1.22875
 *       g = 0.4 + 0.02 = 0.42,            p = 2 - 0.042 = 1.958
 *   t2: g = 0.2 + 0.004895 = 0.204895,    p = 0.4895 - 0.0204895 = 0.4690105
 *       g = -0.1 - 0.0122875 = -0.1122875, p = -1.22875 + 0.01122875 = -1.21752125
 *       g = 0.3 + 0.01958 = 0.31958,      p = 1.958 - 0.031958 = 1.926042
 *   t3: g = 0.05 + 0.004690105 = 0.054690105,   p = 0.4690105 - 0.0054690105 = 0.4635415
 *       g = -0.3 - 0.0121752125 = -0.3121752,   p = -1.21752125 + 0.0312175 = -1.1863037
 *       g = 0.25 + 0.01926042 = 0.26926042,     p = 1.926042 - 0.026926042 = 1.8991160
 */
START_TEST(test_sgd_wd)
{
    psk_optim_t o = {.kind = PSK_SGD, .lr = 0.1f, .weight_decay = 0.01f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.463541488, -1.18630373, 1.89911595});
}
END_TEST

/*
 * momentum 0.9, lr 0.1: v = 0.9 * v + g; p -= 0.1 * v
 *   t1: v = g:                  0.1,  -0.2,  0.4;   p = 0.49, -1.23, 1.96
 *   t2: v = 0.09 + 0.2 = 0.29;  -0.18 - 0.1 = -0.28;  0.36 + 0.3 = 0.66
 *       p = 0.49 - 0.029 = 0.461;  -1.23 + 0.028 = -1.202;  1.96 - 0.066 = 1.894
 *   t3: v = 0.261 + 0.05 = 0.311;  -0.252 - 0.3 = -0.552;  0.594 + 0.25 = 0.844
 *       p = 0.461 - 0.0311 = 0.4299;  -1.202 + 0.0552 = -1.1468;  1.894 - 0.0844 = 1.8096
 */
START_TEST(test_momentum)
{
    psk_optim_t o = {.kind = PSK_MOMENTUM, .lr = 0.1f, .momentum = 0.9f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.429899999, -1.1468, 1.8096});
    expect_close("v", s, (const double[N]){0.310999996, -0.552000005, 0.843999991});
}
END_TEST

/*
 * nesterov, momentum 0.9, lr 0.1, wd 0.01:
 *   g = grad + 0.01 * p; v = 0.9 * v + g; p -= 0.1 * (g + 0.9 * v)
 *   t1: g = 0.105, -0.2125, 0.42; v = g; d = 1.9 * g = 0.1995, -0.40375, 0.798
 *       p = 0.5 - 0.01995 = 0.48005;  -1.25 + 0.040375 = -1.209625;  2 - 0.0798 = 1.9202
 *   t2: g = 0.2 + 0.0048005 = 0.2048005;  -0.1 - 0.01209625 = -0.11209625;
 *         0.3 + 0.019202 = 0.319202
 *       v = 0.0945 + 0.2048005 = 0.2993005;  -0.19125 - 0.11209625 = -0.30334625;
 *         0.378 + 0.319202 = 0.697202
 *       d = 0.2048005 + 0.26937045 = 0.47417095;  -0.11209625 - 0.27301163 = -0.38510788;
 *         0.319202 + 0.6274818 = 0.9466838
 *       p = 0.48005 - 0.047417095 = 0.4326329;  -1.209625 + 0.038510788 = -1.1711142;
 *         1.9202 - 0.09466838 = 1.8255316
 *   t3: g = 0.05 + 0.004326329 = 0.05432633;  -0.3 - 0.011711142 = -0.31171114;
 *         0.25 + 0.018255316 = 0.26825532
 *       v = 0.26937045 + 0.05432633 = 0.32369677;  -0.27301163 - 0.31171114 = -0.58472277;
 *         0.6274818 + 0.26825532 = 0.8957371
 *       d = 0.05432633 + 0.29132709 = 0.34565342;  -0.31171114 - 0.52625049 = -0.83796163;
 *         0.26825532 + 0.80616339 = 1.0744187
 *       p = 0.4326329 - 0.034565342 = 0.3980676;  -1.1711142 + 0.083796163 = -1.0873181;
 *         1.8255316 - 0.10744187 = 1.7180898
 */
START_TEST(test_nesterov)
{
    psk_optim_t o = {.kind = PSK_MOMENTUM,
                     .lr = 0.1f,
                     .momentum = 0.9f,
                     .nesterov = 1,
                     .weight_decay = 0.01f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.398067562, -1.08731805, 1.71808975});
    expect_close("v", s, (const double[N]){0.323696774, -0.58472277, 0.895737105});
}
END_TEST

/*
 * adam, lr 0.01, b1 0.9, b2 0.999, eps 1e-8:
 *   m = 0.9 * m + 0.1 * g; v = 0.999 * v + 0.001 * g^2; bc1 = 1 - 0.9^t; bc2 = 1 - 0.999^t
 *   p -= 0.01 * (m / bc1) / (sqrt(v / bc2) + 1e-8)
 *   t1: bc1 = 0.1, bc2 = 0.001: mhat = g, vhat = g^2, so p moves by 0.01 * sign(g):
 *       m = 0.01, -0.02, 0.04;  v = 1e-5, 4e-5, 1.6e-4;  p = 0.49, -1.24, 1.99
 *   t2: bc1 = 0.19, bc2 = 0.0019990
 *       m = 0.009 + 0.02 = 0.029;  -0.018 - 0.01 = -0.028;  0.036 + 0.03 = 0.066
 *       v = 0.999e-5 + 4e-5 = 4.999e-5;  3.996e-5 + 1e-5 = 4.996e-5;  1.5984e-4 + 9e-5 = 2.4984e-4
 *       mhat = 0.152632, -0.147368, 0.347368;  vhat = 0.0250075, 0.0249925, 0.124982
 *       p = 0.49 - 0.00965182 = 0.4803482;  -1.24 + 0.00932180 = -1.2306782;
 *         1.99 - 0.00982575 = 1.9801743
 *   t3: bc1 = 0.271, bc2 = 0.0029970
 *       m = 0.0261 + 0.005 = 0.0311;  -0.0252 - 0.03 = -0.0552;  0.0594 + 0.025 = 0.0844
 *       v = 4.99400e-5 + 0.25e-5 = 5.24400e-5;  4.99100e-5 + 9e-5 = 1.39910e-4;
 *         2.49590e-4 + 6.25e-5 = 3.12090e-4
 *       mhat = 0.114760, -0.203690, 0.311439;  vhat = 0.0174975, 0.0466834, 0.104134
 *       p = 0.4803482 - 0.00867567 = 0.4716725;  -1.2306782 + 0.00942733 = -1.2212509;
 *         1.9801743 - 0.00965109 = 1.9705232
 */
START_TEST(test_adam)
{
    psk_optim_t o = {.kind = PSK_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.47167251, -1.22125087, 1.97052316});
    expect_close("m", s, (const double[N]){0.031100007, -0.0552000136, 0.0844000192});
    expect_close("v", s + LEN, (const double[N]){5.24393372e-05, 0.000139908249, 0.000312086159});
}
END_TEST

/*
 * adam as above with L2 weight decay 0.1: g = grad + 0.1 * p
 *   t1: g = 0.15, -0.325, 0.6; again p moves by 0.01 * sign(g): p = 0.49, -1.24, 1.99
 *       m = 0.015, -0.0325, 0.06;  v = 2.25e-5, 1.05625e-4, 3.6e-4
 *   t2: g = 0.2 + 0.049 = 0.249;  -0.1 - 0.124 = -0.224;  0.3 + 0.199 = 0.499
 *       m = 0.0135 + 0.0249 = 0.0384;  -0.02925 - 0.0224 = -0.05165;  0.054 + 0.0499 = 0.1039
 *       v = 2.24775e-5 + 6.2001e-5 = 8.44785e-5;  1.05519e-4 + 5.0176e-5 = 1.55695e-4;
 *         3.5964e-4 + 2.49001e-4 = 6.08641e-4
 *       mhat = 0.202105, -0.271842, 0.546842;  vhat = 0.0422604, 0.0778866, 0.304473
 *       p = 0.49 - 0.00983130 = 0.4801687;  -1.24 + 0.00974059 = -1.2302594;
 *         1.99 - 0.00991032 = 1.9800897
 *   t3: g = 0.05 + 0.0480169 = 0.0980169;  -0.3 - 0.1230259 = -0.4230259;
 *         0.25 + 0.1980090 = 0.4480090
 *       m = 0.03456 + 0.00980169 = 0.0443617;  -0.046485 - 0.0423026 = -0.0887876;
 *         0.09351 + 0.0448009 = 0.1383109
 *       mhat = 0.163696, -0.327630, 0.510372;  vhat = 0.0313651, 0.111608, 0.269851
 *       p = 0.4801687 - 0.00924305 = 0.4709257;  -1.2302594 + 0.00980696 = -1.2204525;
 *         1.9800897 - 0.00982483 = 1.9702649
 */
START_TEST(test_adam_wd)
{
    psk_optim_t o = {.kind = PSK_ADAM,
                     .lr = 0.01f,
                     .beta1 = 0.9f,
                     .beta2 = 0.999f,
                     .eps = 1e-8f,
                     .weight_decay = 0.1f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.470925655, -1.22045245, 1.97026485});
    expect_close("m", s, (const double[N]){0.044361697, -0.0887876154, 0.138310928});
    expect_close("v", s + LEN, (const double[N]){9.40001223e-05, 0.00033448634, 0.000808734023});
}
END_TEST

/*
 * adamw, lr 0.01, wd 0.1: p *= 1 - 0.01 * 0.1 = 0.999, then the adam update with g = grad,
 * so m, v and the update sizes are exactly those of test_adam:
 *   t1: p = 0.4995 - 0.01 = 0.4895;  -1.24875 + 0.01 = -1.23875;  1.998 - 0.01 = 1.988
 *   t2: p = 0.4890105 - 0.00965182 = 0.4793587;  -1.2375113 + 0.00932180 = -1.2281895;
 *         1.986012 - 0.00982575 = 1.9761863
 *   t3: p = 0.4788793 - 0.00867567 = 0.4702037;  -1.2269613 + 0.00942733 = -1.2175339;
 *         1.9742101 - 0.00965109 = 1.9645590
 */
START_TEST(test_adamw)
{
    psk_optim_t o = {.kind = PSK_ADAMW,
                     .lr = 0.01f,
                     .beta1 = 0.9f,
                     .beta2 = 0.999f,
                     .eps = 1e-8f,
                     .weight_decay = 0.1f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.470203651, -1.21753393, 1.96455897});
    expect_close("m", s, (const double[N]){0.031100007, -0.0552000136, 0.0844000192});
    expect_close("v", s + LEN, (const double[N]){5.24393372e-05, 0.000139908249, 0.000312086159});
}
END_TEST

/*
 * adagrad, lr 0.1, eps 1e-10: sum += g * g;  p -= 0.1 * g / (sqrt(sum) + eps)
 *   t1: sum = 0.01, 0.04, 0.16;  each update is 0.1 * sign(g): p = 0.4, -1.15, 1.9
 *   t2: sum = 0.05, 0.05, 0.25;  updates 0.0894427, -0.0447214, 0.06:
 *       p = 0.3105573, -1.1052786, 1.84
 *   t3: sum = 0.0525, 0.14, 0.3125;  updates 0.0218218, -0.0801784, 0.0447214:
 *       p = 0.2887355, -1.0251003, 1.7952786
 */
START_TEST(test_adagrad)
{
    psk_optim_t o = {.kind = PSK_ADAGRAD, .lr = 0.1f, .eps = 1e-10f};
    float p[LEN], s[2 * LEN];
    run_steps(&o, p, s);
    expect_close("p", p, (const double[N]){0.288735489, -1.02510026, 1.79527864});
    expect_close("sum", s, (const double[N]){0.0525000016, 0.140000009, 0.312500012});
}
END_TEST

/*
 * adagrad, lr 0.1, weight decay 0.1, lr_decay 0.5, initial accumulator 0.1:
 * clr = 0.1 / (1 + (t - 1) * 0.5) = 0.1, 0.0666667, 0.05;  g = grad + 0.1 * p
 *   t1: g = 0.15, -0.325, 0.6;  sum = 0.1225, 0.205625, 0.46;
 *       updates 0.0428571, -0.0716713, 0.0884652: p = 0.4571429, -1.1783287, 1.9115348
 *   t2: g = 0.2457143, -0.2178329, 0.4911535;  sum = 0.1828755, 0.2530762, 0.7012318;
 *       updates 0.0383055, -0.0288673, 0.0391017: p = 0.4188373, -1.1494614, 1.8724332
 *   t3: g = 0.0918837, -0.4149461, 0.4372433;  sum = 0.1913181, 0.4252565, 0.8924135;
 *       updates 0.0105034, -0.0318153, 0.0231425: p = 0.4083339, -1.1176460, 1.8492907
 */
START_TEST(test_adagrad_decays)
{
    psk_optim_t o = {.kind = PSK_ADAGRAD,
                     .lr = 0.1f,
                     .eps = 1e-10f,
                     .weight_decay = 0.1f,
                     .lr_decay = 0.5f,
                     .initial_accumulator = 0.1f};
    float p[LEN], s[2 * LEN], g[LEN];
    fill_start(p, s);
    psk_optim_state_init_cpu(s, LEN, &o);
    for (size_t i = 0; i < LEN; i++)
        ck_assert_float_eq(s[i], 0.1f);
    ck_assert_float_eq(s[LEN], 0.0f); /* one state array: nothing past it written */
    for (uint64_t t = 1; t <= STEPS; t++) {
        fill_grad(g, t, 1.0f);
        psk_optim_apply_cpu(p, s, p, s, g, 1.0f, LEN, t, &o);
    }
    expect_close("p", p, (const double[N]){0.408333918, -1.11764603, 1.84929067});
    expect_close("sum", s, (const double[N]){0.191318135, 0.425256471, 0.89241349});
}
END_TEST

/* mean: the new params are grad * scale whatever the old ones were (they are not read: NaN in
 * them changes nothing), in place and out of place; no state. */
START_TEST(test_mean)
{
    const psk_optim_t o = {.kind = PSK_MEAN, .lr = 0.5f, .weight_decay = 0.1f};
    float p_in[LEN], p_out[LEN], g[LEN];
    ck_assert_int_eq(psk_optim_state_count(PSK_MEAN), 0);
    /* Its records hold gradients, not a model: a store made with it opens with no other. */
    ck_assert_str_eq(psk_optim_state_name(PSK_MEAN), "mean gradients, no model");
    for (uint64_t t = 1; t <= STEPS; t++) {
        fill_grad(g, t, 1.0f);
        for (size_t i = 0; i < LEN; i++) {
            p_in[i] = NAN;
            p_out[i] = -7.0f;
        }
        psk_optim_apply_cpu(p_out, NULL, p_in, NULL, g, 1.0f / 3.0f, LEN, t, &o);
        for (size_t i = 0; i < LEN; i++) {
            ck_assert(isnan(p_in[i]));
            ck_assert_float_eq(p_out[i], g[i] * (1.0f / 3.0f));
        }
        psk_optim_apply_cpu(p_in, NULL, p_in, NULL, g, 0.5f, LEN, t, &o);
        for (size_t i = 0; i < LEN; i++)
            ck_assert_float_eq(p_in[i], g[i] * 0.5f);
    }
}
END_TEST

/* Every optimizer's state before step 1: zeros, adagrad's initial accumulator. */
START_TEST(test_state_init)
{
    for (int k = 0; k < PSK_OPTIM_KINDS; k++) {
        psk_optim_t o = {.kind = (psk_optim_kind_t)k, .initial_accumulator = 0.25f};
        float s[2 * LEN + 1];
        for (size_t i = 0; i < 2 * LEN + 1; i++)
            s[i] = -7.0f;
        psk_optim_state_init_cpu(s, LEN, &o);
        size_t n = (size_t)psk_optim_state_count(o.kind) * LEN;
        for (size_t i = 0; i < n; i++)
            ck_assert_float_eq(s[i], k == PSK_ADAGRAD ? 0.25f : 0.0f);
        for (size_t i = n; i < 2 * LEN + 1; i++)
            ck_assert_float_eq(s[i], -7.0f);
    }
}
END_TEST

/* One optimizer of each kind, with every term (weight decay, nesterov) switched on. */
static const psk_optim_t KINDS[] = {
    {.kind = PSK_SGD, .lr = 0.1f, .weight_decay = 0.01f},
    {.kind = PSK_MOMENTUM, .lr = 0.1f, .momentum = 0.9f, .nesterov = 1, .weight_decay = 0.01f},
    {.kind = PSK_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
     .weight_decay = 0.1f},
    {.kind = PSK_ADAMW, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
     .weight_decay = 0.1f},
    {.kind = PSK_ADAGRAD, .lr = 0.1f, .eps = 1e-10f, .weight_decay = 0.01f, .lr_decay = 0.1f},
    {.kind = PSK_MEAN, .lr = 0.1f}, /* lr unused */
};

/* Out of place (alternating between two buffer pairs) gives the in-place bits exactly. */
START_TEST(test_in_place_matches_out_of_place)
{
    const psk_optim_t *o = &KINDS[_i];
    size_t k = (size_t)psk_optim_state_count(o->kind);
    float p_ref[LEN], s_ref[2 * LEN], pa[LEN], sa[2 * LEN], pb[LEN], sb[2 * LEN], g[LEN];

    fill_start(p_ref, s_ref);
    fill_start(pa, sa);
    memset(sb, 0, sizeof sb);
    for (uint64_t t = 1; t <= STEPS; t++) {
        fill_grad(g, t, 1.0f);
        psk_optim_apply_cpu(p_ref, s_ref, p_ref, s_ref, g, 1.0f, LEN, t, o);

        /* Odd steps go a -> b, even steps b -> a; the inputs must survive untouched. */
        float *p_from = t % 2 ? pa : pb, *s_from = t % 2 ? sa : sb;
        float *p_to = t % 2 ? pb : pa, *s_to = t % 2 ? sb : sa;
        float p_keep[LEN], s_keep[2 * LEN];
        memcpy(p_keep, p_from, sizeof p_keep);
        memcpy(s_keep, s_from, sizeof s_keep);
        psk_optim_apply_cpu(p_to, s_to, p_from, s_from, g, 1.0f, LEN, t, o);
        ck_assert_mem_eq(p_from, p_keep, sizeof p_keep);
        ck_assert_mem_eq(s_from, s_keep, sizeof s_keep);
        ck_assert_mem_eq(p_to, p_ref, sizeof p_ref);
        ck_assert_mem_eq(s_to, s_ref, k * LEN * sizeof(float));
    }
}
END_TEST

/* grad_scale 0.5 on the summed gradient gives the bits of the halved gradient at scale 1. */
START_TEST(test_grad_scale)
{
    const psk_optim_t *o = &KINDS[_i];
    float pa[LEN], sa[2 * LEN], pb[LEN], sb[2 * LEN], g[LEN];

    fill_start(pa, sa);
    fill_start(pb, sb);
    for (uint64_t t = 1; t <= STEPS; t++) {
        fill_grad(g, t, 1.0f);
        psk_optim_apply_cpu(pa, sa, pa, sa, g, 0.5f, LEN, t, o);
        fill_grad(g, t, 0.5f);
        psk_optim_apply_cpu(pb, sb, pb, sb, g, 1.0f, LEN, t, o);
    }
    ck_assert_mem_eq(pa, pb, sizeof pa);
    ck_assert_mem_eq(sa, sb, sizeof sa);
}
END_TEST

/*
 * Every body of the loops (AVX2 where built and the CPU has it) against the baseline reference,
 * byte for byte, on random data: each optimizer, in place and out of place, contiguous and
 * strided state, one buffer shared and the other not, misaligned starts, lengths covering the
 * vector loops' bodies and remainders, and several step numbers. Where no other body is
 * available the reference is compared with itself.
 */
static const psk_optim_t BODY_KINDS[] = {
    {.kind = PSK_SGD, .lr = 0.1f},
    {.kind = PSK_SGD, .lr = 0.1f, .weight_decay = 0.01f},
    {.kind = PSK_MOMENTUM, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f},
    {.kind = PSK_MOMENTUM, .lr = 0.1f, .momentum = 0.9f, .nesterov = 1, .weight_decay = 0.01f},
    {.kind = PSK_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
    {.kind = PSK_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
     .weight_decay = 0.1f},
    {.kind = PSK_ADAMW, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
     .weight_decay = 0.1f},
    {.kind = PSK_ADAGRAD, .lr = 0.1f, .eps = 1e-10f},
    {.kind = PSK_ADAGRAD, .lr = 0.1f, .eps = 1e-10f, .weight_decay = 0.1f, .lr_decay = 0.5f},
    {.kind = PSK_MEAN},
};

/* Which buffers a call shares between its input and output (see psk_optim_apply_cpu). */
enum { BOTH_IN_PLACE, OUT_OF_PLACE, P_SHARED, S_SHARED, NLAYOUTS };

#define BODY_MAXN 4099
#define BODY_PAD 5 /* floats between strided state arrays */
#define BODY_OFF 1 /* misaligned start, in floats */
/* p_in, s_in, p_out, s_out and grad, each sized for the longest strided case. */
#define BODY_SLOT (BODY_OFF + 2 * (BODY_MAXN + BODY_PAD) + 16)

static uint64_t rng_state;

/* Uniform in [lo, hi) from xorshift64*. */
static float rnd(float lo, float hi)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)(r >> 40) / (float)(1u << 24);
}

/* One call of body on a copy of the random start in buf[5 * BODY_SLOT]; the whole buffer after
 * it (outputs, untouched inputs and padding) is what the bodies must agree on. */
static void run_body(psk__optim_body_t body, float *buf, const float *start, const psk_optim_t *o,
                     int layout, size_t n, size_t stride, uint64_t t, float scale)
{
    memcpy(buf, start, 5 * BODY_SLOT * sizeof(float));
    float *p_in = buf + BODY_OFF, *s_in = buf + BODY_SLOT + BODY_OFF;
    float *p_out = buf + 2 * BODY_SLOT + BODY_OFF, *s_out = buf + 3 * BODY_SLOT + BODY_OFF;
    const float *g = buf + 4 * BODY_SLOT + BODY_OFF;
    if (layout == BOTH_IN_PLACE || layout == P_SHARED) p_out = p_in;
    if (layout == BOTH_IN_PLACE || layout == S_SHARED) s_out = s_in;
    int k = psk_optim_state_count(o->kind);
    psk__optim_apply_body(body, p_out, k ? s_out : NULL, p_in, k ? s_in : NULL, g, scale, n,
                          stride, t, o);
}

START_TEST(test_bodies_identical)
{
    static const size_t lens[] = {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 1000, BODY_MAXN};
    static const uint64_t steps[] = {1, 2, 10, 1000};
    const psk_optim_t *o = &BODY_KINDS[_i];
    float *start = malloc(5 * BODY_SLOT * sizeof(float));
    float *ref = malloc(5 * BODY_SLOT * sizeof(float));
    float *got = malloc(5 * BODY_SLOT * sizeof(float));
    ck_assert_ptr_nonnull(start);
    ck_assert_ptr_nonnull(ref);
    ck_assert_ptr_nonnull(got);

    /* Params, gradients and state of either sign, some exact zeros; Adam's v and Adagrad's sum
     * (made >= 0 below where each call's stride puts them) would otherwise give NaN, equal in
     * every body. */
    rng_state = 0x9E3779B97F4A7C15ull + (uint64_t)_i;
    for (size_t j = 0; j < 5 * BODY_SLOT; j++)
        start[j] = j % 97 == 0 ? 0.0f : rnd(-2.0f, 2.0f);

    int nbodies = 0;
    for (int b = PSK__OPTIM_BASE; b <= PSK__OPTIM_AVX2; b++) {
        if (!psk__optim_body_available((psk__optim_body_t)b)) continue;
        nbodies++;
        for (int layout = 0; layout < NLAYOUTS; layout++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int strided = 0; strided < 2; strided++)
                    for (size_t ti = 0; ti < sizeof steps / sizeof steps[0]; ti++) {
                        size_t n = lens[li];
                        size_t stride = strided ? BODY_MAXN + BODY_PAD : n;
                        float scale = ti % 2 ? 1.0f : 1.0f / 3.0f;
                        /* The square-rooted state: adagrad's first array, adam's second. */
                        size_t sq = o->kind == PSK_ADAGRAD ? 0 : stride;
                        for (size_t j = 0; j < n; j++)
                            for (int slot = 1; slot <= 3; slot += 2) {
                                float *v = &start[slot * BODY_SLOT + BODY_OFF + sq + j];
                                *v = fabsf(*v) * 0.01f;
                            }
                        run_body(PSK__OPTIM_BASE, ref, start, o, layout, n, stride, steps[ti],
                                 scale);
                        run_body((psk__optim_body_t)b, got, start, o, layout, n, stride,
                                 steps[ti], scale);
                        size_t bad = 0;
                        while (bad < 5 * BODY_SLOT &&
                               memcmp(&ref[bad], &got[bad], sizeof(float)) == 0)
                            bad++;
                        ck_assert_msg(bad == 5 * BODY_SLOT,
                                      "body %d, layout %d, n %zu, stride %zu, t %llu: float %zu "
                                      "is %.9g, reference %.9g",
                                      b, layout, n, stride, (unsigned long long)steps[ti], bad,
                                      (double)got[bad], (double)ref[bad]);
                    }
    }
    /* The dispatched entry point uses one of the available bodies. */
    ck_assert(psk__optim_body_available(psk__optim_body_chosen()));
    ck_assert_int_ge(nbodies, 1);
    free(start);
    free(ref);
    free(got);
}
END_TEST

START_TEST(test_state_count)
{
    ck_assert_int_eq(psk_optim_state_count(PSK_SGD), 0);
    ck_assert_int_eq(psk_optim_state_count(PSK_MOMENTUM), 1);
    ck_assert_int_eq(psk_optim_state_count(PSK_ADAM), 2);
    ck_assert_int_eq(psk_optim_state_count(PSK_ADAMW), 2);
    ck_assert_int_eq(psk_optim_state_count(PSK_ADAGRAD), 1);
    ck_assert_int_eq(psk_optim_state_count(PSK_MEAN), 0);
    ck_assert_int_eq(psk_optim_state_count((psk_optim_kind_t)PSK_OPTIM_KINDS), -1);
}
END_TEST

/* |got - want| <= RTOL * |want| for a scalar. */
static void expect_lr(float got, double want)
{
    ck_assert_msg(fabs((double)got - want) <= RTOL * fabs(want), "lr = %.9g, want %.9g",
                  (double)got, want);
}

START_TEST(test_lr_constant)
{
    /* Schedule 0 ignores min_lr, warm-up and decay. */
    expect_lr(psk_lr_at(0, 0.1f, 0.01f, 10, 100, 0), 0.1f);
    expect_lr(psk_lr_at(0, 0.1f, 0.01f, 10, 100, 57), 0.1f);
    expect_lr(psk_lr_at(0, 0.1f, 0.01f, 10, 100, 1000), 0.1f);
}
END_TEST

/* lr 1, min_lr 0.1, 4 warm-up steps, cosine decay until step 14 (10 steps of decay). */
START_TEST(test_lr_warmup)
{
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 0), 0.25); /* 1 * (0 + 1) / 4 */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 1), 0.5);  /* 1 * (1 + 1) / 4 */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 2), 0.75); /* 1 * (2 + 1) / 4 */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 3), 1.0);  /* last warm-up step reaches lr */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 4), 1.0);  /* progress 0: cos 0 = 1 */
}
END_TEST

START_TEST(test_lr_cosine)
{
    /* Step 9: progress (9 - 4) / 10 = 0.5; 0.1 + 0.5 * 0.9 * (1 + cos(pi / 2)) = 0.55. */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 9), 0.55f);
    /* No warm-up, decay over 8 steps, step 2: progress 0.25;
     * 0.1 + 0.45 * (1 + cos(pi / 4)) = 0.1 + 0.45 * 1.70710678 = 0.868198052. */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 0, 8, 2), 0.868198052);
    /* Step 14: progress 1; 0.1 + 0.45 * (1 + cos(pi)) = min_lr. */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 14), 0.1f);
}
END_TEST

START_TEST(test_lr_after_decay)
{
    /* Past decay_steps, progress is clamped to 1: min_lr for good. */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 15), 0.1f);
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 14, 1000000), 0.1f);
    /* decay_steps <= warmup_steps means no decay: lr after the warm-up. */
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 0, 10), 1.0);
    expect_lr(psk_lr_at(1, 1.0f, 0.1f, 4, 4, 10), 1.0);
}
END_TEST

START_TEST(test_add)
{
    float out[LEN], in[LEN];
    for (size_t i = 0; i < LEN; i++) {
        out[i] = (float)i;
        in[i] = 0.25f * (float)i - 3.0f;
    }
    psk_add_cpu(out, in, LEN);
    for (size_t i = 0; i < LEN; i++)
        ck_assert_float_eq(out[i], 1.25f * (float)i - 3.0f); /* exact: quarters of small ints */
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("optim");
    const int nkinds = (int)(sizeof KINDS / sizeof KINDS[0]);

    TCase *tc = tcase_create("sgd");
    tcase_add_test(tc, test_sgd);
    tcase_add_test(tc, test_sgd_wd);
    suite_add_tcase(s, tc);

    tc = tcase_create("momentum");
    tcase_add_test(tc, test_momentum);
    tcase_add_test(tc, test_nesterov);
    suite_add_tcase(s, tc);

    tc = tcase_create("adam");
    tcase_add_test(tc, test_adam);
    tcase_add_test(tc, test_adam_wd);
    tcase_add_test(tc, test_adamw);
    suite_add_tcase(s, tc);

    tc = tcase_create("adagrad");
    tcase_add_test(tc, test_adagrad);
    tcase_add_test(tc, test_adagrad_decays);
    tcase_add_test(tc, test_state_init);
    tcase_add_test(tc, test_mean);
    suite_add_tcase(s, tc);

    tc = tcase_create("aliasing");
    tcase_add_loop_test(tc, test_in_place_matches_out_of_place, 0, nkinds);
    suite_add_tcase(s, tc);

    tc = tcase_create("grad_scale");
    tcase_add_loop_test(tc, test_grad_scale, 0, nkinds);
    suite_add_tcase(s, tc);

    tc = tcase_create("bodies");
    tcase_add_loop_test(tc, test_bodies_identical, 0,
                        (int)(sizeof BODY_KINDS / sizeof BODY_KINDS[0]));
    suite_add_tcase(s, tc);

    tc = tcase_create("state_count");
    tcase_add_test(tc, test_state_count);
    suite_add_tcase(s, tc);

    tc = tcase_create("lr_schedule");
    tcase_add_test(tc, test_lr_constant);
    tcase_add_test(tc, test_lr_warmup);
    tcase_add_test(tc, test_lr_cosine);
    tcase_add_test(tc, test_lr_after_decay);
    suite_add_tcase(s, tc);

    tc = tcase_create("add");
    tcase_add_test(tc, test_add);
    suite_add_tcase(s, tc);

    return s;
}
