/* Compiling a model into a MemoryPlan: one variant per shape configuration,
 * every tensor through the plan's semantic allocators. What each layer
 * type allocates is its descriptor's (layer-impl.h, core/src/layer_*.c);
 * this file runs them in order, and records every id it gets in a
 * bp_model_tensors it keeps with the plan, which the graph build reads.
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
 * and, under AMP only (a plan without AMP keeps its bytes and its hash, so
 * its old checkpoints still load), the dynamic loss scaling's state
 * (docs/amp.md; the trainer writes loss_scale and step at start):
 *   found_inf   fp32 = 0            S_SCALAR   1 when the step's gradients overflowed
 *   good_steps  fp32 = 0            S_SCALAR   clean steps since the scale changed
 *   skipped     fp32 = 0            S_SCALAR   steps skipped on overflow
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
 *   a type from an op module: <l>.out and <l>.dout, of the shape its
 *               forward op infers, and the saved tensors it declares,
 *               <l>.saved<k> (F32, S_MASK, F16 or T by dtype; layer_module.c).
 * Parameter seeds are a hash of the tensor name, so editing one layer does
 * not reshuffle the initial values of the others. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile-impl.h"
#include "fuse-impl.h"
#include "layer-impl.h"
#include "plan-impl.h"

typedef struct compile_ctx {
  const bp_model *model;
  const bp_compile_options *options;
  bp_plan *plan;
  const char *variant; /* name of the open variant */
  int64_t batch, height, width;
  bp_shape *shapes; /* [layer_count] output shape of each layer, this variant */
  bp_dtype fx; /* feature dtype */
  bp_model_tensors *record; /* the ids of every tensor, kept with the plan */
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

bp_status bp_layer_fail(const bp_layer_compile *c, bp_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st = vfail(c->impl, c->index, st, fmt, ap);
  va_end(ap);
  return st;
}

bp_status bp_layer_plan_fail(const bp_layer_compile *c, bp_status st) {
  return plan_fail(c->impl, c->index, st);
}

const char *bp_shape_str(bp_shape s, char *buf, size_t size) {
  snprintf(buf, size, "[%lld,%lld,%lld,%lld]", (long long)s.n, (long long)s.h, (long long)s.w,
           (long long)s.c);
  return buf;
}

const char *bp_layer_producer_name(const bp_model *m, int p) {
  return p == BP_MODEL_INPUT ? BP_MODEL_INPUT_NAME : m->layers[p].name;
}

/* ---- allocation ------------------------------------------------------ */

/* FNV-1a of a tensor name: the init seed of that tensor. */
static uint64_t name_seed(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

/* bp_model_check keeps layer names below BP_LAYER_NAME_MAX, which leaves
 * room for every suffix. */
const char *bp_layer_tensor_name(char *out, const bp_layer *l, const char *what) {
  snprintf(out, BP_NAME_MAX, "%.*s.%s", BP_LAYER_NAME_MAX - 1, l->name, what);
  return out;
}

bp_status bp_layer_param(const bp_layer_compile *c, bp_param_kind kind, const char *what,
                         bp_shape shape, bp_init_kind rule, bp_param_ids *ids) {
  return bp_layer_param_init(c, kind, what, shape, (bp_init){rule, 0.0f, 0.0f, 0}, ids);
}

bp_status bp_layer_param_init(const bp_layer_compile *c, bp_param_kind kind, const char *what,
                              bp_shape shape, bp_init init, bp_param_ids *ids) {
  char name[BP_NAME_MAX];
  bp_layer_tensor_name(name, c->layer, what);
  init.seed = name_seed(name);
  bp_status st = bp_plan_alloc_param(c->plan, kind, name, shape, init, ids);
  if (st == BP_OK) return BP_OK;
  if (st == BP_ERR_SHAPE && kind == BP_PARAM_FC_WEIGHT) {
    char why[640];
    snprintf(why, sizeof why, "%s", bp_last_error());
    return bp_layer_fail(c, st,
                         "%s (an fc layer's weights follow its input's resolution; put a "
                         "global_avgpool before it to allow resolution variants)",
                         why);
  }
  return bp_layer_plan_fail(c, st);
}

bp_status bp_layer_feature(const bp_layer_compile *c, const char *what, bp_shape shape,
                           bp_dtype dtype, int32_t *id) {
  char name[BP_NAME_MAX];
  bp_status st =
      bp_plan_alloc_feature(c->plan, bp_layer_tensor_name(name, c->layer, what), shape, dtype, id);
  return st == BP_OK ? BP_OK : bp_layer_plan_fail(c, st);
}

/* Shape, then tensors of layer i in this variant: the type's own, then its
 * feature and gradient slot (unless it has none). */
static bp_status compile_layer(compile_ctx *x, int i) {
  const bp_model *m = x->model;
  const bp_layer *l = &m->layers[i];
  const bp_layer_desc *d = bp_layer_desc_for(l);
  bp_layer_compile c = {
      .model = m,
      .layer = l,
      .index = i,
      .plan = x->plan,
      .variant = x->variant,
      .fx = x->fx,
      .t = &x->record->layers[i],
      .globals = &x->record->globals,
      .impl = x,
  };
  const bp_shape input = {x->batch, x->height, x->width, m->channels};
  for (int k = 0; k < l->input_count; k++)
    c.in[k] = l->inputs[k] == BP_MODEL_INPUT ? input : x->shapes[l->inputs[k]];
  bp_status st = d->shape(&c);
  if (st != BP_OK) return st;
  x->shapes[i] = c.out;
  if (d->alloc && (st = d->alloc(&c)) != BP_OK) return st;
  if (d->no_feature) return BP_OK;
  if ((st = bp_layer_feature(&c, "out", c.out, x->fx, &c.t->out)) != BP_OK ||
      (st = bp_layer_feature(&c, "dout", c.out, x->fx, &c.t->dout)) != BP_OK)
    return st;
  return BP_OK;
}

/* Weights in the decayed span FC_WEIGHT..CONV_DEEP: one per conv and fc. */
static int64_t decayed_weights(const bp_model *m) {
  int64_t s = 0;
  for (int i = 0; i < m->layer_count; i++) s += bp_layer_desc_for(&m->layers[i])->decayed_weights;
  return s;
}

static bp_status alloc_globals(const compile_ctx *x) {
  const bp_model *m = x->model;
  bp_global_tensors *g = &x->record->globals;
  bp_status st;
  const int64_t lars = x->options->plan.optimizer == BP_OPT_LARS ? decayed_weights(m) : 0;
  if (lars > 0 &&
      ((st = bp_plan_alloc_temp(x->plan, "lars.segments", (bp_shape){1, 1, 1, lars + 1},
                                BP_DTYPE_INT32, &g->lars_segments)) != BP_OK ||
       (st = bp_plan_alloc_temp(x->plan, "lars.norms", (bp_shape){1, 1, 1, 2 * lars},
                                BP_DTYPE_FP32, &g->lars_norms)) != BP_OK))
    return plan_fail(x, -1, st);
  if ((st = bp_plan_alloc_input(x->plan, "input",
                                (bp_shape){x->batch, x->height, x->width, m->channels}, x->fx,
                                g->input)) != BP_OK ||
      (st = bp_plan_alloc_input(x->plan, "label", (bp_shape){x->batch, 1, 1, 1}, BP_DTYPE_INT32,
                                g->label)) != BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "lr", BP_DTYPE_FP32,
                                 (bp_init){BP_INIT_CONSTANT, (float)m->train.lr, 0.0f, 0},
                                 &g->lr)) != BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "loss_scale", BP_DTYPE_FP32,
                                 (bp_init){BP_INIT_ONES, 0.0f, 0.0f, 0}, &g->loss_scale)) != BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "step", BP_DTYPE_FP32,
                                 (bp_init){BP_INIT_ZEROS, 0.0f, 0.0f, 0}, &g->step)) != BP_OK)
    return plan_fail(x, -1, st);
  if (!x->options->plan.amp) return BP_OK;
  const bp_init zeros = {BP_INIT_ZEROS, 0.0f, 0.0f, 0};
  if ((st = bp_plan_alloc_scalar(x->plan, "found_inf", BP_DTYPE_FP32, zeros, &g->found_inf)) !=
          BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "good_steps", BP_DTYPE_FP32, zeros, &g->good_steps)) !=
          BP_OK ||
      (st = bp_plan_alloc_scalar(x->plan, "skipped", BP_DTYPE_FP32, zeros, &g->skipped)) != BP_OK)
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
  for (int i = 0; i < x->model->layer_count; i++)
    if ((st = compile_layer(x, i)) != BP_OK) return st;
  if ((st = bp_plan_end_variant(x->plan)) != BP_OK) return plan_fail(x, -1, st);
  return BP_OK;
}

/* ---- the record of ids ------------------------------------------------- */

static void record_free(void *p) {
  bp_model_tensors *r = p;
  if (!r) return;
  free(r->layers);
  free(r->names);
  free(r->types);
  free(r);
}

/* Every id -1 (absent) until an allocation writes it; the model's layer
 * names and types, to refuse a graph of another model. */
static bp_model_tensors *record_new(const bp_model *m) {
  bp_model_tensors *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  const size_t n = (size_t)m->layer_count;
  r->layer_count = m->layer_count;
  r->layers = malloc(n * sizeof *r->layers);
  r->names = calloc(n, sizeof *r->names);
  r->types = calloc(n, sizeof *r->types);
  if (!r->layers || !r->names || !r->types) {
    record_free(r);
    return NULL;
  }
  const bp_param_ids none = {-1, -1, -1, -1, -1, -1, -1, -1};
  for (size_t i = 0; i < n; i++) {
    r->layers[i] = (bp_layer_tensors){-1, -1, none, none, {-1, -1}, {-1, -1}, -1, -1, {0}};
    for (int k = 0; k < BP_ABI_LAYER_SAVED_MAX; k++) r->layers[i].saved_by_module[k] = -1;
    memcpy(r->names[i], m->layers[i].name, BP_NAME_MAX);
    r->names[i][BP_NAME_MAX - 1] = '\0';
    r->types[i] = m->layers[i].type;
  }
  r->globals = (bp_global_tensors){{-1, -1}, {-1, -1}, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  return r;
}

/* ---- entry points ------------------------------------------------------ */

bp_status bp_compile_layout_fail(const bp_model *model, bp_status st) {
  char where[4200], why[768];
  snprintf(why, sizeof why, "%s", bp_last_error()); /* copied: bp_fail rewrites it */
  bp_model_where(model, NULL, where, sizeof where);
  return bp_fail(st, "%s: the plan of model '%s' cannot be laid out: %s", where, model->name, why);
}

bp_compile_options bp_compile_options_from_model(const bp_model *model) {
  bp_compile_options o;
  memset(&o, 0, sizeof o);
  bp_train_settings t = model ? model->train : bp_train_defaults();
  o.plan.amp = t.amp;
  o.plan.ema = t.ema;
  o.plan.optimizer = t.optimizer;
  o.fuse_bn_relu = 1; /* where allowed: bp_fuse_bn_relu_allowed */
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

bp_status bp_compile_plan(const bp_model *model, const bp_compile_options *options,
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
  x.record = record_new(model);
  if (!x.shapes || !x.record) {
    free(x.shapes);
    record_free(x.record);
    bp_plan_destroy(x.plan);
    return layer_fail(&x, -1, BP_ERR_NOMEM, "out of memory");
  }
  bp_plan_attach(x.plan, x.record, record_free); /* the plan owns it from here */
  x.record->fuse_bn_relu = options->fuse_bn_relu && !options->plan.amp;

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
    if ((st = bp_plan_finalize(x.plan)) != BP_OK) st = bp_compile_layout_fail(model, st);
  }
  free(x.shapes);
  if (st != BP_OK) {
    bp_plan_destroy(x.plan);
    return st;
  }
  *plan_out = x.plan;
  return BP_OK;
}
