/* Gradient checks of the reference backward kernels (validate --gradcheck).
 *
 * For a forward case of the built-in table, with a random r of y's shape
 * and L(inputs) = sum r * y (over y's logical elements, in double), each
 * reference backward gives dL/dinput; central differences of the
 * reference forward give
 *   fd = (L(x + h) - L(x - h)) / ((x + h) - (x - h)),   h = 1e-2,
 * the step as rounded to the input's dtype, at up to GRAD_SAMPLES
 * elements of each differentiated input. The check passes when
 *   max |analytic - fd| / max(1, max |fd|) <= 1e-3
 * (the bound of the per-op tests, tests/ops_ref_util.h). softmax_ce has
 * no separate backward: its dlogits output (grad_scale 1) is checked
 * against differences of its loss output. Inputs are kept away from kinks:
 * relu inputs |x| >= 0.05, maxpool inputs spaced 0.03 apart in each
 * tensor so no step changes a window's argmax, batch norm inputs spread
 * evenly over [-1, 1] so no channel's variance is near eps (a batch of
 * two pixels normalizes to +-1 whatever the inputs). batchnorm_relu has
 * no row: its relu kinks sit wherever BN's outputs cross 0, which no input
 * fill keeps a step away; its backward is batchnorm.bwd on relu.bwd's
 * output, bit for bit (tests/test_fusion.c), and both are checked here. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/op_table.h"
#include "validate-impl.h"

#define GRAD_H 1e-2
#define GRAD_TOL 1e-3
#define GRAD_SAMPLES 16

/* A backward op of a family, from its op table entry (blueprint/op_table.h). */
typedef struct gbwd {
  const char *op;
  int num_inputs;
  const bp_op_grad_src *in; /* where each input comes from */
  int num_outputs;
  const uint8_t *grad_of; /* the forward input each output is the gradient of */
} gbwd;

typedef struct gfamily {
  const char *fwd;
  int num_bwd;
  gbwd bwd[2];
  int kink; /* 1 relu inputs away from 0; 2, 3 input 0 spaced 0.03 / evenly over [-1, 1] */
} gfamily;

#define MAX_FAMILIES 32
static gfamily families[MAX_FAMILIES];
static int family_count;
static pthread_once_t families_once = PTHREAD_ONCE_INIT;

/* The op table's forward ops with a gradient check, each with the
 * backward ops that name it, in table order. */
static void find_families(void) {
  int count = 0;
  const bp_op_info *t = bp_op_table(&count);
  for (int i = 0; i < count && family_count < MAX_FAMILIES; i++) {
    if (!t[i].grad_check) continue;
    gfamily *f = &families[family_count++];
    f->fwd = t[i].abi.name;
    f->kink = t[i].grad_kink;
    for (int j = 0; j < count; j++) {
      if (!t[j].grad_of || strcmp(t[j].grad_of, f->fwd) != 0 || f->num_bwd == 2) continue;
      f->bwd[f->num_bwd++] = (gbwd){t[j].abi.name, t[j].abi.num_inputs, t[j].grad_in,
                                    t[j].abi.num_outputs, t[j].grad_out};
    }
  }
}

/* A forward case of family f to differentiate: softmax_ce's with a loss
 * scale input are left out (their dlogits are the scaled gradient). */
static int grad_case(const gfamily *f, const vc_case *c) {
  return strcmp(c->op, f->fwd) == 0 && !(f->num_bwd == 0 && c->num_inputs > 2) &&
         !c->batch_sweep;
}

/* Rows of one family: its forward cases times its backward ops (1 for
 * softmax_ce). */
static int family_cases(const gfamily *f, const vc_case **first) {
  int count = 0, n = 0;
  const vc_case *all = vc_builtin_cases(&count);
  *first = NULL;
  for (int i = 0; i < count; i++)
    if (grad_case(f, &all[i])) {
      if (!*first) *first = &all[i];
      n++;
    }
  return n;
}

int vc_grad_row_count(void) {
  pthread_once(&families_once, find_families);
  int rows = 0;
  for (int f = 0; f < family_count; f++) {
    const vc_case *first;
    rows += family_cases(&families[f], &first) * (families[f].num_bwd ? families[f].num_bwd : 1);
  }
  return rows;
}

/* The family, forward case and backward op of a row. */
static void locate(int row, const gfamily **f_out, const vc_case **fc_out, int *b_out) {
  pthread_once(&families_once, find_families);
  *f_out = NULL;
  *fc_out = NULL;
  *b_out = 0;
  for (int i = 0; i < family_count; i++) {
    const vc_case *first;
    const int n = family_cases(&families[i], &first);
    const int per = families[i].num_bwd ? families[i].num_bwd : 1;
    if (row >= n * per) {
      row -= n * per;
      continue;
    }
    int count = 0, k = row / per;
    const vc_case *all = vc_builtin_cases(&count);
    for (int c = 0; c < count && !*fc_out; c++)
      if (grad_case(&families[i], &all[c]) && k-- == 0) *fc_out = &all[c];
    *f_out = &families[i];
    *b_out = row % per;
    return;
  }
}

void vc_grad_row_name(int row, const char **op_out, char *case_name, size_t case_name_size) {
  const gfamily *f;
  const vc_case *fc;
  int b;
  locate(row, &f, &fc, &b);
  *op_out = !f ? "?" : f->num_bwd ? f->bwd[b].op : f->fwd;
  snprintf(case_name, case_name_size, "gradcheck %s", fc ? fc->name : "?");
}

typedef struct gctx {
  const bp_abi_kernel *fwd;
  const vc_case *c;
  double *in[VC_MAX], *prior[VC_MAX], *y[VC_MAX], *r;
  const vc_check_options *o;
  int softmax;
} gctx;

/* L at the current inputs; NAN when the forward failed. */
static double loss(gctx *g) {
  char why[320];
  if (vc_run_values(g->fwd, g->c, 0, g->in, g->prior, g->y, g->o, why, sizeof why) != 0)
    return NAN;
  if (g->softmax) return g->y[0][0];
  double l = 0;
  for (int64_t i = 0; i < vt_count(&g->c->out[0].d); i++) l += g->r[i] * g->y[0][i];
  return l;
}

static void fail(vc_outcome *out, const char *fmt, const char *a, const char *b) {
  out->verdict = BP_VALIDATE_FAIL;
  snprintf(out->detail, sizeof out->detail, fmt, a, b);
}

/* Central differences at sampled elements of input j against grad. */
static int fd_compare(gctx *g, int j, const double *grad, uint64_t *rng, double *err_out) {
  const bp_abi_tensor *t = &g->c->in[j].d;
  const int64_t n = vt_count(t);
  const int64_t samples = n < GRAD_SAMPLES ? n : GRAD_SAMPLES;
  double scale = 1, err = 0, fd[GRAD_SAMPLES], an[GRAD_SAMPLES];
  for (int64_t s = 0; s < samples; s++) {
    const int64_t e = samples == n ? s : (int64_t)(vc_rand(rng) % (uint64_t)n);
    const double x0 = g->in[j][e];
    double hi = x0 + GRAD_H, lo = x0 - GRAD_H;
    vt_round(t->dtype, &hi, 1);
    vt_round(t->dtype, &lo, 1);
    g->in[j][e] = hi;
    const double lp = loss(g);
    g->in[j][e] = lo;
    const double lm = loss(g);
    g->in[j][e] = x0;
    if (isnan(lp) || isnan(lm)) return -1;
    fd[s] = (lp - lm) / (hi - lo);
    an[s] = grad[e];
    if (fabs(fd[s]) > scale) scale = fabs(fd[s]);
  }
  for (int64_t s = 0; s < samples; s++) {
    const double d = fabs(an[s] - fd[s]) / scale;
    if (!(d <= err)) err = d; /* NaN sticks */
  }
  *err_out = err;
  return 0;
}

static void grad_check(const bp_registry *r, const bp_abi_kernel *fk, const bp_abi_kernel *bk,
                       const gbwd *bw, int kink, const vc_case *fc, uint64_t rng_seed,
                       const vc_check_options *o, vc_outcome *out);

void vc_grad_row(const bp_registry *r, int row, const vc_check_options *o, const char **op_out,
                 char *case_name, size_t case_name_size, vc_outcome *out) {
  out->verdict = BP_VALIDATE_PASS;
  out->error = NAN;
  out->tolerance = GRAD_TOL;
  out->detail[0] = '\0';
  const gfamily *f = NULL;
  const vc_case *fc = NULL;
  int b = 0;
  locate(row, &f, &fc, &b);
  if (!f || !fc) {
    *op_out = "?";
    snprintf(case_name, case_name_size, "?");
    fail(out, "no gradient check row %s%s", "", "");
    return;
  }
  const int softmax = f->num_bwd == 0;
  const gbwd *bw = softmax ? NULL : &f->bwd[b];
  *op_out = softmax ? f->fwd : bw->op;
  snprintf(case_name, case_name_size, "gradcheck %s", fc->name);
  const bp_abi_kernel *fk = vc_reference(r, f->fwd);
  const bp_abi_kernel *bk = softmax ? NULL : vc_reference(r, bw->op);
  if (!fk || (!softmax && !bk)) {
    out->verdict = BP_VALIDATE_SKIP;
    snprintf(out->detail, sizeof out->detail, "no reference kernel for %s",
             !fk ? f->fwd : bw->op);
    return;
  }
  grad_check(r, fk, bk, bw, f->kink, fc, o->seed * 0x9e3779b97f4a7c15ull + (uint64_t)row + 1,
             o, out);
}

/* The check of backward kernel bk (NULL: softmax_ce, whose dlogits output
 * is the gradient) wired as bw says, against central differences of
 * forward kernel fk on forward case fc; rng_seed: the stream of the
 * inputs and the samples. */
static void grad_check(const bp_registry *r, const bp_abi_kernel *fk, const bp_abi_kernel *bk,
                       const gbwd *bw, int kink, const vc_case *fc, uint64_t rng_seed,
                       const vc_check_options *o, vc_outcome *out) {
  const int softmax = bk == NULL;
  gctx g;
  memset(&g, 0, sizeof g);
  g.c = fc;
  g.o = o;
  g.softmax = softmax;
  g.fwd = fk;
  vc_case fcase = *fc; /* softmax: grad_scale 1, so dlogits = dL/dlogits */
  if (softmax) {
    bp_softmax_ce_attrs a;
    memcpy(&a, fcase.attrs, sizeof a);
    a.grad_scale = 1.0f;
    memcpy(fcase.attrs, &a, sizeof a);
  }
  g.c = &fcase;
  vc_case bc;
  memset(&bc, 0, sizeof bc);
  double *bin[VC_MAX] = {0}, *bout[VC_MAX] = {0};
  uint64_t rng = rng_seed;
  int ok = 1;
  for (int i = 0; i < fcase.num_inputs && ok; i++) {
    const int64_t n = vt_count(&fcase.in[i].d);
    ok = (g.in[i] = calloc((size_t)n, sizeof(double))) != NULL;
    if (!ok) break;
    vc_tensor t = fcase.in[i];
    if (kink == 1) {
      t.fill = VC_FILL_AWAY;
      t.lo = 0.05;
      t.hi = 1;
    }
    vc_fill_values(&fcase, &t, &rng, g.in[i]);
    if (kink >= 2 && i == 0) { /* distinct values, shuffled */
      const double step = kink == 2 ? 0.03 : 2.0 / (double)n;
      for (int64_t e = 0; e < n; e++) g.in[i][e] = -1 + step * (double)e;
      for (int64_t e = n - 1; e > 0; e--) {
        const int64_t s = (int64_t)(vc_rand(&rng) % (uint64_t)(e + 1));
        const double tmp = g.in[i][e];
        g.in[i][e] = g.in[i][s];
        g.in[i][s] = tmp;
      }
    }
  }
  for (int o2 = 0; o2 < fcase.num_outputs && ok; o2++) {
    const int64_t n = vt_count(&fcase.out[o2].d);
    ok = (g.y[o2] = calloc((size_t)n, sizeof(double))) != NULL &&
         (g.prior[o2] = fcase.rmw[o2] ? calloc((size_t)n, sizeof(double)) : NULL,
          !fcase.rmw[o2] || g.prior[o2]);
  }
  const int64_t ny = vt_count(&fcase.out[0].d);
  if (ok) ok = (g.r = malloc((size_t)ny * sizeof(double))) != NULL;
  if (!ok) {
    fail(out, "out of memory%s%s", "", "");
    goto done;
  }
  for (int64_t e = 0; e < ny; e++) g.r[e] = 2 * vc_rand_unit(&rng) - 1;
  vt_round(fcase.out[0].d.dtype, g.r, ny);
  if (isnan(loss(&g))) {
    fail(out, "the forward kernel %s/%s failed on the case", fk->op, fk->impl);
    goto done;
  }
  double *grad[VC_MAX] = {0};
  int grad_in[VC_MAX], ngrad = 0;
  char why[320];
  if (softmax) {
    grad[0] = g.y[2];
    grad_in[0] = 0;
    ngrad = 1;
  } else {
    /* the backward case: descriptors from the forward one */
    vc_case_init(&bc, bw->op);
    snprintf(bc.name, sizeof bc.name, "%s", fcase.name);
    bc.num_inputs = bw->num_inputs;
    for (int k = 0; k < bw->num_inputs; k++) {
      const bp_op_grad_src s = bw->in[k];
      bc.in[k].d = s.of == 'x' ? fcase.in[s.index].d : fcase.out[s.index].d;
      bin[k] = s.of == 'x' ? g.in[s.index] : s.of == 'y' ? g.y[s.index] : g.r;
    }
    for (int k = 0; k < bw->num_outputs; k++) {
      if (bw->grad_of[k] >= fcase.num_inputs) break; /* no bias */
      bc.out[k].d = fcase.in[bw->grad_of[k]].d;
      bc.num_outputs++;
      ok = ok && (bout[k] = calloc((size_t)vt_count(&bc.out[k].d), sizeof(double))) != NULL;
    }
    memcpy(bc.attrs, fcase.attrs, sizeof bc.attrs);
    bc.attr_size = fcase.attr_size;
    vc_op_complete(&bc);
    vc_layer_complete(r, &bc, 0); /* a module layer's accumulate flag */
    if (bc.accumulate_offset >= 0) memset(bc.attrs + bc.accumulate_offset, 0, 4);
    if (!ok) {
      fail(out, "out of memory%s%s", "", "");
      goto done;
    }
    /* the forward's outputs at the unperturbed inputs feed the backward */
    (void)loss(&g);
    double *none[VC_MAX] = {0};
    if (vc_run_values(bk, &bc, 0, bin, none, bout, o, why, sizeof why) != 0) {
      fail(out, "the backward kernel failed: %.280s%s", why, "");
      goto done;
    }
    for (int k = 0; k < bc.num_outputs; k++) {
      grad[k] = bout[k];
      grad_in[k] = bw->grad_of[k];
    }
    ngrad = bc.num_outputs;
  }
  double *grads[VC_MAX] = {0}; /* copies: loss() rewrites g.y */
  for (int k = 0; k < ngrad; k++) {
    const int64_t n = vt_count(&fcase.in[grad_in[k]].d);
    grads[k] = malloc((size_t)n * sizeof(double));
    if (grads[k]) memcpy(grads[k], grad[k], (size_t)n * sizeof(double));
  }
  double worst = 0;
  for (int k = 0; k < ngrad; k++) {
    double err = 0;
    if (!grads[k] || fd_compare(&g, grad_in[k], grads[k], &rng, &err) != 0) {
      fail(out, "the forward kernel failed during differences%s%s", "", "");
      break;
    }
    if (!(err <= worst)) worst = err;
    if (!(err <= GRAD_TOL) && out->verdict == BP_VALIDATE_PASS) {
      out->verdict = BP_VALIDATE_FAIL;
      snprintf(out->detail, sizeof out->detail,
               "the gradient of forward input %d differs from central differences: error %.3g > "
               "%.3g",
               grad_in[k], err, GRAD_TOL);
    }
  }
  out->error = worst;
  for (int k = 0; k < ngrad; k++) free(grads[k]);
done:
  for (int k = 0; k < VC_MAX; k++) {
    free(g.in[k]);
    free(g.y[k]);
    free(g.prior[k]);
    free(bout[k]);
  }
  free(g.r);
}

/* ---- module layers ------------------------------------------------------------------ */

/* A layer type's backward op: its forward inputs x0 [, x1], the forward's
 * y, the cotangent dy, the saved tensors; dx0 [, dx1] (bp_abi_layer). */
static gbwd layer_wiring(const bp_registered_layer *l, bp_op_grad_src *in, uint8_t *grad_of) {
  const int n = l->layer.num_inputs == 2 ? 2 : 1; /* bp_abi_layer: 1 or 2 */
  const int saved = l->layer.num_saved > 0 && l->layer.num_saved <= BP_ABI_LAYER_SAVED_MAX
                        ? l->layer.num_saved
                        : 0;
  int k = 0;
  for (int i = 0; i < n; i++) in[k++] = (bp_op_grad_src){'x', (uint8_t)i};
  in[k++] = (bp_op_grad_src){'y', 0};
  in[k++] = (bp_op_grad_src){'r', 0};
  for (int i = 0; i < saved; i++) in[k++] = (bp_op_grad_src){'y', (uint8_t)(1 + i)};
  for (int i = 0; i < n; i++) grad_of[i] = (uint8_t)i;
  return (gbwd){l->layer.backward_op, k, in, n, grad_of};
}

/* The kernel whose differences are the truth: the op's reference kernel,
 * else its first cpu kernel that takes FP32. */
static const bp_abi_kernel *truth_kernel(const bp_registry *r, const char *op) {
  const bp_abi_kernel *k = vc_reference(r, op);
  for (int i = 0; !k && i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *c = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(c->op, op) == 0 && strcmp(c->device, "cpu") == 0 &&
        (c->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)))
      k = c;
  }
  return k;
}

static int add_module_row(vc_module_grad **rows, int *count, int *cap, const vc_module_grad *x) {
  if (*count == *cap) {
    const int grown_cap = *cap ? 2 * *cap : 16;
    vc_module_grad *grown = realloc(*rows, (size_t)grown_cap * sizeof *grown);
    if (!grown) return -1;
    *rows = grown;
    *cap = grown_cap;
  }
  (*rows)[(*count)++] = *x;
  return 0;
}

/* A row that says why op has no gradient check. */
static int skip_row(vc_module_grad **rows, int *count, int *cap, const char *op,
                    const char *fmt, const char *a) {
  vc_module_grad x;
  memset(&x, 0, sizeof x);
  x.op = op;
  x.impl = "-";
  x.device = "cpu";
  snprintf(x.c.name, sizeof x.c.name, "gradcheck");
  snprintf(x.why, sizeof x.why, fmt, a);
  return add_module_row(rows, count, cap, &x);
}

bp_status vc_module_grad_rows(const bp_registry *r, vc_module_grad **rows_out, int *count_out) {
  vc_module_grad *rows = NULL;
  int count = 0, cap = 0, bad = 0;
  for (int i = 0; i < bp_registry_op_count(r) && !bad; i++) {
    const char *op = bp_registry_op(r, i)->name;
    if (bp_op_find(op)) continue; /* built-in: the rows above */
    const bp_registered_layer *as_bwd = NULL, *as_fwd = NULL, *fwd_with_bwd = NULL;
    for (int j = 0; j < bp_registry_layer_count(r); j++) {
      const bp_registered_layer *l = bp_registry_layer(r, j);
      if (l->layer.backward_op && strcmp(l->layer.backward_op, op) == 0) as_bwd = l;
      if (strcmp(l->layer.forward_op, op) == 0) {
        as_fwd = l;
        if (l->layer.backward_op) fwd_with_bwd = l;
      }
    }
    if (fwd_with_bwd) continue; /* checked through its backward op's rows */
    if (as_fwd && !as_bwd) {
      bad = skip_row(&rows, &count, &cap, op,
                     "no gradient check: layer type '%s' has no backward op (no gradient flows "
                     "back through it)",
                     as_fwd->layer.type);
      continue;
    }
    if (!as_bwd) {
      bad = skip_row(&rows, &count, &cap, op,
                     "no gradient check: %s is neither the forward nor the backward op of a "
                     "layer type, so which input each output is the gradient of is unknown",
                     op);
      continue;
    }
    /* saved tensors: the forward op's outputs after y, made by the same
     * forward runs (its cases carry them, vc_infer_cases), read by the
     * backward at the unperturbed inputs */
    const bp_registered_layer *l = as_bwd;
    const bp_abi_kernel *fk = truth_kernel(r, l->layer.forward_op);
    if (!fk) {
      bad = skip_row(&rows, &count, &cap, op,
                     "no gradient check: no cpu kernel of the forward op %s (FP32) to take "
                     "differences of",
                     l->layer.forward_op);
      continue;
    }
    vc_case cases[8];
    const int n = vc_infer_cases(r, l->forward, cases, 8);
    if (n == 0) {
      bad = skip_row(&rows, &count, &cap, op,
                     "no gradient check: the forward op %s has no infer_shape, or it refuses "
                     "every case (no cases to differentiate)",
                     l->layer.forward_op);
      continue;
    }
    for (int k = 0; k < bp_registry_kernel_count(r) && !bad; k++) {
      const bp_abi_kernel *bk = &bp_registry_kernel(r, k)->kernel;
      if (strcmp(bk->op, op) != 0 || strcmp(bk->device, "cpu") != 0) continue;
      for (int c = 0; c < n && !bad; c++) {
        vc_module_grad x;
        memset(&x, 0, sizeof x);
        x.op = op;
        x.impl = bk->impl;
        x.device = bk->device;
        x.layer = l;
        x.c = cases[c];
        if (bk->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)) {
          x.bwd = bk;
          x.fwd = fk;
        } else {
          snprintf(x.why, sizeof x.why,
                   "no gradient check: the kernel takes no FP32 (differences are taken in FP32)");
        }
        bad = add_module_row(&rows, &count, &cap, &x);
      }
    }
  }
  if (bad) {
    free(rows);
    return bp_fail(BP_ERR_NOMEM, "out of memory listing the gradient checks of module ops");
  }
  *rows_out = rows;
  *count_out = count;
  return BP_OK;
}

void vc_module_grad_check(const bp_registry *r, const vc_module_grad *x,
                          const vc_check_options *o, vc_outcome *out) {
  out->verdict = BP_VALIDATE_PASS;
  out->error = NAN;
  out->tolerance = GRAD_TOL;
  out->detail[0] = '\0';
  if (!x->bwd) {
    out->verdict = BP_VALIDATE_SKIP;
    out->tolerance = NAN;
    snprintf(out->detail, sizeof out->detail, "%s", x->why);
    return;
  }
  bp_op_grad_src in[BP_OP_MAX_TENSORS + 2];
  uint8_t grad_of[2];
  const gbwd bw = layer_wiring(x->layer, in, grad_of);
  uint64_t h = o->seed * 0x9e3779b97f4a7c15ull;
  for (const char *p = x->impl; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  for (const char *p = x->c.name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  /* inputs away from 0, where relu-like module ops have their kink */
  grad_check(r, x->fwd, x->bwd, &bw, 1, &x->c, h, o, out);
}
