/* Range reference kernels: zero, copy, scale, cast FP32<->FP16, EMA,
 * NaN/Inf check, and the SGD (momentum, Nesterov), AdamW and LARS updates.
 *
 * Spans (bp_abi_ops.h): every span is one tensor shaped [1,1,1,E] with
 * stride[3] = 1, E elements from its pointer. The host makes one span of
 * several neighbouring region slots, so the E elements include each slot's
 * padding: the 16-byte tail and the rounding up to 256 bytes between one
 * tensor and the next. These kernels treat a span as a flat array of E
 * elements and never look at where one tensor ends; slot_bytes beyond the
 * E elements is neither read nor written. An FP32 span and its FP16 twin
 * hold the same E (the 2:1 byte ratio of the slots), so range.cast covers
 * the whole of both.
 *
 * Padding is harmless because the executor keeps it zero: arenas start
 * zeroed, range.zero clears whole gradient spans, and no compute kernel
 * writes a slot tail. With w = g = m = v = 0 at an element, every update
 * below leaves all of them 0 (AdamW: 0 / (sqrt(0) + eps) with eps > 0,
 * which supports() insists on; LARS: zeros add nothing to a norm).
 *
 * Arithmetic: each element is updated in FP32 in the order PyTorch's
 * single-tensor CPU optimizers use (torch.optim.SGD / AdamW with
 * foreach=False, the CPU default); factors that depend only on scalars
 * (bias corrections, 1 - lr*wd, 1 - beta) are formed in double and rounded
 * to float once. No fused multiply-add is asked for, so results can differ
 * from PyTorch's vectorized (FMA) kernels by an ulp per operation (against
 * Debian's PyTorch 1.13 on AVX2, 20 steps of 4096 weights: within 2.5e-7
 * of 1 + |w| for SGD, Nesterov and AdamW, and plain SGD bit-identical
 * once PyTorch's FMA is emulated); the tests compare against a double
 * re-implementation of PyTorch's formulas.
 *
 * Scalar inputs (lr, step) are FP32 [1,1,1,1] tensors read at run time;
 * run() checks them (finite lr, step >= 1, segment offsets in order)
 * before writing anything and returns BP_ABI_ERR_INVALID with every
 * output untouched when one is off. No output aliases an input, except
 * range.scale, whose output may be its input (the op is in place). */
#include <math.h>
#include <string.h>

#include "reference-impl.h"

/* ---- checks shared by the range ops ------------------------------------ */

static int64_t range_dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32:
    case BP_ABI_DTYPE_INT32: return 4;
    case BP_ABI_DTYPE_FP16:
    case BP_ABI_DTYPE_BF16: return 2;
    case BP_ABI_DTYPE_INT8: return 1;
    default: return 0;
  }
}

#define RANGE_ALL_DTYPES                                                                   \
  (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16) |             \
   BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32) |            \
   BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_BF16))
#define RANGE_FLOAT_DTYPES \
  (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16))

/* A span of `dtype` (any known dtype when dtype < 0): a valid tensor
 * (ref_check_tensor) shaped [1,1,1,E], contiguous. */
static int span_check(const bp_abi_tensor *t, const char *name, int32_t dtype, char *reason,
                      size_t rs) {
  if (dtype < 0) {
    if (range_dtype_bytes(t->dtype) == 0)
      return ref_fail(reason, rs, "%s: unknown dtype %d", name, (int)t->dtype);
    dtype = t->dtype;
  }
  if (!ref_check_tensor(t, name, dtype, reason, rs)) return 0;
  if (t->shape[0] != 1 || t->shape[1] != 1 || t->shape[2] != 1)
    return ref_fail(reason, rs, "%s: a span is [1,1,1,elements], got [%lld,%lld,%lld,%lld]", name,
                    (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                    (long long)t->shape[3]);
  if (t->shape[3] > 1 && t->stride[3] != 1)
    return ref_fail(reason, rs, "%s: a span is contiguous, got element stride %lld", name,
                    (long long)t->stride[3]);
  return 1;
}

/* An FP32 scalar [1,1,1,1]. */
static int scalar_check(const bp_abi_tensor *t, const char *name, char *reason, size_t rs) {
  return ref_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs) &&
         ref_check_shape(t, name, 1, 1, 1, 1, reason, rs);
}

/* Two spans of the same element count. */
static int same_count(const bp_abi_tensor *a, const char *an, const bp_abi_tensor *b,
                      const char *bn, char *reason, size_t rs) {
  if (a->shape[3] != b->shape[3])
    return ref_fail(reason, rs, "%s has %lld elements, %s has %lld; they must be equal", an,
                    (long long)a->shape[3], bn, (long long)b->shape[3]);
  return 1;
}

/* The attribute block, which must reach at least `needed` bytes (the end
 * of the last field the op reads): an op whose attribute would silently
 * read as zero (a scale of 0, an eps of 0) is refused instead. */
static int attrs_check(const bp_abi_kernel_args *args, void *dst, size_t dst_size, size_t needed,
                       const char *field, char *reason, size_t rs) {
  if (!ref_read_attrs(args, dst, dst_size, reason, rs)) return 0;
  if (args->attr_size < needed)
    return ref_fail(reason, rs, "attribute block of %u bytes lacks %s (needs %zu bytes)",
                    (unsigned)args->attr_size, field, needed);
  return 1;
}

#define RANGE_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

static int finite_at_least(float v, float lo, const char *name, char *reason, size_t rs) {
  if (!isfinite(v) || v < lo)
    return ref_fail(reason, rs, "%s %g must be finite and >= %g", name, (double)v, (double)lo);
  return 1;
}

static int in_unit(float v, int closed_top, const char *name, char *reason, size_t rs) {
  if (!(v >= 0.0f && (closed_top ? v <= 1.0f : v < 1.0f)))
    return ref_fail(reason, rs, "%s %g must be in [0, 1%c", name, (double)v,
                    closed_top ? ']' : ')');
  return 1;
}

/* Reads the FP32 scalar input i. */
static float scalar_in(const bp_abi_kernel_args *args, int i) {
  float v;
  memcpy(&v, args->input_ptrs[i], sizeof v);
  return v;
}

/* ---- FP16 <-> FP32 ------------------------------------------------------ */

/* IEEE binary16 to binary32, exact for every one of the 65536 patterns:
 * normals and subnormals become normal floats, infinities stay infinite,
 * a NaN keeps its sign and its 10 payload bits (shifted to the top of the
 * float's payload, so a quiet NaN stays quiet and a signalling one keeps
 * its pattern). */
static float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13); /* rebias 15 -> 127 */
  } else {
    /* zero or subnormal: mant * 2^-24, exact in float (mant < 2^10) */
    const float v = (float)mant * 0x1p-24f;
    memcpy(&bits, &v, sizeof bits);
    bits |= sign;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* IEEE binary32 to binary16, rounded to nearest with ties to even, on the
 * bits (independent of the floating-point environment):
 *   |f| >= 65520 (65504 + half an ulp, a tie that goes to the even Inf)
 *     and Inf -> Inf;
 *   NaN -> NaN with its sign and the top 10 payload bits, the quiet bit
 *     set only when those bits would all be 0 (so it stays a NaN);
 *   2^-14 <= |f| -> a normal half (a carry out of the mantissa moves to the
 *     next binade, which is the right encoding);
 *   2^-25 < |f| < 2^-14 -> a subnormal (or the smallest normal when it
 *     rounds up to 2^-14); |f| <= 2^-25 -> a signed zero. */
static uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {
    uint32_t payload = (ax >> 13) & 0x3ffu;
    if (payload == 0) payload = 0x200u;
    return (uint16_t)(sign | 0x7c00u | payload);
  }
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) {
    uint32_t h = ((ax >> 23) - 112u) << 10 | ((ax >> 13) & 0x3ffu);
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  if (ax <= 0x33000000u) return sign;
  /* |f| = m * 2^(e - 150) with the implicit bit; in units of 2^-24 that is
   * m >> (126 - e), shift in [14, 24] for e in [102, 112]. */
  const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

/* ---- range.zero --------------------------------------------------------- */

/* range.zero  out: x, a span of any dtype; all E elements set to zero bits
 * (0.0 for the float types). */
static int zero_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  return ref_read_attrs(args, &a, sizeof a, reason, rs) &&
         ref_check_args(args, 0, 1, reason, rs) &&
         span_check(&args->outputs[0], "x", -1, reason, rs);
}
static int zero_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  return zero_check(args, reason, rs);
}
static int zero_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  char reason[REF_REASON_MAX];
  if (!zero_check(args, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *t = &args->outputs[0];
  memset(args->output_ptrs[0], 0, (size_t)(t->shape[3] * range_dtype_bytes(t->dtype)));
  return BP_ABI_OK;
}

/* ---- range.copy --------------------------------------------------------- */

/* range.copy  in: src   out: dst; spans of one dtype (any) and one E; the
 * bytes are copied as they are (NaN payloads included). */
static int copy_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs) || !ref_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *src = &args->inputs[0], *dst = &args->outputs[0];
  if (!span_check(src, "src", -1, reason, rs) || !span_check(dst, "dst", src->dtype, reason, rs))
    return 0;
  return same_count(src, "src", dst, "dst", reason, rs);
}
static int copy_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  return copy_check(args, reason, rs);
}
static int copy_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  char reason[REF_REASON_MAX];
  if (!copy_check(args, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *t = &args->inputs[0];
  memcpy(args->output_ptrs[0], args->input_ptrs[0],
         (size_t)(t->shape[3] * range_dtype_bytes(t->dtype)));
  return BP_ABI_OK;
}

/* ---- range.scale -------------------------------------------------------- */

/* range.scale  in: x   out: y (normally x itself: the op is in place)
 *   y = x * scale, FP32 spans of one E; scale finite (0 allowed). */
static int scale_check(const bp_abi_kernel_args *args, bp_range_attrs *a, char *reason,
                       size_t rs) {
  if (!args) return ref_fail(reason, rs, "no args");
  if (!attrs_check(args, a, sizeof *a, RANGE_END(bp_range_attrs, scale), "scale", reason, rs))
    return 0;
  if (!isfinite(a->scale))
    return ref_fail(reason, rs, "scale %g must be finite", (double)a->scale);
  if (!ref_check_args(args, 1, 1, reason, rs)) return 0;
  const bp_abi_tensor *x = &args->inputs[0], *y = &args->outputs[0];
  return span_check(x, "x", BP_ABI_DTYPE_FP32, reason, rs) &&
         span_check(y, "y", BP_ABI_DTYPE_FP32, reason, rs) &&
         same_count(x, "x", y, "y", reason, rs);
}
static int scale_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_range_attrs a;
  return scale_check(args, &a, reason, rs);
}
static int scale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_range_attrs a;
  char reason[REF_REASON_MAX];
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!scale_check(args, &a, reason, sizeof reason) ||
      !ref_check_ptrs(args, alias_out, alias_in, 1))
    return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0);
  float *y = ref_out(args, 0);
  const int64_t n = args->inputs[0].shape[3];
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * a.scale;
  return BP_ABI_OK;
}

/* ---- range.cast --------------------------------------------------------- */

/* range.cast  in: src   out: dst; one is FP32 and the other FP16, same E
 *   (so the FP32 span is exactly twice the bytes of the FP16 one).
 *   FP32 -> FP16 rounds to nearest, ties to even (fp32_to_fp16); FP16 ->
 *   FP32 is exact. */
static int cast_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs) || !ref_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *src = &args->inputs[0], *dst = &args->outputs[0];
  const int32_t sd = src->dtype, dd = dst->dtype;
  if (!((sd == BP_ABI_DTYPE_FP32 && dd == BP_ABI_DTYPE_FP16) ||
        (sd == BP_ABI_DTYPE_FP16 && dd == BP_ABI_DTYPE_FP32)))
    return ref_fail(reason, rs,
                    "casts fp32 to fp16 or fp16 to fp32, got src dtype %d and dst dtype %d "
                    "(fp32 = %d, fp16 = %d)",
                    (int)sd, (int)dd, BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16);
  return span_check(src, "src", sd, reason, rs) && span_check(dst, "dst", dd, reason, rs) &&
         same_count(src, "src", dst, "dst", reason, rs);
}
static int cast_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  return cast_check(args, reason, rs);
}
static int cast_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  char reason[REF_REASON_MAX];
  if (!cast_check(args, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const int64_t n = args->inputs[0].shape[3];
  if (args->inputs[0].dtype == BP_ABI_DTYPE_FP32) {
    const float *src = ref_in(args, 0);
    uint16_t *dst = (uint16_t *)args->output_ptrs[0];
    for (int64_t i = 0; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
  } else {
    const uint16_t *src = (const uint16_t *)args->input_ptrs[0];
    float *dst = ref_out(args, 0);
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(src[i]);
  }
  return BP_ABI_OK;
}

/* ---- range.ema ---------------------------------------------------------- */

/* range.ema  in: w   out: e (read and written); FP32 spans of one E
 *   e = decay*e + (1-decay)*w, decay in [0, 1], (1-decay) rounded once. */
static int ema_check(const bp_abi_kernel_args *args, bp_range_attrs *a, char *reason, size_t rs) {
  if (!args) return ref_fail(reason, rs, "no args");
  if (!attrs_check(args, a, sizeof *a, RANGE_END(bp_range_attrs, decay), "decay", reason, rs) ||
      !in_unit(a->decay, 1, "decay", reason, rs) || !ref_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *w = &args->inputs[0], *e = &args->outputs[0];
  return span_check(w, "w", BP_ABI_DTYPE_FP32, reason, rs) &&
         span_check(e, "e", BP_ABI_DTYPE_FP32, reason, rs) &&
         same_count(w, "w", e, "e", reason, rs);
}
static int ema_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_range_attrs a;
  return ema_check(args, &a, reason, rs);
}
static int ema_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_range_attrs a;
  char reason[REF_REASON_MAX];
  if (!ema_check(args, &a, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *w = ref_in(args, 0);
  float *e = ref_out(args, 0);
  const float d = a.decay, one_minus_d = (float)(1.0 - (double)a.decay);
  const int64_t n = args->inputs[0].shape[3];
  for (int64_t i = 0; i < n; i++) e[i] = d * e[i] + one_minus_d * w[i];
  return BP_ABI_OK;
}

/* ---- range.nan_check ---------------------------------------------------- */

/* range.nan_check  in: x, an FP32 or FP16 span   out: flag, FP32 [1,1,1,1]
 *   flag = 1 when any of the E elements is NaN or +-Inf, else left as it
 *   was, so one flag collects several spans. FP32 is classified with
 *   isfinite (no compare, no exception even for a signalling NaN), FP16 on
 *   its bits (all exponent bits set). */
static int nan_check_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs) || !ref_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *x = &args->inputs[0];
  if (x->dtype != BP_ABI_DTYPE_FP32 && x->dtype != BP_ABI_DTYPE_FP16)
    return ref_fail(reason, rs, "x: dtype %d, expected fp32 (%d) or fp16 (%d)", (int)x->dtype,
                    BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16);
  return span_check(x, "x", x->dtype, reason, rs) &&
         scalar_check(&args->outputs[0], "flag", reason, rs);
}
static int nan_check_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                              size_t rs) {
  (void)user;
  return nan_check_check(args, reason, rs);
}
static int nan_check_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  char reason[REF_REASON_MAX];
  if (!nan_check_check(args, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const int64_t n = args->inputs[0].shape[3];
  int found = 0;
  if (args->inputs[0].dtype == BP_ABI_DTYPE_FP32) {
    const float *x = ref_in(args, 0);
    for (int64_t i = 0; i < n && !found; i++) found = !isfinite(x[i]);
  } else {
    const uint16_t *x = (const uint16_t *)args->input_ptrs[0];
    for (int64_t i = 0; i < n && !found; i++) found = (x[i] & 0x7c00u) == 0x7c00u;
  }
  if (found) *ref_out(args, 0) = 1.0f;
  return BP_ABI_OK;
}

/* ---- optimizers: shared checks ------------------------------------------ */

/* The spans of an update: grad (input 0) and the outputs 0..nout_spans-1,
 * all FP32 with grad's E; the scalar inputs listed. */
static int update_spans(const bp_abi_kernel_args *args, const char *const *out_names,
                        int nout_spans, char *reason, size_t rs) {
  const bp_abi_tensor *g = &args->inputs[0];
  if (!span_check(g, "grad", BP_ABI_DTYPE_FP32, reason, rs) ||
      !scalar_check(&args->inputs[1], "lr", reason, rs))
    return 0;
  for (int o = 0; o < nout_spans; o++)
    if (!span_check(&args->outputs[o], out_names[o], BP_ABI_DTYPE_FP32, reason, rs) ||
        !same_count(g, "grad", &args->outputs[o], out_names[o], reason, rs))
      return 0;
  return 1;
}

static int lr_ok(float lr) { return isfinite(lr); }

/* ---- range.sgd ---------------------------------------------------------- */

/* range.sgd  in: grad, lr   out: w, m (FP32 spans of one E; m read and written)
 *   As torch.optim.SGD (dampening 0, weight decay coupled into the gradient):
 *     g = grad + weight_decay*w          (skipped when weight_decay == 0)
 *     m = momentum*m + g                 (PyTorch starts its buffer at g on
 *                                         the first step: momentum*0 + g)
 *     u = nesterov ? g + momentum*m : m
 *     w = w - lr*u
 *   momentum == 0 gives plain SGD (m then holds the last g). Nesterov needs
 *   momentum > 0, as in PyTorch. */
static int sgd_check(const bp_abi_kernel_args *args, bp_optimizer_attrs *a, char *reason,
                     size_t rs) {
  static const char *const outs[] = {"w", "m"};
  if (!args) return ref_fail(reason, rs, "no args");
  if (!attrs_check(args, a, sizeof *a, RANGE_END(bp_optimizer_attrs, nesterov),
                   "momentum, weight_decay and nesterov", reason, rs) ||
      !finite_at_least(a->momentum, 0.0f, "momentum", reason, rs) ||
      !finite_at_least(a->weight_decay, 0.0f, "weight_decay", reason, rs) ||
      !ref_check_flag(a->nesterov, "nesterov", reason, rs))
    return 0;
  if (a->nesterov && a->momentum <= 0.0f)
    return ref_fail(reason, rs, "nesterov needs momentum > 0, got %g", (double)a->momentum);
  return ref_check_args(args, 2, 2, reason, rs) && update_spans(args, outs, 2, reason, rs);
}
static int sgd_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return sgd_check(args, &a, reason, rs);
}
static int sgd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  char reason[REF_REASON_MAX];
  if (!sgd_check(args, &a, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float lr = scalar_in(args, 1);
  if (!lr_ok(lr)) return BP_ABI_ERR_INVALID;
  const float *grad = ref_in(args, 0);
  float *w = ref_out(args, 0), *m = ref_out(args, 1);
  const float mu = a.momentum, wd = a.weight_decay;
  const int64_t n = args->inputs[0].shape[3];
  for (int64_t i = 0; i < n; i++) {
    float g = grad[i];
    if (wd != 0.0f) g = g + wd * w[i];
    const float buf = mu * m[i] + g;
    m[i] = buf;
    const float u = a.nesterov ? g + mu * buf : buf;
    w[i] = w[i] - lr * u;
  }
  return BP_ABI_OK;
}

/* ---- range.adamw -------------------------------------------------------- */

/* range.adamw  in: grad, lr, step   out: w, m, v (FP32 spans of one E)
 *   As torch.optim.AdamW (single-tensor path), t = step >= 1:
 *     w  = w * (1 - lr*weight_decay)                  (decoupled decay)
 *     m  = m*beta1 + (1-beta1)*g                      (mul_, add_ with alpha;
 *          PyTorch 1.13, Debian's; 2.x writes lerp(m, g, 1-beta1), the
 *          same value up to rounding)
 *     v  = v*beta2 + ((1-beta2)*g)*g                  (mul_, addcmul_)
 *     bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, step_size = lr/bc1   (double)
 *     denom = sqrt(v) / sqrt(bc2) + eps
 *     w  = w + ((-step_size)*m) / denom               (addcdiv)
 *   which is w -= lr * (m/bc1) / (sqrt(v/bc2) + eps) of bp_abi_ops.h with
 *   PyTorch's placement of the bias corrections: eps is added after the
 *   division by sqrt(bc2), and 1/bc1 is folded into the step size.
 *   beta1, beta2 in [0, 1); eps > 0 (eps = 0 would turn zero padding into
 *   0/0); weight_decay >= 0. */
static int adamw_check(const bp_abi_kernel_args *args, bp_optimizer_attrs *a, char *reason,
                       size_t rs) {
  static const char *const outs[] = {"w", "m", "v"};
  if (!args) return ref_fail(reason, rs, "no args");
  if (!attrs_check(args, a, sizeof *a, RANGE_END(bp_optimizer_attrs, eps),
                   "weight_decay, beta1, beta2 and eps", reason, rs) ||
      !finite_at_least(a->weight_decay, 0.0f, "weight_decay", reason, rs) ||
      !in_unit(a->beta1, 0, "beta1", reason, rs) || !in_unit(a->beta2, 0, "beta2", reason, rs))
    return 0;
  if (!isfinite(a->eps) || !(a->eps > 0.0f))
    return ref_fail(reason, rs, "eps %g must be finite and > 0", (double)a->eps);
  return ref_check_args(args, 3, 3, reason, rs) && update_spans(args, outs, 3, reason, rs) &&
         scalar_check(&args->inputs[2], "step", reason, rs);
}
static int adamw_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return adamw_check(args, &a, reason, rs);
}
static int adamw_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  char reason[REF_REASON_MAX];
  if (!adamw_check(args, &a, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float lr = scalar_in(args, 1), step = scalar_in(args, 2);
  if (!lr_ok(lr) || !isfinite(step) || !(step >= 1.0f)) return BP_ABI_ERR_INVALID;
  const double t = step;
  const double bc1 = 1.0 - pow((double)a.beta1, t), bc2 = 1.0 - pow((double)a.beta2, t);
  const float decay = (float)(1.0 - (double)lr * (double)a.weight_decay);
  const float neg_step_size = (float)(-((double)lr / bc1));
  const float bc2_sqrt = (float)sqrt(bc2);
  const float c1 = (float)(1.0 - (double)a.beta1), c2 = (float)(1.0 - (double)a.beta2);
  const float b1 = a.beta1, b2 = a.beta2, eps = a.eps;
  const float *grad = ref_in(args, 0);
  float *w = ref_out(args, 0), *m = ref_out(args, 1), *v = ref_out(args, 2);
  const int64_t n = args->inputs[0].shape[3];
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i];
    const float wi = w[i] * decay;
    const float mi = m[i] * b1 + c1 * g;
    const float vi = v[i] * b2 + c2 * g * g;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi + neg_step_size * mi / denom;
  }
  return BP_ABI_OK;
}

/* ---- range.lars --------------------------------------------------------- */

/* range.lars  in: grad, lr, segments   out: w, m, norms
 *   grad, w, m: FP32 spans of one E; segments: INT32 [1,1,1,S+1], S >= 1,
 *   offsets 0 <= s_0 <= s_1 <= ... <= s_S <= E (checked at run time),
 *   parameter j being elements [s_j, s_{j+1}) (its slot padding included);
 *   elements outside [s_0, s_S) are left untouched. norms: FP32
 *   [1,1,1,2S], overwritten: norms[2j] = |w_j|, norms[2j+1] = |g_j|, the
 *   L2 norms of the weights before the update and of the raw gradient,
 *   each summed in double in element order.
 *   Per parameter j:
 *     trust = eta*|w_j| / (|g_j| + weight_decay*|w_j|)   (1 when |w_j| or
 *             |g_j| is 0), in double; r = (float)(lr*trust)
 *     g' = grad + weight_decay*w         (skipped when weight_decay == 0)
 *     m = momentum*m + r*g';  w = w - m
 *   eta > 0, momentum and weight_decay >= 0, finite; nesterov is refused
 *   (the contract defines no Nesterov form of LARS). */
static int lars_check(const bp_abi_kernel_args *args, bp_optimizer_attrs *a, char *reason,
                      size_t rs) {
  static const char *const outs[] = {"w", "m"};
  if (!args) return ref_fail(reason, rs, "no args");
  if (!attrs_check(args, a, sizeof *a, RANGE_END(bp_optimizer_attrs, eta),
                   "momentum, weight_decay and eta", reason, rs) ||
      !finite_at_least(a->momentum, 0.0f, "momentum", reason, rs) ||
      !finite_at_least(a->weight_decay, 0.0f, "weight_decay", reason, rs) ||
      !ref_check_flag(a->nesterov, "nesterov", reason, rs))
    return 0;
  if (a->nesterov)
    return ref_fail(reason, rs, "nesterov is not defined for range.lars");
  if (!isfinite(a->eta) || !(a->eta > 0.0f))
    return ref_fail(reason, rs, "eta %g must be finite and > 0", (double)a->eta);
  if (!ref_check_args(args, 3, 3, reason, rs) || !update_spans(args, outs, 2, reason, rs))
    return 0;
  const bp_abi_tensor *seg = &args->inputs[2], *norms = &args->outputs[2];
  if (!span_check(seg, "segments", BP_ABI_DTYPE_INT32, reason, rs) ||
      !span_check(norms, "norms", BP_ABI_DTYPE_FP32, reason, rs))
    return 0;
  if (seg->shape[3] < 2)
    return ref_fail(reason, rs, "segments has %lld offsets; it needs S+1 >= 2",
                    (long long)seg->shape[3]);
  if (norms->shape[3] != 2 * (seg->shape[3] - 1))
    return ref_fail(reason, rs, "norms has %lld elements, expected 2*S = %lld",
                    (long long)norms->shape[3], (long long)(2 * (seg->shape[3] - 1)));
  return 1;
}
static int lars_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return lars_check(args, &a, reason, rs);
}
static int lars_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  char reason[REF_REASON_MAX];
  if (!lars_check(args, &a, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float lr = scalar_in(args, 1);
  if (!lr_ok(lr)) return BP_ABI_ERR_INVALID;
  const int32_t *seg = (const int32_t *)args->input_ptrs[2];
  const int64_t n = args->inputs[0].shape[3], segs = args->inputs[2].shape[3] - 1;
  if (seg[0] < 0) return BP_ABI_ERR_INVALID;
  for (int64_t j = 0; j < segs; j++)
    if (seg[j + 1] < seg[j]) return BP_ABI_ERR_INVALID;
  if (seg[segs] > n) return BP_ABI_ERR_INVALID;

  const float *grad = ref_in(args, 0);
  float *w = ref_out(args, 0), *m = ref_out(args, 1), *norms = ref_out(args, 2);
  const float mu = a.momentum, wd = a.weight_decay;
  for (int64_t j = 0; j < segs; j++) {
    const int64_t lo = seg[j], hi = seg[j + 1];
    double ww = 0.0, gg = 0.0;
    for (int64_t i = lo; i < hi; i++) {
      ww += (double)w[i] * w[i];
      gg += (double)grad[i] * grad[i];
    }
    const double wn = sqrt(ww), gn = sqrt(gg);
    norms[2 * j] = (float)wn;
    norms[2 * j + 1] = (float)gn;
    const double trust = wn > 0.0 && gn > 0.0 ? (double)a.eta * wn / (gn + (double)wd * wn) : 1.0;
    const float r = (float)((double)lr * trust);
    for (int64_t i = lo; i < hi; i++) {
      float g = grad[i];
      if (wd != 0.0f) g = g + wd * w[i];
      m[i] = mu * m[i] + r * g;
      w[i] = w[i] - m[i];
    }
  }
  return BP_ABI_OK;
}

/* ---- descriptors -------------------------------------------------------- */

const bp_abi_kernel ref_range_zero =
    REF_KERNEL_DT("range.zero", zero_supports, zero_run, 0, RANGE_ALL_DTYPES);
const bp_abi_kernel ref_range_copy =
    REF_KERNEL_DT("range.copy", copy_supports, copy_run, 0, RANGE_ALL_DTYPES);
const bp_abi_kernel ref_range_scale =
    REF_KERNEL("range.scale", scale_supports, scale_run, BP_ABI_KERNEL_IN_PLACE);
const bp_abi_kernel ref_range_cast =
    REF_KERNEL_DT("range.cast", cast_supports, cast_run, 0, RANGE_FLOAT_DTYPES);
const bp_abi_kernel ref_range_ema = REF_KERNEL("range.ema", ema_supports, ema_run, 0);
const bp_abi_kernel ref_range_nan_check =
    REF_KERNEL_DT("range.nan_check", nan_check_supports, nan_check_run, 0, RANGE_FLOAT_DTYPES);
const bp_abi_kernel ref_range_sgd = REF_KERNEL("range.sgd", sgd_supports, sgd_run, 0);
const bp_abi_kernel ref_range_adamw = REF_KERNEL("range.adamw", adamw_supports, adamw_run, 0);
const bp_abi_kernel ref_range_lars =
    REF_KERNEL_DT("range.lars", lars_supports, lars_run, 0,
                  BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));
