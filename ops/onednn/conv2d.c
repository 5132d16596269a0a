/* conv2d forward, backward-data and backward-filter on oneDNN's convolution
 * primitives; the backward-filter of most shapes on conv_bwf.c's direct
 * kernel instead (direct_bwf says which; README.md "Backward-filter").
 * Same contract as ops/reference/conv2d.c (bp_abi_ops.h):
 *   x  [N, H, W, C]        oneDNN src / diff_src, tag nhwc
 *   w  [K, kh, kw, C/G]    oneDNN weights as "ohwi" ({K, C, kh, kw}), or with
 *                          groups "gohwi" ({G, K/G, C/G, kh, kw}): the same bytes
 *   b  [1, 1, 1, K]        bias / diff_bias, tag x
 *   y  [N, OH, OW, K]      dst / diff_dst, tag nhwc
 *
 * What each node keeps (its state, made once by prepare()): the primitive
 * descriptor and primitive, a stream, memory objects whose data handles are
 * set to the call's pointers, and, because oneDNN's JIT kernels want the
 * filters in a blocked layout of their own (on an ohwi filter only its
 * reference kernel runs), a filter buffer in that layout and the reorder
 * between it and the plan's filters:
 *  - forward, backward-data: the plan's w is reordered into the buffer on
 *    the first run and again only when the parameter generation (or w's
 *    pointer) changes; activations are never reordered;
 *  - backward-filter: the primitive writes the buffer, one reorder writes
 *    dw from it, with oneDNN's sum post-op when accumulate = 1.
 * Accumulate (bp_abi_ops.h rule 4): the forward ignores it. Backward-data
 * with accumulate = 1 computes into the workspace and adds it to dx (the
 * backward primitives take no post-ops); backward-filter's db likewise
 * through the state's bias buffer.
 *
 * Refused in supports() with a reason: tensors other than dense NHWC
 * without channel padding (padded_c = C), a bias with strided channels, and
 * shapes for which oneDNN offers only its reference kernel ("ref:any").
 *
 * Threads: oneDNN fixes a primitive's thread count (and with it how the
 * work, and backward-filter's sums, are split) when the primitive is
 * created, from OpenMP's count in the creating thread. prepare() therefore
 * applies the rank's count first, keeps it in the state, and run() applies
 * that count: the bits depend only on the inputs and the rank's count.
 *
 * The direct backward-filter keeps no oneDNN object: its state is the plan,
 * its workspace the chunks' partial sums and padded input rows (conv_bwf.h).
 *
 * Memory: oneDNN's scratchpads (mode user, for the convolution and the
 * filter reorder alike) are the state's own buffer, sized by the
 * primitives prepare() made (the size depends on that thread count, which
 * workspace_size() does not know); no oneDNN primitive of this module uses
 * the library's thread-local scratchpad. The bias passes through a state
 * buffer padded to 64 channels (state_new). The plan's workspace holds only
 * the dense dx of backward-data with accumulate = 1, 64-byte aligned in it.
 * Every buffer handed to oneDNN covers its memory descriptor's size. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conv_bwf.h"
#include "onednn-impl.h"
#include "shared/weighted_check.h"

#define ODNN_ALIGN 64
/* Bytes allocated past the scratchpad size a primitive descriptor reports.
 * oneDNN 2.6's strided 1x1 backward-filter wrote past that size (it is
 * refused: conv_plan_make); the forward and backward-data of a strided 1x1
 * use the same strided-input copy into the scratchpad. They stayed inside
 * it in every case tests/test_ops_onednn.c sweeps under guard pages on
 * AVX2, but other ISAs run other code: a page of slack keeps an overrun of
 * a vector or so out of the heap's metadata. */
#define ODNN_SCRATCH_SLACK 4096

/* One node's descriptors, built from its args. */
typedef struct conv_plan {
  ops_conv_geom r;
  ops_pass pass;
  dnnl_memory_desc_t x_md, y_md, w_user_md, b_md;
  dnnl_primitive_desc_t pd; /* owned */
  dnnl_memory_desc_t w_md;  /* the primitive's (diff_)weights layout */
  int w_reorder;            /* w_md differs from the plan's layout */
  uint64_t temp_bytes;      /* workspace: dense dx of bwd_data with accumulate */
  int direct;               /* backward-filter on conv_bwf.c instead (no pd) */
  bwf_plan bwf;
} conv_plan;

/* 1 when t is dense NHWC over its channels (no padding), else 0 with a
 * reason. */
static int dense_nhwc(const bp_abi_tensor *t, const char *name, char *reason, size_t rs) {
  const int64_t c = t->shape[3];
  if (t->padded_c != c)
    return bp_sdk_fail(reason, rs, "%s: padded channels (%lld of %lld) are not supported",
                       name, (long long)t->padded_c, (long long)c);
  const int64_t want[4] = {t->shape[1] * t->shape[2] * c, t->shape[2] * c, c, 1};
  for (int d = 0; d < 4; d++)
    if (t->shape[d] > 1 && t->stride[d] != want[d])
      return bp_sdk_fail(reason, rs, "%s: stride %lld of dimension %d is not dense NHWC", name,
                         (long long)t->stride[d], d);
  return 1;
}

static void md_nhwc(dnnl_memory_desc_t *md, int64_t n, int64_t c, int64_t h, int64_t w) {
  const dnnl_dims_t dims = {n, c, h, w};
  dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, dnnl_nhwc);
}

static void conv_plan_free(conv_plan *p) {
  if (p->pd) dnnl_primitive_desc_destroy(p->pd);
  p->pd = NULL;
}

static int plan_fail(conv_plan *p, dnnl_primitive_desc_t hint, char *reason, size_t rs,
                     const char *what, dnnl_status_t st) {
  if (hint) dnnl_primitive_desc_destroy(hint);
  conv_plan_free(p);
  return bp_sdk_fail(reason, rs, "oneDNN %s: status %d%s", what, (int)st,
                     st == dnnl_unimplemented ? " (no convolution for this case)" : "");
}

/* 1 when backward-filter runs on conv_bwf.c (README.md "Backward-filter"):
 * groups 1, no dilation, and either a filter row (kw*C floats) of at least
 * BWF_SHORT_ROW, or filters in whole vectors (k % 8 == 0: the kernel runs
 * its vectors along them), or a strided 1x1 (oneDNN 2.6's kernel for it
 * overruns its scratchpad). Short rows of ragged filter counts stay on
 * oneDNN. The rule reads the shape only. */
static int direct_bwf(const ops_conv_geom *r, bwf_plan *b) {
  if (r->groups != 1 || r->dh != 1 || r->dw != 1) return 0;
  const int strided_1x1 = r->kh == 1 && r->kw == 1 && (r->sh > 1 || r->sw > 1);
  if (r->kw * r->c < BWF_SHORT_ROW && r->k % 8 != 0 && !strided_1x1) return 0;
  return bwf_plan_make(b, r->n, r->h, r->w_, r->c, r->k, r->oh, r->ow, r->kh, r->kw, r->sh,
                       r->sw, r->ph, r->pw, r->has_bias);
}

/* The checks of the reference (the same messages), then this module's
 * layouts, then the primitive descriptor: 1 with p->pd owned, or 0 with a
 * reason and nothing owned. */
static int conv_plan_make(const bp_abi_kernel_args *args, ops_pass pass, conv_plan *p,
                          char *reason, size_t rs) {
  memset(p, 0, sizeof *p);
  p->pass = pass;
  ops_conv_geom *r = &p->r;
  if (!ops_conv_check(args, pass, r, reason, rs)) return 0;
  const char *xname = pass == OPS_PASS_BWD_DATA ? "dx" : "x";
  const char *wname = pass == OPS_PASS_BWD_FILTER ? "dw" : "w";
  const char *yname = pass == OPS_PASS_FWD ? "y" : "dy";
  if (!dense_nhwc(r->x, xname, reason, rs) || !dense_nhwc(r->y, yname, reason, rs) ||
      !dense_nhwc(r->w, wname, reason, rs))
    return 0;
  if (r->b && r->k > 1 && r->b->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "bias: channel stride %lld is not 1",
                       (long long)r->b->stride[3]);
  if (pass == OPS_PASS_BWD_FILTER && direct_bwf(r, &p->bwf)) {
    p->direct = 1;
    return 1;
  }
  /* oneDNN 2.6's 1x1 backward-filter copies a strided input into its
   * scratchpad first ("reduce to unit stride"); that copy writes past the
   * scratchpad size the primitive descriptor reports (12 bytes with 5
   * input channels on one thread: heap corruption), and with two or more
   * threads it gave wrong filters that vary from run to run (likely the
   * same copy running into the next thread's part). tests/test_ops_onednn.c
   * sweeps 1-17 channels */
  if (pass == OPS_PASS_BWD_FILTER && r->kh == 1 && r->kw == 1 && (r->sh > 1 || r->sw > 1))
    return bp_sdk_fail(reason, rs,
                       "strided 1x1 backward-filter: oneDNN 2.6's kernel for it overruns its "
                       "scratchpad");

  md_nhwc(&p->x_md, r->n, r->c, r->h, r->w_);
  md_nhwc(&p->y_md, r->n, r->k, r->oh, r->ow);
  dnnl_memory_desc_t w_any;
  if (r->groups == 1) {
    const dnnl_dims_t wd = {r->k, r->c, r->kh, r->kw};
    dnnl_memory_desc_init_by_tag(&p->w_user_md, 4, wd, dnnl_f32, dnnl_ohwi);
    dnnl_memory_desc_init_by_tag(&w_any, 4, wd, dnnl_f32, dnnl_format_tag_any);
  } else {
    const dnnl_dims_t wd = {r->groups, r->kg, r->cg, r->kh, r->kw};
    dnnl_memory_desc_init_by_tag(&p->w_user_md, 5, wd, dnnl_f32, dnnl_gohwi);
    dnnl_memory_desc_init_by_tag(&w_any, 5, wd, dnnl_f32, dnnl_format_tag_any);
  }
  const dnnl_dims_t bd = {r->k};
  dnnl_memory_desc_init_by_tag(&p->b_md, 1, bd, dnnl_f32, dnnl_x);
  const dnnl_memory_desc_t *b_md = r->b ? &p->b_md : NULL; /* none in bwd_data */
  const dnnl_dims_t strides = {r->sh, r->sw}, dil = {r->dh - 1, r->dw - 1},
                    pad = {r->ph, r->pw};

  /* the forward descriptor: the kernel itself, or the backward's hint */
  dnnl_convolution_desc_t fd, bd_desc;
  dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(
      &fd, dnnl_forward_training, dnnl_convolution_direct, &p->x_md, &w_any, b_md, &p->y_md,
      strides, dil, pad, pad);
  if (st != dnnl_success) return plan_fail(p, NULL, reason, rs, "forward descriptor", st);

  dnnl_primitive_attr_t attr;
  st = dnnl_primitive_attr_create(&attr);
  if (st != dnnl_success) return plan_fail(p, NULL, reason, rs, "attributes", st);
  dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  dnnl_primitive_desc_t hint = NULL;
  if (pass == OPS_PASS_FWD) {
    st = dnnl_primitive_desc_create(&p->pd, &fd, attr, odnn_engine(), NULL);
  } else {
    st = dnnl_primitive_desc_create(&hint, &fd, NULL, odnn_engine(), NULL);
    if (st == dnnl_success) {
      st = pass == OPS_PASS_BWD_DATA
               ? dnnl_dilated_convolution_backward_data_desc_init(
                     &bd_desc, dnnl_convolution_direct, &p->x_md, &w_any, &p->y_md, strides,
                     dil, pad, pad)
               : dnnl_dilated_convolution_backward_weights_desc_init(
                     &bd_desc, dnnl_convolution_direct, &p->x_md, &w_any, b_md, &p->y_md,
                     strides, dil, pad, pad);
      if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&p->pd, &bd_desc, attr, odnn_engine(), hint);
    }
  }
  dnnl_primitive_attr_destroy(attr);
  if (st != dnnl_success) {
    p->pd = NULL;
    return plan_fail(p, hint, reason, rs, "convolution", st);
  }
  if (hint) dnnl_primitive_desc_destroy(hint);

  const char *impl = NULL;
  dnnl_primitive_desc_query(p->pd, dnnl_query_impl_info_str, 0, &impl);
  if (!impl || strncmp(impl, "ref", 3) == 0) {
    conv_plan_free(p);
    return bp_sdk_fail(reason, rs, "oneDNN has only its reference kernel (%s) for this case",
                       impl ? impl : "?");
  }
  p->w_md = *dnnl_primitive_desc_query_md(
      p->pd, pass == OPS_PASS_BWD_FILTER ? dnnl_query_diff_weights_md : dnnl_query_weights_md, 0);
  p->w_reorder = !dnnl_memory_desc_equal(&p->w_md, &p->w_user_md);
  if (pass == OPS_PASS_BWD_DATA && r->accumulate)
    p->temp_bytes = dnnl_memory_desc_get_size(&p->x_md);
  return 1;
}

static uint64_t plan_workspace(const conv_plan *p) {
  if (p->direct) return ODNN_ALIGN + bwf_workspace_bytes(&p->bwf);
  return p->temp_bytes ? ODNN_ALIGN + p->temp_bytes : 0;
}

/* ---- node state ---------------------------------------------------------------- */

typedef struct conv_state {
  conv_plan p;
  int threads; /* OpenMP count the primitives were made for, and run with */
  dnnl_primitive_t prim;
  dnnl_stream_t stream;
  dnnl_memory_t x, y, w_user, w, b; /* handles set per run; w: the primitive's */
  dnnl_memory_t scratch, rscratch;  /* scratch_buf as the primitive's and the reorder's */
  dnnl_primitive_t reorder; /* w_user -> w, or (backward-filter) w -> w_user; NULL if none */
  void *w_buf;              /* w's buffer (w_reorder) */
  void *scratch_buf;        /* the scratchpads (both in user mode), or NULL when none is needed */
  float *bias_buf;          /* the bias (forward) or db (backward-filter), padded: see state_new */
  int packed;               /* w_buf holds w as of `generation` and `packed_from` */
  uint64_t generation;
  const void *packed_from;
} conv_state;

static void state_release(void *user, void *state) {
  (void)user;
  conv_state *s = state;
  if (!s) return;
  if (s->prim) dnnl_primitive_destroy(s->prim);
  if (s->reorder) dnnl_primitive_destroy(s->reorder);
  dnnl_memory_t *mems[] = {&s->x, &s->y, &s->w_user, &s->w, &s->b, &s->scratch, &s->rscratch};
  for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
    if (*mems[i]) dnnl_memory_destroy(*mems[i]);
  if (s->stream) dnnl_stream_destroy(s->stream);
  conv_plan_free(&s->p);
  free(s->w_buf);
  free(s->scratch_buf);
  free(s->bias_buf);
  free(s);
}

static dnnl_status_t memory_new(dnnl_memory_t *m, const dnnl_memory_desc_t *md, void *handle) {
  return dnnl_memory_create(m, md, odnn_engine(), handle);
}

/* The reorder between the plan's filters and the primitive's: into the
 * primitive's layout, or (backward-filter) out of it, adding when
 * accumulate. Its scratchpad is the state's too (mode user, *scratch_md):
 * in mode library oneDNN would keep it in the creating thread's
 * thread-local storage, while ranks run their nodes on other threads. */
static dnnl_status_t reorder_new(conv_state *s, dnnl_memory_desc_t *scratch_md) {
  const int out = s->p.pass == OPS_PASS_BWD_FILTER;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_status_t st = dnnl_primitive_attr_create(&attr);
  if (st != dnnl_success) return st;
  st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (st == dnnl_success && out && s->p.r.accumulate) {
    if ((st = dnnl_post_ops_create(&po)) == dnnl_success &&
        (st = dnnl_post_ops_append_sum(po, 1.0f)) == dnnl_success)
      st = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  dnnl_primitive_desc_t rpd = NULL;
  if (st == dnnl_success)
    st = dnnl_reorder_primitive_desc_create(&rpd, out ? &s->p.w_md : &s->p.w_user_md,
                                            odnn_engine(), out ? &s->p.w_user_md : &s->p.w_md,
                                            odnn_engine(), attr);
  if (st == dnnl_success) {
    *scratch_md = *dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0);
    st = dnnl_primitive_create(&s->reorder, rpd);
  }
  if (rpd) dnnl_primitive_desc_destroy(rpd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return st;
}

static int state_new(const bp_abi_kernel_args *args, ops_pass pass, conv_state **out) {
  *out = NULL;
  conv_state *s = calloc(1, sizeof *s);
  if (!s) return BP_ABI_ERR_NOMEM;
  /* the primitive descriptor fixes its thread count (the split of the work,
   * the per-thread scratchpad) from OpenMP's count now; run() applies the
   * same count */
  s->threads = bp_sdk_args_thread_count(args);
  odnn_use_threads(s->threads);
  if (!conv_plan_make(args, pass, &s->p, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args))) {
    free(s);
    return BP_ABI_ERR_INVALID;
  }
  const conv_plan *p = &s->p;
  if (p->direct) { /* no oneDNN objects */
    *out = s;
    return BP_ABI_OK;
  }
  /* backward-filter writes w_buf and reorders it into dw, unless it can
   * write dw itself (same layout, no accumulate) */
  const int via_buf = p->w_reorder || (pass == OPS_PASS_BWD_FILTER && p->r.accumulate);
  const char *what = "stream";
  dnnl_status_t st = dnnl_stream_create(&s->stream, odnn_engine(), dnnl_stream_default_flags);
  if (st == dnnl_success) what = "primitive", st = dnnl_primitive_create(&s->prim, p->pd);
  dnnl_memory_desc_t rscratch_md;
  memset(&rscratch_md, 0, sizeof rscratch_md);
  if (st == dnnl_success && via_buf) {
    what = "memory";
    const size_t bytes = dnnl_memory_desc_get_size(&p->w_md);
    if (posix_memalign(&s->w_buf, ODNN_ALIGN, bytes ? bytes : ODNN_ALIGN) != 0) {
      s->w_buf = NULL;
      st = dnnl_out_of_memory;
    } else {
      what = "filter reorder";
      st = memory_new(&s->w, &p->w_md, s->w_buf);
      if (st == dnnl_success) st = reorder_new(s, &rscratch_md);
    }
  }
  if (st == dnnl_success) {
    /* one buffer serves both scratchpads: the primitive and the reorder
     * never run at once */
    what = "memory";
    const dnnl_memory_desc_t *scratch_md =
        dnnl_primitive_desc_query_md(p->pd, dnnl_query_scratchpad_md, 0);
    const size_t scratch_bytes = dnnl_memory_desc_get_size(scratch_md),
                 rscratch_bytes = s->reorder ? dnnl_memory_desc_get_size(&rscratch_md) : 0;
    const size_t bytes = scratch_bytes > rscratch_bytes ? scratch_bytes : rscratch_bytes;
    if (bytes && posix_memalign(&s->scratch_buf, ODNN_ALIGN, bytes + ODNN_SCRATCH_SLACK) != 0)
      s->scratch_buf = NULL, st = dnnl_out_of_memory;
    if (st == dnnl_success &&
        (st = memory_new(&s->x, &p->x_md, DNNL_MEMORY_NONE)) == dnnl_success &&
        (st = memory_new(&s->y, &p->y_md, DNNL_MEMORY_NONE)) == dnnl_success &&
        (st = memory_new(&s->w_user, &p->w_user_md, DNNL_MEMORY_NONE)) == dnnl_success &&
        (st = memory_new(&s->b, &p->b_md, DNNL_MEMORY_NONE)) == dnnl_success)
      st = memory_new(&s->scratch, scratch_md, s->scratch_buf);
    if (st == dnnl_success && rscratch_bytes)
      st = memory_new(&s->rscratch, &rscratch_md, s->scratch_buf);
  }
  /* oneDNN's JIT kernels treat the bias in whole channel blocks: the
   * backward-filter writes diff_bias up to a block past the last channel,
   * and the forward may read that far. Neither touches the plan's bias: a buffer
   * rounded up to 64 channels (zero past k) takes the forward's copy of b,
   * or backward-filter's db, whose k channels are then copied or added */
  if (st == dnnl_success && pass != OPS_PASS_BWD_DATA && p->r.has_bias &&
      !(s->bias_buf = calloc((size_t)(p->r.k + 63) / 64 * 64, sizeof(float))))
    st = dnnl_out_of_memory;
  if (st != dnnl_success) {
    bp_sdk_set_reason(args, "oneDNN %s: status %d", what, (int)st);
    state_release(NULL, s);
    return odnn_error(st);
  }
  *out = s;
  return BP_ABI_OK;
}

static int conv_prepare(const bp_abi_kernel_args *args, ops_pass pass, void **state_out) {
  conv_state *s = NULL;
  const int rc = state_new(args, pass, &s);
  *state_out = s;
  return rc;
}

/* ---- run ----------------------------------------------------------------------- */

static dnnl_status_t execute(dnnl_primitive_t prim, dnnl_stream_t stream, int n,
                             const dnnl_exec_arg_t *a) {
  const dnnl_status_t st = dnnl_primitive_execute(prim, stream, n, a);
  return st == dnnl_success ? dnnl_stream_wait(stream) : st;
}

/* The filters the primitive reads: the plan's w, or w_buf reordered from
 * it when the parameters (or w's pointer) changed since the last pack. */
static dnnl_status_t filters_in(conv_state *s, const bp_abi_kernel_args *args, const void *w) {
  dnnl_status_t st = dnnl_memory_set_data_handle(s->w_user, (void *)(uintptr_t)w);
  if (st != dnnl_success || !s->p.w_reorder) return st;
  const uint64_t gen = bp_sdk_args_generation(args);
  if (s->packed && gen != 0 && gen == s->generation && w == s->packed_from) return dnnl_success;
  const dnnl_exec_arg_t a[] = {
      {DNNL_ARG_FROM, s->w_user}, {DNNL_ARG_TO, s->w}, {DNNL_ARG_SCRATCHPAD, s->rscratch}};
  st = execute(s->reorder, s->stream, s->rscratch ? 3 : 2, a);
  s->packed = st == dnnl_success;
  s->generation = gen, s->packed_from = w;
  return st;
}

/* Backward-filter on conv_bwf.c: the work items on the host's threads, then
 * their ordered sum, split into BWF_REDUCE_PARTS pieces of dw (the split
 * does not change any element's sum). */
#define BWF_REDUCE_PARTS 8
typedef struct bwf_call {
  const bwf_plan *p;
  const float *x, *dy;
  float *dw, *db;
  void *ws;
  int accumulate;
} bwf_call;

static void bwf_item_fn(void *arg, int64_t i) {
  const bwf_call *c = arg;
  bwf_item(c->p, c->x, c->dy, c->ws, i);
}

static void bwf_reduce_fn(void *arg, int64_t i) {
  const bwf_call *c = arg;
  bwf_reduce(c->p, c->ws, c->dw, c->db, c->accumulate, i, BWF_REDUCE_PARTS);
}

static void bwf_run(const bp_abi_kernel_args *args, const conv_plan *p, void *ws) {
  bwf_call c = {&p->bwf, args->input_ptrs[0], args->input_ptrs[1], args->output_ptrs[0],
                p->r.has_bias ? args->output_ptrs[1] : NULL, ws, p->r.accumulate};
  bp_sdk_parallel_for(args, bwf_item_fn, &c, p->bwf.items);
  bp_sdk_parallel_for(args, bwf_reduce_fn, &c, BWF_REDUCE_PARTS);
}

/* d[i] += t[i], i < n. */
static void add_into(float *restrict d, const float *restrict t, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] += t[i];
}

static int conv_run(const bp_abi_kernel_args *args, ops_pass pass) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  conv_state *s = bp_sdk_args_state(args), *tmp = NULL;
  if (!s) { /* a caller that skipped prepare */
    const int rc = state_new(args, pass, &tmp);
    if (rc != BP_ABI_OK) return rc;
    s = tmp;
  } else {
    /* the prepared plan must still describe these args */
    ops_conv_geom r;
    if (!ops_conv_check(args, pass, &r, reason, rs)) return BP_ABI_ERR_INVALID;
    /* the count the primitives were made for, even if the host lends
     * another now: their split and scratchpad assume it */
    odnn_use_threads(s->threads);
  }
  int rc = BP_ABI_OK;
  const conv_plan *p = &s->p;
  const uint64_t ws_need = plan_workspace(p);
  if (!bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs)) {
    rc = BP_ABI_ERR_INVALID;
  } else if (ws_need && (!BP_SDK_HAS_FIELD(args, bp_abi_kernel_args, workspace_bytes) ||
                         !args->workspace || args->workspace_bytes < ws_need)) {
    bp_sdk_set_reason(args, "needs a workspace of %llu bytes, got %llu",
                      (unsigned long long)ws_need,
                      (unsigned long long)(args->workspace ? args->workspace_bytes : 0));
    rc = BP_ABI_ERR_INVALID;
  }
  if (rc != BP_ABI_OK) {
    state_release(NULL, tmp);
    return rc;
  }
  char *ws = ws_need ? (char *)args->workspace : NULL;
  if (ws) ws += (ODNN_ALIGN - (uintptr_t)ws % ODNN_ALIGN) % ODNN_ALIGN;
  float *temp = ws ? (float *)(void *)ws : NULL;
  if (p->direct) {
    bwf_run(args, p, ws);
    state_release(NULL, tmp);
    return BP_ABI_OK;
  }

  const void *in0 = args->input_ptrs[0], *in1 = args->input_ptrs[1];
  void *out0 = args->output_ptrs[0];
  dnnl_status_t st = dnnl_success;
  dnnl_memory_t wmem = p->w_reorder ? s->w : s->w_user;
  if (pass == OPS_PASS_FWD) {
    if (st == dnnl_success) st = filters_in(s, args, in1);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->x, (void *)(uintptr_t)in0);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->y, out0);
    if (st == dnnl_success && p->r.has_bias) {
      memcpy(s->bias_buf, args->input_ptrs[2], sizeof(float) * (size_t)p->r.k);
      st = dnnl_memory_set_data_handle(s->b, s->bias_buf);
    }
    const dnnl_exec_arg_t a[] = {{DNNL_ARG_SRC, s->x},      {DNNL_ARG_WEIGHTS, wmem},
                                 {DNNL_ARG_DST, s->y},      {DNNL_ARG_SCRATCHPAD, s->scratch},
                                 {DNNL_ARG_BIAS, s->b}};
    if (st == dnnl_success) st = execute(s->prim, s->stream, p->r.has_bias ? 5 : 4, a);
  } else if (pass == OPS_PASS_BWD_DATA) {
    if (st == dnnl_success) st = filters_in(s, args, in1);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->y, (void *)(uintptr_t)in0);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->x, temp ? (void *)temp : out0);
    const dnnl_exec_arg_t a[] = {{DNNL_ARG_DIFF_DST, s->y},
                                 {DNNL_ARG_WEIGHTS, wmem},
                                 {DNNL_ARG_DIFF_SRC, s->x},
                                 {DNNL_ARG_SCRATCHPAD, s->scratch}};
    if (st == dnnl_success) st = execute(s->prim, s->stream, 4, a);
    if (st == dnnl_success && temp)
      add_into(out0, temp, p->temp_bytes / sizeof(float));
  } else {
    float *db = p->r.has_bias ? args->output_ptrs[1] : NULL;
    wmem = s->w ? s->w : s->w_user;
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->w_user, out0);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->x, (void *)(uintptr_t)in0);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(s->y, (void *)(uintptr_t)in1);
    if (st == dnnl_success && db)
      st = dnnl_memory_set_data_handle(s->b, s->bias_buf);
    const dnnl_exec_arg_t a[] = {{DNNL_ARG_SRC, s->x},
                                 {DNNL_ARG_DIFF_DST, s->y},
                                 {DNNL_ARG_DIFF_WEIGHTS, wmem},
                                 {DNNL_ARG_SCRATCHPAD, s->scratch},
                                 {DNNL_ARG_DIFF_BIAS, s->b}};
    if (st == dnnl_success) st = execute(s->prim, s->stream, db ? 5 : 4, a);
    if (st == dnnl_success && s->reorder) {
      const dnnl_exec_arg_t ra[] = {
          {DNNL_ARG_FROM, s->w}, {DNNL_ARG_TO, s->w_user}, {DNNL_ARG_SCRATCHPAD, s->rscratch}};
      st = execute(s->reorder, s->stream, s->rscratch ? 3 : 2, ra);
    }
    if (st == dnnl_success && db) {
      if (p->r.accumulate) add_into(db, s->bias_buf, (size_t)p->r.k);
      else memcpy(db, s->bias_buf, sizeof(float) * (size_t)p->r.k);
    }
  }
  if (st != dnnl_success) {
    bp_sdk_set_reason(args, "oneDNN execution: status %d", (int)st);
    rc = odnn_error(st);
  }
  state_release(NULL, tmp);
  return rc;
}

/* ---- descriptors --------------------------------------------------------------- */

#define CONV_FUNCS(suffix, pass)                                                              \
  static int supports_##suffix(void *user, const bp_abi_kernel_args *args, char *reason,      \
                               size_t rs) {                                                   \
    (void)user;                                                                               \
    conv_plan p;                                                                              \
    if (!conv_plan_make(args, pass, &p, reason, rs)) return 0;                                \
    conv_plan_free(&p);                                                                       \
    return 1;                                                                                 \
  }                                                                                           \
  static uint64_t workspace_##suffix(void *user, const bp_abi_kernel_args *args) {            \
    (void)user;                                                                               \
    conv_plan p;                                                                              \
    if (!conv_plan_make(args, pass, &p, NULL, 0)) return 0;                                   \
    const uint64_t bytes = plan_workspace(&p);                                                \
    conv_plan_free(&p);                                                                       \
    return bytes;                                                                             \
  }                                                                                           \
  static int prepare_##suffix(void *user, const bp_abi_kernel_args *args, void **state_out) { \
    (void)user;                                                                               \
    return conv_prepare(args, pass, state_out);                                               \
  }                                                                                           \
  static int run_##suffix(void *user, const bp_abi_kernel_args *args) {                       \
    (void)user;                                                                               \
    return conv_run(args, pass);                                                              \
  }
CONV_FUNCS(fwd, OPS_PASS_FWD)
CONV_FUNCS(bwd_data, OPS_PASS_BWD_DATA)
CONV_FUNCS(bwd_filter, OPS_PASS_BWD_FILTER)

#define ODNN_KERNEL(op_name, suffix)                                                            \
  {                                                                                            \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "onednn", .device = "cpu", \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = ODNN_PRIORITY,                  \
    .flags = BP_ABI_KERNEL_DETERMINISTIC, .supports = supports_##suffix,                       \
    .workspace_size = workspace_##suffix, .run = run_##suffix, .prepare = prepare_##suffix,    \
    .release = state_release                                                                   \
  }
const bp_abi_kernel odnn_conv2d_fwd = ODNN_KERNEL("conv2d.fwd", fwd);
const bp_abi_kernel odnn_conv2d_bwd_data = ODNN_KERNEL("conv2d.bwd_data", bwd_data);
const bp_abi_kernel odnn_conv2d_bwd_filter = ODNN_KERNEL("conv2d.bwd_filter", bwd_filter);
