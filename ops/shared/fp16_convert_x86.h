/* Vectorized FP16 <-> FP32 conversions for the fast modules (ops/cpu,
 * ops/blas), with the F16C instructions: vcvtph2ps widens, vcvtps2ph with
 * the rounding in the immediate (nearest even, whatever MXCSR says)
 * narrows. Their results are the bits of the SDK's scalar conversions
 * (bp_sdk_fp16_to_fp32, bp_sdk_fp32_to_fp16: NaN quieted with its payload
 * kept, overflow to Inf, subnormals rounded to nearest even;
 * tests/test_ops_fp16.c checks every FP16 value and a sweep of FP32 ones),
 * so a fast module and the reference give the same FP16 for the same FP32.
 * The tail of a run (fewer than 8 elements) takes the scalar conversion.
 * Header-only (static inline); ops_fp16_convert_fast() picks the F16C
 * table at run time when the CPU has F16C and AVX2 (and the OS saves the
 * AVX state), else the scalar one; other architectures always get the
 * scalar one. */
#ifndef BP_OPS_SHARED_FP16_CONVERT_X86_H
#define BP_OPS_SHARED_FP16_CONVERT_X86_H

#include "shared/fp16_adapter.h"

#if defined(__x86_64__) || defined(__i386__)
#define OPS_FP16_HAVE_F16C 1
#include <cpuid.h>
#include <immintrin.h>

#define OPS_FP16_TARGET __attribute__((target("f16c,avx2")))
#define OPS_FP16_ROUND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

OPS_FP16_TARGET static inline void ops_fp16_widen_f16c(const uint16_t *src, float *dst,
                                                       int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; i++) dst[i] = bp_sdk_fp16_to_fp32(src[i]);
}

OPS_FP16_TARGET static inline void ops_fp16_narrow_f16c(const float *src, uint16_t *dst,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(void *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), OPS_FP16_ROUND));
  for (; i < n; i++) dst[i] = bp_sdk_fp32_to_fp16(src[i]);
}

OPS_FP16_TARGET static inline void ops_fp16_add_narrow_f16c(const float *src, uint16_t *dst,
                                                            int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i *p = (__m128i *)(void *)(dst + i);
    const __m256 sum = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_loadu_ps(src + i));
    _mm_storeu_si128(p, _mm256_cvtps_ph(sum, OPS_FP16_ROUND));
  }
  for (; i < n; i++) dst[i] = bp_sdk_fp32_to_fp16(bp_sdk_fp16_to_fp32(dst[i]) + src[i]);
}

/* 1 when the CPU has F16C and AVX2 (__builtin_cpu_supports checks that
 * the OS saves the AVX state; clang 14 does not know "f16c" there, so
 * CPUID leaf 1 answers that one). */
static inline int ops_fp16_cpu_has_f16c(void) {
  unsigned a, b, c, d;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  return (c & bit_F16C) != 0;
}

/* The F16C table (callers check ops_fp16_cpu_has_f16c first). */
static inline const ops_fp16_convert *ops_fp16_convert_f16c(void) {
  static const ops_fp16_convert f16c = {"f16c", ops_fp16_widen_f16c, ops_fp16_narrow_f16c,
                                        ops_fp16_add_narrow_f16c};
  return &f16c;
}


OPS_FP16_TARGET static inline void ops_fp16_widen_mul_f16c(const uint16_t *src, float *dst,
                                                           int64_t n, float k) {
  int64_t i = 0;
  const __m256 vk = _mm256_set1_ps(k);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(
                                                (const __m128i *)(const void *)(src + i))),
                                            vk));
  for (; i < n; i++) dst[i] = bp_sdk_fp16_to_fp32(src[i]) * k;
}
#else
#define OPS_FP16_HAVE_F16C 0
static inline int ops_fp16_cpu_has_f16c(void) { return 0; }
#endif

/* Plain calls for span loops (the range ops of ops/cpu): use_f16c (from
 * ops_fp16_f16c_supported(), possibly lowered by the caller) picks the
 * F16C loop, else the scalar one; the same bits either way. */
static inline int ops_fp16_f16c_supported(void) { return ops_fp16_cpu_has_f16c(); }

static inline void ops_fp16_narrow(const float *src, uint16_t *dst, int64_t n, int use_f16c) {
#if OPS_FP16_HAVE_F16C
  if (use_f16c) {
    ops_fp16_narrow_f16c(src, dst, n);
    return;
  }
#endif
  (void)use_f16c;
  ops_fp16_narrow_scalar(src, dst, n);
}

static inline void ops_fp16_widen(const uint16_t *src, float *dst, int64_t n, int use_f16c) {
#if OPS_FP16_HAVE_F16C
  if (use_f16c) {
    ops_fp16_widen_f16c(src, dst, n);
    return;
  }
#endif
  (void)use_f16c;
  ops_fp16_widen_scalar(src, dst, n);
}

/* dst = float(src) * k, one FP32 multiplication per element. */
static inline void ops_fp16_widen_mul(const uint16_t *src, float *dst, int64_t n, float k,
                                      int use_f16c) {
#if OPS_FP16_HAVE_F16C
  if (use_f16c) {
    ops_fp16_widen_mul_f16c(src, dst, n, k);
    return;
  }
#endif
  (void)use_f16c;
  for (int64_t i = 0; i < n; i++) dst[i] = bp_sdk_fp16_to_fp32(src[i]) * k;
}

/* The fastest table this CPU runs (ops_fp16_kernel.convert of the fast
 * modules). */
static inline const ops_fp16_convert *ops_fp16_convert_fast(void) {
#if OPS_FP16_HAVE_F16C
  if (ops_fp16_cpu_has_f16c()) return ops_fp16_convert_f16c();
#endif
  return ops_fp16_convert_scalar();
}

#endif
