/* Float math the float loops of ops/blas (attention.c, gelu_tanh.c) share:
 * an exp the compiler vectorizes (no libm call, no branch) and the
 * instruction-set dispatch of those loops.
 *
 * blas_expf: exp(x) = 2^n * e^r, n = round(x log2 e), r = x - n ln 2 in
 * [-ln2/2, ln2/2] (ln 2 split in two so r is exact to float), e^r by a
 * degree-6 minimax polynomial (relative error about 2e-7, 1-2 ulp),
 * 2^n built in the exponent bits. x is clamped to [-87.3, 88.3] first, so
 * the result is always a finite normal float: exp of -inf gives about
 * 1e-38, not 0, and of +inf about 2e38 (callers either subtract a maximum
 * first or use the result where that is harmless; gelu_tanh.c); a NaN
 * gives that NaN (so a NaN in attention's scores or gelu's input reaches
 * the outputs, as in the reference, for AMP's overflow check).
 *
 * Dispatch: BLAS_SIMD(name, (params), (args)) builds name##_body (a
 * BLAS_SIMD_INLINE function) twice, for AVX2 with FMA and for the
 * baseline, and defines `static void name(params)` that runs the first
 * where the CPU has both (checked once per call, __builtin_cpu_supports).
 * The two builds may differ in the last bits (FMA contraction), which is
 * the same "fixed per machine" rule as the GEMM libraries' kernel sets
 * (blas-impl.h, Determinism). */
#ifndef BP_OPS_BLAS_SIMD_H
#define BP_OPS_BLAS_SIMD_H

#include <stdint.h>
#include <string.h>

#define BLAS_SIMD_INLINE static inline __attribute__((always_inline))

BLAS_SIMD_INLINE float blas_expf(float in) {
  /* a NaN becomes -87.3 here (no float-to-int conversion of a NaN) and
   * is returned as it came at the end */
  const float x = in > -87.3f ? (in < 88.3f ? in : 88.3f) : -87.3f;
  /* round to nearest by the 1.5 * 2^23 shift: n is an integer-valued float */
  const float shift = 12582912.0f;
  const float n = (x * 1.44269504088896341f + shift) - shift;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) * (1 << 23);
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return in == in ? p * scale : in;
}

#if defined(__x86_64__) || defined(__i386__)
#define BLAS_SIMD(name, params, args)                                                    \
  __attribute__((target("avx2,fma"))) static void name##_avx2 params { name##_body args; } \
  static void name##_base params { name##_body args; }                                 \
  static void name params {                                                            \
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) name##_avx2 args; \
    else name##_base args;                                                             \
  }
#else
#define BLAS_SIMD(name, params, args) \
  static void name params { name##_body args; }
#endif

#endif
