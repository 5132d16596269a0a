/* pos_embed.fwd and pos_embed.bwd, vectorized across the H*W*C elements
 * of a sample; bit-identical to ops/reference/pos_embed.c:
 *   fwd  y = x + P (one float addition per element)
 *   bwd  dx (+)= dy in float; dP = sum over n of dy in double, samples in
 *        order from 0, then bp_bn_param_grad (old value + sum, rounded once)
 * Every tensor one dense run (cpu_dense; others are refused and go to the
 * reference), so element k of sample n is ptr[n * H*W*C + k] and P's is
 * P[k]. Threads: the H*W*C elements of a sample are cut into tasks of
 * CPU_TASK_ELEMS / N elements (each task walks every sample for its own
 * elements, so dP's sum stays in sample order); no bit depends on them. No
 * output aliases an input (bp_sdk_check_ptrs). The checks are the
 * reference's (ops/shared/elementwise_check.h, ops_pos_embed_check). */
#include "cpu-impl.h"
#include "shared/elem_math.h"
#include "shared/elementwise_check.h"

CPU_INLINE void pe_fwd_loop_body(const float *restrict x, const float *restrict P,
                                 float *restrict y, int64_t n) {
  for (int64_t k = 0; k < n; k++) y[k] = x[k] + P[k];
}
CPU_DISPATCH(pe_fwd_loop,
             (const float *restrict x, const float *restrict P, float *restrict y, int64_t n),
             (x, P, y, n))

/* One sample's dy into dx (overwrite or add) and into the double sums. */
CPU_INLINE void pe_bwd_mode(const float *restrict dy, float *restrict dx, double *restrict sum,
                            int64_t n, int accumulate) {
  for (int64_t k = 0; k < n; k++) {
    const float g = dy[k];
    dx[k] = accumulate ? dx[k] + g : g;
    sum[k] += g;
  }
}
CPU_INLINE void pe_bwd_loop_body(const float *restrict dy, float *restrict dx,
                                 double *restrict sum, int64_t n, int accumulate) {
  if (accumulate) pe_bwd_mode(dy, dx, sum, n, 1);
  else pe_bwd_mode(dy, dx, sum, n, 0);
}
CPU_DISPATCH(pe_bwd_loop,
             (const float *restrict dy, float *restrict dx, double *restrict sum, int64_t n,
              int accumulate),
             (dy, dx, sum, n, accumulate))

#define PE_SUM_BLOCK 256 /* elements of dP summed at once (the double sums on the stack) */

typedef struct pe_job {
  const float *a; /* fwd: x; bwd: dy */
  const float *P; /* fwd only */
  float *out;     /* fwd: y; bwd: dx */
  float *dP;      /* bwd only */
  int64_t N, S;   /* samples, elements per sample */
  int64_t per;    /* elements per task */
  int accumulate;
  cpu_isa_level isa;
} pe_job;

static void pe_fwd_task(void *p, int64_t i) {
  const pe_job *j = p;
  int64_t end;
  const int64_t lo = cpu_task_items(i, j->per, j->S, &end);
  for (int64_t n = 0; n < j->N; n++)
    pe_fwd_loop(j->isa, j->a + n * j->S + lo, j->P + lo, j->out + n * j->S + lo, end - lo);
}

static void pe_bwd_task(void *p, int64_t i) {
  const pe_job *j = p;
  int64_t end;
  const int64_t lo = cpu_task_items(i, j->per, j->S, &end);
  for (int64_t k0 = lo; k0 < end; k0 += PE_SUM_BLOCK) {
    const int64_t nb = end - k0 < PE_SUM_BLOCK ? end - k0 : PE_SUM_BLOCK;
    double sum[PE_SUM_BLOCK] = {0};
    for (int64_t n = 0; n < j->N; n++)
      pe_bwd_loop(j->isa, j->a + n * j->S + k0, j->out + n * j->S + k0, sum, nb, j->accumulate);
    for (int64_t k = 0; k < nb; k++)
      j->dP[k0 + k] = bp_bn_param_grad(j->dP[k0 + k], sum[k], j->accumulate);
  }
}

/* The reference's checks, then every tensor one dense run. */
static int pe_check(int bwd, const bp_abi_kernel_args *args, bp_elementwise_attrs *a,
                    char *reason, size_t rs) {
  if (!ops_pos_embed_check(args, bwd, a, reason, rs)) return 0;
  const int nin = bwd ? 1 : 2, nout = bwd ? 2 : 1;
  static const char *const in_names[] = {"input 0", "input 1"}, *const out_names[] = {
                                                                    "output 0", "output 1"};
  for (int i = 0; i < nin; i++)
    if (!cpu_dense(bp_sdk_input(args, i), in_names[i], reason, rs)) return 0;
  for (int i = 0; i < nout; i++)
    if (!cpu_dense(bp_sdk_output(args, i), out_names[i], reason, rs)) return 0;
  return 1;
}

static int pe_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return pe_check(0, args, &a, reason, rs);
}
static int pe_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return pe_check(1, args, &a, reason, rs);
}

static pe_job pe_job_of(const bp_abi_kernel_args *args, void *user, int accumulate) {
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  pe_job j = {.N = x->shape[0], .S = x->shape[1] * x->shape[2] * x->shape[3],
              .accumulate = accumulate, .isa = cpu_user_isa(user)};
  j.per = cpu_items_per_task(j.N); /* an element of a sample is N elements of work */
  return j;
}

/* pos_embed.fwd  in: x, P   out: y (overwritten) */
static int pe_run_fwd(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  if (!pe_check(0, args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  pe_job j = pe_job_of(args, user, 0);
  j.a = bp_sdk_input_f32(args, 0), j.P = bp_sdk_input_f32(args, 1);
  j.out = bp_sdk_output_f32(args, 0);
  bp_sdk_parallel_for(args, pe_fwd_task, &j, cpu_task_count(j.S, j.per));
  return BP_ABI_OK;
}

/* pos_embed.bwd  in: dy   out: dx, dP (accumulate 0: overwritten, 1: added) */
static int pe_run_bwd(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  if (!pe_check(1, args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  pe_job j = pe_job_of(args, user, a.accumulate);
  j.a = bp_sdk_input_f32(args, 0), j.out = bp_sdk_output_f32(args, 0);
  j.dP = bp_sdk_output_f32(args, 1);
  bp_sdk_parallel_for(args, pe_bwd_task, &j, cpu_task_count(j.S, j.per));
  return BP_ABI_OK;
}

static const ops_fp16_kernel pe_fwd16 =
    CPU_FP16(pe_supports_fwd, pe_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel pe_bwd16 =
    CPU_FP16(pe_supports_bwd, pe_run_bwd, offsetof(bp_elementwise_attrs, accumulate));
const bp_abi_kernel cpu_pos_embed_fwd =
    CPU_KERNEL16("pos_embed.fwd", pe_fwd16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_pos_embed_bwd =
    CPU_KERNEL16("pos_embed.bwd", pe_bwd16, 0, CPU_FP16_DTYPES);
