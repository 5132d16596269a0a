/* blueprint module SDK: header-only helpers for op-module authors, on top
 * of bp_abi.h and bp_abi_ops.h. Nothing here is part of the ABI itself
 * (a module need not use it, and the host never calls it): every function
 * is static inline, C11 or C++11, and needs only the C library, so a
 * module that includes it still links nothing from blueprint.
 *
 * What it holds:
 *  - dtype sizes and names                      bp_sdk_dtype_size / _name
 *  - FP32 <-> FP16 and FP32 <-> BF16            bp_sdk_fp32_to_fp16 ...
 *  - reasons (printf into reason/reason_size)   bp_sdk_fail, bp_sdk_set_reason
 *  - tensor arrays strided by struct_size       bp_sdk_input, bp_sdk_output
 *    (bp_abi_ops.h rule 6)
 *  - argument and tensor checks with reasons    bp_sdk_check_*
 *  - NHWC element walking                       bp_sdk_offset, BP_SDK_FOR_EACH_*
 *  - the 1.4 fields of the kernel args, read    bp_sdk_args_state, _threads,
 *    only when struct_size covers them          _generation, _reason
 *  - host options, a kernel pointed at a        bp_sdk_host_option,
 *    module's context (1.6)                     bp_sdk_register_kernel_user
 *
 * Conventions: a check returns 1 when the arguments are fine, else 0 with
 * a reason written into reason[reason_size] (NUL-terminated, truncated;
 * reason may be NULL), so a kernel's supports() and run() can share one
 * check function and a check reads `return bp_sdk_fail(reason, rs, ...)`.
 * abi/README.md ("Writing a module") says how a kernel uses these. */
#ifndef BP_ABI_SDK_H
#define BP_ABI_SDK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BP_SDK_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define BP_SDK_PRINTF(fmt_index, first_arg)
#endif

/* The tree's one assert: an always-on check of an internal invariant
 * (never of a caller's input, which gets a status and a reason). It prints
 * "blueprint: file:line: invariant broken: cond" and aborts, in every build
 * type (NDEBUG does not remove it). */
#ifndef BP_ASSERT
#define BP_ASSERT(cond)                                                                   \
  do {                                                                                    \
    if (!(cond)) bp_sdk_assert_fail(#cond, __FILE__, __LINE__);                           \
  } while (0)
#endif
#if defined(__GNUC__)
__attribute__((noreturn, cold))
#endif
static inline void bp_sdk_assert_fail(const char *what, const char *file, int line) {
  fprintf(stderr, "blueprint: %s:%d: invariant broken: %s\n", file, line, what);
  abort();
}

/* 1 when the struct at p (which begins with struct_size) reaches `field`
 * of `type`: the field is present (abi/README.md, versioning rule 2). */
#define BP_SDK_HAS_FIELD(p, type, field) \
  ((p)->struct_size >= offsetof(type, field) + sizeof(((const type *)0)->field))

/* ---- dtypes ------------------------------------------------------------- */

/* Bytes of one element of `dtype` (BP_ABI_DTYPE_*); 0 for an unknown one. */
static inline size_t bp_sdk_dtype_size(int32_t dtype) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32:
    case BP_ABI_DTYPE_INT32: return 4;
    case BP_ABI_DTYPE_FP16:
    case BP_ABI_DTYPE_BF16: return 2;
    case BP_ABI_DTYPE_INT8: return 1;
    default: return 0;
  }
}

/* "fp32", "fp16", "int8", "int32", "bf16", or "unknown". */
static inline const char *bp_sdk_dtype_name(int32_t dtype) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32: return "fp32";
    case BP_ABI_DTYPE_FP16: return "fp16";
    case BP_ABI_DTYPE_INT8: return "int8";
    case BP_ABI_DTYPE_INT32: return "int32";
    case BP_ABI_DTYPE_BF16: return "bf16";
    default: return "unknown";
  }
}

/* ---- FP16 and BF16 ------------------------------------------------------- */

/* The one conversion of the project (the core's data pipeline and range.cast
 * use these too). Done on the bits, so the result does not depend on the
 * floating-point environment, the compiler or the instruction set.
 *
 * Narrowing (FP32 -> FP16, FP32 -> BF16), IEEE 754 convertFormat:
 *  - rounds to nearest, ties to even;
 *  - a value whose rounded magnitude exceeds the largest finite number
 *    becomes Inf of its sign (FP16: |f| >= 65520, the midpoint between
 *    65504 and 2^16, which ties to the even Inf); Inf stays Inf;
 *  - FP16 subnormals are rounded the same way (|f| <= 2^-25 gives a signed
 *    zero, the midpoint 2^-25 tying to the even 0), and a value that rounds
 *    up out of the subnormals becomes the smallest normal; signed zeros keep
 *    their sign;
 *  - NaN stays NaN: its sign and the top bits of its payload are kept (10
 *    bits for FP16, 7 for BF16) and the quiet bit is set, so a signalling
 *    NaN comes out quiet (IEEE 754-2019 6.2: a conversion delivers a quiet
 *    NaN) and a NaN whose payload lies only in the dropped bits stays a NaN.
 * Widening (FP16 -> FP32, BF16 -> FP32) is exact for every number
 * (subnormal halves become normal floats); NaN keeps its sign and payload
 * with the quiet bit set. So every number and every quiet NaN round-trips
 * bit for bit, and a signalling NaN comes back as the quiet NaN of the same
 * payload. These are also the results of x86's F16C instructions
 * (vcvtps2ph with round-to-nearest, vcvtph2ps), so a vectorized cast can use
 * them and give the same bits. */

static inline float bp_sdk_float_of_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint32_t bp_sdk_bits_of_float(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

static inline uint16_t bp_sdk_fp32_to_fp16(float f) {
  const uint32_t x = bp_sdk_bits_of_float(f);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) /* NaN: quiet, sign and the top 10 payload bits kept */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) /* >= 65520 = 65504 + half an ulp (ties to the even Inf), Inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) { /* >= 2^-14: a normal half */
    /* rebias the exponent (127 -> 15), keep 10 mantissa bits, round the 13
     * dropped ones to nearest even; a carry into the exponent is correct */
    uint32_t h = (ax >> 13) - ((127u - 15u) << 10);
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  if (ax <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ties to 0 */
    return (uint16_t)sign;
  /* a subnormal half m * 2^-24: the float is mant * 2^(e - 150) with the
   * implicit bit, so m = mant >> (126 - e), rounded to nearest even (e in
   * 102..112 here, the shift in 14..24); m may round up to 0x400, the
   * smallest normal, which is its correct encoding */
  const uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (m & 1u))) m++;
  return (uint16_t)(sign | m);
}

static inline float bp_sdk_fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13); /* Inf, or NaN with its payload on top */
    if (m) x |= 0x00400000u;            /* ... made quiet */
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13); /* rebias 15 -> 127 */
  } else if (m == 0) {
    x = sign;
  } else { /* subnormal m * 2^-24: normalize */
    e = 113u;
    while (!(m & 0x400u)) {
      m <<= 1;
      e--;
    }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  return bp_sdk_float_of_bits(x);
}

static inline uint16_t bp_sdk_fp32_to_bf16(float f) {
  const uint32_t x = bp_sdk_bits_of_float(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, sign and the top 7 payload bits kept */
    return (uint16_t)((x >> 16) | 0x0040u);
  /* round the 16 dropped bits to nearest even; a carry moves to the next
   * binade, and out of the largest finite one to Inf, as it should */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float bp_sdk_bf16_to_fp32(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  if ((b & 0x7fffu) > 0x7f80u) x |= 0x00400000u; /* NaN: made quiet */
  return bp_sdk_float_of_bits(x);
}

/* ---- reasons -------------------------------------------------------------- */

/* Writes a reason (printf format) into reason[reason_size] when reason is
 * not NULL and reason_size > 0; returns 0, so a check reads
 * `return bp_sdk_fail(reason, reason_size, "...", ...)`. */
static inline int bp_sdk_fail(char *reason, size_t reason_size, const char *fmt, ...)
    BP_SDK_PRINTF(3, 4);
static inline int bp_sdk_fail(char *reason, size_t reason_size, const char *fmt, ...) {
  if (reason && reason_size > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, reason_size, fmt, ap);
    va_end(ap);
  }
  return 0;
}

/* ---- the host (1.6 fields read only when present) --------------------------- */

/* The run option `name` the host passes modules (bp_abi_host.option), or
 * NULL: unset, or a host before 1.6. Call it during init; copy what must
 * outlive init. */
static inline const char *bp_sdk_host_option(const bp_abi_host *host, const char *name) {
  return host && BP_SDK_HAS_FIELD(host, bp_abi_host, option) && host->option
             ? host->option(host->ctx, name)
             : NULL;
}

/* (1.6) Registers a copy of `kernel` whose `user` is `user`: what a
 * module's init_ctx does to point a static descriptor at its context (the
 * host copies descriptors at registration, bp_abi_module). The copy keeps
 * the descriptor's struct_size (capped at this header's). Returns what
 * register_kernel returns. */
static inline int bp_sdk_register_kernel_user(const bp_abi_host *host, const bp_abi_kernel *kernel,
                                              void *user) {
  if (!host || !kernel || !host->register_kernel) return BP_ABI_ERR_INVALID;
  bp_abi_kernel copy;
  const size_t n = kernel->struct_size < sizeof copy ? kernel->struct_size : sizeof copy;
  memset(&copy, 0, sizeof copy);
  memcpy(&copy, kernel, n);
  copy.struct_size = (uint32_t)n;
  if (n < offsetof(bp_abi_kernel, user) + sizeof copy.user) return BP_ABI_ERR_INVALID;
  copy.user = user;
  return host->register_kernel(host->ctx, &copy);
}

/* ---- the kernel args (1.4 fields read only when present) -------------------- */

/* The state prepare() made for this node (args->state), or NULL: no
 * prepare, a host before 1.4, or outside run(). */
static inline void *bp_sdk_args_state(const bp_abi_kernel_args *args) {
  return args && BP_SDK_HAS_FIELD(args, bp_abi_kernel_args, state) ? args->state : NULL;
}

/* The threads the host lends this rank, or NULL (a host before 1.4, or
 * supports/workspace_size). */
static inline const bp_abi_threads *bp_sdk_args_threads(const bp_abi_kernel_args *args) {
  if (!args || !BP_SDK_HAS_FIELD(args, bp_abi_kernel_args, threads) || !args->threads)
    return NULL;
  const bp_abi_threads *t = args->threads;
  return BP_SDK_HAS_FIELD(t, bp_abi_threads, parallel_for) ? t : NULL;
}

/* The number of threads a kernel may use: the host's count, 1 without
 * threads. */
static inline int bp_sdk_args_thread_count(const bp_abi_kernel_args *args) {
  const bp_abi_threads *t = bp_sdk_args_threads(args);
  return t && t->count > 1 ? (int)t->count : 1;
}

/* fn(arg, i) for every i in [0, n): on the host's threads when it lends
 * some (bp_abi_threads.parallel_for; fn must not call this again), else on
 * the calling thread in order. */
static inline void bp_sdk_parallel_for(const bp_abi_kernel_args *args,
                                       void (*fn)(void *arg, int64_t i), void *arg, int64_t n) {
  const bp_abi_threads *t = bp_sdk_args_threads(args);
  if (t && t->count > 1 && t->parallel_for && n > 1) {
    t->parallel_for(t->ctx, fn, arg, n);
    return;
  }
  for (int64_t i = 0; i < n; i++) fn(arg, i);
}

/* The rank's parameter generation (*args->params_generation), or 0 when
 * the host passes none (a host before 1.4, or outside run()). It covers
 * parameters only: a kernel that caches something derived from its
 * parameters (packed weights) keeps the generation it packed at and
 * repacks when this differs; with 0 it cannot tell, and repacks on every
 * run. Nothing derived from data inputs may be cached: their contents
 * change between runs on the same pointers within one generation. */
static inline uint64_t bp_sdk_args_generation(const bp_abi_kernel_args *args) {
  if (!args || !BP_SDK_HAS_FIELD(args, bp_abi_kernel_args, params_generation) ||
      !args->params_generation)
    return 0;
  return *args->params_generation;
}

/* The host's reason buffer of run() and prepare() (args->reason), or NULL
 * with size 0 when it passes none; hand both to the bp_sdk_check_*
 * functions in run() so a refused call says why. */
static inline char *bp_sdk_args_reason(const bp_abi_kernel_args *args) {
  if (!args || !BP_SDK_HAS_FIELD(args, bp_abi_kernel_args, reason_size)) return NULL;
  return args->reason_size > 0 ? args->reason : NULL;
}
static inline size_t bp_sdk_args_reason_size(const bp_abi_kernel_args *args) {
  return bp_sdk_args_reason(args) ? args->reason_size : 0;
}

/* Writes why run() or prepare() failed into the host's buffer (printf
 * format); does nothing when the host passes none. */
static inline void bp_sdk_set_reason(const bp_abi_kernel_args *args, const char *fmt, ...)
    BP_SDK_PRINTF(2, 3);
static inline void bp_sdk_set_reason(const bp_abi_kernel_args *args, const char *fmt, ...) {
  char *reason = bp_sdk_args_reason(args);
  if (!reason) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, args->reason_size, fmt, ap);
  va_end(ap);
}

/* ---- tensors of the args (bp_abi_ops.h rule 6) -------------------------------- */

/* Descriptor of input / output i. The arrays are strided by the
 * struct_size of their first element (the writer's sizeof), never by this
 * build's sizeof. The args passed bp_sdk_check_args. */
static inline const bp_abi_tensor *bp_sdk_input(const bp_abi_kernel_args *args, int i) {
  return (const bp_abi_tensor *)(const void *)((const char *)args->inputs +
                                               (size_t)i * args->inputs[0].struct_size);
}
static inline const bp_abi_tensor *bp_sdk_output(const bp_abi_kernel_args *args, int i) {
  return (const bp_abi_tensor *)(const void *)((const char *)args->outputs +
                                               (size_t)i * args->outputs[0].struct_size);
}

/* Data pointers of input / output i (run() only), untyped and as FP32. */
static inline const void *bp_sdk_input_data(const bp_abi_kernel_args *args, int i) {
  return args->input_ptrs[i];
}
static inline void *bp_sdk_output_data(const bp_abi_kernel_args *args, int i) {
  return args->output_ptrs[i];
}
static inline const float *bp_sdk_input_f32(const bp_abi_kernel_args *args, int i) {
  return (const float *)args->input_ptrs[i];
}
static inline float *bp_sdk_output_f32(const bp_abi_kernel_args *args, int i) {
  return (float *)args->output_ptrs[i];
}

/* ---- NHWC element walking ------------------------------------------------------ */

/* Offset in elements of (n, h, w, c) with the device strides: the element
 * lives at its pointer + bp_sdk_offset(t, n, h, w, c). Channel padding
 * (c >= shape[3]) is never reached by the walks below. */
static inline int64_t bp_sdk_offset(const bp_abi_tensor *t, int64_t n, int64_t h, int64_t w,
                                    int64_t c) {
  return n * t->stride[0] + h * t->stride[1] + w * t->stride[2] + c * t->stride[3];
}

/* Logical elements of t (N*H*W*C; padding not counted). */
static inline int64_t bp_sdk_count(const bp_abi_tensor *t) {
  return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* Elements from the pointer to the last logical element, inclusive (the
 * last offset + 1); a checked tensor has extents >= 1. */
static inline int64_t bp_sdk_span(const bp_abi_tensor *t) {
  int64_t span = 1;
  for (int d = 0; d < 4; d++) span += (t->shape[d] - 1) * t->stride[d];
  return span;
}

/* Loops over the logical extent of t in NHWC order (c innermost), declaring
 * the int64_t indices n, h, w (and c); the body follows the macro:
 *   BP_SDK_FOR_EACH_NHWC(t, n, h, w, c) y[bp_sdk_offset(ty, n, h, w, c)] = ...;
 * BP_SDK_FOR_EACH_PIXEL leaves the channel loop to the body (a pixel's
 * channels are c * stride[3] apart from bp_sdk_offset(t, n, h, w, 0)).
 * Neither walks channel padding (rule 2 of bp_abi_ops.h). */
#define BP_SDK_FOR_EACH_PIXEL(t, n, h, w)           \
  for (int64_t n = 0; n < (t)->shape[0]; n++)       \
    for (int64_t h = 0; h < (t)->shape[1]; h++)     \
      for (int64_t w = 0; w < (t)->shape[2]; w++)
#define BP_SDK_FOR_EACH_NHWC(t, n, h, w, c) \
  BP_SDK_FOR_EACH_PIXEL(t, n, h, w)         \
  for (int64_t c = 0; c < (t)->shape[3]; c++)

/* Sets every logical element of the FP32 tensor t at p to v; channel
 * padding and the tail untouched. */
static inline void bp_sdk_fill_f32(const bp_abi_tensor *t, float *p, float v) {
  BP_SDK_FOR_EACH_PIXEL(t, n, h, w) {
    float *row = p + bp_sdk_offset(t, n, h, w, 0);
    for (int64_t c = 0; c < t->shape[3]; c++) row[c * t->stride[3]] = v;
  }
}

/* ---- checks with reasons ---------------------------------------------------------- */

#define BP_SDK_MAX_EXTENT (INT64_C(1) << 31) /* per dimension; keeps products in int64 */

/* The args themselves: struct_size, the tensor counts, the tensor arrays
 * and every tensor's struct_size (at least this build's sizeof; the
 * arrays are then walked by the first element's, rule 6). */
static inline int bp_sdk_check_args(const bp_abi_kernel_args *args, int num_inputs,
                                    int num_outputs, char *reason, size_t reason_size) {
  if (!args) return bp_sdk_fail(reason, reason_size, "no args");
  if (args->struct_size < offsetof(bp_abi_kernel_args, workspace))
    return bp_sdk_fail(reason, reason_size, "args struct_size %u is too small",
                       (unsigned)args->struct_size);
  if (args->num_inputs != num_inputs || args->num_outputs != num_outputs)
    return bp_sdk_fail(reason, reason_size, "expects %d inputs and %d outputs, got %d and %d",
                       num_inputs, num_outputs, (int)args->num_inputs, (int)args->num_outputs);
  if ((num_inputs > 0 && !args->inputs) || (num_outputs > 0 && !args->outputs))
    return bp_sdk_fail(reason, reason_size, "tensor descriptors missing");
  /* element 0 first: the stride of the others is its struct_size */
  for (int i = 0; i < num_inputs; i++)
    if (bp_sdk_input(args, i)->struct_size < sizeof(bp_abi_tensor))
      return bp_sdk_fail(reason, reason_size, "input %d: tensor struct_size %u is too small", i,
                         (unsigned)bp_sdk_input(args, i)->struct_size);
  for (int o = 0; o < num_outputs; o++)
    if (bp_sdk_output(args, o)->struct_size < sizeof(bp_abi_tensor))
      return bp_sdk_fail(reason, reason_size, "output %d: tensor struct_size %u is too small", o,
                         (unsigned)bp_sdk_output(args, o)->struct_size);
  return 1;
}

/* One tensor of `dtype`: extents in [1, BP_SDK_MAX_EXTENT], padded_c >=
 * channels, strides that nest in NHWC order (each at least the span of the
 * dimensions inside it, so no two logical elements share an address; a
 * dimension of extent 1 may carry any stride) and the whole logical extent
 * inside slot_bytes. `name` names it in the reason ("x", "dy", ...). */
static inline int bp_sdk_check_tensor(const bp_abi_tensor *t, const char *name, int32_t dtype,
                                      char *reason, size_t reason_size) {
  if (t->dtype != dtype)
    return bp_sdk_fail(reason, reason_size, "%s: dtype %s, expected %s", name,
                       bp_sdk_dtype_name(t->dtype), bp_sdk_dtype_name(dtype));
  for (int d = 0; d < 4; d++)
    if (t->shape[d] < 1 || t->shape[d] > BP_SDK_MAX_EXTENT)
      return bp_sdk_fail(reason, reason_size, "%s: extent %lld of dimension %d is out of range",
                         name, (long long)t->shape[d], d);
  if (t->padded_c < t->shape[3])
    return bp_sdk_fail(reason, reason_size, "%s: padded_c %lld < channels %lld", name,
                       (long long)t->padded_c, (long long)t->shape[3]);
  int64_t span = 1;
  for (int d = 3; d >= 0; d--) {
    if (t->shape[d] == 1) continue;
    if (t->stride[d] < span)
      return bp_sdk_fail(reason, reason_size,
                         "%s: stride %lld of dimension %d overlaps the inner dimensions (span "
                         "%lld)",
                         name, (long long)t->stride[d], d, (long long)span);
    if (t->stride[d] > (INT64_MAX / 8 - span) / (t->shape[d] - 1))
      return bp_sdk_fail(reason, reason_size, "%s: extent overflows", name);
    span += (t->shape[d] - 1) * t->stride[d];
  }
  const uint64_t bytes = (uint64_t)span * (uint64_t)bp_sdk_dtype_size(dtype);
  if (bytes > t->slot_bytes)
    return bp_sdk_fail(reason, reason_size, "%s: needs %llu bytes, slot_bytes is %llu", name,
                       (unsigned long long)bytes, (unsigned long long)t->slot_bytes);
  return 1;
}

/* t's shape is {n, h, w, c}. */
static inline int bp_sdk_check_shape(const bp_abi_tensor *t, const char *name, int64_t n,
                                     int64_t h, int64_t w, int64_t c, char *reason,
                                     size_t reason_size) {
  if (t->shape[0] != n || t->shape[1] != h || t->shape[2] != w || t->shape[3] != c)
    return bp_sdk_fail(reason, reason_size,
                       "%s: shape [%lld,%lld,%lld,%lld], expected [%lld,%lld,%lld,%lld]", name,
                       (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                       (long long)t->shape[3], (long long)n, (long long)h, (long long)w,
                       (long long)c);
  return 1;
}

/* Copies the attribute block into dst (dst_size bytes, this build's sizeof
 * of the block): fields the writer did not send (a smaller attr_size) read
 * as zero, fields it sent beyond ours are ignored (the block only grows at
 * its end). 0 with a reason when attrs is NULL with a non-zero attr_size. */
static inline int bp_sdk_read_attrs(const bp_abi_kernel_args *args, void *dst, size_t dst_size,
                                    char *reason, size_t reason_size) {
  memset(dst, 0, dst_size);
  if (!args) return bp_sdk_fail(reason, reason_size, "no args");
  if (args->struct_size < offsetof(bp_abi_kernel_args, workspace))
    return bp_sdk_fail(reason, reason_size, "args struct_size %u is too small",
                       (unsigned)args->struct_size);
  if (args->attr_size == 0) return 1;
  if (!args->attrs)
    return bp_sdk_fail(reason, reason_size, "attr_size %u but no attribute block",
                       (unsigned)args->attr_size);
  memcpy(dst, args->attrs, args->attr_size < dst_size ? args->attr_size : dst_size);
  return 1;
}

/* A flag attribute (has_bias, accumulate, ...) is 0 or 1. */
static inline int bp_sdk_check_flag(int32_t value, const char *name, char *reason,
                                    size_t reason_size) {
  if (value != 0 && value != 1)
    return bp_sdk_fail(reason, reason_size, "attribute %s is %d, expected 0 or 1", name,
                       (int)value);
  return 1;
}

/* 1 when a and b (pointers pa, pb) describe the very same elements. */
static inline int bp_sdk_same_elements(const bp_abi_tensor *a, const void *pa,
                                       const bp_abi_tensor *b, const void *pb) {
  if (pa != pb || a->dtype != b->dtype) return 0;
  for (int d = 0; d < 4; d++)
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
      return 0;
  return 1;
}

/* 1 when the byte ranges of the logical extents of a and b meet. */
static inline int bp_sdk_overlaps(const bp_abi_tensor *a, const void *pa, const bp_abi_tensor *b,
                                  const void *pb) {
  const uintptr_t a0 = (uintptr_t)pa, b0 = (uintptr_t)pb;
  const uintptr_t a1 = a0 + (uintptr_t)bp_sdk_span(a) * (uintptr_t)bp_sdk_dtype_size(a->dtype);
  const uintptr_t b1 = b0 + (uintptr_t)bp_sdk_span(b) * (uintptr_t)bp_sdk_dtype_size(b->dtype);
  return a0 < b1 && b0 < a1;
}

/* The data pointers of run(), for args whose tensors passed the checks
 * above: every pointer present and aligned to its element size, and no
 * output overlapping an input or another output (rule 5 of bp_abi_ops.h),
 * except output alias_out[k] with input alias_in[k] (k < alias_count)
 * when both describe the very same elements (same pointer, shape and
 * strides): the "may alias" pairs of an IN_PLACE kernel. */
static inline int bp_sdk_check_ptrs(const bp_abi_kernel_args *args, const int *alias_out,
                                    const int *alias_in, int alias_count, char *reason,
                                    size_t reason_size) {
  if (!args->input_ptrs && args->num_inputs > 0)
    return bp_sdk_fail(reason, reason_size, "no input pointers");
  if (!args->output_ptrs) return bp_sdk_fail(reason, reason_size, "no output pointers");
  for (int i = 0; i < args->num_inputs; i++) {
    const size_t size = bp_sdk_dtype_size(bp_sdk_input(args, i)->dtype);
    const void *p = args->input_ptrs[i];
    if (!p || (size > 1 && (uintptr_t)p % size != 0))
      return bp_sdk_fail(reason, reason_size, "input %d: pointer %p is NULL or not aligned to %zu",
                         i, p, size);
  }
  for (int o = 0; o < args->num_outputs; o++) {
    const bp_abi_tensor *t = bp_sdk_output(args, o);
    const void *p = args->output_ptrs[o];
    const size_t size = bp_sdk_dtype_size(t->dtype);
    if (!p || (size > 1 && (uintptr_t)p % size != 0))
      return bp_sdk_fail(reason, reason_size,
                         "output %d: pointer %p is NULL or not aligned to %zu", o, p, size);
    for (int i = 0; i < args->num_inputs; i++) {
      const bp_abi_tensor *in = bp_sdk_input(args, i);
      if (!bp_sdk_overlaps(t, p, in, args->input_ptrs[i])) continue;
      int allowed = 0;
      for (int a = 0; a < alias_count; a++)
        if (alias_out[a] == o && alias_in[a] == i &&
            bp_sdk_same_elements(t, p, in, args->input_ptrs[i]))
          allowed = 1;
      if (!allowed)
        return bp_sdk_fail(reason, reason_size, "output %d overlaps input %d", o, i);
    }
    for (int o2 = 0; o2 < o; o2++)
      if (bp_sdk_overlaps(t, p, bp_sdk_output(args, o2), args->output_ptrs[o2]))
        return bp_sdk_fail(reason, reason_size, "output %d overlaps output %d", o, o2);
  }
  return 1;
}

#ifdef __cplusplus
}
#endif
#endif
