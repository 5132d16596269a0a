/* conv2d.fwd, conv2d.bwd_data and conv2d.bwd_filter by Winograd
 * (winograd-impl.h, README.md). Same contract as ops/reference/conv2d.c
 * (bp_abi_ops.h):
 *   fwd         x [N,H,W,C], w [K,3,3,C], b [1,1,1,K] (has_bias)  ->  y [N,H,W,K]
 *   bwd_data    dy [N,H,W,K], w                                   ->  dx [N,H,W,C]
 *   bwd_filter  x, dy                                             ->  dw [K,3,3,C]
 * The backward-data of a 3x3 convolution with stride 1 and padding 1 is
 * itself one: dy convolved with the filters flipped in both directions
 * and transposed (input channel k, output channel c, tap (2-ky, 2-kx)),
 * so the forward and it run the same code and differ only in how the
 * filters are gathered for the transform. The backward-filter is
 * F(3x3,4x4): x tiles and dy tiles transformed, multiplied per position
 * and summed over the tiles, one inverse transform at the end.
 *
 * Refused in supports() with a reason: anything but a 3x3 kernel with
 * stride 1, padding 1, dilation 1 and one group; activations whose
 * channels are not contiguous (channel stride 1; padded channels are
 * fine); backward-filter with a bias (db); and the shapes where oneDNN's
 * direct convolution measured faster (wino_fast_enough). Any other
 * strides, channel counts, odd sizes and batches are served.
 *
 * Accumulate: the forward overwrites y (and ignores the flag); the
 * backward passes add into dx or dw when it is 1. Bias: added to every
 * output of the forward, after the inverse transform.
 *
 * State (prepare): the transformed filters, the bias padded to whole
 * vectors, one scratch block per thread, and for backward-filter the
 * partial sums of its fixed tile groups. The filters are transformed on
 * every run (a training step changes them every step). Without a prepared
 * state run() makes one for the call. No plan workspace. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "shared/weighted_check.h"
#include "winograd-impl.h"

#define WINO_ALIGN 64
/* Fewest input channels served: below, the transforms outweigh the saved
 * multiplies and oneDNN's direct convolution is faster (README.md). */
#define WINO_MIN_CIN 16

/* One call's geometry: the reference's checks, then this module's. */
typedef struct wino_plan {
  ops_conv_geom g;
  const bp_abi_tensor *src, *dst; /* x and y (fwd), dy and dx (bwd_data) */
  int64_t cin, cout, cin_pad, cout_pad;
} wino_plan;

/* The shapes where this kernel beat oneDNN's (README.md, "Speed"). */
static int wino_fast_enough(const wino_plan *p, char *reason, size_t rs) {
  if (p->cin < WINO_MIN_CIN)
    return bp_sdk_fail(reason, rs,
                       "%lld input channels: below %d oneDNN's direct convolution is faster",
                       (long long)p->cin, WINO_MIN_CIN);
  return 1;
}

static int contiguous_channels(const bp_abi_tensor *t, const char *name, char *reason,
                               size_t rs) {
  if (t->shape[3] > 1 && t->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "%s: channel stride %lld is not 1", name,
                       (long long)t->stride[3]);
  return 1;
}

static int plan_make(const bp_abi_kernel_args *args, ops_pass pass, wino_plan *p, char *reason,
                     size_t rs) {
  memset(p, 0, sizeof *p);
  ops_conv_geom *g = &p->g;
  if (!ops_conv_check(args, pass, g, reason, rs)) return 0;
  if (g->kh != 3 || g->kw != 3)
    return bp_sdk_fail(reason, rs, "Winograd F(4x4,3x3) needs a 3x3 kernel, got %lldx%lld",
                       (long long)g->kh, (long long)g->kw);
  if (g->sh != 1 || g->sw != 1)
    return bp_sdk_fail(reason, rs, "Winograd needs stride 1, got %lldx%lld", (long long)g->sh,
                       (long long)g->sw);
  if (g->dh != 1 || g->dw != 1)
    return bp_sdk_fail(reason, rs, "Winograd needs dilation 1, got %lldx%lld", (long long)g->dh,
                       (long long)g->dw);
  if (g->ph != 1 || g->pw != 1)
    return bp_sdk_fail(reason, rs, "Winograd needs padding 1, got %lldx%lld", (long long)g->ph,
                       (long long)g->pw);
  if (g->groups != 1)
    return bp_sdk_fail(reason, rs, "Winograd needs one group, got %lld", (long long)g->groups);
  const int data = pass == OPS_PASS_BWD_DATA;
  if (!contiguous_channels(g->x, data ? "dx" : "x", reason, rs) ||
      !contiguous_channels(g->y, pass == OPS_PASS_FWD ? "y" : "dy", reason, rs))
    return 0;
  if (pass == OPS_PASS_BWD_FILTER && g->has_bias)
    return bp_sdk_fail(reason, rs, "Winograd backward-filter computes no db (has_bias)");
  /* the filter gradient reads x (src) and dy (dst), C in, K out */
  p->src = data ? g->y : g->x;
  p->dst = data ? g->x : g->y;
  p->cin = data ? g->k : g->c;
  p->cout = data ? g->c : g->k;
  p->cin_pad = wino_pad8(p->cin), p->cout_pad = wino_pad8(p->cout);
  return wino_fast_enough(p, reason, rs);
}

/* ---- node state ------------------------------------------------------------------ */

typedef struct wino_state {
  int64_t cin_pad, cout_pad; /* what the buffers are sized for */
  float *u;                  /* wino_u_floats, pad rows zero (not backward-filter) */
  float *gather;             /* 9 * cout_pad: one input channel's taps */
  float *bias;               /* cout_pad, zero past cout */
  float *scratch;            /* tasks * wino_scratch_floats */
  int tasks;
  float *mw;                 /* filter gradient: WINO_GRAD_GROUPS partial sums of wino_u_floats */
} wino_state;

static void state_release(void *user, void *state) {
  (void)user;
  wino_state *s = state;
  if (!s) return;
  free(s->u);
  free(s->gather);
  free(s->bias);
  free(s->scratch);
  free(s->mw);
  free(s);
}

static float *alloc_floats(int64_t count) {
  void *p = NULL;
  const size_t bytes = ((size_t)count * sizeof(float) + WINO_ALIGN - 1) / WINO_ALIGN * WINO_ALIGN;
  if (posix_memalign(&p, WINO_ALIGN, bytes ? bytes : WINO_ALIGN) != 0) return NULL;
  memset(p, 0, bytes);
  return p;
}

/* Buffers for the plan and `tasks` threads: made or remade when too
 * small. BP_ABI_OK or BP_ABI_ERR_NOMEM. */
static int state_fit(wino_state *s, const wino_plan *p, ops_pass pass, int tasks) {
  if (s->cin_pad != p->cin_pad || s->cout_pad != p->cout_pad) {
    free(s->u), free(s->gather), free(s->bias), free(s->scratch), free(s->mw);
    s->u = s->gather = s->bias = s->scratch = s->mw = NULL;
    s->tasks = 0;
    s->cin_pad = p->cin_pad, s->cout_pad = p->cout_pad;
    s->gather = alloc_floats(9 * p->cout_pad);
    s->bias = alloc_floats(p->cout_pad);
    if (!s->gather || !s->bias) {
      s->cin_pad = s->cout_pad = 0;
      return BP_ABI_ERR_NOMEM;
    }
  }
  /* the filters' transform (forward, backward-data) or the partial sums
   * (backward-filter) */
  const int64_t uf = wino_u_floats(p->cin_pad, p->cout_pad);
  if (pass != OPS_PASS_BWD_FILTER && !s->u && !(s->u = alloc_floats(uf))) return BP_ABI_ERR_NOMEM;
  if (pass == OPS_PASS_BWD_FILTER && !s->mw && !(s->mw = alloc_floats(WINO_GRAD_GROUPS * uf)))
    return BP_ABI_ERR_NOMEM;
  if (s->tasks < tasks) {
    free(s->scratch);
    s->scratch = alloc_floats(tasks * wino_scratch_floats(p->cin_pad, p->cout_pad));
    s->tasks = s->scratch ? tasks : 0;
    if (!s->scratch) return BP_ABI_ERR_NOMEM;
  }
  return BP_ABI_OK;
}

static int conv_prepare(const bp_abi_kernel_args *args, ops_pass pass, void **state_out) {
  *state_out = NULL;
  wino_plan p;
  if (!plan_make(args, pass, &p, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  wino_state *s = calloc(1, sizeof *s);
  if (!s || state_fit(s, &p, pass, bp_sdk_args_thread_count(args)) != BP_ABI_OK) {
    state_release(NULL, s);
    bp_sdk_set_reason(args, "out of memory for the transformed filters and scratch");
    return BP_ABI_ERR_NOMEM;
  }
  *state_out = s;
  return BP_ABI_OK;
}

/* ---- run ----------------------------------------------------------------------------- */

/* U from the call's filters: forward input channel c, output k, tap
 * (ky,kx) = w[k,ky,kx,c]; backward-data input channel k, output c,
 * tap (ky,kx) = w[k,2-ky,2-kx,c]. */
static void transform_filters(const wino_plan *p, ops_pass pass, const float *w, wino_state *s) {
  const bp_abi_tensor *wt = p->g.w;
  for (int64_t ci = 0; ci < p->cin; ci++) {
    for (int tap = 0; tap < 9; tap++) {
      float *g = s->gather + tap * p->cout_pad;
      const int ky = tap / 3, kx = tap % 3;
      for (int64_t co = 0; co < p->cout; co++)
        g[co] = pass == OPS_PASS_FWD ? w[bp_sdk_offset(wt, co, ky, kx, ci)]
                                     : w[bp_sdk_offset(wt, ci, 2 - ky, 2 - kx, co)];
    }
    wino_filter_row(s->gather, ci, p->cin_pad, p->cout_pad, s->u);
  }
}

/* The blocks of one call, handed out to the tasks in turn. Which task
 * computes a block does not change its bits. */
typedef struct wino_job {
  const wino_conv *cv;
  float *scratch;
  int64_t scratch_floats, blocks;
  atomic_int_fast64_t next;
} wino_job;

static void job_task(void *arg, int64_t task) {
  wino_job *job = arg;
  float *scratch = job->scratch + task * job->scratch_floats;
  for (;;) {
    const int64_t b = atomic_fetch_add(&job->next, 1);
    if (b >= job->blocks) break;
    const int64_t t0 = b * job->cv->block, left = job->cv->tiles - t0;
    wino_block(job->cv, t0, left < job->cv->block ? left : job->cv->block, scratch);
  }
}

/* The filter gradient's fixed tile groups: each task takes the next
 * group and sums its blocks in order into the group's partial sums (the
 * first block writes them). */
typedef struct wino_grad_job {
  const wino_conv *cv;
  float *scratch, *mw;
  int64_t scratch_floats, group_floats, blocks;
  int groups;
  atomic_int_fast64_t next;
} wino_grad_job;

static void grad_task(void *arg, int64_t task) {
  wino_grad_job *job = arg;
  float *scratch = job->scratch + task * job->scratch_floats;
  const int64_t block = job->cv->block;
  for (;;) {
    const int64_t g = atomic_fetch_add(&job->next, 1);
    if (g >= job->groups) break;
    float *mw = job->mw + g * job->group_floats;
    const int64_t b0 = g * job->blocks / job->groups, b1 = (g + 1) * job->blocks / job->groups;
    for (int64_t b = b0; b < b1; b++) {
      const int64_t left = job->cv->tiles - b * block;
      wino_grad_block(job->cv, b * block, left < block ? left : block, scratch, mw, b == b0);
    }
  }
}

/* dw (+)= G^T (sum of the groups' partial sums) G for the input
 * channels of one task (each channel's taps computed and written by one
 * task: the split does not change the bits). */
typedef struct wino_grad_finish {
  const wino_plan *p;
  const wino_grad_job *job;
  float *dw;
  int64_t tasks;
} wino_grad_finish;

static void finish_task(void *arg, int64_t task) {
  const wino_grad_finish *f = arg;
  const wino_plan *p = f->p;
  const bp_abi_tensor *wt = p->g.w;
  float *taps = f->job->scratch + task * f->job->scratch_floats; /* 9 * cout_pad */
  for (int64_t c = p->cin * task / f->tasks; c < p->cin * (task + 1) / f->tasks; c++) {
    wino_grad_row(f->job->mw, f->job->groups, f->job->group_floats, c, p->cin_pad, p->cout_pad,
                  taps);
    for (int tap = 0; tap < 9; tap++)
      for (int64_t k = 0; k < p->cout; k++) {
        float *o = f->dw + bp_sdk_offset(wt, k, tap / 3, tap % 3, c);
        const float v = taps[tap * p->cout_pad + k];
        *o = p->g.accumulate ? *o + v : v;
      }
  }
}

static int conv_run(const bp_abi_kernel_args *args, ops_pass pass) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  wino_plan p;
  if (!plan_make(args, pass, &p, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  wino_state *s = bp_sdk_args_state(args), *tmp = NULL;
  if (!s && !(s = tmp = calloc(1, sizeof *s))) return BP_ABI_ERR_NOMEM;
  const int tasks = bp_sdk_args_thread_count(args);
  if (state_fit(s, &p, pass, tasks) != BP_ABI_OK) {
    state_release(NULL, tmp);
    bp_sdk_set_reason(args, "out of memory for the transformed filters and scratch");
    return BP_ABI_ERR_NOMEM;
  }
  if (pass != OPS_PASS_BWD_FILTER) transform_filters(&p, pass, bp_sdk_input_f32(args, 1), s);
  const float *bias = NULL;
  if (pass == OPS_PASS_FWD && p.g.has_bias) {
    const float *b = bp_sdk_input_f32(args, 2);
    for (int64_t k = 0; k < p.cout; k++) s->bias[k] = b[k * p.g.b->stride[3]];
    bias = s->bias;
  }
  wino_conv cv = {
      .n = p.g.n, .h = p.g.h, .w = p.g.w_,
      .cin = p.cin, .cout = p.cout, .cin_pad = p.cin_pad, .cout_pad = p.cout_pad,
      .tiles_h = (p.g.h + 3) / 4, .tiles_w = (p.g.w_ + 3) / 4,
      .src = bp_sdk_input_f32(args, 0),
      .src_stride = {p.src->stride[0], p.src->stride[1], p.src->stride[2]},
      .dst = pass == OPS_PASS_BWD_FILTER ? NULL : bp_sdk_output_f32(args, 0),
      .dst_stride = {p.dst->stride[0], p.dst->stride[1], p.dst->stride[2]},
      .bias = bias,
      .accumulate = pass == OPS_PASS_BWD_DATA && p.g.accumulate,
      .u = s->u,
  };
  cv.tiles = cv.n * cv.tiles_h * cv.tiles_w;
  cv.block = WINO_BLOCK;
  cv.pos_pad = WINO_POS_PAD;
  if (pass == OPS_PASS_BWD_FILTER) {
    cv.block = WINO_GRAD_BLOCK;
    cv.grad = bp_sdk_input_f32(args, 1);
    for (int d = 0; d < 3; d++) cv.grad_stride[d] = p.dst->stride[d];
    wino_grad_job job = {.cv = &cv,
                         .scratch = s->scratch,
                         .mw = s->mw,
                         .scratch_floats = wino_scratch_floats(p.cin_pad, p.cout_pad),
                         .group_floats = wino_u_floats(p.cin_pad, p.cout_pad),
                         .blocks = (cv.tiles + cv.block - 1) / cv.block};
    job.groups = job.blocks < WINO_GRAD_GROUPS ? (int)job.blocks : WINO_GRAD_GROUPS;
    atomic_init(&job.next, 0);
    bp_sdk_parallel_for(args, grad_task, &job, tasks < job.groups ? tasks : job.groups);
    wino_grad_finish fin = {.p = &p, .job = &job, .dw = bp_sdk_output_f32(args, 0),
                            .tasks = tasks < p.cin ? tasks : p.cin};
    bp_sdk_parallel_for(args, finish_task, &fin, fin.tasks);
    state_release(NULL, tmp);
    return BP_ABI_OK;
  }
  wino_job job = {.cv = &cv,
                  .scratch = s->scratch,
                  .scratch_floats = wino_scratch_floats(p.cin_pad, p.cout_pad),
                  .blocks = (cv.tiles + cv.block - 1) / cv.block};
  atomic_init(&job.next, 0);
  bp_sdk_parallel_for(args, job_task, &job, tasks < job.blocks ? tasks : job.blocks);
  state_release(NULL, tmp);
  return BP_ABI_OK;
}

/* ---- descriptors ------------------------------------------------------------------------ */

#define WINO_FUNCS(suffix, pass)                                                              \
  static int supports_##suffix(void *user, const bp_abi_kernel_args *args, char *reason,      \
                               size_t rs) {                                                   \
    (void)user;                                                                               \
    wino_plan p;                                                                              \
    return plan_make(args, pass, &p, reason, rs);                                             \
  }                                                                                           \
  static int prepare_##suffix(void *user, const bp_abi_kernel_args *args, void **state_out) { \
    (void)user;                                                                               \
    return conv_prepare(args, pass, state_out);                                               \
  }                                                                                           \
  static int run_##suffix(void *user, const bp_abi_kernel_args *args) {                       \
    (void)user;                                                                               \
    return conv_run(args, pass);                                                              \
  }
WINO_FUNCS(fwd, OPS_PASS_FWD)
WINO_FUNCS(bwd_data, OPS_PASS_BWD_DATA)
WINO_FUNCS(bwd_filter, OPS_PASS_BWD_FILTER)

#define WINO_KERNEL(op_name, suffix)                                                            \
  {                                                                                             \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "winograd", .device = "cpu", \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = WINO_PRIORITY,                   \
    .flags = BP_ABI_KERNEL_DETERMINISTIC, .supports = supports_##suffix, .run = run_##suffix,   \
    .prepare = prepare_##suffix, .release = state_release                                       \
  }
const bp_abi_kernel wino_conv2d_fwd = WINO_KERNEL("conv2d.fwd", fwd);
const bp_abi_kernel wino_conv2d_bwd_data = WINO_KERNEL("conv2d.bwd_data", bwd_data);
const bp_abi_kernel wino_conv2d_bwd_filter = WINO_KERNEL("conv2d.bwd_filter", bwd_filter);
