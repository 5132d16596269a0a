/* The module SDK (abi/bp_abi_sdk.h): the FP16 and BF16 conversions against
 * oracles computed in double (every half and every bfloat16, every midpoint
 * between neighbours, a stride through all 2^32 float patterns, NaN
 * payloads), dtype sizes, the struct_size-strided tensor arrays, the checks
 * and their reasons, NHWC walking and the ABI 1.4 args accessors. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"

static uint32_t bits_of(float f) { return bp_sdk_bits_of_float(f); }
static float float_of(uint32_t b) { return bp_sdk_float_of_bits(b); }

/* ---- oracles ----------------------------------------------------------------- */

/* The value of a half (NaN for NaN patterns), computed without bit tricks. */
static double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = ldexp(mant, -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

/* The value of a bfloat16: the float whose top 16 bits it is. */
static double bf16_value(uint16_t b) { return (double)float_of((uint32_t)b << 16); }

/* Rounds |a| (finite, >= 0) to `bits` significant bits with quantum at
 * least 2^min_exp, to nearest even (nearbyint in the default mode), in
 * double: exact for every float input. */
static double round_to(double a, int bits, int min_exp) {
  if (a == 0.0) return 0.0;
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  int q = e - bits;  /* quantum 2^q */
  if (q < min_exp) q = min_exp;
  return ldexp(nearbyint(ldexp(a, -q)), q);
}

/* The half a finite float should become: 11 significant bits, quantum
 * >= 2^-24 (subnormals), Inf at or beyond 2^16. */
static uint16_t half_oracle(float f) {
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  const double r = round_to(fabs((double)f), 11, -24);
  if (r >= 65536.0) return sign | 0x7c00;
  if (r < 0x1p-14) return sign | (uint16_t)ldexp(r, 24); /* subnormal, or the smallest normal */
  int e;
  const double m = frexp(r, &e); /* r = m * 2^e, m in [0.5, 1) */
  return sign | (uint16_t)(((e + 14) << 10) | ((int)ldexp(m, 11) - 1024));
}

/* The bfloat16 a finite float should become: 8 significant bits, quantum
 * >= 2^-133 (subnormals), Inf at or beyond 2^128. */
static uint16_t bf16_oracle(float f) {
  const double r = round_to(fabs((double)f), 8, -133);
  const uint32_t sign = signbit(f) ? 0x80000000u : 0;
  if (r >= 0x1p128) return (uint16_t)((sign | 0x7f800000u) >> 16);
  return (uint16_t)((sign | bits_of((float)r)) >> 16); /* (float)r is exact */
}

/* Hot loops abort only on failure: a passing ck_assert is a message to
 * Check's parent process. */
static void expect_u16(uint16_t got, uint16_t want, const char *what, uint32_t input) {
  if (got != want) ck_abort_msg("%s %08x: got %04x, want %04x", what, input, got, want);
}

/* A NaN narrowed: quiet, same sign, the top payload bits (`keep` of them)
 * of the float. */
static void expect_nan_narrowed(uint32_t x, uint16_t got, int keep, const char *what) {
  const int exp_bits = keep == 10 ? 5 : 8;
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint16_t exp_mask = (uint16_t)(((1u << exp_bits) - 1u) << keep);
  const uint16_t quiet = (uint16_t)(1u << (keep - 1));
  const uint16_t payload = (uint16_t)((x & 0x7fffffu) >> (23 - keep));
  const uint16_t want = sign | exp_mask | quiet | payload;
  if (got != want) ck_abort_msg("%s NaN %08x: got %04x, want %04x", what, x, got, want);
}

/* narrow() against oracle() on every 251st float pattern from `first` (17
 * million floats: all binades, both signs, subnormals, Inf, NaNs with
 * scattered payloads); NaNs keep `keep` payload bits. */
static void expect_stride_narrowed(uint32_t first, uint16_t (*narrow)(float),
                                   uint16_t (*oracle)(float), int keep, const char *what) {
  const uint64_t stride = 251;
  for (uint64_t x = first; x <= UINT32_MAX; x += stride) {
    const float f = float_of((uint32_t)x);
    const uint16_t got = narrow(f);
    if (isnan(f)) expect_nan_narrowed((uint32_t)x, got, keep, what);
    else expect_u16(got, oracle(f), what, (uint32_t)x);
  }
}

/* ---- FP16 --------------------------------------------------------------------- */

START_TEST(every_half_widens_exactly_and_nans_come_out_quiet) {
  for (uint32_t i = 0; i < 0x10000; i++) {
    const uint16_t h = (uint16_t)i;
    const float f = bp_sdk_fp16_to_fp32(h);
    const double want = half_value(h);
    if (isnan(want)) {
      /* sign, the 10 payload bits on top of the float's, quiet bit set */
      const uint32_t nan_bits = ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u |
                                ((uint32_t)(h & 0x3ffu) << 13);
      if (bits_of(f) != nan_bits)
        ck_abort_msg("%04x -> %08x, expected the NaN %08x", h, bits_of(f), nan_bits);
    } else if (!((double)f == want && !signbit(f) == !signbit(want))) {
      ck_abort_msg("%04x -> %a, expected %a", h, (double)f, want);
    }
  }
}
END_TEST

START_TEST(every_half_round_trips_and_signalling_nans_come_back_quiet) {
  for (uint32_t i = 0; i < 0x10000; i++) {
    const uint16_t h = (uint16_t)i;
    const int snan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) && !(h & 0x200);
    expect_u16(bp_sdk_fp32_to_fp16(bp_sdk_fp16_to_fp32(h)), snan ? (uint16_t)(h | 0x200) : h,
               "fp16 round trip", h);
  }
}
END_TEST

START_TEST(fp32_to_fp16_rounds_to_nearest_even_at_every_midpoint) {
  /* between every two neighbouring halves of either sign (the largest
   * finite one and 2^16 included): the midpoint goes to the even one, the
   * floats beside it to the nearer one */
  for (uint32_t h = 0; h < 0x7c00; h++) {
    for (int neg = 0; neg < 2; neg++) {
      const double lo = half_value((uint16_t)h);
      const double hi = h == 0x7bff ? 65536.0 : half_value((uint16_t)(h + 1));
      const float mid = (float)((lo + hi) / 2); /* 12 significant bits: exact */
      ck_assert((double)mid == (lo + hi) / 2);
      const uint16_t sign = neg ? 0x8000 : 0;
      const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
      const float s = neg ? -1.0f : 1.0f;
      expect_u16(bp_sdk_fp32_to_fp16(s * mid), sign | even, "midpoint", bits_of(s * mid));
      const float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
      expect_u16(bp_sdk_fp32_to_fp16(s * below), sign | (uint16_t)h, "below", bits_of(below));
      expect_u16(bp_sdk_fp32_to_fp16(s * above), sign | (uint16_t)(h + 1), "above",
                 bits_of(above));
    }
  }
}
END_TEST

START_TEST(fp32_to_fp16_matches_the_oracle_over_a_stride_of_all_floats) {
  expect_stride_narrowed(0, bp_sdk_fp32_to_fp16, half_oracle, 10, "fp16");
}
END_TEST

START_TEST(fp32_to_fp16_by_hand) {
  const struct {
    float f;
    uint16_t h;
  } cases[] = {
      {1.0f, 0x3c00},
      {1.0f + 0x1p-11f, 0x3c00},               /* tie: to the even 1 */
      {1.0f + 3 * 0x1p-11f, 0x3c02},           /* tie: to the even 1+2^-9 */
      {65504.0f, 0x7bff},                      /* the largest half */
      {65519.996f, 0x7bff},                    /* just below the midpoint to 2^16 */
      {65520.0f, 0x7c00},                      /* the midpoint: ties to the even Inf */
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {FLT_MAX, 0x7c00},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
      {0x1p-24f, 0x0001},                      /* the smallest subnormal */
      {0x1p-25f, 0x0000},                      /* half of it: ties to the even 0 */
      {-0x1p-25f, 0x8000},
      {0x1p-25f + 0x1p-40f, 0x0001},
      {3 * 0x1p-25f, 0x0002},                  /* 1.5 units: to the even 2 */
      {5 * 0x1p-25f, 0x0002},                  /* 2.5 units: to the even 2 */
      {1023.5f * 0x1p-24f, 0x0400},            /* rounds out of the subnormals */
      {0x1p-14f, 0x0400},                      /* the smallest normal */
      {FLT_MIN, 0x0000},
      {0x1p-140f, 0x0000},                     /* a float subnormal */
      {-0.0f, 0x8000},
      {0.1f, 0x2e66},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(bp_sdk_fp32_to_fp16(cases[i].f) == cases[i].h, "%a -> %04x, want %04x",
                  (double)cases[i].f, bp_sdk_fp32_to_fp16(cases[i].f), cases[i].h);
  /* NaNs: quiet, sign kept, the top 10 payload bits kept */
  ck_assert_uint_eq(bp_sdk_fp32_to_fp16(float_of(0x7fc00000u)), 0x7e00);
  ck_assert_uint_eq(bp_sdk_fp32_to_fp16(float_of(0xffc00000u)), 0xfe00);
  ck_assert_uint_eq(bp_sdk_fp32_to_fp16(float_of(0x7f800001u)), 0x7e00); /* low payload: quiet */
  ck_assert_uint_eq(bp_sdk_fp32_to_fp16(float_of(0x7fa02000u)), 0x7f01); /* signalling: quiet */
  ck_assert_uint_eq(bp_sdk_fp32_to_fp16(float_of(0xffffe000u)), 0xffff);
}
END_TEST

#ifdef __FLT16_MAX__
START_TEST(fp32_to_fp16_matches_the_compilers_float16) {
  uint32_t x = 12345;
  for (int i = 0; i < 1000000; i++) {
    x = x * 1664525u + 1013904223u;
    const float f = float_of(x);
    if (isnan(f)) continue;
    const _Float16 r = (_Float16)f;
    uint16_t want;
    memcpy(&want, &r, sizeof want);
    expect_u16(bp_sdk_fp32_to_fp16(f), want, "_Float16", x);
  }
}
END_TEST
#endif

/* ---- BF16 --------------------------------------------------------------------- */

START_TEST(every_bf16_widens_exactly_and_round_trips) {
  for (uint32_t i = 0; i < 0x10000; i++) {
    const uint16_t b = (uint16_t)i;
    const float f = bp_sdk_bf16_to_fp32(b);
    const int nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
    const uint32_t want = nan ? ((uint32_t)b << 16) | 0x00400000u : (uint32_t)b << 16;
    if (bits_of(f) != want) ck_abort_msg("%04x -> %08x, want %08x", b, bits_of(f), want);
    const int snan = nan && !(b & 0x40);
    expect_u16(bp_sdk_fp32_to_bf16(f), snan ? (uint16_t)(b | 0x40) : b, "bf16 round trip", b);
  }
}
END_TEST

START_TEST(fp32_to_bf16_rounds_to_nearest_even_at_every_midpoint) {
  for (uint32_t b = 0; b < 0x7f80; b++) {
    for (int neg = 0; neg < 2; neg++) {
      const double lo = bf16_value((uint16_t)b);
      const double hi = b == 0x7f7f ? 0x1p128 : bf16_value((uint16_t)(b + 1));
      const double mid = (lo + hi) / 2;
      const float fmid = (float)mid; /* 9 significant bits: exact */
      ck_assert((double)fmid == mid);
      const uint16_t sign = neg ? 0x8000 : 0;
      const uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
      const float s = neg ? -1.0f : 1.0f;
      expect_u16(bp_sdk_fp32_to_bf16(s * fmid), sign | even, "bf16 midpoint", bits_of(s * fmid));
      expect_u16(bp_sdk_fp32_to_bf16(s * nextafterf(fmid, 0.0f)), sign | (uint16_t)b,
                 "bf16 below", bits_of(fmid));
      expect_u16(bp_sdk_fp32_to_bf16(s * nextafterf(fmid, INFINITY)), sign | (uint16_t)(b + 1),
                 "bf16 above", bits_of(fmid));
    }
  }
}
END_TEST

START_TEST(fp32_to_bf16_matches_the_oracle_over_a_stride_of_all_floats) {
  expect_stride_narrowed(7, bp_sdk_fp32_to_bf16, bf16_oracle, 7, "bf16");
  ck_assert_uint_eq(bp_sdk_fp32_to_bf16(FLT_MAX), 0x7f80); /* rounds to Inf, as IEEE says */
  ck_assert_uint_eq(bp_sdk_fp32_to_bf16(-FLT_MAX), 0xff80);
  ck_assert_uint_eq(bp_sdk_fp32_to_bf16(float_of(0x7f800001u)), 0x7fc0); /* stays a NaN */
  ck_assert_uint_eq(bp_sdk_fp32_to_bf16(float_of(0xff810000u)), 0xffc1);
  ck_assert_uint_eq(bp_sdk_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
  ck_assert_uint_eq(bp_sdk_fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
}
END_TEST

/* ---- dtypes --------------------------------------------------------------------- */

START_TEST(dtype_sizes_and_names) {
  ck_assert_uint_eq(bp_sdk_dtype_size(BP_ABI_DTYPE_FP32), 4);
  ck_assert_uint_eq(bp_sdk_dtype_size(BP_ABI_DTYPE_FP16), 2);
  ck_assert_uint_eq(bp_sdk_dtype_size(BP_ABI_DTYPE_INT8), 1);
  ck_assert_uint_eq(bp_sdk_dtype_size(BP_ABI_DTYPE_INT32), 4);
  ck_assert_uint_eq(bp_sdk_dtype_size(BP_ABI_DTYPE_BF16), 2);
  ck_assert_uint_eq(bp_sdk_dtype_size(99), 0);
  ck_assert_uint_eq(bp_sdk_dtype_size(-1), 0);
  ck_assert_str_eq(bp_sdk_dtype_name(BP_ABI_DTYPE_BF16), "bf16");
  ck_assert_str_eq(bp_sdk_dtype_name(BP_ABI_DTYPE_INT8), "int8");
  ck_assert_str_eq(bp_sdk_dtype_name(42), "unknown");
}
END_TEST

/* ---- tensors and checks ---------------------------------------------------------- */

/* A dense FP32 tensor [n,h,w,c] with channels padded to pc. */
static bp_abi_tensor tensor(int64_t n, int64_t h, int64_t w, int64_t c, int64_t pc) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = BP_ABI_DTYPE_FP32;
  t.shape[0] = n, t.shape[1] = h, t.shape[2] = w, t.shape[3] = c;
  t.padded_c = pc;
  t.stride[3] = 1, t.stride[2] = pc, t.stride[1] = w * pc, t.stride[0] = h * w * pc;
  t.slot_bytes = (uint64_t)(n * h * w * pc) * 4 + 16;
  return t;
}

/* A tensor as a newer host might write it: 24 more bytes per element. */
typedef struct wide_tensor {
  bp_abi_tensor t;
  char future[24];
} wide_tensor;

START_TEST(tensor_arrays_are_strided_by_the_writers_struct_size) {
  wide_tensor in[3], out[2];
  memset(in, 0, sizeof in), memset(out, 0, sizeof out);
  for (int i = 0; i < 3; i++) {
    in[i].t = tensor(1, 1, 1, 10 + i, 10 + i);
    in[i].t.struct_size = sizeof(wide_tensor);
    memset(in[i].future, 0xee, sizeof in[i].future);
  }
  for (int o = 0; o < 2; o++) {
    out[o].t = tensor(1, 1, 1, 20 + o, 20 + o);
    out[o].t.struct_size = sizeof(wide_tensor);
  }
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.num_inputs = 3, a.num_outputs = 2;
  a.inputs = &in[0].t, a.outputs = &out[0].t;
  char reason[128] = "";
  ck_assert_msg(bp_sdk_check_args(&a, 3, 2, reason, sizeof reason), "%s", reason);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(bp_sdk_input(&a, i)->shape[3], 10 + i);
  for (int o = 0; o < 2; o++) ck_assert_int_eq(bp_sdk_output(&a, o)->shape[3], 20 + o);
  /* an element shorter than this build's descriptor is refused, by index */
  in[1].t.struct_size = 8;
  ck_assert(!bp_sdk_check_args(&a, 3, 2, reason, sizeof reason));
  ck_assert_str_eq(reason, "input 1: tensor struct_size 8 is too small");
  in[1].t.struct_size = sizeof(wide_tensor);
  ck_assert(!bp_sdk_check_args(&a, 2, 2, reason, sizeof reason));
  ck_assert_str_eq(reason, "expects 2 inputs and 2 outputs, got 3 and 2");
  ck_assert(!bp_sdk_check_args(NULL, 2, 2, reason, sizeof reason));
  ck_assert_str_eq(reason, "no args");
}
END_TEST

START_TEST(tensor_checks_name_what_is_wrong) {
  char reason[160];
  bp_abi_tensor t = tensor(2, 3, 4, 5, 8);
  ck_assert(bp_sdk_check_tensor(&t, "x", BP_ABI_DTYPE_FP32, reason, sizeof reason));
  ck_assert(!bp_sdk_check_tensor(&t, "x", BP_ABI_DTYPE_FP16, reason, sizeof reason));
  ck_assert_str_eq(reason, "x: dtype fp32, expected fp16");
  bp_abi_tensor u = t;
  u.shape[1] = 0;
  ck_assert(!bp_sdk_check_tensor(&u, "x", BP_ABI_DTYPE_FP32, reason, sizeof reason));
  ck_assert_str_eq(reason, "x: extent 0 of dimension 1 is out of range");
  u = t, u.padded_c = 4;
  ck_assert(!bp_sdk_check_tensor(&u, "w", BP_ABI_DTYPE_FP32, reason, sizeof reason));
  ck_assert_str_eq(reason, "w: padded_c 4 < channels 5");
  u = t, u.stride[2] = 4; /* pixels 4 apart hold 5 channels: they overlap */
  ck_assert(!bp_sdk_check_tensor(&u, "y", BP_ABI_DTYPE_FP32, reason, sizeof reason));
  ck_assert_str_eq(reason, "y: stride 4 of dimension 2 overlaps the inner dimensions (span 5)");
  u = t, u.slot_bytes = (2 * 3 * 4 * 8 - 3) * 4 - 1; /* one byte short of the last element */
  ck_assert(!bp_sdk_check_tensor(&u, "y", BP_ABI_DTYPE_FP32, reason, sizeof reason));
  ck_assert_str_eq(reason, "y: needs 756 bytes, slot_bytes is 755");
  ck_assert(!bp_sdk_check_shape(&t, "x", 2, 3, 4, 6, reason, sizeof reason));
  ck_assert_str_eq(reason, "x: shape [2,3,4,5], expected [2,3,4,6]");
  ck_assert(bp_sdk_check_shape(&t, "x", 2, 3, 4, 5, reason, sizeof reason));
  ck_assert(!bp_sdk_check_flag(2, "accumulate", reason, sizeof reason));
  ck_assert_str_eq(reason, "attribute accumulate is 2, expected 0 or 1");
  /* a NULL reason is fine; a short one is truncated */
  ck_assert(!bp_sdk_check_flag(2, "accumulate", NULL, 0));
  char tiny[8];
  ck_assert(!bp_sdk_fail(tiny, sizeof tiny, "%s", "longer than eight"));
  ck_assert_str_eq(tiny, "longer ");
}
END_TEST

START_TEST(attribute_blocks_grow_at_their_end) {
  bp_conv2d_attrs full = {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}, got;
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.attrs = &full, a.attr_size = offsetof(bp_conv2d_attrs, has_bias); /* an older writer */
  char reason[128];
  ck_assert(bp_sdk_read_attrs(&a, &got, sizeof got, reason, sizeof reason));
  ck_assert_int_eq(got.kernel_h, 3);
  ck_assert_int_eq(got.groups, 1);
  ck_assert_int_eq(got.has_bias, 0); /* not sent: zero */
  ck_assert_int_eq(got.accumulate, 0);
  a.attr_size = sizeof full + 64; /* a newer writer: the rest is ignored */
  ck_assert(bp_sdk_read_attrs(&a, &got, sizeof got, reason, sizeof reason));
  ck_assert_int_eq(got.accumulate, 1);
  a.attrs = NULL;
  ck_assert(!bp_sdk_read_attrs(&a, &got, sizeof got, reason, sizeof reason));
  ck_assert_str_eq(reason, "attr_size 108 but no attribute block");
}
END_TEST

START_TEST(pointer_checks_refuse_overlaps_but_allow_declared_aliases) {
  float buf[64];
  bp_abi_tensor ts[2] = {tensor(1, 1, 2, 4, 4), tensor(1, 1, 2, 4, 4)};
  const void *in_ptrs[1] = {buf};
  void *out_ptrs[1] = {buf};
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.num_inputs = 1, a.num_outputs = 1;
  a.inputs = &ts[0], a.outputs = &ts[1];
  a.input_ptrs = in_ptrs, a.output_ptrs = out_ptrs;
  char reason[128];
  static const int alias_out[] = {0}, alias_in[] = {0};
  ck_assert(bp_sdk_check_ptrs(&a, alias_out, alias_in, 1, reason, sizeof reason));
  ck_assert(!bp_sdk_check_ptrs(&a, NULL, NULL, 0, reason, sizeof reason));
  ck_assert_str_eq(reason, "output 0 overlaps input 0");
  out_ptrs[0] = buf + 4; /* a partial overlap is never an alias */
  ck_assert(!bp_sdk_check_ptrs(&a, alias_out, alias_in, 1, reason, sizeof reason));
  out_ptrs[0] = buf + 8;
  ck_assert(bp_sdk_check_ptrs(&a, NULL, NULL, 0, reason, sizeof reason));
  out_ptrs[0] = (char *)buf + 34; /* not aligned to 4 */
  ck_assert(!bp_sdk_check_ptrs(&a, NULL, NULL, 0, reason, sizeof reason));
  ck_assert(strstr(reason, "output 0: pointer") && strstr(reason, "not aligned to 4"));
}
END_TEST

/* ---- NHWC walking ------------------------------------------------------------------- */

START_TEST(nhwc_walk_visits_the_logical_extent_and_leaves_padding_alone) {
  enum { N = 2, H = 3, W = 2, C = 3, PC = 4 };
  float data[N * H * W * PC];
  for (int i = 0; i < N * H * W * PC; i++) data[i] = -1.0f;
  const bp_abi_tensor t = tensor(N, H, W, C, PC);
  ck_assert_int_eq(bp_sdk_offset(&t, 1, 2, 1, 2), 1 * H * W * PC + 2 * W * PC + 1 * PC + 2);
  ck_assert_int_eq(bp_sdk_count(&t), N * H * W * C);
  ck_assert_int_eq(bp_sdk_span(&t), N * H * W * PC - (PC - C));
  int64_t visits = 0, last = -1, ordered = 1;
  BP_SDK_FOR_EACH_NHWC(&t, n, h, w, c) {
    const int64_t off = bp_sdk_offset(&t, n, h, w, c);
    ordered &= off > last;
    last = off;
    data[off] = (float)visits++;
  }
  ck_assert_int_eq(visits, N * H * W * C);
  ck_assert(ordered);
  bp_sdk_fill_f32(&t, data, 7.0f);
  for (int i = 0; i < N * H * W * PC; i++)
    ck_assert_msg(data[i] == (i % PC < C ? 7.0f : -1.0f), "element %d is %g", i, (double)data[i]);
}
END_TEST

/* ---- the ABI 1.4 fields of the args ----------------------------------------------------- */

static void count_calls(void *arg, int64_t i) { ((int64_t *)arg)[i]++; }

/* A threads service that runs the loop backwards, to tell it from the
 * fallback. */
static int service_calls;
static void backwards_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  service_calls++;
  for (int64_t i = n - 1; i >= 0; i--) fn(arg, i);
}

START_TEST(args_accessors_read_only_what_the_host_wrote) {
  uint64_t generation = 41;
  char buffer[16];
  bp_abi_threads threads = {sizeof threads, 4, NULL, backwards_for};
  int state_object;
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.state = &state_object;
  a.params_generation = &generation;
  a.reason = buffer, a.reason_size = sizeof buffer;
  a.threads = &threads;
  ck_assert_ptr_eq(bp_sdk_args_state(&a), &state_object);
  ck_assert_ptr_eq(bp_sdk_args_threads(&a), &threads);
  ck_assert_int_eq(bp_sdk_args_thread_count(&a), 4);
  ck_assert_uint_eq(bp_sdk_args_generation(&a), 41);
  bp_sdk_set_reason(&a, "mask %d is out of its window", 1234567);
  ck_assert_str_eq(buffer, "mask 1234567 is"); /* truncated to reason_size */
  int64_t hits[5] = {0};
  bp_sdk_parallel_for(&a, count_calls, hits, 5);
  ck_assert_int_eq(service_calls, 1);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(hits[i], 1);

  /* a 1.3 host: its args end before state; nothing beyond is read */
  a.struct_size = (uint32_t)offsetof(bp_abi_kernel_args, state);
  strcpy(buffer, "untouched");
  ck_assert_ptr_null(bp_sdk_args_state(&a));
  ck_assert_ptr_null(bp_sdk_args_threads(&a));
  ck_assert_int_eq(bp_sdk_args_thread_count(&a), 1);
  ck_assert_uint_eq(bp_sdk_args_generation(&a), 0);
  ck_assert_ptr_null(bp_sdk_args_reason(&a));
  ck_assert_uint_eq(bp_sdk_args_reason_size(&a), 0);
  bp_sdk_set_reason(&a, "lost");
  ck_assert_str_eq(buffer, "untouched");
  bp_sdk_parallel_for(&a, count_calls, hits, 5); /* serial fallback */
  ck_assert_int_eq(service_calls, 1);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(hits[i], 2);
  /* NULL args and a NULL reason buffer are fine */
  ck_assert_ptr_null(bp_sdk_args_state(NULL));
  a.struct_size = sizeof a, a.reason = NULL;
  bp_sdk_set_reason(&a, "nowhere");
  bp_sdk_set_reason(NULL, "nowhere");
}
END_TEST

int main(void) {
  Suite *s = suite_create("sdk");
  TCase *conv = tcase_create("conversions");
  tcase_set_timeout(conv, 120);
  tcase_add_test(conv, every_half_widens_exactly_and_nans_come_out_quiet);
  tcase_add_test(conv, every_half_round_trips_and_signalling_nans_come_back_quiet);
  tcase_add_test(conv, fp32_to_fp16_rounds_to_nearest_even_at_every_midpoint);
  tcase_add_test(conv, fp32_to_fp16_matches_the_oracle_over_a_stride_of_all_floats);
  tcase_add_test(conv, fp32_to_fp16_by_hand);
#ifdef __FLT16_MAX__
  tcase_add_test(conv, fp32_to_fp16_matches_the_compilers_float16);
#endif
  tcase_add_test(conv, every_bf16_widens_exactly_and_round_trips);
  tcase_add_test(conv, fp32_to_bf16_rounds_to_nearest_even_at_every_midpoint);
  tcase_add_test(conv, fp32_to_bf16_matches_the_oracle_over_a_stride_of_all_floats);
  suite_add_tcase(s, conv);
  TCase *tc = tcase_create("helpers");
  tcase_add_test(tc, dtype_sizes_and_names);
  tcase_add_test(tc, tensor_arrays_are_strided_by_the_writers_struct_size);
  tcase_add_test(tc, tensor_checks_name_what_is_wrong);
  tcase_add_test(tc, attribute_blocks_grow_at_their_end);
  tcase_add_test(tc, pointer_checks_refuse_overlaps_but_allow_declared_aliases);
  tcase_add_test(tc, nhwc_walk_visits_the_logical_extent_and_leaves_padding_alone);
  tcase_add_test(tc, args_accessors_read_only_what_the_host_wrote);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
