/* The span ops a mixed-precision step runs over whole regions every step:
 * range.zero (any dtype), range.cast (FP32 <-> FP16), range.unscale (FP16
 * -> FP32 times 1/scale) and range.nan_check (FP32 and FP16); each output
 * bit-identical to zero_run, cast_run, unscale_run and nan_check_run of
 * ops/reference/range.c (the semantics are described there and in
 * bp_abi_ops.h), with the reference's own checks
 * (ops/shared/range_check.h) and the same reasons.
 *
 * Conversions: ops/shared/fp16_convert_x86.h, F16C eight at a time when
 * the CPU has it and the kernel's instruction set (cpu_user_isa) is AVX2 or
 * above, so BP_CPU_ISA=default runs the SDK's bit conversion; the two give
 * the same bits. unscale multiplies the exactly widened value by the same
 * FP32 inv = 1.0f / scale (ops_unscale_factor). nan_check classifies on
 * the bits with the reference's bp_fp32_nonfinite / bp_fp16_nonfinite
 * (ops/shared/elem_math.h), in a branch-free OR over the span that the
 * compiler vectorizes (CPU_DISPATCH).
 *
 * Threads: a span is cut into chunks of SPAN_CHUNK elements, run through
 * the host's threads (bp_sdk_parallel_for) when there are two or more;
 * each chunk writes only its own elements, so the order of the chunks
 * does not change any bit. nan_check's chunks set one shared flag
 * (atomic), and the calling thread writes the output once at the end. */
#include <stdatomic.h>
#include <string.h>

#include "cpu-impl.h"
#include "shared/fp16_convert_x86.h"
#include "shared/range_check.h"

/* Elements per task: a chunk's work (tens of microseconds) dwarfs handing
 * it to a thread; a span of one chunk runs on the calling thread. */
#define SPAN_CHUNK ((int64_t)1 << 16)

/* One span op spread over chunks. */
typedef struct span_job {
  const void *src;
  void *dst;
  int64_t n;        /* elements */
  size_t elem_size; /* range.zero: bytes of dst's element */
  float k;          /* range.unscale: inv */
  int use_f16c;
  int32_t dtype;    /* range.nan_check: src's dtype */
  atomic_int found; /* range.nan_check */
  cpu_isa_level isa; /* the context's (cpu_user) */
} span_job;

/* Elements [lo, lo + len) of chunk i. */
static int64_t chunk_of(const span_job *j, int64_t i, int64_t *len) {
  const int64_t lo = i * SPAN_CHUNK, rest = j->n - lo;
  *len = rest < SPAN_CHUNK ? rest : SPAN_CHUNK;
  return lo;
}

static void span_run(const bp_abi_kernel_args *args, void (*task)(void *job, int64_t i),
                     span_job *job) {
  const int64_t chunks = (job->n + SPAN_CHUNK - 1) / SPAN_CHUNK;
  if (chunks == 1) task(job, 0);
  else bp_sdk_parallel_for(args, task, job, chunks);
}

static int use_f16c(cpu_isa_level isa) { return isa >= CPU_ISA_AVX2 && ops_fp16_f16c_supported(); }

/* ---- loops ------------------------------------------------------------------ */

CPU_INLINE void nonfinite_f32_body(const float *restrict x, int64_t n, int *found) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; i++) any |= (uint32_t)bp_fp32_nonfinite(x[i]);
  *found = any != 0;
}
CPU_DISPATCH(nonfinite_f32, (const float *restrict x, int64_t n, int *found), (x, n, found))

CPU_INLINE void nonfinite_f16_body(const uint16_t *restrict x, int64_t n, int *found) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; i++) any |= (uint32_t)bp_fp16_nonfinite(x[i]);
  *found = any != 0;
}
CPU_DISPATCH(nonfinite_f16, (const uint16_t *restrict x, int64_t n, int *found), (x, n, found))

/* ---- chunk tasks -------------------------------------------------------------- */

static void zero_task(void *p, int64_t i) {
  span_job *j = p;
  int64_t len;
  const int64_t lo = chunk_of(j, i, &len);
  memset((char *)j->dst + (size_t)lo * j->elem_size, 0, (size_t)len * j->elem_size);
}

static void narrow_task(void *p, int64_t i) {
  span_job *j = p;
  int64_t len;
  const int64_t lo = chunk_of(j, i, &len);
  ops_fp16_narrow((const float *)j->src + lo, (uint16_t *)j->dst + lo, len, j->use_f16c);
}

static void widen_task(void *p, int64_t i) {
  span_job *j = p;
  int64_t len;
  const int64_t lo = chunk_of(j, i, &len);
  ops_fp16_widen((const uint16_t *)j->src + lo, (float *)j->dst + lo, len, j->use_f16c);
}

static void unscale_task(void *p, int64_t i) {
  span_job *j = p;
  int64_t len;
  const int64_t lo = chunk_of(j, i, &len);
  ops_fp16_widen_mul((const uint16_t *)j->src + lo, (float *)j->dst + lo, len, j->k,
                     j->use_f16c);
}

static void nan_check_task(void *p, int64_t i) {
  span_job *j = p;
  if (atomic_load_explicit(&j->found, memory_order_relaxed)) return; /* decided */
  int64_t len;
  const int64_t lo = chunk_of(j, i, &len);
  int found;
  if (j->dtype == BP_ABI_DTYPE_FP32) nonfinite_f32(j->isa, (const float *)j->src + lo, len, &found);
  else nonfinite_f16(j->isa, (const uint16_t *)j->src + lo, len, &found);
  if (found) atomic_store_explicit(&j->found, 1, memory_order_relaxed);
}

/* ---- kernels ---------------------------------------------------------------------- */

/* The job of input 0 (if any) into output 0 over span's elements. */
static void job_init(span_job *j, const void *user, const bp_abi_kernel_args *args,
                     const bp_abi_tensor *span) {
  memset(j, 0, sizeof *j);
  j->isa = cpu_user_isa(user);
  j->src = args->num_inputs > 0 ? args->input_ptrs[0] : NULL;
  j->dst = args->output_ptrs[0];
  j->n = span->shape[3];
  j->use_f16c = use_f16c(j->isa);
  atomic_init(&j->found, 0);
}

OPS_RANGE_SUPPORTS(zero_supports, ops_zero_check)
static int zero_run(void *user, const bp_abi_kernel_args *args) {
  if (!ops_range_run_checks(args, ops_zero_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *x = bp_sdk_output(args, 0);
  span_job j;
  job_init(&j, user, args, x);
  j.elem_size = bp_sdk_dtype_size(x->dtype);
  span_run(args, zero_task, &j);
  return BP_ABI_OK;
}

OPS_RANGE_SUPPORTS(cast_supports, ops_cast_check)
static int cast_run(void *user, const bp_abi_kernel_args *args) {
  if (!ops_range_run_checks(args, ops_cast_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *src = bp_sdk_input(args, 0);
  span_job j;
  job_init(&j, user, args, src);
  span_run(args, src->dtype == BP_ABI_DTYPE_FP32 ? narrow_task : widen_task, &j);
  return BP_ABI_OK;
}

OPS_RANGE_SUPPORTS(unscale_supports, ops_unscale_check)
static int unscale_run(void *user, const bp_abi_kernel_args *args) {
  float inv;
  if (!ops_range_run_checks(args, ops_unscale_check) || !ops_unscale_factor(args, 1, &inv))
    return BP_ABI_ERR_INVALID;
  span_job j;
  job_init(&j, user, args, bp_sdk_input(args, 0));
  j.k = inv;
  span_run(args, unscale_task, &j);
  return BP_ABI_OK;
}

OPS_RANGE_SUPPORTS(nan_check_supports, ops_nan_check_check)
static int nan_check_run(void *user, const bp_abi_kernel_args *args) {
  if (!ops_range_run_checks(args, ops_nan_check_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  span_job j;
  job_init(&j, user, args, x);
  j.dtype = x->dtype;
  span_run(args, nan_check_task, &j);
  if (atomic_load_explicit(&j.found, memory_order_relaxed)) *bp_sdk_output_f32(args, 0) = 1.0f;
  return BP_ABI_OK;
}

const bp_abi_kernel cpu_range_zero =
    CPU_KERNEL_DT("range.zero", zero_supports, zero_run, 0, OPS_RANGE_ALL_DTYPES);
const bp_abi_kernel cpu_range_cast =
    CPU_KERNEL_DT("range.cast", cast_supports, cast_run, 0, OPS_RANGE_FLOAT_DTYPES);
const bp_abi_kernel cpu_range_unscale =
    CPU_KERNEL_DT("range.unscale", unscale_supports, unscale_run, 0, OPS_RANGE_FLOAT_DTYPES);
const bp_abi_kernel cpu_range_nan_check =
    CPU_KERNEL_DT("range.nan_check", nan_check_supports, nan_check_run, 0,
                  OPS_RANGE_FLOAT_DTYPES);
