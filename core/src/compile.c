/* Compiling a model into a MemoryPlan: one variant per shape configuration,
 * every tensor through the plan's semantic allocators.
 *
 * Variants, in this order (model.h states the rule): the per-rank training
 * batches of R = options->world ranks, "train" ceil(B/R), "train_small"
 * floor(B/R), "train_last" ceil(L/R), "train_last_small" floor(L/R) (B the
 * global batch, L = train_size % B; the "_small" ones only when the split
 * is uneven and they are > 0, "train_last*" only when L != 0), then "eval"
 * (eval_batch), "eval_last" (eval_size % eval_batch, only when eval_size is
 * given and the remainder is nonzero), then options->extra (any batch and
 * resolution). One rank: "train" B, "train_last" L.
 *
 * Allocation scheme. Every variant makes the same calls in the same order,
 * so a tensor has one id everywhere; only batch and resolution change the
 * feature shapes. "fx" below is FP16 under AMP, else FP32.
 *   input.a/.b  [N,H,W,C] fx        I_A / I_B  model input, double-buffered
 *   label.a/.b  [N,1,1,1] int32     I_A / I_B
 *   lr          fp32 = train lr     S_SCALAR
 *   loss_scale  fp32 = 1            S_SCALAR
 *   step        fp32 = 0            S_SCALAR   AdamW's step counter (bp_abi_ops.h:
 *                                              scalars are FP32; exact to 2^24 steps)
 * and, with the LARS optimizer, for its one node over the decayed span
 * (the S weights of conv and fc layers, graph.h):
 *   lars.segments [1,1,1,S+1] int32 T   element offsets of each weight in
 *                                        the span (written by the trainer
 *                                        from the graph's constants)
 *   lars.norms    [1,1,1,2S] fp32   T   |w| and |g| of each weight
 * then per layer, in file order, its parameters, then its features:
 *   conv        <l>.w [F,kh,kw,Cin/groups]  CONV_FIRST when it reads the
 *               model input, else CONV_DEEP; Kaiming normal (fan_in, gain
 *               sqrt 2: convs feed ReLUs or BN).
 *               <l>.b [1,1,1,F] zeros, when bias: in the FC_BIAS regions,
 *               which hold every bias-like parameter (no weight decay; the
 *               decayed span FC_WEIGHT..CONV_DEEP stays weights only).
 *   batchnorm   <l>.bias [1,1,1,C] zeros (BN_BIAS), <l>.weight ones
 *               (BN_WEIGHT); <l>.running_mean/var (B);
 *               <l>.save_mean, <l>.save_invstd [1,1,1,C] FP32 features
 *               (what backward needs from the forward batch statistics).
 *   maxpool     <l>.mask INT8 of the output shape (S_MASK): the argmax.
 *   fc          <l>.w [U,1,1,H*W*C] (FC_WEIGHT), Kaiming normal as for conv
 *               (one rule for every weight; the logits layer included);
 *               <l>.b [1,1,1,U] zeros (FC_BIAS) when bias.
 *   all but softmax_ce: <l>.out and <l>.dout of the output shape, fx (F32
 *               or F16): the feature and its gradient slot.
 *   softmax_ce  <l>.prob [N,1,1,classes] FP32 (T); results loss and
 *               correct [1,1,1,1] (R).
 * Parameter seeds are a hash of the tensor name, so editing one layer does
 * not reshuffle the initial values of the others. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model-impl.h"

typedef struct compile_ctx {
  const bp_model *model;
  const bp_compile_options *options;
  bp_plan *plan;
  const char *variant; /* name of the open variant */
  int64_t batch, height, width;
  bp_shape *shapes; /* [layer_count] output shape of each layer, this variant */
  bp_dtype fx; /* feature dtype */
} compile_ctx;

/* ---- messages ---------------------------------------------------------- */

static bp_status vfail(const compile_ctx *x, int layer, bp_status st, const char *fmt, va_list ap) {
  char where[4200], what[768];
  const bp_layer *l = layer >= 0 ? &x->model->layers[layer] : NULL;
  bp_model_where(x->model, l, where, sizeof where);
  vsnprintf(what, sizeof what, fmt, ap);
  if (l) return bp_fail(st, "%s: layer '%s' (variant '%s'): %s", where, l->name, x->variant, what);
  if (x->variant) return bp_fail(st, "%s: variant '%s': %s", where, x->variant, what);
  return bp_fail(st, "%s: %s", where, what);
}

/* Fails with "file:line:column: layer 'name' (variant 'v'): <fmt>";
 * layer -1 drops the layer part. */
static bp_status layer_fail(const compile_ctx *x, int layer, bp_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bp_status layer_fail(const compile_ctx *x, int layer, bp_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st = vfail(x, layer, st, fmt, ap);
  va_end(ap);
  return st;
}

/* Puts the model's context in front of the plan's own message. */
static bp_status plan_fail(const compile_ctx *x, int layer, bp_status st) {
  char why[768];
  snprintf(why, sizeof why, "%s", bp_last_error()); /* copied: bp_fail rewrites it */
  return layer_fail(x, layer, st, "%s", why);
}

static const char *shape_str(bp_shape s, char *buf, size_t size) {
  snprintf(buf, size, "[%lld,%lld,%lld,%lld]", (long long)s.n, (long long)s.h, (long long)s.w,
           (long long)s.c);
  return buf;
}

static const char *producer_name(const compile_ctx *x, int p) {
  return p == BP_MODEL_INPUT ? BP_MODEL_INPUT_NAME : x->model->layers[p].name;
}

/* ---- shapes ---------------------------------------------------------- */

/* One spatial extent of a sliding window: checks the kernel fits its padded
 * input and returns (in + 2*pad - extent) / stride + 1. Cannot overflow:
 * every term is at most BP_MODEL_DIM_MAX (2^31). */
static bp_status window_shape(const compile_ctx *x, int i, bp_shape in, int64_t dilation,
                              bp_shape *out) {
  const bp_layer *l = &x->model->layers[i];
  int64_t eh = dilation * (l->kernel_h - 1) + 1, ew = dilation * (l->kernel_w - 1) + 1;
  int64_t ph = in.h + 2 * l->pad, pw = in.w + 2 * l->pad;
  if (eh > ph || ew > pw)
    return layer_fail(x, i, BP_ERR_SHAPE,
                      "%lldx%lld kernel (dilation %lld) is larger than its padded input "
                      "%lldx%lld (pad %lld)",
                      (long long)l->kernel_h, (long long)l->kernel_w, (long long)dilation,
                      (long long)ph, (long long)pw, (long long)l->pad);
  out->n = in.n;
  out->h = (ph - eh) / l->stride + 1;
  out->w = (pw - ew) / l->stride + 1;
  out->c = in.c;
  if (out->h < 1 || out->w < 1) /* kept as a guard; the check above implies it */
    return layer_fail(x, i, BP_ERR_SHAPE, "output extent %lldx%lld is below 1", (long long)out->h,
                      (long long)out->w);
  return BP_OK;
}

/* Output shape of layer i in this variant, from its producers' shapes. */
static bp_status layer_shape(const compile_ctx *x, int i, bp_shape *out) {
  const bp_model *m = x->model;
  const bp_layer *l = &m->layers[i];
  bp_shape input = {x->batch, x->height, x->width, m->channels};
  bp_shape in = l->inputs[0] == BP_MODEL_INPUT ? input : x->shapes[l->inputs[0]];
  char a[96], b[96];
  switch (l->type) {
  case BP_LAYER_CONV: {
    if (in.c % l->groups || l->units % l->groups)
      return layer_fail(x, i, BP_ERR_SHAPE,
                        "groups %lld must divide both its %lld input channels and its %lld filters",
                        (long long)l->groups, (long long)in.c, (long long)l->units);
    bp_status st = window_shape(x, i, in, l->dilation, out);
    out->c = l->units;
    return st;
  }
  case BP_LAYER_MAXPOOL:
  case BP_LAYER_AVGPOOL: return window_shape(x, i, in, 1, out);
  case BP_LAYER_GLOBAL_AVGPOOL: *out = (bp_shape){in.n, 1, 1, in.c}; return BP_OK;
  case BP_LAYER_FC: {
    int64_t flat;
    if (__builtin_mul_overflow(in.h, in.w, &flat) || __builtin_mul_overflow(flat, in.c, &flat))
      return layer_fail(x, i, BP_ERR_OVERFLOW, "flattening input %s overflows 64 bits",
                        shape_str(in, a, sizeof a));
    (void)flat;
    *out = (bp_shape){in.n, 1, 1, l->units};
    return BP_OK;
  }
  case BP_LAYER_ADD: {
    bp_shape other = l->inputs[1] == BP_MODEL_INPUT ? input : x->shapes[l->inputs[1]];
    if (in.n != other.n || in.h != other.h || in.w != other.w || in.c != other.c)
      return layer_fail(x, i, BP_ERR_SHAPE, "inputs '%s' %s and '%s' %s must have the same shape",
                        producer_name(x, l->inputs[0]), shape_str(in, a, sizeof a),
                        producer_name(x, l->inputs[1]), shape_str(other, b, sizeof b));
    *out = in;
    return BP_OK;
  }
  case BP_LAYER_SOFTMAX_CE:
    if (in.h != 1 || in.w != 1 || in.c != m->classes)
      return layer_fail(x, i, BP_ERR_SHAPE,
                        "its input '%s' is %s; softmax_ce needs [N,1,1,%lld] (one score per "
                        "class; add an fc or global_avgpool layer)",
                        producer_name(x, l->inputs[0]), shape_str(in, a, sizeof a),
                        (long long)m->classes);
    *out = in;
    return BP_OK;
  case BP_LAYER_BATCHNORM:
  case BP_LAYER_RELU:
  case BP_LAYER_TYPE_COUNT: break;
  }
  *out = in;
  return BP_OK;
}

/* ---- allocation ------------------------------------------------------ */

/* FNV-1a of a tensor name: the init seed of that tensor. */
static uint64_t name_seed(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

/* "<layer>.<what>" into out. bp_model_check keeps layer names below
 * BP_LAYER_NAME_MAX, which leaves room for every suffix. */
static const char *tensor_name(char out[BP_NAME_MAX], const bp_layer *l, const char *what) {
  snprintf(out, BP_NAME_MAX, "%.*s.%s", BP_LAYER_NAME_MAX - 1, l->name, what);
  return out;
}

static bp_status param(const compile_ctx *x, int i, bp_param_kind kind, const char *what,
                       bp_shape shape, bp_init_kind rule) {
  char name[BP_NAME_MAX];
  tensor_name(name, &x->model->layers[i], what);
  bp_init init = {rule, 0.0f, 0.0f, name_seed(name)};
  bp_status st = bp_plan_alloc_param(x->plan, kind, name, shape, init, NULL);
  if (st == BP_OK) return BP_OK;
  if (st == BP_ERR_SHAPE && kind == BP_PARAM_FC_WEIGHT) {
    char why[640];
    snprintf(why, sizeof why, "%s", bp_last_error());
    return layer_fail(x, i, st,
                      "%s (an fc layer's weights follow its input's resolution; put a "
                      "global_avgpool before it to allow resolution variants)",
                      why);
  }
  return plan_fail(x, i, st);
}

static bp_status feature(const compile_ctx *x, int i, const char *what, bp_shape shape,
                         bp_dtype dtype) {
  char name[BP_NAME_MAX];
  bp_status st = bp_plan_alloc_feature(x->plan, tensor_name(name, &x->model->layers[i], what),
                                       shape, dtype, NULL);
  return st == BP_OK ? BP_OK : plan_fail(x, i, st);
}

static bp_status alloc_layer(const compile_ctx *x, int i, bp_shape out) {
  const bp_model *m = x->model;
  const bp_layer *l = &m->layers[i];
  bp_shape in = l->inputs[0] == BP_MODEL_INPUT
                    ? (bp_shape){x->batch, x->height, x->width, m->channels}
                    : x->shapes[l->inputs[0]];
  bp_shape channel = {1, 1, 1, out.c};
  char name[BP_NAME_MAX];
  bp_status st = BP_OK;
  int32_t ids[2];
  switch (l->type) {
  case BP_LAYER_CONV: {
    bp_param_kind kind = l->inputs[0] == BP_MODEL_INPUT ? BP_PARAM_CONV_FIRST : BP_PARAM_CONV_DEEP;
    bp_shape w = {l->units, l->kernel_h, l->kernel_w, in.c / l->groups};
    if ((st = param(x, i, kind, "w", w, BP_INIT_KAIMING_NORMAL)) != BP_OK) return st;
    if (l->bias && (st = param(x, i, BP_PARAM_FC_BIAS, "b", channel, BP_INIT_ZEROS)) != BP_OK)
      return st;
    break;
  }
  case BP_LAYER_BATCHNORM:
    if ((st = param(x, i, BP_PARAM_BN_BIAS, "bias", channel, BP_INIT_ZEROS)) != BP_OK ||
        (st = param(x, i, BP_PARAM_BN_WEIGHT, "weight", channel, BP_INIT_ONES)) != BP_OK)
      return st;
    if ((st = bp_plan_alloc_bn_stats(x->plan, l->name, out.c, ids)) != BP_OK)
      return plan_fail(x, i, st);
    if ((st = feature(x, i, "save_mean", channel, BP_DTYPE_FP32)) != BP_OK ||
        (st = feature(x, i, "save_invstd", channel, BP_DTYPE_FP32)) != BP_OK)
      return st;
    break;
  case BP_LAYER_MAXPOOL:
    if ((st = bp_plan_alloc_mask(x->plan, tensor_name(name, l, "mask"), out, NULL)) != BP_OK)
      return plan_fail(x, i, st);
    break;
  case BP_LAYER_FC: {
    bp_shape w = {l->units, 1, 1, in.h * in.w * in.c}; /* checked in layer_shape */
    if ((st = param(x, i, BP_PARAM_FC_WEIGHT, "w", w, BP_INIT_KAIMING_NORMAL)) != BP_OK) return st;
    if (l->bias && (st = param(x, i, BP_PARAM_FC_BIAS, "b", channel, BP_INIT_ZEROS)) != BP_OK)
      return st;
    break;
  }
  case BP_LAYER_SOFTMAX_CE:
    if ((st = bp_plan_alloc_temp(x->plan, tensor_name(name, l, "prob"), out, BP_DTYPE_FP32,
                                 NULL)) != BP_OK ||
        (st = bp_plan_alloc_result(x->plan, "loss", (bp_shape){1, 1, 1, 1}, NULL)) != BP_OK ||
        (st = bp_plan_alloc_result(x->plan, "correct", (bp_shape){1, 1, 1, 1}, NULL)) != BP_OK)
      return plan_fail(x, i, st);
    return BP_OK; /* the loss has no feature of its own */
  case BP_LAYER_RELU:
  case BP_LAYER_AVGPOOL:
  case BP_LAYER_GLOBAL_AVGPOOL:
  case BP_LAYER_ADD:
  case BP_LAYER_TYPE_COUNT: break;
  }
  if ((st = feature(x, i, "out", out, x->fx)) != BP_OK ||
      (st = feature(x, i, "dout", out, x->fx)) != BP_OK)
    return st;
  return BP_OK;
}

/* Weights in the decayed span FC_WEIGHT..CONV_DEEP: one per conv and fc. */
static int64_t decayed_weights(const bp_model *m) {
  int64_t s = 0;
  for (int i = 0; i < m->layer_count; i++)
    s += m->layers[i].type == BP_LAYER_CONV || m->layers[i].type == BP_LAYER_FC;
  return s;
}

static bp_status alloc_globals(const compile_ctx *x) {
  const bp_model *m = x->model;
  int32_t ids[2];
  bp_status st;
  const int64_t lars = x->options->plan.optimizer == BP_OPT_LARS ? decayed_weights(m) : 0;
  if (lars > 0 &&
      ((st = bp_plan_alloc_temp(x->plan, "lars.segments", (bp_shape){1, 1, 1, lars + 1},
                                BP_DTYPE_INT32, NULL)) != BP_OK ||
       (st = bp_plan_alloc_temp(x->plan, "lars.norms", (bp_shape){1, 1, 1, 2 * lars},
                                BP_DTYPE_FP32, NULL)) != BP_OK))
    return plan_fail(x, -1, st);
  if ((st = bp_plan_alloc_input(x->plan, "input",
                                (bp_shape){x->batch, x->height, x->width, m->channels}, x->fx,
                                ids)) != BP_OK ||
      (st = bp_plan_alloc_input(x->plan, "label", (bp_shape){x->batch, 1, 1, 1}, BP_DTYPE_INT32,
                                ids)) != BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "lr", BP_DTYPE_FP32,
                                 (bp_init){BP_INIT_CONSTANT, (float)m->train.lr, 0.0f, 0}, NULL)) !=
          BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "loss_scale", BP_DTYPE_FP32,
                                 (bp_init){BP_INIT_ONES, 0.0f, 0.0f, 0}, NULL)) != BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "step", BP_DTYPE_FP32,
                                 (bp_init){BP_INIT_ZEROS, 0.0f, 0.0f, 0}, NULL)) != BP_OK)
    return plan_fail(x, -1, st);
  return BP_OK;
}

static bp_status compile_variant(compile_ctx *x, const char *name, int64_t batch, int64_t height,
                                 int64_t width) {
  x->variant = name;
  x->batch = batch;
  x->height = height;
  x->width = width;
  bp_status st = bp_plan_begin_variant(x->plan, name, batch, height, width);
  if (st != BP_OK) return plan_fail(x, -1, st);
  if ((st = alloc_globals(x)) != BP_OK) return st;
  for (int i = 0; i < x->model->layer_count; i++) {
    if ((st = layer_shape(x, i, &x->shapes[i])) != BP_OK ||
        (st = alloc_layer(x, i, x->shapes[i])) != BP_OK)
      return st;
  }
  if ((st = bp_plan_end_variant(x->plan)) != BP_OK) return plan_fail(x, -1, st);
  return BP_OK;
}

/* ---- entry points ------------------------------------------------------ */

bp_compile_options bp_compile_options_from_model(const bp_model *model) {
  bp_compile_options o;
  memset(&o, 0, sizeof o);
  bp_train_settings t = model ? model->train : bp_train_defaults();
  o.plan.amp = t.amp;
  o.plan.ema = t.ema;
  o.plan.optimizer = t.optimizer;
  o.batch = t.batch;
  o.eval_batch = t.eval_batch;
  o.train_size = t.train_size;
  o.world = 1;
  return o;
}

static bp_status check_options(const compile_ctx *x) {
  const bp_compile_options *o = x->options;
  if (o->batch < 1 || o->eval_batch < 1 || o->train_size < 1)
    return layer_fail(x, -1, BP_ERR_INVALID,
                      "batch %lld, eval batch %lld and train size %lld must all be >= 1",
                      (long long)o->batch, (long long)o->eval_batch, (long long)o->train_size);
  if (o->world < 0)
    return layer_fail(x, -1, BP_ERR_INVALID, "world %d must be >= 1 (0: one rank)", o->world);
  if (o->eval_size < 0)
    return layer_fail(x, -1, BP_ERR_INVALID, "eval size %lld must be >= 0 (0: no eval_last)",
                      (long long)o->eval_size);
  if (o->extra_count < 0 || (o->extra_count > 0 && !o->extra))
    return layer_fail(x, -1, BP_ERR_INVALID, "%d extra variants given without their list",
                      o->extra_count);
  for (int k = 0; k < o->extra_count; k++) {
    const bp_variant_spec *v = &o->extra[k];
    if (strnlen(v->name, BP_NAME_MAX) == BP_NAME_MAX || v->name[0] == '\0')
      return layer_fail(x, -1, BP_ERR_INVALID, "extra variant %d has no name (or no NUL)", k);
    if (v->batch < 0 || v->height < 0 || v->width < 0)
      return layer_fail(x, -1, BP_ERR_INVALID,
                        "extra variant '%s': batch %lld and resolution %lldx%lld must be >= 1 "
                        "(or 0 for the model's)",
                        v->name, (long long)v->batch, (long long)v->height, (long long)v->width);
  }
  return BP_OK;
}

bp_status bp_model_compile(const bp_model *model, const bp_compile_options *options,
                           bp_plan **plan_out) {
  if (!model || !options || !plan_out)
    return bp_fail(BP_ERR_INVALID, "bp_model_compile: NULL argument");
  bp_status st = bp_model_check(model);
  if (st != BP_OK) return st;
  compile_ctx x;
  memset(&x, 0, sizeof x);
  x.model = model;
  x.options = options;
  x.fx = options->plan.amp ? BP_DTYPE_FP16 : BP_DTYPE_FP32;
  if ((st = check_options(&x)) != BP_OK) return st;
  if ((st = bp_plan_create(&options->plan, &x.plan)) != BP_OK) return plan_fail(&x, -1, st);
  x.shapes = calloc((size_t)model->layer_count, sizeof *x.shapes);
  if (!x.shapes) {
    bp_plan_destroy(x.plan);
    return layer_fail(&x, -1, BP_ERR_NOMEM, "out of memory");
  }

  const int64_t h = model->height, w = model->width;
  const int64_t world = options->world > 1 ? options->world : 1;
  const int64_t batch = options->batch, last = options->train_size % batch;
  /* data.h's shard rule: the first b % R ranks take b / R + 1, the others b / R */
  const int64_t small = batch / world, big = small + (batch % world != 0);
  st = compile_variant(&x, "train", big, h, w);
  if (st == BP_OK && small != big && small > 0)
    st = compile_variant(&x, "train_small", small, h, w);
  if (st == BP_OK && last != 0) {
    const int64_t last_small = last / world, last_big = last_small + (last % world != 0);
    st = compile_variant(&x, "train_last", last_big, h, w);
    if (st == BP_OK && last_small != last_big && last_small > 0)
      st = compile_variant(&x, "train_last_small", last_small, h, w);
  }
  if (st == BP_OK) st = compile_variant(&x, "eval", options->eval_batch, h, w);
  const int64_t eval_last = options->eval_size % options->eval_batch;
  if (st == BP_OK && eval_last != 0) st = compile_variant(&x, "eval_last", eval_last, h, w);
  for (int k = 0; st == BP_OK && k < options->extra_count; k++) {
    const bp_variant_spec *v = &options->extra[k];
    st = compile_variant(&x, v->name, v->batch ? v->batch : big, v->height ? v->height : h,
                         v->width ? v->width : w);
  }
  if (st == BP_OK) {
    x.variant = NULL;
    if ((st = bp_plan_finalize(x.plan)) != BP_OK) {
      char why[768];
      snprintf(why, sizeof why, "%s", bp_last_error());
      st =
          layer_fail(&x, -1, st, "the plan of model '%s' cannot be laid out: %s", model->name, why);
    }
  }
  free(x.shapes);
  if (st != BP_OK) {
    bp_plan_destroy(x.plan);
    return st;
  }
  *plan_out = x.plan;
  return BP_OK;
}
