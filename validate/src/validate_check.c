/* The checks of one (kernel, case): the kernel and the reference run on
 * the same inputs, in fresh buffers each time, and what the kernel left
 * behind is compared with the reference and with the op conventions
 * (validate.h lists the checks; docs/validate.md the measures). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/dtype.h"
#include "blueprint/threads.h"
#include "validate-impl.h"

/* The mean signed error of an output of at least VC_BIAS_MIN elements,
 * over max(1, rms(ref)), must stay below this fraction of the tolerance. */
#define VC_BIAS_FRACTION 0.1
#define VC_BIAS_MIN 64
/* check 11: one case in SWEEP_EVERY runs at every other count of the sweep */
#define SWEEP_EVERY 4
/* FP16 outputs: the mean error along the sign of ref, over max(1,
 * rms(ref)), must stay below this plus one standard error of that mean
 * (docs/validate.md; XNNPACK's FP16 GEMMs, accumulating in FP16, stay
 * below 3.5e-4, a path truncating x and w to 7 mantissa bits above 2e-3) */
#define VC_TREND_FLOOR 1e-3

double vc_tolerance(int32_t dtype) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32: return 1e-4;
    case BP_ABI_DTYPE_FP16:
    case BP_ABI_DTYPE_BF16: return 1e-2;
    default: return 0; /* integers: exact */
  }
}

/* ---- one run ------------------------------------------------------------------- */

/* A later run of the kernel on the buffers and state of the first: new
 * input values, the params_generation it sees, its outputs. */
typedef struct vc_rerun {
  double *const *in_vals; /* [num_inputs] */
  uint64_t generation;
  double **got; /* [num_outputs] */
} vc_rerun;

typedef struct run_spec {
  const bp_abi_kernel *k;
  const vc_case *c;
  int accumulate;               /* the flag written into the attributes (when the op has one) */
  double *const *in_vals;       /* [num_inputs] */
  double *const *prior;         /* [num_outputs]: starting values, NULL: poisoned */
  int inplace;                  /* output 0 is this input's buffer, or -1 */
  const vc_check_options *o;
  const vc_rerun *reruns;       /* [rerun_count] later runs on the same buffers, or NULL */
  int rerun_count;
  int *failed_run;              /* (optional) which run failed: 0 the first, r rerun r */
} run_spec;

/* RUN_DEVICE: the device failed (a copy, a synchronization), why says how */
enum { RUN_OK = 0, RUN_FAILED = 1, RUN_VIOLATION = 2, RUN_NOMEM = 3, RUN_DEVICE = 4 };

static void element_name(const bp_abi_tensor *t, int64_t i, char *buf, size_t size) {
  const int64_t c = i % t->shape[3], w = i / t->shape[3] % t->shape[2];
  const int64_t h = i / (t->shape[3] * t->shape[2]) % t->shape[1];
  const int64_t n = i / (t->shape[3] * t->shape[2] * t->shape[1]);
  snprintf(buf, size, "(%d,%d,%d,%d)", (int)n, (int)h, (int)w, (int)c);
}

static int is_float(int32_t dtype) {
  return dtype == BP_ABI_DTYPE_FP32 || dtype == BP_ABI_DTYPE_FP16 || dtype == BP_ABI_DTYPE_BF16;
}

/* The first byte in [from, to) where a and b differ, or -1. */
static int64_t first_diff(const unsigned char *a, const unsigned char *b, uint64_t from,
                          uint64_t to) {
  if (to <= from || memcmp(a + from, b + from, (size_t)(to - from)) == 0) return -1;
  for (uint64_t i = from; i < to; i++)
    if (a[i] != b[i]) return (int64_t)i;
  return -1;
}

/* The first changed byte outside the logical elements of t, or -1. */
static int64_t stray_write(const bp_abi_tensor *t, const unsigned char *now,
                           const unsigned char *before) {
  const uint64_t es = vt_elem_size(t->dtype), slot = t->slot_bytes;
  if (t->stride[3] == 1 && t->stride[2] == t->padded_c &&
      t->stride[1] == t->padded_c * t->shape[2] && t->stride[0] == t->stride[1] * t->shape[1]) {
    /* the plan's layout: each pixel's channel padding, then the tail */
    const uint64_t pixels = (uint64_t)(t->shape[0] * t->shape[1] * t->shape[2]);
    const uint64_t pixel = (uint64_t)t->padded_c * es, used = (uint64_t)t->shape[3] * es;
    for (uint64_t p = 0; used < pixel && p < pixels && p * pixel < slot; p++) {
      const uint64_t end = (p + 1) * pixel < slot ? (p + 1) * pixel : slot;
      const int64_t at = first_diff(now, before, p * pixel + used, end);
      if (at >= 0) return at;
    }
    return first_diff(now, before, pixels * pixel < slot ? pixels * pixel : slot, slot);
  }
  unsigned char *mask = vt_logical_mask(t);
  int64_t at = -1;
  for (uint64_t b = 0; mask && b < t->slot_bytes; b++)
    if (!mask[b] && now[b] != before[b]) {
      at = (int64_t)b;
      break;
    }
  vc_mem_free(mask);
  return at;
}

/* b: slot_bytes of t, its guard page (if any) registered as "<side> <i>"
 * for the fault report. 0, or -1 when out of memory. */
static int guarded_slot(vbuf *b, const bp_abi_tensor *t, int guard, const char *side, int i) {
  if (vbuf_alloc(b, t->slot_bytes, guard) != 0) return -1;
  char what[32];
  snprintf(what, sizeof what, "%s %d", side, i);
  vbuf_guard_register(b, what);
  return 0;
}

/* Runs the kernel once, then once more per s->reruns entry on the very
 * same buffers, workspace and kernel state (prepare() once before the
 * first run, release() after the last), as the executor runs a node step
 * after step: before each run the inputs get that run's values and the
 * outputs their starting contents again, and *params_generation that
 * run's generation (the first run: 1). Outputs' logical elements into
 * got[o] (the first run) and each rerun's got. On a device (s->o->device)
 * the host images are copied in before and back after every run
 * (validate_device.c); the checks read the images. A failing rerun's why
 * starts with "run N on the same buffers: ". */
static int run_once(const run_spec *s, double **got, char *why, size_t why_size) {
  const vc_case *c = s->c;
  vc_device *dev = s->o->device;
  vbuf in[VC_MAX], out[VC_MAX], ws;
  unsigned char *snap_in[VC_MAX] = {0}, *snap_out[VC_MAX] = {0};
  const void *in_ptrs[VC_MAX];
  void *out_ptrs[VC_MAX];
  int alias[VC_MAX];
  int rc = RUN_OK;
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  memset(&ws, 0, sizeof ws);
  vbuf_guard_clear();
  why[0] = '\0';

  for (int i = 0; i < c->num_inputs && rc == RUN_OK; i++) {
    if (guarded_slot(&in[i], &c->in[i].d, s->o->guard, "input", i) != 0) rc = RUN_NOMEM;
    else in_ptrs[i] = in[i].ptr;
  }
  for (int o = 0; o < c->num_outputs && rc == RUN_OK; o++) {
    alias[o] = o == 0 && s->inplace >= 0 ? s->inplace : c->alias[o];
    if (alias[o] >= 0) {
      out_ptrs[o] = in[alias[o]].ptr; /* the input's values are its prior contents */
      continue;
    }
    if (guarded_slot(&out[o], &c->out[o].d, s->o->guard, "output", o) != 0) rc = RUN_NOMEM;
    else out_ptrs[o] = out[o].ptr;
  }
  for (int i = 0; i < c->num_inputs && rc == RUN_OK; i++)
    if (!(snap_in[i] = vc_mem_calloc((size_t)c->in[i].d.slot_bytes + 1, 1))) rc = RUN_NOMEM;
  for (int o = 0; o < c->num_outputs && rc == RUN_OK; o++)
    if (!(snap_out[o] = vc_mem_calloc((size_t)c->out[o].d.slot_bytes + 1, 1))) rc = RUN_NOMEM;

  bp_abi_tensor ind[VC_MAX], outd[VC_MAX];
  for (int i = 0; i < c->num_inputs; i++) ind[i] = c->in[i].d;
  for (int o = 0; o < c->num_outputs; o++) outd[o] = c->out[o].d;
  unsigned char attrs[sizeof c->attrs];
  memcpy(attrs, c->attrs, sizeof attrs);
  if (c->accumulate_offset >= 0) {
    const int32_t flag = s->accumulate;
    memcpy(attrs + c->accumulate_offset, &flag, sizeof flag);
  }
  uint64_t generation = 1;
  char reason[256] = "";
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.num_inputs = c->num_inputs;
  a.num_outputs = c->num_outputs;
  a.inputs = ind;
  a.outputs = outd;
  a.attrs = c->attr_size ? attrs : NULL;
  a.attr_size = c->attr_size;
  a.attr_version = BP_ABI_ATTR_VERSION;
  a.world_size = 1;
  const bp_abi_kernel *k = s->k;
  uint64_t ws_need = 0;
  if (rc == RUN_OK && k->workspace_size) ws_need = k->workspace_size(k->user, &a);
  if (rc == RUN_OK && ws_need && !dev) { /* on a device: in its arena */
    if (vbuf_alloc(&ws, ws_need, s->o->guard) != 0) {
      rc = RUN_NOMEM;
    } else {
      vbuf_guard_register(&ws, "the workspace");
      a.workspace = ws.ptr;
      a.workspace_bytes = ws_need;
    }
  }
  /* on a device: every input and every output that is not an input */
  vc_slot slots[2 * VC_MAX];
  int nslots = 0;
  const void *dev_in[VC_MAX];
  void *dev_out[VC_MAX];
  if (dev) {
    for (int i = 0; i < c->num_inputs; i++)
      slots[nslots++] = (vc_slot){in[i].ptr, c->in[i].d.slot_bytes, 0, NULL};
    for (int o = 0; o < c->num_outputs; o++)
      if (alias[o] < 0) slots[nslots++] = (vc_slot){out[o].ptr, c->out[o].d.slot_bytes, 0, NULL};
  }
  a.input_ptrs = dev ? dev_in : in_ptrs;
  a.output_ptrs = dev ? dev_out : out_ptrs;
  a.params_generation = &generation;
  a.reason = reason;
  a.reason_size = sizeof reason;
  a.threads = s->o->threads;
  void *state = NULL;
  int prepared = 0; /* prepare() ran and succeeded (or there is none) */

  for (int r = 0; r <= s->rerun_count && rc == RUN_OK; r++) {
    double *const *in_vals = r ? s->reruns[r - 1].in_vals : s->in_vals;
    double **dst = r ? s->reruns[r - 1].got : got;
    generation = r ? s->reruns[r - 1].generation : 1;
    char run_why[320] = "";
    /* the run's starting images */
    for (int i = 0; i < c->num_inputs; i++) {
      vt_fill_input_padding(&c->in[i].d, in[i].ptr);
      vt_write(&c->in[i].d, in[i].ptr, in_vals[i]);
    }
    for (int o = 0; o < c->num_outputs; o++) {
      if (alias[o] >= 0) continue;
      vt_fill_output(&c->out[o].d, out[o].ptr, s->prior[o] == NULL);
      if (s->prior[o]) vt_write(&c->out[o].d, out[o].ptr, s->prior[o]);
    }
    for (int i = 0; i < c->num_inputs; i++)
      memcpy(snap_in[i], in[i].ptr, (size_t)c->in[i].d.slot_bytes);
    for (int o = 0; o < c->num_outputs; o++)
      memcpy(snap_out[o], out_ptrs[o], (size_t)c->out[o].d.slot_bytes);
    int uploaded = 0;
    if (dev) {
      if (vc_device_upload(dev, slots, nslots, ws_need, &a.workspace, run_why,
                           sizeof run_why) != 0) {
        rc = RUN_DEVICE;
      } else {
        uploaded = 1;
        a.workspace_bytes = a.workspace ? ws_need : 0;
        for (int i = 0; i < c->num_inputs; i++) dev_in[i] = slots[i].dev;
        for (int o = 0, next = c->num_inputs; o < c->num_outputs; o++)
          dev_out[o] = alias[o] >= 0 ? slots[alias[o]].dev : slots[next++].dev;
        a.stream = vc_device_stream(dev); /* prepare() sees it too, as at bind */
      }
    }
    int krc = BP_ABI_OK;
    if (rc == RUN_OK && r == 0) {
      if (k->prepare) {
        if (!dev) krc = k->prepare(k->user, &a, &state);
        else if (vc_device_prepare(dev, k, &a, &state, &krc, run_why, sizeof run_why) != 0)
          rc = RUN_DEVICE;
        if (krc != BP_ABI_OK) state = NULL;
      }
      prepared = rc == RUN_OK && krc == BP_ABI_OK;
    }
    a.state = state;
    if (rc == RUN_OK && prepared) {
      if (!dev) krc = k->run(k->user, &a);
      else if (vc_device_launch(dev, k, &a, &krc, run_why, sizeof run_why) != 0) rc = RUN_DEVICE;
    }
    reason[sizeof reason - 1] = '\0';
    if (rc == RUN_OK && krc != BP_ABI_OK) {
      snprintf(run_why, sizeof run_why, "%s returned status %d%s%s",
               k->prepare && !prepared ? "prepare()" : "run()", krc,
               reason[0] ? ": " : " (no reason given)", reason);
      rc = RUN_FAILED;
    }
    if (uploaded) { /* the images now hold what the device holds */
      char dwhy[256];
      if (vc_device_download(dev, slots, nslots, dwhy, sizeof dwhy) != 0 && rc == RUN_OK) {
        snprintf(run_why, sizeof run_why, "%s", dwhy);
        rc = RUN_DEVICE;
      }
    }
    /* what the run left behind */
    for (int i = 0; i < c->num_inputs && rc == RUN_OK; i++) {
      int written = 0;
      for (int o = 0; o < c->num_outputs; o++) written |= alias[o] == i;
      if (!written && memcmp(in[i].ptr, snap_in[i], (size_t)c->in[i].d.slot_bytes) != 0) {
        snprintf(run_why, sizeof run_why, "wrote into input %d (inputs are read-only)", i);
        rc = RUN_VIOLATION;
      }
    }
    for (int o = 0; o < c->num_outputs && rc == RUN_OK; o++) {
      const bp_abi_tensor *t = &c->out[o].d;
      const int64_t at = stray_write(t, out_ptrs[o], snap_out[o]);
      const uint64_t data = (uint64_t)(t->shape[0] * t->stride[0]) * vt_elem_size(t->dtype);
      if (at >= 0) {
        if ((uint64_t)at < data)
          snprintf(run_why, sizeof run_why,
                   "wrote the channel padding of output %d (byte %" PRId64 "; channels %" PRId64
                   "..%" PRId64 " of every pixel must stay untouched)",
                   o, at, t->shape[3], t->padded_c - 1);
        else
          snprintf(run_why, sizeof run_why,
                   "wrote past the last element of output %d (byte %" PRId64 " of %" PRIu64
                   " slot bytes; the tail is read-only)",
                   o, at, t->slot_bytes);
        rc = RUN_VIOLATION;
        break;
      }
      const int64_t poisoned = s->prior[o] == NULL && alias[o] < 0 && is_float(t->dtype)
                                   ? vt_find_poison(t, out_ptrs[o])
                                   : -1;
      if (poisoned >= 0) {
        char e[64];
        element_name(t, poisoned, e, sizeof e);
        snprintf(run_why, sizeof run_why,
                 "left element %s of output %d unwritten (still poisoned)", e, o);
        rc = RUN_VIOLATION;
      }
      vt_read(t, out_ptrs[o], dst[o]);
    }
    if (rc != RUN_OK) {
      if (r) snprintf(why, why_size, "run %d on the same buffers: %s", r + 1, run_why);
      else snprintf(why, why_size, "%s", run_why);
      if (s->failed_run) *s->failed_run = r;
    }
  }
  if (state && k->release) k->release(k->user, state);
  for (int i = 0; i < VC_MAX; i++) {
    vbuf_free(&in[i]);
    vbuf_free(&out[i]);
    vc_mem_free(snap_in[i]);
    vc_mem_free(snap_out[i]);
  }
  vbuf_free(&ws);
  vbuf_guard_clear();
  if (rc == RUN_NOMEM) snprintf(why, why_size, "out of memory for the case's buffers");
  return rc;
}

/* ---- comparison ------------------------------------------------------------------- */

/* atol of output o (and its rtol: 0 but for FP16 outputs); fp32_tol: the
 * kernel's FP32 tolerance (vc_impl_fp32_tolerance). */
static double out_tolerance(const vc_case *c, int o, double fp32_tol, double *rtol) {
  double atol =
      c->out[o].d.dtype == BP_ABI_DTYPE_FP32 ? fp32_tol : vc_tolerance(c->out[o].d.dtype);
  *rtol = 0;
  if (c->out[o].d.dtype == BP_ABI_DTYPE_FP16) vc_op_fp16_tolerance(c->op, rtol, &atol);
  return atol;
}

/* Largest normalized error of got against want over every output; 1 when
 * every output is within its dtype's tolerance, else 0 and why. */
static int compare(const vc_case *c, double fp32_tol, double *const *got, double *const *want,
                   double *err_out, double *tol_out, char *why, size_t why_size) {
  int ok = 1;
  double worst = 0, worst_tol = NAN;
  for (int o = 0; o < c->num_outputs; o++) {
    const bp_abi_tensor *t = &c->out[o].d;
    const int64_t n = vt_count(t);
    double rtol;
    const double tol = out_tolerance(c, o, fp32_tol, &rtol);
    double scale = 1;
    for (int64_t i = 0; i < n; i++)
      if (isfinite(want[o][i]) && fabs(want[o][i]) > scale) scale = fabs(want[o][i]);
    double err = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
      const double g = got[o][i], w = want[o][i];
      double d;
      if (isnan(g) || isnan(w)) d = isnan(g) && isnan(w) ? 0 : INFINITY;
      else if (isinf(g) || isinf(w)) d = g == w ? 0 : INFINITY;
      else d = fmax(0, fabs(g - w) - rtol * fabs(w)) / scale; /* beyond the rounding */
      if (d > err) {
        err = d;
        at = i;
      }
    }
    /* a systematic offset hides under max(1, max|ref|) when the values are
     * large; rounding errors average out, an offset does not */
    double sum = 0, sq = 0;
    int64_t finite = 0;
    for (int64_t i = 0; i < n; i++)
      if (isfinite(got[o][i]) && isfinite(want[o][i])) {
        sum += got[o][i] - want[o][i];
        sq += want[o][i] * want[o][i];
        finite++;
      }
    const double rms = finite ? sqrt(sq / (double)finite) : 0;
    const double bias = finite ? fabs(sum) / (double)finite / (rms > 1 ? rms : 1) : 0;
    /* FP16: the mean of n roundings to nearest stays within a few
     * rtol / sqrt(n) */
    const double bias_tol =
        tol * VC_BIAS_FRACTION + (finite ? 4 * rtol / sqrt((double)finite) : 0);
    if (err <= tol && finite >= VC_BIAS_MIN && bias > bias_tol && ok) {
      ok = 0;
      snprintf(why, why_size,
               "output %d: mean error %.3g over %lld elements > %.3g (a systematic offset; the "
               "largest error %.3g is within %.3g)",
               o, bias, (long long)finite, bias_tol, err, tol);
      worst = bias;
      worst_tol = bias_tol;
      continue;
    }
    /* FP16 (rtol > 0): errors of rounding to nearest have no sign of their
     * own, so the mean error along the sign of ref stays near 0; a path
     * that truncates (x and w to 7 mantissa bits: the magnitudes shrink by
     * about 2^-7) moves it a few 1e-3 away, while each error may stay
     * within atol */
    double along = 0, e2 = 0;
    for (int64_t i = 0; rtol > 0 && i < n; i++)
      if (isfinite(got[o][i]) && isfinite(want[o][i])) {
        const double d = got[o][i] - want[o][i];
        along += want[o][i] > 0 ? d : want[o][i] < 0 ? -d : 0;
        e2 += d * d;
      }
    const double per = rms > 1 ? rms : 1;
    const double trend = finite ? along / (double)finite / per : 0;
    const double trend_tol =
        VC_TREND_FLOOR + (finite ? sqrt(e2 / (double)finite) / per / sqrt((double)finite) : 0);
    if (rtol > 0 && err <= tol && fabs(trend) > trend_tol && ok) {
      ok = 0;
      snprintf(why, why_size,
               "output %d: magnitudes %s by %.3g on average over %lld elements > %.3g (a trend "
               "%s zero: %s, not rounding to nearest; the largest error %.3g is within %.3g)",
               o, trend < 0 ? "shrink" : "grow", fabs(trend), (long long)finite, trend_tol,
               trend < 0 ? "toward" : "away from", trend < 0 ? "truncation" : "rounding up", err,
               tol);
      worst = fabs(trend);
      worst_tol = trend_tol;
      continue;
    }
    if (isnan(worst_tol) || err > worst) {
      worst = err;
      worst_tol = tol;
    }
    if (err > tol && ok) {
      ok = 0;
      char e[64];
      element_name(t, at, e, sizeof e);
      snprintf(why, why_size, "output %d element %s: got %.9g, want %.9g (error %.3g > %.3g)%s",
               o, e, got[o][at], want[o][at], err, tol,
               isnan(got[o][at]) && !isnan(want[o][at])
                   ? "; NaN: it read poisoned memory or input channel padding"
                   : "");
      worst = err;
      worst_tol = tol;
    }
  }
  *err_out = worst;
  *tol_out = worst_tol;
  return ok;
}

/* ---- the checks ------------------------------------------------------------------- */

static int dtypes_claimed(const bp_abi_kernel *k, const vc_case *c, char *why, size_t size) {
  for (int side = 0; side < 2; side++) {
    const int n = side ? c->num_outputs : c->num_inputs;
    for (int i = 0; i < n; i++) {
      const int32_t d = side ? c->out[i].d.dtype : c->in[i].d.dtype;
      if (d < 0 || d >= 32 || !(k->dtypes & BP_ABI_DTYPE_BIT((unsigned)d))) {
        snprintf(why, size, "%s %d is %s, a dtype the kernel does not claim",
                 side ? "output" : "input", i, bp_dtype_name((bp_dtype)d));
        return 0;
      }
    }
  }
  return 1;
}

static int supports(const bp_abi_kernel *k, const vc_case *c, char *why, size_t size) {
  if (!dtypes_claimed(k, c, why, size)) return 0;
  if (!k->supports) return 1;
  bp_abi_tensor ind[VC_MAX], outd[VC_MAX];
  for (int i = 0; i < c->num_inputs; i++) ind[i] = c->in[i].d;
  for (int o = 0; o < c->num_outputs; o++) outd[o] = c->out[o].d;
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.num_inputs = c->num_inputs;
  a.num_outputs = c->num_outputs;
  a.inputs = ind;
  a.outputs = outd;
  a.attrs = c->attr_size ? c->attrs : NULL;
  a.attr_size = c->attr_size;
  a.attr_version = BP_ABI_ATTR_VERSION;
  a.world_size = 1;
  why[0] = '\0';
  if (k->supports(k->user, &a, why, size)) return 1;
  why[size - 1] = '\0';
  if (!why[0]) snprintf(why, size, "supports() said no without a reason");
  return 0;
}

typedef struct vals {
  double *v[VC_MAX];
} vals;

static int vals_alloc(vals *x, const vc_tensor *t, int n) {
  memset(x, 0, sizeof *x);
  for (int i = 0; i < n; i++) {
    const int64_t count = vt_count(&t[i].d);
    if (!(x->v[i] = vc_mem_calloc((size_t)(count > 0 ? count : 1), sizeof(double)))) return -1;
  }
  return 0;
}

static void vals_free(vals *x) {
  for (int i = 0; i < VC_MAX; i++) vc_mem_free(x->v[i]);
  memset(x, 0, sizeof *x);
}

static uint64_t case_seed(uint64_t seed, const vc_case *c) {
  uint64_t h = seed ^ 0x6a09e667f3bcc909ull;
  for (const char *p = c->op; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  for (const char *p = c->name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return h;
}

static void fail(vc_outcome *out, const char *stage, const char *why) {
  out->verdict = BP_VALIDATE_FAIL;
  snprintf(out->detail, sizeof out->detail, "%.64s%s%.250s", stage, stage[0] ? ": " : "", why);
}

/* Keeps the larger error seen (for the report's error column). */
static void note_error(vc_outcome *out, double err, double tol) {
  if (isnan(out->error) || err > out->error) {
    out->error = err;
    out->tolerance = tol;
  }
}

/* Compares got with want and notes the error; on a mismatch fails out at
 * stage and returns 0. */
static int agrees(vc_outcome *out, const char *stage, const vc_case *c, double fp32_tol,
                  double *const *got, double *const *want, char *why, size_t why_size) {
  double err, tol;
  const int ok = compare(c, fp32_tol, got, want, &err, &tol, why, why_size);
  note_error(out, err, tol);
  if (!ok) fail(out, stage, why);
  return ok;
}

/* (1.5) skip != 0: every output must keep its starting values; else
 * fails out and returns 0. */
static int kept_when_skipped(vc_outcome *out, const vc_case *c, const vals *in,
                             double *const *start, const vals *got) {
  if (c->skip_in < 0 || in->v[c->skip_in][0] == 0) return 1;
  for (int i = 0; i < c->num_outputs; i++)
    for (int64_t e = 0; start[i] && e < vt_count(&c->out[i].d); e++)
      if (memcmp(&got->v[i][e], &start[i][e], sizeof(double)) != 0) {
        char why[200];
        snprintf(why, sizeof why,
                 "skip is %g, but element %" PRId64 " of output %d changed (%.9g -> %.9g)",
                 in->v[c->skip_in][0], e, i, start[i][e], got->v[i][e]);
        fail(out, "", why);
        return 0;
      }
  return 1;
}

/* Fails out with a stage of any length (fail() keeps stages short). */
static void fail_long(vc_outcome *out, const char *stage, const char *why) {
  out->verdict = BP_VALIDATE_FAIL;
  const size_t cap = sizeof out->detail - 1;
  size_t n = strlen(stage) < cap ? strlen(stage) : cap;
  memcpy(out->detail, stage, n);
  for (const char *p = ": "; *p && n < cap; p++) out->detail[n++] = *p;
  for (const char *p = why; *p && n < cap; p++) out->detail[n++] = *p;
  out->detail[n] = '\0';
}

/* The thread service of `count` threads for check 11: one of o->sweep, or
 * o->threads when none has that count. */
static const bp_abi_threads *threads_of(const vc_check_options *o, int count) {
  for (int i = 0; i < o->sweep_count; i++)
    if (o->sweep[i]->count == count) return o->sweep[i];
  return o->threads;
}

/* The inputs of the later runs of check 10: B new data inputs with the
 * parameters kept, C every input new. A stream of its own, so the other
 * checks' inputs stay what they were. */
static void later_inputs(const vc_case *c, uint64_t seed, const vals *in, vals *in_b,
                         vals *in_c) {
  uint64_t rng = case_seed(seed ^ 0x243f6a8885a308d3ull, c);
  for (int i = 0; i < c->num_inputs; i++) {
    const size_t bytes = (size_t)vt_count(&c->in[i].d) * sizeof(double);
    if (c->param_in & (1u << i)) memcpy(in_b->v[i], in->v[i], bytes);
    else vc_fill_values(c, &c->in[i], &rng, in_b->v[i]);
    vc_fill_values(c, &c->in[i], &rng, in_c->v[i]);
  }
}

/* 10 and 11: what the kernel gave on the later runs of its first run's
 * buffers and state (got_b: new data, the same generation; got_c: every
 * input new, the generation bumped; session_why: why one of them failed,
 * or "") against fresh runs of the kernel on the same inputs, at other
 * thread counts. A mismatch is told apart by one more fresh run at the
 * first run's count: a fresh run there that differs too means the
 * result depends on the thread count, else on what the state kept. 1 when
 * they pass, else out failed. */
static int across_calls(const bp_abi_kernel *k, const vc_case *c, const vc_check_options *o,
                        double fp32_tol, double *const *start, const vals *in_b,
                        const vals *in_c, const vals *got_b, const vals *got_c,
                        const char *session_why, vc_outcome *out) {
  if (session_why[0]) {
    fail_long(out, "on the first run's buffers and state, with new inputs", session_why);
    return 0;
  }
  char why[320], stage[240];
  const int first = o->threads->count;
  /* check 11's counts for these two runs: 1 (2 when the first run had 1)
   * and more threads than cores (twice the cores, else 4 or 3), so every
   * case runs at 1 and above the cores at no extra cost */
  const int cores = bp_threads_share(1);
  int counts[2] = {first == 1 ? 2 : 1, 0};
  const int above[3] = {2 * cores, 4, 3};
  for (int i = 0; i < 3 && !counts[1]; i++)
    if (above[i] != first && above[i] != counts[0]) counts[1] = above[i];
  const vals *ins[2] = {in_b, in_c}, *gots[2] = {got_b, got_c};
  vals fresh, again;
  int ok = vals_alloc(&fresh, c->out, c->num_outputs) == 0 &&
           vals_alloc(&again, c->out, c->num_outputs) == 0;
  if (!ok) fail(out, "", "out of memory");
  for (int r = 0; r < 2 && ok; r++) {
    vc_check_options to = *o;
    to.threads = threads_of(o, counts[r]);
    const int n = to.threads->count;
    run_spec fs = {k, c, 0, ins[r]->v, start, -1, &to, NULL, 0, NULL};
    snprintf(stage, sizeof stage,
             "with %d thread%s (the first run had %d; a result that depends on the thread "
             "count: a race between threads or a chunking error)",
             n, n == 1 ? "" : "s", first);
    if (run_once(&fs, fresh.v, why, sizeof why) != RUN_OK) {
      fail_long(out, stage, why);
      ok = 0;
      break;
    }
    double err, tol;
    if (compare(c, fp32_tol, gots[r]->v, fresh.v, &err, &tol, why, sizeof why)) continue;
    /* which one: the same inputs afresh at the first run's count */
    run_spec as = {k, c, 0, ins[r]->v, start, -1, o, NULL, 0, NULL};
    if (run_once(&as, again.v, why, sizeof why) != RUN_OK) {
      fail_long(out, "a fresh run at the first run's thread count", why);
      ok = 0;
      break;
    }
    if (compare(c, fp32_tol, gots[r]->v, again.v, &err, &tol, why, sizeof why)) {
      /* the later run equals a fresh one at its count: the count matters */
      (void)compare(c, fp32_tol, fresh.v, again.v, &err, &tol, why, sizeof why);
      fail_long(out, stage, why);
    } else if (r == 0) {
      fail_long(out,
                "output did not follow new inputs with the same params_generation (the kernel "
                "caches state derived from its data inputs; the generation covers parameters "
                "only)",
                why);
    } else {
      fail_long(out,
                "output did not follow new parameters after a params_generation bump (what the "
                "kernel derives from parameters must be rebuilt when the generation changes)",
                why);
    }
    note_error(out, err, tol);
    ok = 0;
  }
  /* the sweep's other counts (1, 2, 3, 4 and twice the cores, less the
   * three above): fresh runs on the third run's inputs, each against what
   * the kernel gave there, on one case in SWEEP_EVERY (picked by the
   * case's seed): each count still meets every kernel on several cases,
   * for a quarter of the runs */
  const int sweep_here = case_seed(o->seed ^ 0x5851f42d4c957f2dull, c) % SWEEP_EVERY == 0;
  for (int s = 0; ok && sweep_here && s < o->sweep_count; s++) {
    const int n = o->sweep[s]->count;
    if (n == first || n == counts[0] || n == counts[1]) continue;
    vc_check_options to = *o;
    to.threads = o->sweep[s];
    run_spec fs = {k, c, 0, in_c->v, start, -1, &to, NULL, 0, NULL};
    snprintf(stage, sizeof stage,
             "with %d thread%s (the first run had %d; a result that depends on the thread "
             "count: a race between threads or a chunking error)",
             n, n == 1 ? "" : "s", first);
    double err, tol;
    if (run_once(&fs, fresh.v, why, sizeof why) != RUN_OK) {
      fail_long(out, stage, why);
      ok = 0;
    } else if (!compare(c, fp32_tol, got_c->v, fresh.v, &err, &tol, why, sizeof why)) {
      fail_long(out, stage, why);
      note_error(out, err, tol);
      ok = 0;
    }
  }
  vals_free(&fresh);
  vals_free(&again);
  return ok;
}

void vc_check(const bp_abi_kernel *k, const bp_abi_kernel *ref, const vc_case *c,
              const vc_check_options *o, vc_outcome *out) {
  out->verdict = BP_VALIDATE_PASS;
  out->error = out->tolerance = NAN;
  out->detail[0] = '\0';
  char why[320];
  if (c->collective) {
    out->verdict = BP_VALIDATE_SKIP;
    snprintf(out->detail, sizeof out->detail, "collective: needs every rank");
    return;
  }
  if (!k->run) {
    fail(out, "", "the kernel has no run()");
    return;
  }
  if (!supports(k, c, why, sizeof why)) {
    out->verdict = BP_VALIDATE_SKIP;
    snprintf(out->detail, sizeof out->detail, "unsupported: %.280s", why);
    return;
  }
  /* the oracle's case: FP16 layer tensors as FP32 tensors of the same
   * layout holding the same (FP16) values, a zero skip input dropped; the
   * reference kernel is checked against itself only on the very case */
  vc_case oracle;
  const vc_case *refc = vc_case_oracle(c, &oracle) ? &oracle : c;
  /* the oracle runs on host buffers when it is a cpu kernel (a kernel
   * without a reference is its own oracle, on its own device) */
  vc_check_options on_host = *o;
  on_host.device = NULL;
  const vc_check_options *ro = o->device && strcmp(ref->device, "cpu") == 0 ? &on_host : o;
  const int is_ref = k == ref && refc == c && ro == o;
  const double fp32_tol = vc_impl_fp32_tolerance(k->impl, o->no_tf32);
  if (!is_ref && !supports(ref, refc, why, sizeof why)) {
    out->verdict = BP_VALIDATE_SKIP;
    snprintf(out->detail, sizeof out->detail, "the reference refuses the case: %.260s", why);
    return;
  }
  vals in, prior, accp, ref0, got, p2, ref_acc, got_acc, in_b, in_c, got_b, got_c;
  int ok = vals_alloc(&in_b, c->in, c->num_inputs) == 0 &&
           vals_alloc(&in_c, c->in, c->num_inputs) == 0 &&
           vals_alloc(&got_b, c->out, c->num_outputs) == 0 &&
           vals_alloc(&got_c, c->out, c->num_outputs) == 0 &&
           vals_alloc(&in, c->in, c->num_inputs) == 0 &&
           vals_alloc(&prior, c->out, c->num_outputs) == 0 &&
           vals_alloc(&accp, c->out, c->num_outputs) == 0 &&
           vals_alloc(&ref0, c->out, c->num_outputs) == 0 &&
           vals_alloc(&got, c->out, c->num_outputs) == 0 &&
           vals_alloc(&p2, c->out, c->num_outputs) == 0 &&
           vals_alloc(&ref_acc, c->out, c->num_outputs) == 0 &&
           vals_alloc(&got_acc, c->out, c->num_outputs) == 0;
  if (!ok) {
    fail(out, "", "out of memory");
    goto done;
  }
  uint64_t rng = case_seed(o->seed, c);
  for (int i = 0; i < c->num_inputs; i++) vc_fill_values(c, &c->in[i], &rng, in.v[i]);
  double *start[VC_MAX] = {0}; /* rmw outputs start from data, the others poisoned */
  for (int i = 0; i < c->num_outputs; i++)
    if (c->rmw[i] && c->alias[i] < 0) {
      vc_fill_values(c, &c->out[i], &rng, prior.v[i]);
      start[i] = prior.v[i];
    }

  /* 10: the kernel's first run goes on with new inputs on its buffers and
   * state (B: new data, the same generation; C: every input new, the
   * generation bumped); they are compared once every other check passed */
  later_inputs(c, o->seed, &in, &in_b, &in_c);
  const vc_rerun later[2] = {{in_b.v, 1, got_b.v}, {in_c.v, 2, got_c.v}};
  int failed_run = -1;
  char session_why[320] = "";

  /* 1-4: the reference, then the kernel, on the same inputs */
  run_spec rs = {ref, refc, 0, in.v, start, -1, ro, is_ref ? later : NULL, is_ref ? 2 : 0,
                 &failed_run};
  int rc = run_once(&rs, ref0.v, why, sizeof why);
  if (rc != RUN_OK && is_ref && failed_run > 0) { /* the first run passed */
    snprintf(session_why, sizeof session_why, "%s", why);
    rc = RUN_OK;
  }
  if (rc != RUN_OK) {
    fail(out, is_ref ? "" : "the reference", why);
    goto done;
  }
  if (!is_ref) {
    run_spec ks = {k, c, 0, in.v, start, -1, o, later, 2, &failed_run};
    rc = run_once(&ks, got.v, why, sizeof why);
    if (rc != RUN_OK && failed_run > 0) {
      snprintf(session_why, sizeof session_why, "%s", why);
      rc = RUN_OK;
    }
    if (rc == RUN_FAILED) {
      fail(out, "supports() accepted the case but", why);
      goto done;
    }
    if (rc != RUN_OK) {
      fail(out, "", why);
      goto done;
    }
    if (!kept_when_skipped(out, c, &in, start, &got)) goto done;
    if (!agrees(out, "differs from the reference", c, fp32_tol, got.v, ref0.v, why, sizeof why))
      goto done;
  } else {
    for (int i = 0; i < c->num_outputs; i++)
      memcpy(got.v[i], ref0.v[i], (size_t)vt_count(&c->out[i].d) * sizeof(double));
    if (!kept_when_skipped(out, c, &in, start, &got)) goto done;
    double rtol;
    note_error(out, 0, c->num_outputs ? out_tolerance(c, 0, fp32_tol, &rtol) : NAN);
  }

  /* 7: the same bits twice */
  if (k->flags & BP_ABI_KERNEL_DETERMINISTIC) {
    run_spec ks = {k, c, 0, in.v, start, -1, o, NULL, 0, NULL};
    rc = run_once(&ks, p2.v, why, sizeof why);
    if (rc != RUN_OK) {
      fail(out, "second run", why);
      goto done;
    }
    for (int i = 0; i < c->num_outputs; i++)
      for (int64_t e = 0; e < vt_count(&c->out[i].d); e++)
        if (memcmp(&p2.v[i][e], &got.v[i][e], sizeof(double)) != 0) {
          char name[64];
          snprintf(name, sizeof name, "%" PRId64, e);
          snprintf(why, sizeof why,
                   "flagged DETERMINISTIC, but element %s of output %d differs between two runs "
                   "(%.9g, then %.9g)",
                   name, i, got.v[i][e], p2.v[i][e]);
          fail(out, "", why);
          goto done;
        }
  }

  /* 5: accumulate = 1 adds into random prior contents */
  if (c->accumulate_offset >= 0) {
    double *acc_start[VC_MAX] = {0};
    for (int i = 0; i < c->num_outputs; i++) {
      if (c->alias[i] >= 0) continue;
      vc_tensor t = c->out[i];
      t.fill = VC_FILL_UNIFORM;
      t.lo = -1;
      t.hi = 1;
      vc_fill_values(c, &t, &rng, accp.v[i]);
      acc_start[i] = accp.v[i];
    }
    run_spec ks = {k, c, 1, in.v, acc_start, -1, o, NULL, 0, NULL};
    rc = run_once(&ks, got_acc.v, why, sizeof why);
    if (rc != RUN_OK) {
      fail(out, "accumulate=1", why);
      goto done;
    }
    if (is_ref) { /* the oracle against itself: out(1) = prior + out(0) */
      for (int i = 0; i < c->num_outputs; i++)
        for (int64_t e = 0; e < vt_count(&c->out[i].d); e++)
          ref_acc.v[i][e] = (acc_start[i] ? acc_start[i][e] : 0) + ref0.v[i][e];
    } else {
      run_spec r1 = {ref, refc, 1, in.v, acc_start, -1, ro, NULL, 0, NULL};
      rc = run_once(&r1, ref_acc.v, why, sizeof why);
      if (rc != RUN_OK) {
        fail(out, "accumulate=1: the reference", why);
        goto done;
      }
    }
    if (!agrees(out, "accumulate=1 (out += result) is wrong", c, fp32_tol, got_acc.v, ref_acc.v,
                why, sizeof why))
      goto done;
  }

  /* 6: in place, when the kernel says it may */
  if ((k->flags & BP_ABI_KERNEL_IN_PLACE) && c->inplace_in >= 0 && c->num_outputs > 0 &&
      c->alias[0] < 0) {
    char stage[64];
    snprintf(stage, sizeof stage, "in place (output 0 = input %d)", c->inplace_in);
    run_spec ks = {k, c, 0, in.v, start, c->inplace_in, o, NULL, 0, NULL};
    rc = run_once(&ks, p2.v, why, sizeof why);
    if (rc != RUN_OK) {
      fail(out, stage, why);
      goto done;
    }
    if (!agrees(out, stage, c, fp32_tol, p2.v, ref0.v, why, sizeof why)) goto done;
  }

  /* 10, 11: new inputs on the same buffers and state, other thread counts */
  (void)across_calls(k, c, o, fp32_tol, start, &in_b, &in_c, &got_b, &got_c, session_why, out);
done:
  vals_free(&in_b);
  vals_free(&in_c);
  vals_free(&got_b);
  vals_free(&got_c);
  vals_free(&in);
  vals_free(&prior);
  vals_free(&accp);
  vals_free(&ref0);
  vals_free(&got);
  vals_free(&p2);
  vals_free(&ref_acc);
  vals_free(&got_acc);
}

/* c with every tensor of dtype `from` made `to` (same shape and padded_c,
 * slot by the plan's rule); 0 when c has none. */
static int retype(const vc_case *c, int32_t from, int32_t to, vc_case *out) {
  *out = *c;
  int any = 0;
  for (int side = 0; side < 2; side++) {
    const int n = side ? c->num_outputs : c->num_inputs;
    for (int i = 0; i < n; i++) {
      vc_tensor *t = side ? &out->out[i] : &out->in[i];
      if (t->d.dtype != from) continue;
      const int span = t->d.slot_bytes == (uint64_t)vt_count(&t->d) * vt_elem_size(from);
      t->d = span ? vc_span_desc(to, t->d.shape[3])
                  : vc_tensor_desc(to, t->d.shape[0], t->d.shape[1], t->d.shape[2], t->d.shape[3],
                                   t->d.padded_c);
      any = 1;
    }
  }
  return any;
}

int vc_case_widen(const vc_case *c, vc_case *out) {
  return retype(c, BP_ABI_DTYPE_FP16, BP_ABI_DTYPE_FP32, out);
}

int vc_case_from_args(const char *op, const bp_abi_kernel_args *args, vc_case *c) {
  vc_case_init(c, op);
  snprintf(c->name, sizeof c->name, "the node's shapes");
  if (args->num_inputs < 0 || args->num_inputs > VC_MAX || args->num_outputs < 0 ||
      args->num_outputs > VC_MAX || args->attr_size > sizeof c->attrs ||
      (args->attr_size && !args->attrs))
    return -1;
  c->num_inputs = args->num_inputs;
  c->num_outputs = args->num_outputs;
  /* arrays of ABI structs step by the first element's struct_size (rule 6) */
  const size_t in_step = args->num_inputs ? args->inputs[0].struct_size : 0;
  const size_t out_step = args->num_outputs ? args->outputs[0].struct_size : 0;
  for (int i = 0; i < c->num_inputs; i++) {
    const bp_abi_tensor *t = (const bp_abi_tensor *)((const char *)args->inputs + i * in_step);
    memcpy(&c->in[i].d, t, t->struct_size < sizeof c->in[i].d ? t->struct_size : sizeof c->in[i].d);
    c->in[i].d.struct_size = sizeof c->in[i].d;
  }
  for (int o = 0; o < c->num_outputs; o++) {
    const bp_abi_tensor *t = (const bp_abi_tensor *)((const char *)args->outputs + o * out_step);
    memcpy(&c->out[o].d, t,
           t->struct_size < sizeof c->out[o].d ? t->struct_size : sizeof c->out[o].d);
    c->out[o].d.struct_size = sizeof c->out[o].d;
    for (int i = 0; args->input_ptrs && args->output_ptrs && i < c->num_inputs; i++)
      if (args->output_ptrs[o] && args->output_ptrs[o] == args->input_ptrs[i]) c->alias[o] = i;
  }
  if (args->attr_size) memcpy(c->attrs, args->attrs, args->attr_size);
  c->attr_size = args->attr_size;
  vc_op_complete(c);
  return 0;
}

int vc_run_values(const bp_abi_kernel *k, const vc_case *c, int accumulate, double *const *in,
                  double *const *prior, double **got, const vc_check_options *o, char *why,
                  size_t why_size) {
  run_spec s = {k, c, accumulate, in, prior, -1, o, NULL, 0, NULL};
  return run_once(&s, got, why, why_size) == RUN_OK ? 0 : -1;
}
