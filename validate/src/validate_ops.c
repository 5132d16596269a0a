/* A case completed from the op table (blueprint/op_table.h): the value
 * ranges its inputs must hold (labels below the class count, positive
 * variances, a valid maxpool mask), the outputs it reads before writing
 * (optimizer state, accumulating loss), the outputs it updates in place,
 * where its accumulate flag lives, which input an IN_PLACE kernel's output
 * may be, its FP16 tolerance and its AMP twin. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/op_table.h"
#include "validate-impl.h"

static void set_fill(vc_tensor *t, vc_fill fill, double lo, double hi) {
  if (t->fill != VC_FILL_UNSET) return; /* the case decided */
  t->fill = fill;
  t->lo = lo;
  t->hi = hi;
}

static int starts(const char *op, const char *p) { return strncmp(op, p, strlen(p)) == 0; }

/* An output read before written, filled like a parameter. */
static void rmw(vc_case *c, int o, vc_fill fill, double lo, double hi) {
  if (o >= c->num_outputs) return;
  c->rmw[o] = 1;
  set_fill(&c->out[o], fill, lo, hi);
}

static vc_fill fill_of(bp_op_fill_kind kind) {
  switch (kind) {
  case BP_OP_FILL_INT:
  case BP_OP_FILL_CLASS: return VC_FILL_INT;
  case BP_OP_FILL_CONST: return VC_FILL_CONST;
  case BP_OP_FILL_POOL_MASK: return VC_FILL_POOL_MASK;
  case BP_OP_FILL_SEGMENTS: return VC_FILL_SEGMENTS;
  case BP_OP_FILL_RELU_Y: return VC_FILL_RELU_Y;
  default: return VC_FILL_UNIFORM;
  }
}

/* The op table's fills of the tensors the case has. */
static void table_fills(vc_case *c, const bp_op_info *info) {
  for (int f = 0; f < BP_OP_MAX_FILLS && info->fills[f].kind != BP_OP_FILL_NONE; f++) {
    const bp_op_fill *r = &info->fills[f];
    const vc_fill fill = fill_of((bp_op_fill_kind)r->kind);
    double lo = r->lo, hi = r->hi;
    if (r->kind == BP_OP_FILL_CLASS) { /* a label below the class count */
      lo = 0;
      hi = (double)c->in[0].d.shape[3] - 1;
    }
    if (r->output) {
      if (r->rmw) rmw(c, r->index, fill, lo, hi);
      else if (r->index < c->num_outputs) set_fill(&c->out[r->index], fill, lo, hi);
    } else if (r->index < c->num_inputs) {
      set_fill(&c->in[r->index], fill, lo, hi);
    }
  }
}

void vc_op_complete(vc_case *c) {
  const bp_op_info *info = bp_op_find(c->op);
  c->accumulate_offset = -1;
  c->inplace_in = -1;
  c->skip_in = -1;
  c->collective = info && info->collective;
  c->param_in = 0;
  if (info) {
    if (info->accumulates && info->accumulate_offset + 4 <= c->attr_size)
      c->accumulate_offset = (int)info->accumulate_offset; /* else too short to hold it */
    if (info->has_inplace) c->inplace_in = info->inplace_in;
    /* parameters: weights, biases, batch norm's gamma and beta, and the
     * running statistics an evaluating batch norm reads (bp_abi.h counts
     * them: only a training step changes them, and bumps the generation) */
    c->param_in = info->amp_param_in;
    if (strcmp(c->op, "batchnorm.fwd_eval") == 0) c->param_in |= (1u << 3) | (1u << 4);
    for (int o = 0; o < c->num_outputs; o++)
      if (info->alias_outputs & (1u << o)) c->alias[o] = o;
    table_fills(c, info);

    /* (1.5) the skip input; when it skips, every output is data to keep */
    int32_t has_skip = 0;
    if (info->has_skip && info->skip_flag_offset + 4 <= c->attr_size)
      memcpy(&has_skip, c->attrs + info->skip_flag_offset, 4);
    const int at = info->skip_in;
    if (has_skip && c->num_inputs == at + 1) {
      c->skip_in = at;
      set_fill(&c->in[at], VC_FILL_CONST, 0, 0);
      if (c->in[at].fill == VC_FILL_CONST && c->in[at].lo != 0)
        for (int o = 0; o < c->num_outputs; o++) rmw(c, o, VC_FILL_UNIFORM, -1, 1);
    }
  }

  /* everything left open: uniform data, integers in a small range */
  for (int side = 0; side < 2; side++) {
    const int n = side ? c->num_outputs : c->num_inputs;
    for (int i = 0; i < n; i++) {
      vc_tensor *t = side ? &c->out[i] : &c->in[i];
      const int integer = t->d.dtype == BP_ABI_DTYPE_INT8 || t->d.dtype == BP_ABI_DTYPE_INT32;
      if (integer) set_fill(t, VC_FILL_INT, -100, 100);
      else set_fill(t, VC_FILL_UNIFORM, -1, 1);
    }
  }
  for (int o = 0; o < c->num_outputs; o++)
    if (c->alias[o] >= c->num_inputs) c->alias[o] = -1;
}

double vc_impl_fp32_tolerance(const char *impl, int no_tf32) {
  /* TF32 keeps 10 mantissa bits: inputs rounded to 2^-11, products to
   * about 1e-3 relative (docs/validate.md) */
  if ((starts(impl, "cudnn") || starts(impl, "cublas")) && !no_tf32) return VC_TF32_TOLERANCE;
  return vc_tolerance(BP_ABI_DTYPE_FP32);
}

void vc_op_fp16_tolerance(const char *op, double *rtol, double *atol) {
  const bp_op_info *info = bp_op_find(op);
  *rtol = 0x1p-11; /* one rounding to nearest FP16 of the FP32 result */
  switch (info ? info->fp16_tolerance : BP_OP_TOL_LONG_SUM) { /* a module's op: a long sum */
  case BP_OP_TOL_EXACT: *rtol = *atol = 0; break;
  case BP_OP_TOL_SELECT: *atol = 1e-5; break;
  case BP_OP_TOL_REDUCTION: *atol = 1e-4; break;
  case BP_OP_TOL_WINDOW: *atol = 1e-3; break; /* XNNPACK's FP16 global pool sums in FP16 */
  default: *atol = 1e-2; break; /* XNNPACK's FP16 GEMMs accumulate in FP16 */
  }
}

/* ---- AMP twins ------------------------------------------------------------------- */

static int bit(uint8_t mask, int i) { return (mask >> i) & 1; }

int vc_case_amp(const vc_case *c, vc_case *out) {
  static const bp_op_info module_op; /* a module's op: every tensor follows the features */
  const bp_op_info *info = bp_op_find(c->op);
  if (!info) info = &module_op;
  if (info->amp_none || c->collective) return 0;
  *out = *c;
  int any = 0;
  for (int side = 0; side < 2; side++) {
    const int n = side ? c->num_outputs : c->num_inputs;
    for (int i = 0; i < n; i++) {
      vc_tensor *t = side ? &out->out[i] : &out->in[i];
      if (t->d.dtype != BP_ABI_DTYPE_FP32 || bit(side ? info->amp_fp32_out : info->amp_fp32_in, i))
        continue;
      const int64_t ch = t->d.shape[3];
      /* a compact input stands for the model's input, padded to 4; a
       * padded one for a feature, padded to 8 like every other */
      const int64_t align = !side && bit(info->amp_first_in, i) && t->d.padded_c == ch ? 4 : 8;
      const int64_t pad = bit(side ? info->amp_param_out : info->amp_param_in, i)
                              ? t->d.padded_c
                              : (ch + align - 1) / align * align;
      t->d = vc_tensor_desc(BP_ABI_DTYPE_FP16, t->d.shape[0], t->d.shape[1], t->d.shape[2], ch,
                            pad);
      any = 1;
    }
  }
  if (any) snprintf(out->name, sizeof out->name, "%.88s fp16", c->name);
  return any;
}

int vc_case_oracle(const vc_case *c, vc_case *out) {
  int changed = 0;
  *out = *c;
  /* copies and casts keep their dtypes: the oracle runs them as they are */
  const bp_op_info *info = bp_op_find(c->op);
  if (!(info && info->fp16_tolerance == BP_OP_TOL_EXACT)) changed = vc_case_widen(c, out);
  const int s = c->skip_in;
  if (s >= 0 && s == c->num_inputs - 1 && c->in[s].fill == VC_FILL_CONST && c->in[s].lo == 0) {
    memset(out->attrs + info->skip_flag_offset, 0, 4); /* skip_in >= 0: a table op */
    out->num_inputs--;
    out->skip_in = -1;
    changed = 1;
  }
  return changed;
}
