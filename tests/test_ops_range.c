/* Range reference kernels (ops/reference/range.c): zero, copy, scale, cast,
 * EMA and NaN check by hand; the FP16 <-> FP32 cast exhaustively against an
 * independent double-precision rounding; SGD and AdamW over several steps
 * against double re-implementations of PyTorch's formulas; LARS by hand
 * (zero-norm and empty segments) and over steps; slot padding inside a span
 * staying zero; refusals with their reasons. Mixed precision: unscale
 * (exact values, Inf/NaN, the run-time scale check), the loss-scale update
 * (growth at the interval, backoff, no growth to Inf, a static scale, the
 * counts), the skip input of every update and of EMA (a skipped step
 * leaves every output byte as it was; skip 0 gives the bits of no skip). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "ops_ref_util.h"

#define FP32 BP_ABI_DTYPE_FP32
#define FP16 BP_ABI_DTYPE_FP16
#define INT32 BP_ABI_DTYPE_INT32

static tt span(int32_t dtype, int64_t elements) { return tt_new(dtype, 1, 1, 1, elements, 0); }
static float *f32(const tt *t) { return (float *)t->data; }
static uint16_t *u16(const tt *t) { return (uint16_t *)t->data; }

static tt scalar(float v) {
  tt t = span(FP32, 1);
  f32(&t)[0] = v;
  return t;
}

/* ---- zero, copy, scale, ema --------------------------------------------- */

START_TEST(zero_any_dtype) {
  static const int32_t dtypes[] = {BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16, BP_ABI_DTYPE_INT8,
                                   BP_ABI_DTYPE_INT32, BP_ABI_DTYPE_BF16};
  static const size_t bytes[] = {4, 2, 1, 4, 2};
  for (int d = 0; d < 5; d++) {
    tt x = span(dtypes[d], 13);
    memset(x.data, 0x77, 13 * bytes[d]);
    ops_call c = {"range.zero", {NULL}, {&x}, 0, 1, NULL, 0};
    ops_run(&c);
    for (size_t b = 0; b < 13 * bytes[d]; b++)
      ck_assert_msg(((unsigned char *)x.data)[b] == 0, "dtype %d byte %zu", dtypes[d], b);
    ck_assert_msg(tt_padding_intact(&x), "dtype %d: the tail was written", dtypes[d]);
    tt_free(&x);
  }
}
END_TEST

START_TEST(copy_keeps_bits) {
  tt src = span(FP32, 9), dst = span(FP32, 9);
  for (int i = 0; i < 9; i++) f32(&src)[i] = (float)i - 4.5f;
  f32(&src)[3] = float_of(0x7fa00001u); /* a signalling NaN with a payload */
  f32(&src)[5] = -0.0f;
  ops_call c = {"range.copy", {&src}, {&dst}, 1, 1, NULL, 0};
  ops_run(&c);
  ck_assert_int_eq(memcmp(src.data, dst.data, 9 * sizeof(float)), 0);
  ck_assert(tt_padding_intact(&dst) && tt_padding_intact(&src));
  tt hs = span(FP16, 7), hd = span(FP16, 7);
  for (int i = 0; i < 7; i++) u16(&hs)[i] = (uint16_t)(0x3c00 + 17 * i);
  ops_call ch = {"range.copy", {&hs}, {&hd}, 1, 1, NULL, 0};
  ops_run(&ch);
  ck_assert_int_eq(memcmp(hs.data, hd.data, 7 * sizeof(uint16_t)), 0);
  ck_assert(tt_padding_intact(&hd));
  tt_free(&src), tt_free(&dst), tt_free(&hs), tt_free(&hd);
}
END_TEST

START_TEST(scale_by_hand) {
  tt x = span(FP32, 5), y = span(FP32, 5);
  tt_set(&x, (const float[]){1, -2, 0.5f, 3, 0});
  bp_range_attrs a = {0.25f, 0, 0};
  /* out of place, then in place (output 0 is input 0) */
  ops_call c = {"range.scale", {&x}, {&y}, 1, 1, &a, sizeof a};
  ops_run(&c);
  ops_expect_close(&y, (const float[]){0.25f, -0.5f, 0.125f, 0.75f, 0}, 0, "y");
  ops_call ip = {"range.scale", {&x}, {&x}, 1, 1, &a, sizeof a};
  ops_run(&ip);
  ops_expect_close(&x, (const float[]){0.25f, -0.5f, 0.125f, 0.75f, 0}, 0, "x");
  ck_assert(tt_padding_intact(&x) && tt_padding_intact(&y));
  tt_free(&x), tt_free(&y);
}
END_TEST

START_TEST(ema_by_hand) {
  tt w = span(FP32, 3), e = span(FP32, 3);
  tt_set(&w, (const float[]){11, 2, -10});
  tt_set(&e, (const float[]){1, 2, 0});
  bp_range_attrs a = {0, 0.75f, 0}; /* 0.75 and 0.25: every product exact */
  ops_call c = {"range.ema", {&w}, {&e}, 1, 1, &a, sizeof a};
  ops_run(&c);
  /* 0.75*1 + 0.25*11 = 3.5; 0.75*2 + 0.25*2 = 2; 0 + 0.25*-10 = -2.5 */
  ops_expect_close(&e, (const float[]){3.5f, 2, -2.5f}, 0, "e");
  a.decay = 0.9f; /* 1 - decay is rounded once: 0.9f*e + 0.1f*w */
  ops_run(&c);
  const float d = 0.9f, od = (float)(1.0 - (double)0.9f);
  ops_expect_close(&e, (const float[]){d * 3.5f + od * 11, d * 2 + od * 2, d * -2.5f + od * -10},
                   1e-6, "e (0.9)");
  a.decay = 1.0f; /* e stays */
  ops_call c1 = c;
  ops_run(&c1);
  ops_expect_close(&e, (const float[]){d * 3.5f + od * 11, d * 2 + od * 2, d * -2.5f + od * -10},
                   1e-6, "e (1)");
  a.decay = 0.0f; /* e = w */
  ops_run(&c1);
  ops_expect_close(&e, (const float[]){11, 2, -10}, 0, "e (0)");
  ck_assert(tt_padding_intact(&e));
  tt_free(&w), tt_free(&e);
}
END_TEST

/* ---- nan_check ---------------------------------------------------------- */

START_TEST(nan_check_finds_one_anywhere) {
  enum { N = 37 };
  tt x = span(FP32, N), h = span(FP16, N), flag = scalar(0);
  ops_call c = {"range.nan_check", {&x}, {&flag}, 1, 1, NULL, 0};
  ops_call ch = {"range.nan_check", {&h}, {&flag}, 1, 1, NULL, 0};
  for (int i = 0; i < N; i++) {
    f32(&x)[i] = i % 2 ? FLT_MAX : -FLT_MAX * 0.5f; /* large, finite */
    u16(&h)[i] = i % 2 ? 0x7bff : 0xfbff;           /* +-65504 */
  }
  f32(&x)[4] = FLT_MIN * 0.25f; /* a subnormal */
  u16(&h)[4] = 0x0001;
  /* nothing to find: the flag keeps whatever it held */
  const float held[] = {0.0f, 1.0f, 0.5f};
  for (int k = 0; k < 3; k++) {
    f32(&flag)[0] = held[k];
    ops_run(&c);
    ck_assert_float_eq(f32(&flag)[0], held[k]);
    ops_run(&ch);
    ck_assert_float_eq(f32(&flag)[0], held[k]);
  }
  const uint32_t specials32[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f800000u, 0xff800000u};
  const uint16_t specials16[] = {0x7e00, 0xfe00, 0x7c01, 0x7c00, 0xfc00};
  for (int s = 0; s < 5; s++)
    for (int i = 0; i < N; i++) {
      const float keep = f32(&x)[i];
      const uint16_t keep16 = u16(&h)[i];
      f32(&x)[i] = float_of(specials32[s]);
      f32(&flag)[0] = 0.0f;
      ops_run(&c);
      ck_assert_msg(f32(&flag)[0] == 1.0f, "fp32 special %08x at %d missed", specials32[s], i);
      f32(&x)[i] = keep;
      u16(&h)[i] = specials16[s];
      f32(&flag)[0] = 0.0f;
      ops_run(&ch);
      ck_assert_msg(f32(&flag)[0] == 1.0f, "fp16 special %04x at %d missed", specials16[s], i);
      u16(&h)[i] = keep16;
    }
  ck_assert(tt_padding_intact(&flag));
  tt_free(&x), tt_free(&h), tt_free(&flag);
}
END_TEST

/* ---- cast --------------------------------------------------------------- */

/* fp16 bits to their value, from the definition. */
static double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = ldexp(mant, -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

/* fp32 to fp16 bits, rounded with nearbyint in double (the default mode
 * rounds to nearest, ties to even): an oracle written differently from the
 * kernel's bit manipulation. NaN: any NaN of the same sign is accepted by
 * the caller. */
static uint16_t half_oracle(float f) {
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  const double a = fabs((double)f);
  if (isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* 1024 is 2^-14: 0x0400 */
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  const double q = nearbyint(ldexp(a, 11 - e)); /* in [1024, 2048] */
  return sign | (uint16_t)(((e + 14) << 10) + (int)q - 1024); /* 2048 carries into the exponent */
}

static void cast_f32_to_f16(const float *values, int64_t n, uint16_t *out) {
  tt src = span(FP32, n), dst = span(FP16, n);
  memcpy(src.data, values, (size_t)n * sizeof(float));
  ops_call c = {"range.cast", {&src}, {&dst}, 1, 1, NULL, 0};
  ops_run(&c);
  ck_assert(tt_padding_intact(&dst));
  memcpy(out, dst.data, (size_t)n * sizeof(uint16_t));
  tt_free(&src), tt_free(&dst);
}

/* Hot checks abort only on failure: a passing ck_assert is a message to
 * Check's parent process. */
static void expect_half(float f, uint16_t got, uint16_t want) {
  if (isnan(f)) {
    if (!((got & 0x7c00) == 0x7c00 && (got & 0x3ff) && (got & 0x8000) == (want & 0x8000)))
      ck_abort_msg("NaN %08x -> %04x is no NaN of that sign", bits_of(f), got);
    return;
  }
  if (got != want)
    ck_abort_msg("%a (%08x) -> %04x, expected %04x", (double)f, bits_of(f), got, want);
}

START_TEST(cast_fp16_round_trip_exhaustive) {
  /* all 65536 halves: exact values in fp32, and back to the same bits
   * (NaNs come out quiet: a signalling one returns with its quiet bit set;
   * the rules are abi/bp_abi_sdk.h's, tested further in test_sdk.c) */
  enum { N = 65536 };
  tt h = span(FP16, N), f = span(FP32, N), back = span(FP16, N);
  for (int i = 0; i < N; i++) u16(&h)[i] = (uint16_t)i;
  ops_call to32 = {"range.cast", {&h}, {&f}, 1, 1, NULL, 0};
  ops_call to16 = {"range.cast", {&f}, {&back}, 1, 1, NULL, 0};
  ops_run(&to32);
  ops_run(&to16);
  for (int i = 0; i < N; i++) {
    const double want = half_value((uint16_t)i);
    const float got = f32(&f)[i];
    if (isnan(want)) {
      /* sign and the 10 payload bits on top of the float's payload, quiet */
      const uint32_t nan_bits = ((uint32_t)(i & 0x8000) << 16) | 0x7fc00000u |
                                ((uint32_t)(i & 0x3ff) << 13);
      if (bits_of(got) != nan_bits)
        ck_abort_msg("%04x -> %08x, expected the NaN %08x", i, bits_of(got), nan_bits);
    } else if (!((double)got == want && !signbit(got) == !signbit(want))) {
      ck_abort_msg("%04x -> %a, expected %a", i, (double)got, want);
    }
    const int snan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) && !(i & 0x200);
    if (u16(&back)[i] != (snan ? (i | 0x200) : i))
      ck_abort_msg("%04x -> %08x -> %04x", i, bits_of(got), u16(&back)[i]);
  }
  ck_assert(tt_padding_intact(&f) && tt_padding_intact(&back));
  tt_free(&h), tt_free(&f), tt_free(&back);
}
END_TEST

START_TEST(cast_fp32_to_fp16_by_hand) {
  const float in[] = {
      1.0f,
      1.0f + 0x1p-11f,          /* midpoint of 1 and 1+2^-10: ties to the even 1 */
      1.0f + 3 * 0x1p-11f,      /* midpoint of 1+2^-10 and 1+2^-9: to the even 1+2^-9 */
      1.0f + 0x1p-11f + 0x1p-23f, /* just above a midpoint: up */
      65504.0f, 65519.0f,       /* the largest half; below the midpoint to 2^16 */
      65520.0f,                 /* the midpoint: ties to the even, which is Inf */
      1e10f, INFINITY, -INFINITY,
      0x1p-24f,                 /* the smallest subnormal */
      0x1p-25f,                 /* half of it: ties to the even 0 */
      0x1p-25f + 0x1p-40f,      /* above half: the smallest subnormal */
      3 * 0x1p-25f,             /* 1.5 subnormal units: ties to the even 2 */
      5 * 0x1p-25f,             /* 2.5 subnormal units: ties to the even 2 */
      1023.5f * 0x1p-24f,       /* between the largest subnormal and 2^-14: to even 2^-14 */
      0x1p-14f,                 /* the smallest normal */
      FLT_MIN, FLT_MIN * 0.25f, /* float normal and subnormal far below: 0 */
      -0.0f, -2.5f, 0.1f,
  };
  const uint16_t want[] = {
      0x3c00, 0x3c00, 0x3c02, 0x3c01, 0x7bff, 0x7bff, 0x7c00, 0x7c00, 0x7c00, 0xfc00,
      0x0001, 0x0000, 0x0001, 0x0002, 0x0002, 0x0400, 0x0400,
      0x0000, 0x0000, 0x8000, 0xc100, 0x2e66,
  };
  enum { N = sizeof in / sizeof in[0] };
  ck_assert_int_eq(N, sizeof want / sizeof want[0]);
  uint16_t got[N];
  cast_f32_to_f16(in, N, got);
  for (int i = 0; i < N; i++) expect_half(in[i], got[i], want[i]);
  /* NaNs stay NaN of their sign, quiet, with the payload bits that fit */
  const float nans[] = {float_of(0x7fc00000u), float_of(0xffc00000u), float_of(0x7f800001u),
                        float_of(0x7fa02000u)};
  uint16_t hn[4];
  cast_f32_to_f16(nans, 4, hn);
  ck_assert_uint_eq(hn[0], 0x7e00);
  ck_assert_uint_eq(hn[1], 0xfe00);
  ck_assert_uint_eq(hn[2], 0x7e00); /* payload only in the low bits: quieted */
  ck_assert_uint_eq(hn[3], 0x7f01); /* signalling: quieted, payload kept */
}
END_TEST

START_TEST(cast_fp32_to_fp16_matches_oracle) {
  /* every midpoint between neighbouring halves (and the floats on either
   * side of it), both signs, then a stride through all 2^32 patterns */
  const int64_t mids = 0x7c00; /* halves 0 .. 0x7bff, each with its successor */
  const int64_t stride = 65521, sampled = (INT64_C(1) << 32) / stride + 1;
  const int64_t n = mids * 6 + sampled;
  float *in = malloc((size_t)n * sizeof *in);
  uint16_t *out = malloc((size_t)n * sizeof *out);
  ck_assert(in && out);
  int64_t k = 0;
  for (int64_t hbits = 0; hbits < mids; hbits++) {
    const double lo = half_value((uint16_t)hbits);
    const double hi = hbits == 0x7bff ? 65536.0 : half_value((uint16_t)(hbits + 1));
    const float mid = (float)((lo + hi) / 2); /* 12 significant bits: exact */
    ck_assert((double)mid == (lo + hi) / 2);
    const float around[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
    for (int j = 0; j < 3; j++) in[k++] = around[j], in[k++] = -around[j];
  }
  for (uint64_t b = 0; b < (UINT64_C(1) << 32); b += (uint64_t)stride)
    in[k++] = float_of((uint32_t)b);
  ck_assert_int_eq(k, n);
  cast_f32_to_f16(in, n, out);
  for (int64_t i = 0; i < n; i++) expect_half(in[i], out[i], half_oracle(in[i]));
  free(in), free(out);
}
END_TEST

/* ---- SGD ---------------------------------------------------------------- */

START_TEST(sgd_by_hand) {
  /* lr 0.5, momentum 0.5, weight decay 0.25; w = [1, -2], grad = [0.5, 0.25]
   * step 1: g = [0.75, -0.25], m = g, w = [0.625, -1.875]
   * step 2 (same grad): g = [0.5 + 0.15625, 0.25 - 0.46875] = [0.65625, -0.21875]
   *   m = 0.5*[0.75, -0.25] + g = [1.03125, -0.34375]
   *   w = [0.625 - 0.515625, -1.875 + 0.171875] = [0.109375, -1.703125]
   * Nesterov, step 1: u = g + 0.5*m = 1.5*g = [1.125, -0.375], w = [0.4375, -1.8125] */
  tt g = span(FP32, 2), w = span(FP32, 2), m = span(FP32, 2), lr = scalar(0.5f);
  tt_set(&g, (const float[]){0.5f, 0.25f});
  tt_set(&w, (const float[]){1, -2});
  bp_optimizer_attrs a = {0.5f, 0.25f, 0, 0, 0, 0, 0, 0};
  ops_call c = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &a, sizeof a};
  ops_run(&c);
  ops_expect_close(&m, (const float[]){0.75f, -0.25f}, 0, "m1");
  ops_expect_close(&w, (const float[]){0.625f, -1.875f}, 0, "w1");
  ops_run(&c);
  ops_expect_close(&m, (const float[]){1.03125f, -0.34375f}, 0, "m2");
  ops_expect_close(&w, (const float[]){0.109375f, -1.703125f}, 0, "w2");
  a.nesterov = 1;
  tt_set(&w, (const float[]){1, -2});
  tt_set(&m, (const float[]){0, 0});
  ops_run(&c);
  ops_expect_close(&w, (const float[]){0.4375f, -1.8125f}, 0, "w nesterov");
  ck_assert(tt_padding_intact(&w) && tt_padding_intact(&m));
  tt_free(&g), tt_free(&w), tt_free(&m), tt_free(&lr);
}
END_TEST

/* A span of two "tensors" with slot padding after each, as the plan lays
 * out regions: elements [0,A) and [P, P+B) hold data, the rest is padding
 * (zero weights, zero gradients) that every update must leave at zero. */
enum { SPAN_A = 37, SPAN_P = 64, SPAN_B = 53, SPAN_E = 128 };
static int is_padding(int64_t i) { return (i >= SPAN_A && i < SPAN_P) || i >= SPAN_P + SPAN_B; }

static void fill_span(tt *t, uint64_t *rng, double lo, double hi) {
  for (int64_t i = 0; i < SPAN_E; i++)
    f32(t)[i] = is_padding(i) ? 0.0f : (float)(lo + (hi - lo) * tt_rand_unit(rng));
}

static void expect_padding_zero(const tt *t, const char *what) {
  for (int64_t i = 0; i < SPAN_E; i++)
    if (is_padding(i) && bits_of(f32(t)[i]) != 0)
      ck_abort_msg("%s: padding element %lld became %g", what, (long long)i, (double)f32(t)[i]);
}

/* max |got - want| / (1 + |want|) over the span */
static double span_err(const tt *t, const double *want) {
  double e = 0.0;
  for (int64_t i = 0; i < SPAN_E; i++) {
    const double d = fabs((double)f32(t)[i] - want[i]) / (1.0 + fabs(want[i]));
    if (!(d <= e)) e = d;
  }
  return e;
}

typedef struct sgd_case {
  float momentum, weight_decay;
  int nesterov;
} sgd_case;

static const sgd_case sgd_cases[] = {
    {0.0f, 0.0f, 0},  {0.9f, 0.0f, 0}, {0.9f, 0.0f, 1},
    {0.9f, 5e-4f, 0}, {0.9f, 1e-2f, 1}, {0.0f, 1e-2f, 0},
};

START_TEST(sgd_matches_pytorch_formulas) {
  const sgd_case *sc = &sgd_cases[_i];
  uint64_t rng = 1000 + (uint64_t)_i;
  tt g = span(FP32, SPAN_E), w = span(FP32, SPAN_E), m = span(FP32, SPAN_E), lr = scalar(0);
  fill_span(&w, &rng, -1, 1);
  double rw[SPAN_E], rbuf[SPAN_E];
  for (int64_t i = 0; i < SPAN_E; i++) rw[i] = f32(&w)[i], rbuf[i] = 0.0;
  bp_optimizer_attrs a = {sc->momentum, sc->weight_decay, sc->nesterov, 0, 0, 0, 0, 0};
  ops_call c = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &a, sizeof a};
  const double mu = sc->momentum, wd = sc->weight_decay;
  double err_w = 0, err_m = 0;
  for (int step = 0; step < 12; step++) {
    f32(&lr)[0] = 0.1f * (float)(step + 1) / 12.0f; /* a schedule: lr changes every step */
    fill_span(&g, &rng, -1, 1);
    ops_run(&c);
    /* torch.optim.SGD, single-tensor path, dampening 0, in double */
    const double lrd = f32(&lr)[0];
    for (int64_t i = 0; i < SPAN_E; i++) {
      double d = f32(&g)[i];
      if (wd != 0) d = d + wd * rw[i];
      if (mu != 0) {
        rbuf[i] = step == 0 ? d : rbuf[i] * mu + d; /* PyTorch clones g on step 1 */
        d = sc->nesterov ? d + mu * rbuf[i] : rbuf[i];
      }
      rw[i] = rw[i] - lrd * d;
    }
    const double ew = span_err(&w, rw), em = mu != 0 ? span_err(&m, rbuf) : 0.0;
    if (ew > err_w) err_w = ew;
    if (em > err_m) err_m = em;
  }
  printf("sgd case %d (momentum %g, wd %g, nesterov %d): err w %.2e m %.2e\n", _i, mu, wd,
         sc->nesterov, err_w, err_m);
  ck_assert_msg(err_w < 1e-6 && err_m < 1e-6, "w %.3g m %.3g", err_w, err_m);
  expect_padding_zero(&w, "w"), expect_padding_zero(&m, "m");
  ck_assert(tt_padding_intact(&w) && tt_padding_intact(&m));
  tt_free(&g), tt_free(&w), tt_free(&m), tt_free(&lr);
}
END_TEST

/* ---- AdamW -------------------------------------------------------------- */

START_TEST(adamw_first_step_by_hand) {
  /* step 1, no decay: m = (1-b1) g, v = (1-b2) g^2, so the bias-corrected
   * m/sqrt(v) is g/|g| = sign(g), and w moves by lr * |g| / (|g| + eps):
   * eps = 2^-10 and |g| = 2^-3 make it lr * 128/129. With weight decay 0.5
   * and lr 0.25, w first shrinks by (1 - 0.125). */
  tt g = span(FP32, 3), w = span(FP32, 3), m = span(FP32, 3), v = span(FP32, 3);
  tt lr = scalar(0.25f), step = scalar(1.0f);
  tt_set(&g, (const float[]){0.125f, -0.125f, 0});
  tt_set(&w, (const float[]){1, 1, 1});
  bp_optimizer_attrs a = {0, 0, 0, 0.5f, 0.75f, 0x1p-10f, 0, 0};
  ops_call c = {"range.adamw", {&g, &lr, &step}, {&w, &m, &v}, 3, 3, &a, sizeof a};
  ops_run(&c);
  const double u = 0.25 * 128.0 / 129.0;
  ops_expect_close(&w, (const float[]){(float)(1 - u), (float)(1 + u), 1}, 1e-6, "w");
  ops_expect_close(&m, (const float[]){0.0625f, -0.0625f, 0}, 0, "m");
  ops_expect_close(&v, (const float[]){0.25f * 0.015625f, 0.25f * 0.015625f, 0}, 0, "v");
  tt_set(&w, (const float[]){1, 1, 1}), tt_set(&m, (const float[]){0, 0, 0});
  tt_set(&v, (const float[]){0, 0, 0});
  a.weight_decay = 0.5f;
  ops_run(&c);
  ops_expect_close(&w, (const float[]){(float)(0.875 - u), (float)(0.875 + u), 0.875f}, 1e-6,
                   "w (decay)");
  tt_free(&g), tt_free(&w), tt_free(&m), tt_free(&v), tt_free(&lr), tt_free(&step);
}
END_TEST

typedef struct adamw_case {
  float weight_decay, beta1, beta2, eps;
} adamw_case;

static const adamw_case adamw_cases[] = {
    {0.0f, 0.9f, 0.999f, 1e-8f},  /* Adam */
    {1e-2f, 0.9f, 0.999f, 1e-8f}, /* AdamW's default decay */
    {0.1f, 0.5f, 0.99f, 1e-6f},   /* strong decay, short memories */
    {0.05f, 0.3f, 0.9f, 1e-3f},   /* a large eps: its place in the formula shows */
};

START_TEST(adamw_matches_pytorch_formulas) {
  const adamw_case *ac = &adamw_cases[_i];
  uint64_t rng = 2000 + (uint64_t)_i;
  tt g = span(FP32, SPAN_E), w = span(FP32, SPAN_E), m = span(FP32, SPAN_E), v = span(FP32, SPAN_E);
  tt lr = scalar(0), step = scalar(0);
  fill_span(&w, &rng, -1, 1);
  double rw[SPAN_E], rm[SPAN_E], rv[SPAN_E];
  for (int64_t i = 0; i < SPAN_E; i++) rw[i] = f32(&w)[i], rm[i] = rv[i] = 0.0;
  bp_optimizer_attrs a = {0, ac->weight_decay, 0, ac->beta1, ac->beta2, ac->eps, 0, 0};
  ops_call c = {"range.adamw", {&g, &lr, &step}, {&w, &m, &v}, 3, 3, &a, sizeof a};
  const double b1 = ac->beta1, b2 = ac->beta2, eps = ac->eps, wd = ac->weight_decay;
  double err_w = 0, err_m = 0, err_v = 0;
  for (int t = 1; t <= 12; t++) {
    f32(&lr)[0] = 1e-2f / (float)t;
    f32(&step)[0] = (float)t;
    fill_span(&g, &rng, -1, 1);
    ops_run(&c);
    /* torch.optim.AdamW, single-tensor path (as in PyTorch 1.13), in double */
    const double lrd = f32(&lr)[0];
    const double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    const double step_size = lrd / bc1, bc2_sqrt = sqrt(bc2);
    for (int64_t i = 0; i < SPAN_E; i++) {
      const double gd = f32(&g)[i];
      rw[i] *= 1 - lrd * wd;
      rm[i] = rm[i] * b1 + (1 - b1) * gd;
      rv[i] = rv[i] * b2 + (1 - b2) * gd * gd;
      const double denom = sqrt(rv[i]) / bc2_sqrt + eps;
      rw[i] += -step_size * rm[i] / denom;
    }
    double e = span_err(&w, rw);
    if (e > err_w) err_w = e;
    e = span_err(&m, rm);
    if (e > err_m) err_m = e;
    e = span_err(&v, rv);
    if (e > err_v) err_v = e;
  }
  printf("adamw case %d (wd %g, betas %g %g, eps %g): err w %.2e m %.2e v %.2e\n", _i, wd, b1,
         b2, eps, err_w, err_m, err_v);
  ck_assert_msg(err_w < 1e-6 && err_m < 1e-6 && err_v < 1e-6, "w %.3g m %.3g v %.3g", err_w,
                err_m, err_v);
  expect_padding_zero(&w, "w"), expect_padding_zero(&m, "m"), expect_padding_zero(&v, "v");
  ck_assert(tt_padding_intact(&w) && tt_padding_intact(&m) && tt_padding_intact(&v));
  tt_free(&g), tt_free(&w), tt_free(&m), tt_free(&v), tt_free(&lr), tt_free(&step);
}
END_TEST

/* ---- LARS --------------------------------------------------------------- */

START_TEST(lars_by_hand) {
  /* eta 0.5, weight decay 0.1, lr 0.2, momentum 0.9; segments
   * [0,2) [2,5) [5,5) [5,7), elements 7 and 8 outside every segment.
   *  seg 0: w = [3,4] (|w| = 5), g = [0.6,0.8] (|g| = 1):
   *         trust = 0.5*5 / (1 + 0.1*5) = 5/3, r = 1/3; g' = [0.9, 1.2];
   *         m = [0.3, 0.4]; w = [2.7, 3.6]
   *  seg 1: w = [1,0,0], g = 0 (|g| = 0): trust 1, r = 0.2; g' = [0.1,0,0];
   *         m = [0.02,0,0]; w = [0.98,0,0]
   *  seg 2: empty: norms 0, 0
   *  seg 3: w = 0 (|w| = 0), g = [1,-1]: trust 1; m = [0.2,-0.2]; w = -m
   * Step 2 with the same gradient in seg 0: |w| = 4.5, trust = 2.25/1.45,
   *   g' = [0.6+0.27, 0.8+0.36], m = 0.9*[0.3,0.4] + 0.2*trust*g'. */
  tt g = span(FP32, 9), w = span(FP32, 9), m = span(FP32, 9), lr = scalar(0.2f);
  tt seg = span(INT32, 5), norms = span(FP32, 8);
  tt_set(&w, (const float[]){3, 4, 1, 0, 0, 0, 0, 5, 5});
  tt_set(&g, (const float[]){0.6f, 0.8f, 0, 0, 0, 1, -1, 1, 1});
  const int32_t offsets[] = {0, 2, 5, 5, 7};
  memcpy(seg.data, offsets, sizeof offsets);
  bp_optimizer_attrs a = {0.9f, 0.1f, 0, 0, 0, 0, 0.5f, 0};
  ops_call c = {"range.lars", {&g, &lr, &seg}, {&w, &m, &norms}, 3, 3, &a, sizeof a};
  ops_run(&c);
  ops_expect_close(&norms, (const float[]){5, 1, 1, 0, 0, 0, 0, (float)sqrt(2.0)}, 1e-6, "norms");
  ops_expect_close(&m, (const float[]){0.3f, 0.4f, 0.02f, 0, 0, 0.2f, -0.2f, 0, 0}, 1e-6, "m");
  ops_expect_close(&w, (const float[]){2.7f, 3.6f, 0.98f, 0, 0, -0.2f, 0.2f, 5, 5}, 1e-6, "w");
  ops_run(&c);
  const double trust = 0.5 * 4.5 / (1 + 0.1 * 4.5);
  const double m0 = 0.9 * 0.3 + 0.2 * trust * 0.87, m1 = 0.9 * 0.4 + 0.2 * trust * 1.16;
  ck_assert_float_eq_tol(f32(&norms)[0], 4.5f, 2e-6f);
  ck_assert_float_eq_tol(f32(&m)[0], (float)m0, 2e-6f);
  ck_assert_float_eq_tol(f32(&m)[1], (float)m1, 2e-6f);
  ck_assert_float_eq_tol(f32(&w)[0], (float)(2.7 - m0), 2e-6f);
  ck_assert_float_eq_tol(f32(&w)[1], (float)(3.6 - m1), 2e-6f);
  ck_assert(f32(&w)[7] == 5 && f32(&w)[8] == 5 && f32(&m)[7] == 0 && f32(&m)[8] == 0);
  tt *all[] = {&g, &w, &m, &lr, &seg, &norms};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

START_TEST(lars_matches_double_over_steps) {
  /* two parameters, each with its slot padding, over several steps */
  uint64_t rng = 3000;
  tt g = span(FP32, SPAN_E), w = span(FP32, SPAN_E), m = span(FP32, SPAN_E), lr = scalar(0.1f);
  tt seg = span(INT32, 3), norms = span(FP32, 4);
  const int32_t offsets[] = {0, SPAN_P, SPAN_E};
  memcpy(seg.data, offsets, sizeof offsets);
  fill_span(&w, &rng, -1, 1);
  double rw[SPAN_E], rm[SPAN_E] = {0};
  for (int64_t i = 0; i < SPAN_E; i++) rw[i] = f32(&w)[i];
  bp_optimizer_attrs a = {0.9f, 5e-4f, 0, 0, 0, 0, 1e-3f, 0};
  ops_call c = {"range.lars", {&g, &lr, &seg}, {&w, &m, &norms}, 3, 3, &a, sizeof a};
  const double mu = a.momentum, wd = a.weight_decay, eta = a.eta;
  double err_w = 0, err_n = 0;
  for (int step = 0; step < 10; step++) {
    fill_span(&g, &rng, -0.1, 0.1);
    ops_run(&c);
    for (int j = 0; j < 2; j++) {
      double ww = 0, gg = 0;
      for (int64_t i = offsets[j]; i < offsets[j + 1]; i++)
        ww += rw[i] * rw[i], gg += (double)f32(&g)[i] * f32(&g)[i];
      const double wn = sqrt(ww), gn = sqrt(gg);
      err_n = fmax(err_n, fabs(f32(&norms)[2 * j] - wn) / wn);
      err_n = fmax(err_n, fabs(f32(&norms)[2 * j + 1] - gn) / gn);
      const double trust = wn > 0 && gn > 0 ? eta * wn / (gn + wd * wn) : 1.0;
      for (int64_t i = offsets[j]; i < offsets[j + 1]; i++) {
        rm[i] = mu * rm[i] + 0.1 * trust * (f32(&g)[i] + wd * rw[i]);
        rw[i] -= rm[i];
      }
    }
    err_w = fmax(err_w, span_err(&w, rw));
  }
  printf("lars: err w %.2e norms %.2e\n", err_w, err_n);
  ck_assert_msg(err_w < 1e-6 && err_n < 1e-6, "w %.3g norms %.3g", err_w, err_n);
  expect_padding_zero(&w, "w"), expect_padding_zero(&m, "m");
  tt_free(&g), tt_free(&w), tt_free(&m), tt_free(&lr), tt_free(&seg), tt_free(&norms);
}
END_TEST

/* ---- refusals ----------------------------------------------------------- */

START_TEST(refuses_with_reasons) {
  tt a8 = span(FP32, 8), b8 = span(FP32, 8), c9 = span(FP32, 9), h8 = span(FP16, 8);
  tt i8 = span(INT32, 8), lr = scalar(0.1f), st = scalar(1), flag = scalar(0);
  tt grid = tt_new(FP32, 2, 1, 1, 4, 0);
  bp_range_attrs ra = {2.0f, 0.5f, 0};

  /* spans */
  ops_call z = {"range.zero", {NULL}, {&grid}, 0, 1, NULL, 0};
  ops_expect_refused(&z, "x: a span is [1,1,1,elements], got [2,1,1,4]");
  ops_call z2 = {"range.zero", {&a8}, {&b8}, 1, 1, NULL, 0};
  ops_expect_refused(&z2, "expects 0 inputs and 1 outputs");
  tt strided = span(FP32, 16);
  strided.d.shape[3] = 8, strided.d.stride[3] = 2;
  ops_call z3 = {"range.zero", {NULL}, {&strided}, 0, 1, NULL, 0};
  ops_expect_refused(&z3, "contiguous");
  tt bad_dtype = span(FP32, 8);
  bad_dtype.d.dtype = 9;
  ops_call z4 = {"range.zero", {NULL}, {&bad_dtype}, 0, 1, NULL, 0};
  ops_expect_refused(&z4, "unknown dtype 9");

  ops_call cp = {"range.copy", {&a8}, {&c9}, 1, 1, NULL, 0};
  ops_expect_refused(&cp, "src has 8 elements, dst has 9");
  cp.out[0] = &h8;
  ops_expect_refused(&cp, "dst: dtype fp16, expected fp32");

  ops_call sc = {"range.scale", {&a8}, {&a8}, 1, 1, NULL, 0};
  ops_expect_refused(&sc, "lacks scale");
  bp_range_attrs inf_scale = {INFINITY, 0, 0};
  sc.attrs = &inf_scale, sc.attr_size = sizeof inf_scale;
  ops_expect_refused(&sc, "scale inf must be finite");
  sc.attrs = &ra, sc.in[0] = &h8, sc.out[0] = &h8;
  ops_expect_refused(&sc, "x: dtype fp16, expected fp32");

  ops_call ca = {"range.cast", {&a8}, {&b8}, 1, 1, NULL, 0};
  ops_expect_refused(&ca, "casts fp32 to fp16 or fp16 to fp32");
  tt h9 = span(FP16, 9);
  ca.out[0] = &h9;
  ops_expect_refused(&ca, "src has 8 elements, dst has 9");
  ca.out[0] = &i8;
  ops_expect_refused(&ca, "casts fp32 to fp16");

  bp_range_attrs bad_decay = {0, 1.5f, 0};
  ops_call em = {"range.ema", {&a8}, {&b8}, 1, 1, &bad_decay, sizeof bad_decay};
  ops_expect_refused(&em, "decay 1.5 must be in [0, 1]");
  em.attr_size = sizeof(float); /* only scale sent */
  ops_expect_refused(&em, "lacks decay");

  ops_call nc = {"range.nan_check", {&i8}, {&flag}, 1, 1, NULL, 0};
  ops_expect_refused(&nc, "x: dtype 3, expected fp32");
  nc.in[0] = &a8, nc.out[0] = &b8;
  ops_expect_refused(&nc, "flag: shape [1,1,1,8], expected [1,1,1,1]");

  /* sgd */
  bp_optimizer_attrs o = {0.0f, 0.0f, 1, 0, 0, 0, 0, 0};
  ops_call sg = {"range.sgd", {&a8, &lr}, {&b8, &c9}, 2, 2, &o, sizeof o};
  ops_expect_refused(&sg, "nesterov needs momentum > 0");
  o.nesterov = 2;
  ops_expect_refused(&sg, "attribute nesterov is 2");
  o.nesterov = 0, o.weight_decay = -1;
  ops_expect_refused(&sg, "weight_decay -1 must be finite and >= 0");
  o.weight_decay = 0, o.momentum = NAN;
  ops_expect_refused(&sg, "momentum nan must be finite");
  o.momentum = 0.9f;
  ops_expect_refused(&sg, "grad has 8 elements, m has 9");
  sg.out[1] = &h8;
  ops_expect_refused(&sg, "m: dtype fp16, expected fp32");
  sg.out[1] = &c9, sg.in[1] = &a8;
  ops_expect_refused(&sg, "lr: shape [1,1,1,8], expected [1,1,1,1]");
  sg.attr_size = 4;
  ops_expect_refused(&sg, "lacks momentum, weight_decay and nesterov");

  /* adamw */
  bp_optimizer_attrs ad = {0, 0.01f, 0, 0.9f, 0.999f, 0.0f, 0, 0};
  tt m8 = span(FP32, 8), v8 = span(FP32, 8);
  ops_call aw = {"range.adamw", {&a8, &lr, &st}, {&b8, &m8, &v8}, 3, 3, &ad, sizeof ad};
  ops_expect_refused(&aw, "eps 0 must be finite and > 0");
  ad.eps = 1e-8f, ad.beta1 = 1.0f;
  ops_expect_refused(&aw, "beta1 1 must be in [0, 1)");
  ad.beta1 = 0.9f, ad.beta2 = -0.5f;
  ops_expect_refused(&aw, "beta2 -0.5 must be in [0, 1)");
  ad.beta2 = 0.999f;
  aw.nin = 2;
  ops_expect_refused(&aw, "expects 3 inputs and 3 outputs");
  aw.nin = 3, aw.in[2] = &i8;
  ops_expect_refused(&aw, "step: dtype int32, expected fp32");

  /* lars */
  bp_optimizer_attrs la = {0.9f, 1e-4f, 1, 0, 0, 0, 1e-3f, 0};
  tt seg = span(INT32, 3), norms = span(FP32, 4), norms6 = span(FP32, 6), seg1 = span(INT32, 1);
  ops_call lc = {"range.lars", {&a8, &lr, &seg}, {&b8, &m8, &norms}, 3, 3, &la, sizeof la};
  ops_expect_refused(&lc, "nesterov is not defined for range.lars");
  la.nesterov = 0, la.eta = 0;
  ops_expect_refused(&lc, "eta 0 must be finite and > 0");
  la.eta = 1e-3f;
  lc.out[2] = &norms6;
  ops_expect_refused(&lc, "norms has 6 elements, expected 2*S = 4");
  lc.out[2] = &norms, lc.in[2] = &v8;
  ops_expect_refused(&lc, "segments: dtype fp32, expected int32");
  lc.in[2] = &seg1;
  ops_expect_refused(&lc, "segments has 1 offsets");

  tt *all[] = {&a8, &b8, &c9, &h8, &i8, &lr, &st, &flag, &grid, &strided, &bad_dtype,
               &h9, &m8, &v8, &seg, &norms, &norms6, &seg1};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* run() checks the scalar inputs and the pointers before writing anything */
START_TEST(run_refuses_bad_values_untouched) {
  tt g = span(FP32, 4), w = span(FP32, 4), m = span(FP32, 4), v = span(FP32, 4);
  tt lr = scalar(0.1f), st = scalar(0.0f);
  tt_set(&g, (const float[]){1, 2, 3, 4});
  tt_set(&w, (const float[]){5, 6, 7, 8});
  bp_optimizer_attrs ad = {0.9f, 0.01f, 0, 0.9f, 0.999f, 1e-8f, 1e-3f, 0};
  ops_call aw = {"range.adamw", {&g, &lr, &st}, {&w, &m, &v}, 3, 3, &ad, sizeof ad};
  char reason[256];
  ck_assert_int_eq(ops_supports(&aw, reason, sizeof reason), 1);
  ck_assert_int_eq(ops_run_raw(&aw), BP_ABI_ERR_INVALID); /* step 0 */
  f32(&st)[0] = NAN;
  ck_assert_int_eq(ops_run_raw(&aw), BP_ABI_ERR_INVALID);
  f32(&st)[0] = 1, f32(&lr)[0] = INFINITY;
  ck_assert_int_eq(ops_run_raw(&aw), BP_ABI_ERR_INVALID);
  ops_call sg = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &ad, sizeof ad};
  ck_assert_int_eq(ops_run_raw(&sg), BP_ABI_ERR_INVALID); /* lr inf */
  f32(&lr)[0] = 0.1f;
  /* w and m the same memory */
  ops_call alias = {"range.sgd", {&g, &lr}, {&w, &w}, 2, 2, &ad, sizeof ad};
  ck_assert_int_eq(ops_run_raw(&alias), BP_ABI_ERR_INVALID);
  /* grad is w */
  ops_call alias2 = {"range.sgd", {&w, &lr}, {&w, &m}, 2, 2, &ad, sizeof ad};
  ck_assert_int_eq(ops_run_raw(&alias2), BP_ABI_ERR_INVALID);

  tt seg = span(INT32, 3), norms = span(FP32, 4);
  ops_call lc = {"range.lars", {&g, &lr, &seg}, {&w, &m, &norms}, 3, 3, &ad, sizeof ad};
  const int32_t bad[][3] = {{0, 3, 2}, {0, 2, 5}, {-1, 2, 4}};
  for (int b = 0; b < 3; b++) {
    memcpy(seg.data, bad[b], sizeof bad[b]);
    ck_assert_int_eq(ops_supports(&lc, reason, sizeof reason), 1);
    ck_assert_msg(ops_run_raw(&lc) == BP_ABI_ERR_INVALID, "segments %d %d %d accepted", bad[b][0],
                  bad[b][1], bad[b][2]);
  }
  ops_expect_close(&w, (const float[]){5, 6, 7, 8}, 0, "w");
  ops_expect_close(&m, (const float[]){0, 0, 0, 0}, 0, "m");
  ops_expect_close(&v, (const float[]){0, 0, 0, 0}, 0, "v");
  ops_expect_close(&norms, (const float[]){0, 0, 0, 0}, 0, "norms");
  tt *all[] = {&g, &w, &m, &v, &lr, &st, &seg, &norms};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* ---- mixed precision: unscale ------------------------------------------- */

START_TEST(unscale_exact_values_and_specials) {
  /* scale 65536 (a power of two): every value divided exactly, Inf and NaN
   * kept (a NaN keeps sign and payload, quieted, as the widening does);
   * scale 3: each element is float(h) * (1.0f / 3.0f), one FP32 product */
  static const uint16_t in[] = {0x3c00, 0xc000, 0x7bff, 0xfbff, 0x0001, 0x8000, 0x0000,
                                0x7c00, 0xfc00, 0x7e00, 0xfd01, 0x3555, 0x03ff};
  enum { N = sizeof in / sizeof in[0] };
  tt src = span(FP16, N), dst = span(FP32, N), sc = scalar(65536.0f);
  memcpy(src.data, in, sizeof in);
  ops_call c = {"range.unscale", {&src, &sc}, {&dst}, 2, 1, NULL, 0};
  ops_run(&c);
  for (int i = 0; i < N; i++) {
    const float h = bp_sdk_fp16_to_fp32(in[i]);
    const float want = isnan(h) ? h : (float)ldexp(half_value(in[i]), -16);
    ck_assert_msg(bits_of(f32(&dst)[i]) == bits_of(want), "%04x / 65536: %08x, expected %08x",
                  in[i], bits_of(f32(&dst)[i]), bits_of(want));
  }
  ck_assert(isinf(f32(&dst)[7]) && f32(&dst)[7] > 0 && isinf(f32(&dst)[8]) && f32(&dst)[8] < 0);
  ck_assert(isnan(f32(&dst)[9]) && isnan(f32(&dst)[10]) && signbit(f32(&dst)[10]));
  f32(&sc)[0] = 3.0f;
  ops_run(&c);
  const float inv3 = 1.0f / 3.0f;
  for (int i = 0; i < N; i++) {
    const float want = bp_sdk_fp16_to_fp32(in[i]) * inv3;
    ck_assert_msg(bits_of(f32(&dst)[i]) == bits_of(want), "%04x / 3: %08x, expected %08x", in[i],
                  bits_of(f32(&dst)[i]), bits_of(want));
  }
  ck_assert(tt_padding_intact(&dst));
  /* a scale that is not finite and > 0 is refused at run time, dst untouched */
  memset(dst.data, 0, N * sizeof(float));
  const float bad[] = {0.0f, -2.0f, INFINITY, NAN};
  for (int b = 0; b < 4; b++) {
    f32(&sc)[0] = bad[b];
    ck_assert_msg(ops_run_raw(&c) == BP_ABI_ERR_INVALID, "scale %g accepted", (double)bad[b]);
  }
  for (int i = 0; i < N; i++) ck_assert_uint_eq(bits_of(f32(&dst)[i]), 0);
  tt_free(&src), tt_free(&dst), tt_free(&sc);
}
END_TEST

/* ---- mixed precision: loss_scale ---------------------------------------- */

typedef struct scaler {
  tt found, scale, good, step, skipped;
  bp_loss_scale_attrs a;
} scaler;

static scaler scaler_new(float scale, float growth, float backoff, int32_t interval) {
  scaler s = {scalar(0), scalar(scale), scalar(0), scalar(1), scalar(0),
              {growth, backoff, interval}};
  return s;
}
static void scaler_step(scaler *s, float found_inf) {
  f32(&s->found)[0] = found_inf;
  ops_call c = {"range.loss_scale", {&s->found}, {&s->scale, &s->good, &s->step, &s->skipped},
                1, 4, &s->a, sizeof s->a};
  ops_run(&c);
  ck_assert_uint_eq(bits_of(f32(&s->found)[0]), bits_of(found_inf)); /* only read */
}
static void scaler_expect(const scaler *s, float scale, float good, float step, float skipped,
                          const char *what) {
  ck_assert_msg(bits_of(f32(&s->scale)[0]) == bits_of(scale) && f32(&s->good)[0] == good &&
                    f32(&s->step)[0] == step && f32(&s->skipped)[0] == skipped,
                "%s: scale %g good %g step %g skipped %g, expected %g %g %g %g", what,
                (double)f32(&s->scale)[0], (double)f32(&s->good)[0], (double)f32(&s->step)[0],
                (double)f32(&s->skipped)[0], (double)scale, (double)good, (double)step,
                (double)skipped);
}
static void scaler_free(scaler *s) {
  tt *all[] = {&s->found, &s->scale, &s->good, &s->step, &s->skipped};
  for (int i = 0; i < 5; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}

START_TEST(loss_scale_grows_at_the_interval_and_backs_off) {
  scaler s = scaler_new(65536.0f, 2.0f, 0.5f, 3);
  scaler_step(&s, 0);
  scaler_expect(&s, 65536.0f, 1, 2, 0, "clean 1");
  scaler_step(&s, 0);
  scaler_expect(&s, 65536.0f, 2, 3, 0, "clean 2");
  scaler_step(&s, 0); /* the third clean step in a row: grow, restart the count */
  scaler_expect(&s, 131072.0f, 0, 4, 0, "grown");
  scaler_step(&s, 0);
  scaler_step(&s, 0);
  scaler_expect(&s, 131072.0f, 2, 6, 0, "clean 2 again");
  scaler_step(&s, 1); /* overflow: back off, count again from 0, step stays */
  scaler_expect(&s, 65536.0f, 0, 6, 1, "backoff");
  scaler_step(&s, NAN); /* any nonzero flag, NaN included, is an overflow */
  scaler_expect(&s, 32768.0f, 0, 6, 2, "backoff (nan)");
  scaler_step(&s, -1);
  scaler_expect(&s, 16384.0f, 0, 6, 3, "backoff (-1)");
  for (int i = 0; i < 3; i++) scaler_step(&s, 0);
  scaler_expect(&s, 32768.0f, 0, 9, 3, "grown after the backoffs");
  scaler_free(&s);
}
END_TEST

START_TEST(loss_scale_never_grows_to_inf) {
  /* 2^127 * 2 and FLT_MAX * 2 overflow: the scale stays, the count restarts */
  const float tops[] = {0x1p127f, FLT_MAX};
  for (int t = 0; t < 2; t++) {
    scaler s = scaler_new(tops[t], 2.0f, 0.5f, 1);
    scaler_step(&s, 0);
    scaler_expect(&s, tops[t], 0, 2, 0, "at the top");
    scaler_step(&s, 0);
    scaler_expect(&s, tops[t], 0, 3, 0, "still at the top");
    scaler_step(&s, 1);
    scaler_expect(&s, tops[t] * 0.5f, 0, 3, 1, "backoff from the top");
    scaler_free(&s);
  }
}
END_TEST

START_TEST(loss_scale_static_when_interval_is_zero) {
  /* growth_interval 0: the scale never moves (the factors are not read);
   * the counts move as in the dynamic case */
  scaler s = scaler_new(1024.0f, 0.0f, 0.0f, 0);
  for (int i = 0; i < 5; i++) scaler_step(&s, 0);
  scaler_expect(&s, 1024.0f, 5, 6, 0, "clean");
  scaler_step(&s, 1);
  scaler_expect(&s, 1024.0f, 0, 6, 1, "overflow");
  scaler_free(&s);
}
END_TEST

START_TEST(loss_scale_refuses_with_reasons) {
  scaler s = scaler_new(65536.0f, 2.0f, 0.5f, 2000);
  ops_call c = {"range.loss_scale", {&s.found}, {&s.scale, &s.good, &s.step, &s.skipped}, 1, 4,
                &s.a, sizeof s.a};
  char reason[256];
  ck_assert_int_eq(ops_supports(&c, reason, sizeof reason), 1);
  c.attr_size = 2 * sizeof(float);
  ops_expect_refused(&c, "lacks growth_factor, backoff_factor and growth_interval");
  c.attr_size = sizeof s.a;
  s.a.growth_interval = -1;
  ops_expect_refused(&c, "growth_interval -1 must be >= 0");
  s.a.growth_interval = 10, s.a.growth_factor = 0.5f;
  ops_expect_refused(&c, "growth_factor 0.5 must be finite and >= 1");
  s.a.growth_factor = INFINITY;
  ops_expect_refused(&c, "growth_factor inf must be finite");
  s.a.growth_factor = 2.0f, s.a.backoff_factor = 0.0f;
  ops_expect_refused(&c, "backoff_factor 0 must be in (0, 1]");
  s.a.backoff_factor = 1.5f;
  ops_expect_refused(&c, "backoff_factor 1.5 must be in (0, 1]");
  s.a.backoff_factor = 0.5f;
  c.nout = 3;
  ops_expect_refused(&c, "expects 1 inputs and 4 outputs, got 1 and 3");
  c.nout = 4;
  tt wide = span(FP32, 2), h = span(FP16, 1);
  c.out[1] = &wide;
  ops_expect_refused(&c, "good_steps: shape [1,1,1,2], expected [1,1,1,1]");
  c.out[1] = &s.good, c.in[0] = &h;
  ops_expect_refused(&c, "found_inf: dtype fp16, expected fp32");
  c.in[0] = &s.found;
  /* run-time values: a scale that is not finite and > 0, a negative or
   * non-finite count; nothing is written */
  const float bad_scale[] = {0.0f, -1.0f, INFINITY, NAN};
  for (int b = 0; b < 4; b++) {
    f32(&s.scale)[0] = bad_scale[b];
    ck_assert_msg(ops_run_raw(&c) == BP_ABI_ERR_INVALID, "scale %g accepted", (double)bad_scale[b]);
    ck_assert_uint_eq(bits_of(f32(&s.scale)[0]), bits_of(bad_scale[b]));
  }
  f32(&s.scale)[0] = 8.0f, f32(&s.skipped)[0] = -1.0f;
  ck_assert_int_eq(ops_run_raw(&c), BP_ABI_ERR_INVALID);
  f32(&s.skipped)[0] = 0.0f, f32(&s.step)[0] = NAN;
  ck_assert_int_eq(ops_run_raw(&c), BP_ABI_ERR_INVALID);
  ck_assert_float_eq(f32(&s.scale)[0], 8.0f);
  ck_assert_float_eq(f32(&s.good)[0], 0.0f);
  ck_assert_float_eq(f32(&s.skipped)[0], 0.0f);
  tt_free(&wide), tt_free(&h);
  scaler_free(&s);
}
END_TEST

/* ---- mixed precision: the skip input ------------------------------------ */

/* One update with and without has_skip: `in`/`out` name the tensors of the
 * call without skip; the skip copy gets the same inputs plus skip. */
typedef struct skip_case {
  const char *op;
  int nin, nout;
  const void *attrs, *skip_attrs;
  uint32_t attr_size;
} skip_case;

/* The state after one call, every output buffer byte for byte (tails too). */
static void snapshot(tt *const *outs, int nout, unsigned char **buf) {
  for (int o = 0; o < nout; o++) {
    buf[o] = malloc(outs[o]->d.slot_bytes);
    ck_assert_ptr_nonnull(buf[o]);
    memcpy(buf[o], outs[o]->data, outs[o]->d.slot_bytes);
  }
}
static void expect_same(tt *const *outs, int nout, unsigned char **buf, const char *what) {
  for (int o = 0; o < nout; o++)
    ck_assert_msg(memcmp(buf[o], outs[o]->data, outs[o]->d.slot_bytes) == 0,
                  "%s: output %d changed", what, o);
}

/* Runs c (has_skip 0) on outs_a and the same call with skip on outs_b
 * (same starting bits) for several steps: skip 0 gives the very bits of
 * no skip; skip 1, NaN or -0.5 leaves every output as it was. */
static void check_skip(const skip_case *k, tt **in, tt **outs_a, tt **outs_b) {
  tt skip = scalar(0);
  ops_call plain = {k->op, {NULL}, {NULL}, k->nin, k->nout, k->attrs, k->attr_size};
  ops_call with = {k->op, {NULL}, {NULL}, k->nin + 1, k->nout, k->skip_attrs, k->attr_size};
  for (int i = 0; i < k->nin; i++) plain.in[i] = with.in[i] = in[i];
  with.in[k->nin] = &skip;
  for (int o = 0; o < k->nout; o++) plain.out[o] = outs_a[o], with.out[o] = outs_b[o];
  const float skips[] = {0.0f, 1.0f, 0.0f, NAN, -0.5f, 0.0f};
  for (int t = 0; t < 6; t++) {
    f32(&skip)[0] = skips[t];
    unsigned char *before[6];
    snapshot(outs_b, k->nout, before);
    if (skips[t] == 0.0f) ops_run(&plain);
    ops_run(&with);
    if (skips[t] != 0.0f) expect_same(outs_b, k->nout, before, k->op);
    for (int o = 0; o < k->nout; o++) {
      ck_assert_msg(memcmp(outs_a[o]->data, outs_b[o]->data, outs_a[o]->d.slot_bytes) == 0,
                    "%s step %d: output %d differs from the call without skip", k->op, t, o);
      free(before[o]);
    }
  }
  tt_free(&skip);
}

START_TEST(skip_leaves_every_update_untouched) {
  uint64_t rng = 31;
  tt g = span(FP32, SPAN_E), lr = scalar(0.05f), st = scalar(3.0f);
  fill_span(&g, &rng, -1, 1);
  tt wa = span(FP32, SPAN_E), ma = span(FP32, SPAN_E), va = span(FP32, SPAN_E);
  tt wb = span(FP32, SPAN_E), mb = span(FP32, SPAN_E), vb = span(FP32, SPAN_E);
  tt na = span(FP32, 4), nb = span(FP32, 4), seg = span(INT32, 3);
  const int32_t offsets[] = {0, SPAN_P, SPAN_E};
  memcpy(seg.data, offsets, sizeof offsets);
  for (int v = 0; v < 5; v++) { /* sgd (plain, nesterov), adamw, lars, ema */
    fill_span(&wa, &rng, -1, 1), fill_span(&ma, &rng, -1, 1), fill_span(&va, &rng, 0, 1);
    tt_copy(&wb, &wa), tt_copy(&mb, &ma), tt_copy(&vb, &va);
    memset(na.data, 0, 16), memset(nb.data, 0, 16);
    bp_optimizer_attrs o = {0.9f, 1e-2f, v == 1, 0.9f, 0.999f, 1e-8f, 1e-3f, 0}, os = o;
    os.has_skip = 1;
    bp_range_attrs r = {0, 0.75f, 0}, rs = r;
    rs.has_skip = 1;
    if (v <= 1) {
      const skip_case k = {"range.sgd", 2, 2, &o, &os, sizeof o};
      check_skip(&k, (tt *[]){&g, &lr}, (tt *[]){&wa, &ma}, (tt *[]){&wb, &mb});
    } else if (v == 2) {
      const skip_case k = {"range.adamw", 3, 3, &o, &os, sizeof o};
      check_skip(&k, (tt *[]){&g, &lr, &st}, (tt *[]){&wa, &ma, &va}, (tt *[]){&wb, &mb, &vb});
    } else if (v == 3) {
      const skip_case k = {"range.lars", 3, 3, &o, &os, sizeof o};
      check_skip(&k, (tt *[]){&g, &lr, &seg}, (tt *[]){&wa, &ma, &na}, (tt *[]){&wb, &mb, &nb});
    } else {
      const skip_case k = {"range.ema", 1, 1, &r, &rs, sizeof r};
      check_skip(&k, (tt *[]){&g}, (tt *[]){&wa}, (tt *[]){&wb});
    }
  }
  tt *all[] = {&g, &lr, &st, &wa, &ma, &va, &wb, &mb, &vb, &na, &nb, &seg};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

START_TEST(skip_refusals_have_reasons) {
  tt g = span(FP32, 8), w = span(FP32, 8), m = span(FP32, 8), v = span(FP32, 8);
  tt lr = scalar(0.1f), st = scalar(1), skip = scalar(0), wide = span(FP32, 2);
  tt iskip = span(INT32, 1), seg = span(INT32, 2), norms = span(FP32, 2);
  bp_optimizer_attrs o = {0.9f, 0, 0, 0.9f, 0.999f, 1e-8f, 1e-3f, 1};
  ops_call sg = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &o, sizeof o};
  ops_expect_refused(&sg, "expects 3 inputs and 2 outputs, got 2");
  sg.in[2] = &skip, sg.nin = 3;
  char reason[256];
  ck_assert_int_eq(ops_supports(&sg, reason, sizeof reason), 1);
  o.has_skip = 0;
  ops_expect_refused(&sg, "expects 2 inputs and 2 outputs, got 3");
  o.has_skip = 2;
  ops_expect_refused(&sg, "attribute has_skip is 2");
  o.has_skip = 1, sg.in[2] = &wide;
  ops_expect_refused(&sg, "skip: shape [1,1,1,2], expected [1,1,1,1]");
  sg.in[2] = &iskip;
  ops_expect_refused(&sg, "skip: dtype int32, expected fp32");
  ops_call aw = {"range.adamw", {&g, &lr, &st}, {&w, &m, &v}, 3, 3, &o, sizeof o};
  ops_expect_refused(&aw, "expects 4 inputs and 3 outputs, got 3");
  aw.in[3] = &iskip, aw.nin = 4;
  ops_expect_refused(&aw, "skip: dtype int32");
  ops_call la = {"range.lars", {&g, &lr, &seg}, {&w, &m, &norms}, 3, 3, &o, sizeof o};
  ops_expect_refused(&la, "expects 4 inputs and 3 outputs, got 3");
  la.in[3] = &wide, la.nin = 4;
  ops_expect_refused(&la, "skip: shape");
  bp_range_attrs r = {0, 0.5f, 1};
  ops_call em = {"range.ema", {&g}, {&w}, 1, 1, &r, sizeof r};
  ops_expect_refused(&em, "expects 2 inputs and 1 outputs, got 1");
  em.in[1] = &iskip, em.nin = 2;
  ops_expect_refused(&em, "skip: dtype int32");
  r.has_skip = 0, em.in[1] = &skip;
  ops_expect_refused(&em, "expects 1 inputs and 1 outputs, got 2");
  /* a skipped step reads no other scalar: an lr of Inf is no error then,
   * but is one as soon as the step runs */
  o.has_skip = 1, sg.in[2] = &skip;
  f32(&lr)[0] = INFINITY, f32(&skip)[0] = 1;
  ck_assert_int_eq(ops_run_raw(&sg), BP_ABI_OK);
  f32(&skip)[0] = 0;
  ck_assert_int_eq(ops_run_raw(&sg), BP_ABI_ERR_INVALID);
  tt *all[] = {&g, &w, &m, &v, &lr, &st, &skip, &wide, &iskip, &seg, &norms};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

START_TEST(unscale_refusals_have_reasons) {
  tt h8 = span(FP16, 8), f8 = span(FP32, 8), f9 = span(FP32, 9), sc = scalar(2), wide = span(FP32, 2);
  ops_call c = {"range.unscale", {&h8, &sc}, {&f8}, 2, 1, NULL, 0};
  char reason[256];
  ck_assert_int_eq(ops_supports(&c, reason, sizeof reason), 1);
  c.nin = 1;
  ops_expect_refused(&c, "expects 2 inputs and 1 outputs, got 1");
  c.nin = 2, c.in[0] = &f8, c.out[0] = &f9;
  ops_expect_refused(&c, "src: dtype fp32, expected fp16");
  c.in[0] = &h8, c.out[0] = &h8;
  ops_expect_refused(&c, "dst: dtype fp16, expected fp32");
  c.out[0] = &f9;
  ops_expect_refused(&c, "src has 8 elements, dst has 9");
  c.out[0] = &f8, c.in[1] = &wide;
  ops_expect_refused(&c, "scale: shape [1,1,1,2], expected [1,1,1,1]");
  tt_free(&h8), tt_free(&f8), tt_free(&f9), tt_free(&sc), tt_free(&wide);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_range");
  TCase *tc = tcase_create("range");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, zero_any_dtype);
  tcase_add_test(tc, copy_keeps_bits);
  tcase_add_test(tc, scale_by_hand);
  tcase_add_test(tc, ema_by_hand);
  tcase_add_test(tc, nan_check_finds_one_anywhere);
  tcase_add_test(tc, cast_fp16_round_trip_exhaustive);
  tcase_add_test(tc, cast_fp32_to_fp16_by_hand);
  tcase_add_test(tc, cast_fp32_to_fp16_matches_oracle);
  tcase_add_test(tc, sgd_by_hand);
  tcase_add_loop_test(tc, sgd_matches_pytorch_formulas, 0,
                      (int)(sizeof sgd_cases / sizeof sgd_cases[0]));
  tcase_add_test(tc, adamw_first_step_by_hand);
  tcase_add_loop_test(tc, adamw_matches_pytorch_formulas, 0,
                      (int)(sizeof adamw_cases / sizeof adamw_cases[0]));
  tcase_add_test(tc, lars_by_hand);
  tcase_add_test(tc, lars_matches_double_over_steps);
  tcase_add_test(tc, refuses_with_reasons);
  tcase_add_test(tc, run_refuses_bad_values_untouched);
  tcase_add_test(tc, unscale_exact_values_and_specials);
  tcase_add_test(tc, unscale_refusals_have_reasons);
  tcase_add_test(tc, loss_scale_grows_at_the_interval_and_backs_off);
  tcase_add_test(tc, loss_scale_never_grows_to_inf);
  tcase_add_test(tc, loss_scale_static_when_interval_is_zero);
  tcase_add_test(tc, loss_scale_refuses_with_reasons);
  tcase_add_test(tc, skip_leaves_every_update_untouched);
  tcase_add_test(tc, skip_refusals_have_reasons);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
