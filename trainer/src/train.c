/* The trainer's life cycle (train.h): options, data, plan, graph, arenas,
 * binding, initialization and resume; checkpoints and accessors. The
 * epochs themselves are in train_loop.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/autotune.h"
#include "blueprint/kernel_checks.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "blueprint/op_table.h"
#include "checkpoint-impl.h"
#include "fuse-impl.h"
#include "model-impl.h"
#include "train-impl.h"

void bp_train_options_init(bp_train_options *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1;
  o->ranks = 1;
  o->device = "cpu";
  o->optimizer = -1;
  o->lr = o->momentum = o->weight_decay = -1.0;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->lars_eta = 0.001;
  o->schedule = -1;
  o->warmup_epochs = -1.0;
  o->step_gamma = 0.1;
  o->step_epochs = 1;
  o->amp = o->ema = -1;
  o->ema_decay = 0.999;
  o->eval_ema = -1;
}

/* ---- options ---------------------------------------------------------------- */

static int finite_in(double v, double lo, double hi) { return isfinite(v) && v >= lo && v <= hi; }

static bp_status check_options(const bp_train_options *o) {
  if (o->ranks < 1) return bp_fail(BP_ERR_INVALID, "ranks %d must be >= 1", o->ranks);
  if (o->threads < 0 || o->threads > 1024)
    return bp_fail(BP_ERR_INVALID, "threads %d must be in [1, 1024] (0: the cores' share)",
                   o->threads);
  if (o->streams < 0 || o->streams > BP_EXEC_COMPUTE_LANES)
    return bp_fail(BP_ERR_INVALID, "streams %d must be in [1, %d] (0: the default, %d)",
                   o->streams, BP_EXEC_COMPUTE_LANES, BP_EXEC_COMPUTE_LANES);
  if (o->ranks > BP_TRAIN_MAX_RANKS)
    return bp_fail(BP_ERR_UNSUPPORTED, "%d ranks: at most %d ranks run as threads", o->ranks,
                   BP_TRAIN_MAX_RANKS);
  if (o->epochs < 0 || o->epochs > BP_TRAIN_MAX_EPOCHS || o->step_epochs < 1 ||
      o->step_epochs > BP_TRAIN_MAX_EPOCHS)
    return bp_fail(BP_ERR_INVALID, "epochs %lld must be in [0, %d] and step epochs %lld in [1, %d]",
                   (long long)o->epochs, BP_TRAIN_MAX_EPOCHS, (long long)o->step_epochs,
                   BP_TRAIN_MAX_EPOCHS);
  const int64_t counts[] = {o->batch,      o->eval_batch, o->train_limit,
                            o->test_limit, o->log_every,  o->stop_after_steps};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
    if (counts[k] < 0 || counts[k] > BP_TRAIN_MAX_COUNT)
      return bp_fail(BP_ERR_INVALID,
                     "batches, limits, log_every and stop_after_steps must be in [0, 2^40], "
                     "got %lld",
                     (long long)counts[k]);
  if (o->optimizer < -1 || o->optimizer > BP_OPT_LARS)
    return bp_fail(BP_ERR_INVALID, "unknown optimizer %d", o->optimizer);
  if (o->schedule < -1 || o->schedule > BP_LR_COSINE)
    return bp_fail(BP_ERR_INVALID, "unknown learning-rate schedule %d", (int)o->schedule);
  if ((o->lr >= 0 || !isfinite(o->lr)) && !finite_in(o->lr, 0.0, 1e6))
    return bp_fail(BP_ERR_INVALID, "learning rate %g must be in [0, %g]", o->lr, BP_TRAIN_MAX_RATE);
  if ((o->momentum >= 0 || !isfinite(o->momentum)) && !finite_in(o->momentum, 0.0, 0.999999))
    return bp_fail(BP_ERR_INVALID, "momentum %g must be in [0, 1)", o->momentum);
  if ((o->weight_decay >= 0 || !isfinite(o->weight_decay)) && !finite_in(o->weight_decay, 0.0, 1e6))
    return bp_fail(BP_ERR_INVALID, "weight decay %g must be in [0, %g]", o->weight_decay,
                   BP_TRAIN_MAX_RATE);
  if (!finite_in(o->beta1, 0.0, 0.999999) || !finite_in(o->beta2, 0.0, 0.999999) ||
      !finite_in(o->eps, 1e-30, 1.0) || !finite_in(o->lars_eta, 0.0, 1e6))
    return bp_fail(BP_ERR_INVALID,
                   "beta1 %g and beta2 %g must be in [0, 1), eps %g in (0, 1], "
                   "lars eta %g >= 0",
                   o->beta1, o->beta2, o->eps, o->lars_eta);
  if (!finite_in(o->step_gamma, 0.0, BP_TRAIN_MAX_RATE))
    return bp_fail(BP_ERR_INVALID, "step gamma %g must be in [0, %g]", o->step_gamma,
                   BP_TRAIN_MAX_RATE);
  if (o->warmup_epochs != -1.0 && !finite_in(o->warmup_epochs, 0.0, BP_TRAIN_MAX_EPOCHS))
    return bp_fail(BP_ERR_INVALID, "warmup epochs %g must be in [0, %d]", o->warmup_epochs,
                   BP_TRAIN_MAX_EPOCHS);
  if (!finite_in(o->ema_decay, 0.0, 1.0))
    return bp_fail(BP_ERR_INVALID, "ema decay %g must be in [0, 1]", o->ema_decay);
  if (o->progress_interval < 0 || !isfinite(o->progress_interval))
    return bp_fail(BP_ERR_INVALID, "progress interval %g must be >= 0", o->progress_interval);
  if (o->augment.crop_pad < 0 || o->augment.crop_pad > BP_TRAIN_MAX_CROP_PAD ||
      o->augment.flip < 0 || o->augment.flip > 1)
    return bp_fail(BP_ERR_INVALID, "crop padding %d must be in [0, %d] and flip 0 or 1",
                   o->augment.crop_pad, BP_TRAIN_MAX_CROP_PAD);
  if (o->plugin_path_count < 0 || (o->plugin_path_count && !o->plugin_paths))
    return bp_fail(BP_ERR_INVALID, "%d plugin paths without their list", o->plugin_path_count);
  if (o->loss_scale != 0 &&
      !finite_in(o->loss_scale, BP_TRAIN_MIN_LOSS_SCALE, BP_TRAIN_MAX_LOSS_SCALE))
    return bp_fail(BP_ERR_INVALID, "loss scale %g must be 0 (dynamic) or in [2^-24, 2^64]",
                   o->loss_scale);
  if (o->loss_scale_growth_interval < 0 ||
      o->loss_scale_growth_interval > BP_TRAIN_MAX_GROWTH_INTERVAL)
    return bp_fail(BP_ERR_INVALID,
                   "loss scale growth interval %lld must be in [1, 2^24] (0: %d)",
                   (long long)o->loss_scale_growth_interval, BP_TRAIN_DEFAULT_GROWTH_INTERVAL);
  if (o->loss_scale != 0 && o->loss_scale_growth_interval != 0)
    return bp_fail(BP_ERR_INVALID,
                   "a static loss scale (%g) never grows: drop the growth interval (%lld)",
                   o->loss_scale, (long long)o->loss_scale_growth_interval);
  return BP_OK;
}

static char *dup_or_null(const char *s, int *failed) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *failed = 1;
  return d;
}

/* The trainer's own copy of the options' strings. */
static bp_status keep_options(bp_trainer *t, const bp_train_options *o) {
  int failed = 0;
  t->opt = *o;
  t->opt.data_dir = t->data_dir = dup_or_null(o->data_dir, &failed);
  t->opt.device = t->device = dup_or_null(o->device ? o->device : "cpu", &failed);
  t->opt.devices = t->devices = dup_or_null(o->devices, &failed);
  t->opt.checkpoint_path = t->checkpoint_path = dup_or_null(o->checkpoint_path, &failed);
  t->opt.resume_path = t->resume_path = dup_or_null(o->resume_path, &failed);
  t->opt.metrics_path = t->metrics_path = dup_or_null(o->metrics_path, &failed);
  t->opt.kernels = t->kernels = dup_or_null(o->kernels, &failed);
  t->opt.autotune_cache = t->autotune_cache = dup_or_null(o->autotune_cache, &failed);
  t->opt.plugin_paths = NULL; /* used only at create */
  t->opt.plugin_path_count = 0;
  t->opt.registry = NULL;
  t->opt.registry_options = NULL; /* used only at create */
  return failed ? bp_fail(BP_ERR_NOMEM, "out of memory copying the training options") : BP_OK;
}

/* The model with the options' overrides applied to its training settings. */
static bp_status copy_model(bp_trainer *t, const bp_model *m) {
  t->model = malloc(sizeof *t->model);
  if (!t->model) return bp_fail(BP_ERR_NOMEM, "out of memory copying the model");
  *t->model = *m;
  t->model->layers = malloc((size_t)m->layer_count * sizeof *m->layers);
  if (!t->model->layers) return bp_fail(BP_ERR_NOMEM, "out of memory copying the model");
  memcpy(t->model->layers, m->layers, (size_t)m->layer_count * sizeof *m->layers);
  t->model->inits = NULL; /* the copy owns its own initial values */
  t->model->init_count = 0;
  if (m->init_count > 0) {
    t->model->inits = calloc((size_t)m->init_count, sizeof *m->inits);
    if (!t->model->inits) return bp_fail(BP_ERR_NOMEM, "out of memory copying the model");
    for (int i = 0; i < m->init_count; i++, t->model->init_count++) {
      bp_model_init *d = &t->model->inits[i];
      *d = m->inits[i];
      d->values = malloc((size_t)(d->count ? d->count : 1) * sizeof *d->values);
      if (!d->values) return bp_fail(BP_ERR_NOMEM, "out of memory copying the model");
      memcpy(d->values, m->inits[i].values, (size_t)d->count * sizeof *d->values);
    }
  }
  bp_train_settings *s = &t->model->train;
  const bp_train_options *o = &t->opt;
  if (o->epochs) s->epochs = o->epochs;
  if (o->batch) s->batch = o->batch;
  if (o->eval_batch) s->eval_batch = o->eval_batch;
  if (o->optimizer >= 0) s->optimizer = (bp_optimizer)o->optimizer;
  if (o->lr >= 0) s->lr = o->lr;
  if (o->momentum >= 0) s->momentum = o->momentum;
  if (o->weight_decay >= 0) s->weight_decay = o->weight_decay;
  if (o->amp >= 0) s->amp = o->amp;
  if (o->ema >= 0) s->ema = o->ema;
  if (o->schedule >= 0) s->schedule = (bp_lr_schedule)o->schedule;
  if (o->warmup_epochs >= 0) s->warmup_epochs = o->warmup_epochs;
  if (!s->amp && (o->loss_scale != 0 || o->loss_scale_growth_interval != 0))
    return bp_fail(BP_ERR_INVALID,
                   "model '%s': loss scale options apply to mixed precision only (--amp, or "
                   "amp: true in the model's train: settings)",
                   m->name);
  s->kernels[sizeof s->kernels - 1] = '\0'; /* a model built in C may lack the NUL */
  return bp_model_check(t->model);
}

/* ---- kernels and device ------------------------------------------------------- */

static bp_status open_registry(bp_trainer *t, const bp_train_options *o) {
  if (o->registry) {
    t->registry = o->registry;
    return BP_OK;
  }
  bp_status st = bp_registry_create_with(o->registry_options, &t->registry);
  if (st != BP_OK) return st;
  t->own_registry = 1;
  return bp_registry_discover(t->registry, o->plugin_paths, o->plugin_path_count);
}

static int kernels_on(const bp_registry *r, const char *device) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++)
    if (strcmp(bp_registry_kernel(r, i)->kernel.device, device) == 0) return 1;
  return 0;
}

/* Arena memory of local rank k on its device (allocators[k].user). */
static void *device_alloc(void *user, size_t bytes, size_t alignment) {
  const bp_train_rank *r = user;
  void *p = NULL;
  return r->dev->arena_alloc(r->device, bytes, alignment, &p) == BP_ABI_OK ? p : NULL;
}

static void device_free(void *user, void *ptr, size_t bytes) {
  const bp_train_rank *r = user;
  r->dev->arena_free(r->device, ptr, bytes);
}

/* The device kinds plugins registered, for a message. */
static void device_kinds(const bp_registry *r, char *out, size_t size) {
  out[0] = '\0';
  for (int i = 0; i < bp_registry_device_count(r); i++) {
    const size_t used = strlen(out);
    snprintf(out + used, size - used, "%s%s", i ? ", " : "", bp_registry_device(r, i)->kind);
  }
  if (!out[0]) snprintf(out, size, "none");
}

/* The device plugin of t->device and the kind of kernels it runs (its own,
 * or the kind it names in kernel_kind). A kind no plugin provides runs on
 * host memory when op modules provide kernels for it (a registry without
 * device plugins, as some embedders build). */
static bp_status open_device(bp_trainer *t) {
  const char *dev = t->device;
  t->dev = bp_registry_find_device(t->registry, dev);
  t->kernel_kind = t->dev && t->dev->kernel_kind ? t->dev->kernel_kind : dev;
  if (!t->dev && !kernels_on(t->registry, dev)) {
    char kinds[512];
    device_kinds(t->registry, kinds, sizeof kinds);
    return bp_fail(BP_ERR_INVALID,
                   "unknown device '%s': no device plugin provides it and no op module has "
                   "kernels for it (devices loaded: %s; `blueprint plugins` lists them)",
                   dev, kinds);
  }
  if (!kernels_on(t->registry, t->kernel_kind))
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "device '%s': no op module provides kernels for %s'%s' (`blueprint plugins` "
                   "lists what loaded)",
                   dev, strcmp(t->kernel_kind, dev) ? "the kernel kind it runs, " : "",
                   t->kernel_kind);
  int count = 1;
  if (t->dev && t->dev->device_count(&count) != BP_ABI_OK)
    return bp_fail(BP_ERR_DEVICE, "device '%s': device_count failed: %s", dev,
                   t->dev->last_error ? t->dev->last_error() : "no reason given");
  if (count < 1) return bp_fail(BP_ERR_DEVICE, "device '%s': the machine has none", dev);
  if (t->opt.autotune && t->dev && !(t->dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE) &&
      (t->dev->flags & BP_ABI_DEVICE_HOST_TASK_KERNELS))
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "device '%s': autotune times kernels on the calling thread, and this "
                   "device's kernels run only inside its stream tasks; train without --autotune",
                   dev);
  /* selection asks the registry's checker about what it picks untimed:
   * pinned kernels are checked (unless --trust-pins), slow priority picks
   * of other modules reported (kernel_checks.h) */
  bp_status checked = bp_kernel_checks_install(t->registry, !t->opt.trust_pins);
  if (checked != BP_OK) return checked;
  /* selection asks the registry's tuner; --autotune's is validate's autotuner */
  if (t->opt.autotune) {
    bp_status st = bp_autotune_install(t->registry);
    if (st != BP_OK) return st;
  }
  t->device_count = count;
  return BP_OK;
}

/* The device index of global rank `rank`: the options' list in turn, else
 * rank mod the devices the plugin has. */
static bp_status rank_device(const bp_trainer *t, int rank, int *out) {
  const char *list = t->opt.devices;
  /* under mpirun a process takes the device of its index on its machine */
  const int local = bp_train_multi_process(t) ? bp_mpi_launched_local_rank() : -1;
  if (local >= 0) rank = local;
  if (!list || !list[0]) {
    *out = rank % t->device_count;
    return BP_OK;
  }
  int ids[BP_TRAIN_MAX_RANKS], n = 0;
  for (const char *c = list; *c;) {
    char *end;
    const long v = strtol(c, &end, 10);
    if (end == c || v < 0 || v >= t->device_count || n == BP_TRAIN_MAX_RANKS ||
        (*end && *end != ','))
      return bp_fail(BP_ERR_INVALID,
                     "devices '%s': a comma-separated list of device indices, each below the %d "
                     "device(s) of '%s'",
                     list, t->device_count, t->device);
    ids[n++] = (int)v;
    c = *end ? end + 1 : end;
  }
  *out = ids[rank % n];
  return BP_OK;
}

/* ---- data ------------------------------------------------------------------------ */

static bp_status limit(bp_dataset **set, int64_t n) {
  const int64_t count = bp_dataset_get_info(*set)->count;
  if (n == 0 || n >= count) return BP_OK;
  bp_dataset *sub = NULL;
  bp_status st = bp_dataset_subset(*set, 0, n, &sub);
  if (st != BP_OK) return st;
  bp_dataset_destroy(*set);
  *set = sub;
  return BP_OK;
}

static bp_status check_data(const bp_trainer *t, const bp_dataset *d, const char *what) {
  const bp_dataset_info *i = bp_dataset_get_info(d);
  const bp_model *m = t->model;
  if (i->height != m->height || i->width != m->width || i->channels != m->channels)
    return bp_fail(BP_ERR_SHAPE,
                   "the %s images of '%s' are %lldx%lldx%lld; model '%s' takes %lldx%lldx%lld",
                   what, t->data_dir ? t->data_dir : BP_DATA_DEFAULT_DIR, (long long)i->height,
                   (long long)i->width, (long long)i->channels, m->name, (long long)m->height,
                   (long long)m->width, (long long)m->channels);
  if (i->classes > m->classes)
    return bp_fail(BP_ERR_SHAPE, "the %s labels of '%s' go up to %d; model '%s' has %lld classes",
                   what, t->data_dir ? t->data_dir : BP_DATA_DEFAULT_DIR, i->classes - 1, m->name,
                   (long long)m->classes);
  return BP_OK;
}

static bp_status load_data(bp_trainer *t) {
  bp_dataset *train = NULL;
  bp_status st;
  /* synthetic data (--data synthetic) takes its shape and size from the model */
  const bp_model *m = t->model;
  const bp_dataset_info shape = {m->train.train_size, m->height, m->width, m->channels,
                                 (int)m->classes};
  /* the training set's statistics normalize both splits; the default data
   * uses the published Fashion-MNIST values */
  if (!t->opt.eval_only || t->data_dir) {
    if ((st = bp_dataset_open(t->data_dir, BP_DATA_TRAIN, &shape, &train)) != BP_OK) return st;
    if ((st = check_data(t, train, "training")) != BP_OK) goto fail;
  }
  if (t->data_dir) {
    if ((st = bp_dataset_stats(train, &t->norm)) != BP_OK) goto fail;
  } else {
    t->norm.channels = 1;
    t->norm.mean[0] = BP_FASHION_MNIST_MEAN;
    t->norm.std[0] = BP_FASHION_MNIST_STD;
  }
  if (t->opt.eval_only) {
    bp_dataset_destroy(train);
    train = NULL;
  } else if ((st = limit(&train, t->opt.train_limit)) != BP_OK) {
    goto fail;
  }
  if ((st = bp_dataset_open(t->data_dir, BP_DATA_TEST, &shape, &t->test_set)) != BP_OK ||
      (st = check_data(t, t->test_set, "test")) != BP_OK ||
      (st = limit(&t->test_set, t->opt.test_limit)) != BP_OK)
    goto fail;
  t->train_set = train;
  return BP_OK;
fail:
  bp_dataset_destroy(train);
  return st;
}

/* ---- plan, graph, ranks ---------------------------------------------------------- */

static bp_status compile_and_build(bp_trainer *t) {
  const bp_train_settings *s = &t->model->train;
  bp_session_options so;
  bp_session_options_init(&so, t->model);
  const int64_t train_size =
      t->train_set ? bp_dataset_get_info(t->train_set)->count : s->train_size;
  /* R ranks: the plan holds one rank's tensors, a variant per rank share
   * of the global batch B and of the last batch n mod B (model.h);
   * evaluation runs on rank 0 with the whole evaluation batch */
  bp_compile_options *co = &so.compile;
  co->batch = s->batch;
  co->eval_batch = s->eval_batch;
  co->train_size = train_size;
  co->world = t->world;
  co->eval_size = bp_dataset_get_info(t->test_set)->count;
  co->no_reuse = t->opt.no_reuse;
  /* batchnorm + relu fused unless asked not to, where the device has the kernels */
  co->fuse_bn_relu = co->fuse_bn_relu && !t->opt.no_fuse;
  so.registry = t->registry;
  so.device = t->kernel_kind;
  so.pins = t->pins;
  bp_graph_options *go = &so.graph;
  go->optimizer.momentum = (float)s->momentum;
  go->optimizer.weight_decay = (float)s->weight_decay;
  go->optimizer.nesterov = t->opt.nesterov != 0;
  go->optimizer.beta1 = (float)t->opt.beta1;
  go->optimizer.beta2 = (float)t->opt.beta2;
  go->optimizer.eps = (float)t->opt.eps;
  go->optimizer.eta = (float)t->opt.lars_eta;
  go->ema_decay = (float)t->opt.ema_decay;
  go->eval_ema = s->ema && t->opt.eval_ema != 0;
  go->replicate_update = t->opt.replicate_update != 0;
  go->loss_scale.growth_interval = t->opt.loss_scale_growth_interval
                                       ? (int32_t)t->opt.loss_scale_growth_interval
                                       : BP_TRAIN_DEFAULT_GROWTH_INTERVAL;
  if (t->opt.loss_scale > 0) /* static: interval 0 (bp_abi_ops.h, range.loss_scale) */
    go->loss_scale.growth_interval = 0;
  bp_status st = bp_session_create(t->model, &so, &t->session);
  if (st != BP_OK) return st;
  t->plan = bp_session_plan(t->session);
  t->graph = bp_session_graph(t->session);
  t->v_train = bp_plan_find_variant(t->plan, "train");
  t->v_eval = bp_plan_find_variant(t->plan, "eval");
  t->v_eval_last = bp_plan_find_variant(t->plan, "eval_last");
  BP_ASSERT(t->v_train == 0 && t->v_eval > 0);

  const bp_plan *p = t->plan;
  const bp_graph_tensors *ids = bp_graph_get_tensors(t->graph); /* the compiler's ids */
  t->lr = bp_plan_tensor(p, 0, ids->lr);
  t->step = bp_plan_tensor(p, 0, ids->step);
  t->loss = bp_plan_tensor(p, 0, ids->loss);
  t->correct = bp_plan_tensor(p, 0, ids->correct);
  for (int b = 0; b < 2; b++) {
    t->input_ids[b] = ids->input[b];
    t->label_ids[b] = ids->label[b];
  }
  BP_ASSERT(t->lr && t->step && t->loss && t->correct);
  if (s->amp) {
    t->loss_scale = bp_plan_tensor(p, 0, ids->loss_scale);
    t->good_steps = bp_plan_tensor(p, 0, ids->good_steps);
    t->skipped = bp_plan_tensor(p, 0, ids->skipped);
    BP_ASSERT(t->loss_scale && t->good_steps && t->skipped);
  }
  for (int b = 0; b < 2; b++) BP_ASSERT(t->input_ids[b] >= 0 && t->label_ids[b] >= 0);
  return BP_OK;
}

/* The table of what each rank runs in a full step and in the epoch's last
 * one (train-impl.h invariants 4 and 5): rank k's share of a global batch
 * by data.h's rule, and the variant compiled for that share ("train" /
 * "train_small", "train_last" / "train_last_small"); a rank of 0 samples
 * gets the step's first variant and skips the segments that read samples,
 * the others skip ZERO_GRAD. */
static void plan_rank_steps(bp_trainer *t) {
  static const char *const names[2][2] = {{"train", "train_small"},
                                          {"train_last", "train_last_small"}};
  const int64_t n = t->train_set ? bp_dataset_get_info(t->train_set)->count : 0;
  const int64_t global[2] = {t->batch, n % t->batch};
  for (int kind = 0; kind < 2; kind++) {
    for (int k = 0; k < BP_TRAIN_MAX_RANKS; k++) t->rank_steps[kind][k] = (bp_rank_step){-1, 0, 0};
    if (global[kind] == 0) continue; /* the epoch divides: no short last batch */
    const int big = bp_plan_find_variant(t->plan, names[kind][0]);
    const int small = bp_plan_find_variant(t->plan, names[kind][1]);
    BP_ASSERT(big >= 0);
    for (int k = 0; k < t->local; k++) {
      int64_t offset, count;
      const bp_status shard =
          bp_data_shard(global[kind], t->world, t->first_rank + k, &offset, &count);
      BP_ASSERT(shard == BP_OK);
      bp_rank_step *r = &t->rank_steps[kind][k];
      r->count = count;
      r->skip = BP_TRAIN_SKIP_ACTIVE;
      if (count == 0) {
        r->variant = big;
        r->skip = BP_TRAIN_SKIP_EMPTY;
      } else if (count == bp_plan_variant(t->plan, big)->batch) {
        r->variant = big;
      } else {
        /* the compiler and data.h follow the same rule: the other share is "_small" */
        BP_ASSERT(small >= 0 && count == bp_plan_variant(t->plan, small)->batch);
        r->variant = small;
      }
    }
  }
}

/* The end of the last byte a collective node reads or writes, in any
 * variant: the part of the arena processes on one machine share. */
static size_t collective_extent(const bp_trainer *t) {
  uint64_t end = 0;
  for (int v = 0; v < bp_plan_variant_count(t->plan); v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int i = 0; i < bp_graph_node_count(t->graph, v, (bp_segment)s); i++) {
        const bp_node *n = bp_graph_node(t->graph, v, (bp_segment)s, i);
        const bp_op_info *info = bp_op_find(n->op);
        if (!info || !info->collective) continue;
        for (int j = 0; j < n->num_inputs + n->num_outputs; j++) {
          const bp_node_tensor *x = j < n->num_inputs ? &n->inputs[j]
                                                      : &n->outputs[j - n->num_inputs];
          const bp_dtensor *d = x->id >= 0 ? bp_plan_tensor(t->plan, v, x->id) : NULL;
          const uint64_t last = d ? d->offset + d->slot_bytes : x->span.offset + x->span.bytes;
          if (last > end) end = last;
        }
      }
  return (size_t)end;
}

/* The arena of local rank k and the communicator its kernels see. Under
 * mpirun on one machine the processes share their arenas' first
 * shared_bytes and the kernels reach peers in place, as threads do
 * (comm.h); else each arena is the device's. */
static bp_status open_arena(bp_trainer *t, bp_train_rank *r, int k) {
  const int host = !t->dev || (t->dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE);
  if (bp_train_multi_process(t) && host && /* shared memory needs host arenas */
      !t->opt.no_mpi_shared &&
      t->comm_kind == BP_COMM_KIND_MPI &&   /* and the host's communicator */
      bp_arena_create(t->plan, &t->shared_allocator, k, &r->arena) == BP_OK)
    return bp_mpi_shared_comm(t->shared, bp_arena_base(r->arena), &r->comm);
  /* each rank allocates on its own device: the allocator points at the rank */
  t->allocators[k] = t->dev ? (bp_arena_allocator){t->device, device_alloc, device_free, r}
                            : *bp_host_allocator();
  bp_status st = bp_arena_create(t->plan, &t->allocators[k], k, &r->arena);
  if (t->comm) r->comm = bp_comm_abi(t->comm, k);
  if (bp_train_multi_process(t)) r->comm = t->mpi;
  return st;
}

/* The host's bootstrap for a transport across processes (bp_abi_device.h):
 * the run's MPI communicator. */
static int boot_broadcast(void *ctx, void *data, uint64_t bytes) {
  (void)ctx;
  if (bytes > (uint64_t)INT32_MAX) return BP_ABI_ERR_INVALID;
  return bp_mpi_bcast(data, (int)bytes, 0) == BP_OK ? BP_ABI_OK : BP_ABI_ERR_DEVICE;
}
static int boot_count(void *ctx, int32_t value, int32_t *total_out) {
  (void)ctx;
  double v = value;
  if (bp_mpi_sum_f64(&v, 1) != BP_OK) return BP_ABI_ERR_DEVICE;
  *total_out = (int32_t)v;
  return BP_ABI_OK;
}

/* Ranks whose device brings the collectives reach each other through the
 * device's transport (comm_kind DEVICE): the first local rank opens the
 * group of every local rank (on its own thread, its device current there:
 * some runtimes join on the current device), and each rank's kernels see
 * their own communicator from it. */
static bp_status open_transport(bp_trainer *t, bp_train_rank *r, int k) {
  if (t->comm_kind != BP_COMM_KIND_DEVICE) return BP_OK;
  const bp_abi_comm_transport *tr = &t->transport;
  if (k == 0) {
    int32_t devices[BP_TRAIN_MAX_RANKS];
    for (int j = 0; j < t->local; j++) {
      int d;
      bp_status st = rank_device(t, t->first_rank + j, &d);
      if (st != BP_OK) return st;
      devices[j] = d;
    }
    (void)bp_devio_stream_native(&r->io);
    const bp_abi_comm_bootstrap boot = {sizeof boot, NULL, t->mpi.rank, t->mpi.world,
                                        boot_broadcast, boot_count};
    char reason[1024] = "";
    const bp_abi_comm_open_args a = {
        .struct_size = sizeof a,
        .local = t->local,
        .devices = devices,
        .first_rank = t->first_rank,
        .world = t->world,
        .bootstrap = bp_train_multi_process(t) ? &boot : NULL,
        .reason = reason,
        .reason_size = sizeof reason,
    };
    void *group = NULL;
    const int rc = tr->open(tr->user, &a, &group);
    if (rc != BP_ABI_OK || !group)
      return bp_fail(rc == BP_ABI_ERR_NOMEM ? BP_ERR_NOMEM : BP_ERR_DEVICE,
                     "device '%s': its collective transport '%s' did not open for %d rank(s) "
                     "of %d: %s",
                     t->device, tr->backend, t->local, t->world,
                     reason[0] ? reason : "no reason given");
    t->comm_group = group;
  }
  bp_abi_comm c = {0};
  const int rc = tr->comm(t->comm_group, k, &c);
  if (rc != BP_ABI_OK || c.struct_size < sizeof c || !c.backend ||
      c.rank != t->first_rank + k || c.world != t->world)
    return bp_fail(BP_ERR_DEVICE,
                   "device '%s': its collective transport '%s' gave local rank %d no valid "
                   "communicator (status %d; want rank %d of %d)",
                   t->device, tr->backend, k, rc, t->first_rank + k, t->world);
  r->comm = c;
  return BP_OK;
}

/* Which communicator the kernels get (comm.h: bp_comm_choose), by the
 * device's flags and its transports' capabilities; a layout nothing can
 * serve is refused here, before the plan is built. */
static bp_status choose_comm(bp_trainer *t) {
  const uint32_t host_flags = BP_ABI_DEVICE_HOST_ACCESSIBLE | BP_ABI_DEVICE_HOST_TASK_KERNELS;
  bp_comm_layout l = {
      .device = t->device,
      .host_reach = !t->dev || (t->dev->flags & host_flags) != 0,
      .device_count = t->device_count,
      .local = t->local,
      .world = t->world,
      .local_processes = bp_train_multi_process(t) ? bp_mpi_launched_local() : 1,
  };
  for (int k = 0; k < t->local; k++) {
    bp_status st = rank_device(t, t->first_rank + k, &l.devices[k]);
    if (st != BP_OK) return st;
  }
  /* the registry checked the array (count, stride, functions, flags) */
  bp_abi_comm_transport offered[BP_COMM_MAX_TRANSPORTS] = {{0}};
  for (; l.transports < BP_COMM_MAX_TRANSPORTS &&
         bp_registry_device_transport(t->dev, l.transports, &offered[l.transports]);
       l.transports++) {
    l.transport_names[l.transports] = offered[l.transports].backend;
    l.transport_flags[l.transports] = offered[l.transports].flags;
  }
  int chosen = -1;
  bp_status st = bp_comm_choose(&l, &t->comm_kind, &chosen);
  if (st == BP_OK && chosen >= 0) t->transport = offered[chosen];
  return st;
}

void bp_train_measure_yardstick(bp_trainer *t) {
  bp_train_rank *r = &t->ranks[0];
  if (t->opt.profile && r->io.host && r->threads)
    bp_profile_measure_sgemm(t->opt.profile, t->registry, t->kernel_kind,
                             bp_threads_abi(r->threads));
}

static bp_status open_rank(bp_trainer *t, int k) {
  bp_train_rank *r = &t->ranks[k];
  r->rank = k;
  bp_status st = rank_device(t, t->first_rank + k, &r->device);
  if (st != BP_OK) return st;
  r->dev = t->dev;
  if ((st = open_arena(t, r, k)) != BP_OK) return st;
  r->base = bp_arena_base(r->arena);
  if ((st = bp_devio_open(&r->io, t->dev, t->device, r->device, r->base, t->plan)) != BP_OK)
    return st;
  if ((st = bp_train_lanes_open(t, r)) != BP_OK) return st;
  if ((st = open_transport(t, r, k)) != BP_OK) return st;
  const char *pins = t->pins; /* resolved and checked once (train_kernels.c) */
  /* the ranks sharing this machine share its cores: ranks as threads here,
   * or the processes mpirun started on it (options.threads overrides) */
  const int sharing = t->local > 1 ? t->local : bp_mpi_launched_local();
  const int threads = t->opt.threads > 0 ? t->opt.threads : bp_threads_share(sharing);
  if ((st = bp_threads_create(threads, &r->threads)) != BP_OK) return st;
  bp_exec_options eo = {
      .device = t->kernel_kind, /* the kernels the device runs (bp_abi_device.kernel_kind) */
      .pins = pins,
      .autotune = t->opt.autotune,
      .autotune_cache = t->autotune_cache,
      .rank = t->first_rank + k,
      .world = t->world,
      .comm = t->world > 1 ? &r->comm : NULL,
      .threads = bp_threads_abi(r->threads),
      .memory_device = t->dev ? t->device : NULL, /* the workspace beside the arena */
      .device_index = r->device,
      .stream = bp_devio_stream_native(&r->io),
      .streams = r->lanes ? bp_train_streams(t) : 1,
  };
  for (int l = 0; r->lanes && l < BP_EXEC_LANES; l++)
    eo.lane_stream[l] = bp_devio_lane_native(&r->io, l);
  /* bind before filling: autotuning runs kernels on the arena */
  if ((st = bp_session_bind(t->session, t->registry, r->base, &eo, &r->exec)) != BP_OK) return st;
  if (t->opt.autotune) { /* the default selection too, for the steps that decide (train_autotune.c) */
    bp_exec_options plain = eo;
    plain.autotune = 0;
    plain.autotune_cache = NULL;
    if ((st = bp_session_bind(t->session, t->registry, r->base, &plain, &r->default_exec)) != BP_OK)
      return st;
  }
  if (k == 0 && t->opt.profile && !t->opt.autotune) { /* rank 0 is profiled (autotune: once decided) */
    if ((st = bp_exec_set_profile(r->exec, t->opt.profile)) != BP_OK) return st;
    bp_train_measure_yardstick(t);
  }
  return bp_train_arena_init(t, r);
}

/* ---- create / destroy ------------------------------------------------------------- */

/* R > 1 ranks run on the cpu device, as threads (--ranks R) or as
 * processes under mpirun (one rank each). Any global batch splits: by
 * data.h's rule the first b mod R ranks take one sample more, each share
 * runs its own variant of the plan (model.h), a rank with no sample still
 * takes the step (train-impl.h invariant 5). */
static bp_status open_ranks(bp_trainer *t, const bp_train_options *o) {
  const int launched = bp_mpi_launched_world();
  t->world = t->local = o->ranks;
  t->first_rank = 0;
  if (launched > 1) {
    if (o->ranks > 1)
      return bp_fail(BP_ERR_UNSUPPORTED,
                     "mpirun started %d processes and blueprint runs one rank per process under "
                     "mpirun: drop --ranks %d (or run --ranks without mpirun)",
                     launched, o->ranks);
    bp_status st = bp_mpi_comm(&t->mpi);
    if (st != BP_OK) return st;
    t->world = t->mpi.world;
    t->first_rank = t->mpi.rank;
  }
  if (t->local > 1) return bp_comm_create(t->local, &t->comm);
  return BP_OK;
}

static bp_status setup(bp_trainer *t, const bp_model *model, const bp_train_options *o) {
  bp_status st;
  if ((st = keep_options(t, o)) != BP_OK || (st = copy_model(t, model)) != BP_OK ||
      (st = open_registry(t, o)) != BP_OK || (st = open_device(t)) != BP_OK ||
      (st = bp_train_pins_resolve(t)) != BP_OK || (st = load_data(t)) != BP_OK)
    return st;
  t->batch = t->model->train.batch;
  t->eval_batch = t->model->train.eval_batch;
  t->epochs = t->model->train.epochs;
  if ((st = open_ranks(t, o)) != BP_OK || (st = choose_comm(t)) != BP_OK) return st;
  if ((st = compile_and_build(t)) != BP_OK) return st;
  if (bp_train_multi_process(t)) { /* only processes share arenas */
    t->shared_bytes = collective_extent(t);
    if ((st = bp_mpi_shared_create(&t->shared_bytes, &t->shared)) != BP_OK) return st;
    t->shared_allocator = bp_mpi_shared_allocator(t->shared);
  }
  plan_rank_steps(t);
  const int64_t n = t->train_set ? bp_dataset_get_info(t->train_set)->count : 1;
  t->steps_per_epoch = bp_data_steps_per_epoch(n, t->batch, 0);
  t->schedule =
      (bp_schedule){t->model->train.schedule, t->model->train.lr, t->opt.step_gamma,
                    t->opt.step_epochs, t->model->train.warmup_epochs, t->steps_per_epoch,
                    t->epochs};
  t->state = (bp_train_state){.seed = o->seed, .loss_scale = 1.0};
  if (t->loss_scale) /* AMP: the scale starts at the static one, or GradScaler's */
    t->state.loss_scale = o->loss_scale > 0 ? o->loss_scale : BP_TRAIN_INITIAL_LOSS_SCALE;
  for (int k = 0; k < t->local; k++)
    if ((st = open_rank(t, k)) != BP_OK) return st;
  if ((st = bp_train_write_amp_state(t)) != BP_OK) return st;
  if ((st = bp_train_graphs_open(t)) != BP_OK) return st;
  if (t->local > 1 && (st = bp_rank_pool_start(t)) != BP_OK) return st;
  if ((st = bp_train_autotune_confirm(t)) != BP_OK) return st;
  if (t->opt.autotune && t->opt.profile) { /* the executor kept */
    if ((st = bp_exec_set_profile(t->ranks[0].exec, t->opt.profile)) != BP_OK) return st;
    bp_train_measure_yardstick(t);
  }
  if (t->resume_path && (st = bp_trainer_load(t, t->resume_path)) != BP_OK) return st;
  if (t->metrics_path && t->first_rank == 0 && /* under mpirun rank 0 writes for all */
      (st = bp_metrics_open(t->metrics_path, t->resume_path != NULL, &t->metrics)) != BP_OK)
    return st;
  if ((st = bp_train_kernels_collect(t)) != BP_OK) return st;
  if (t->metrics && (st = bp_metrics_write_kernels(t->metrics, t)) != BP_OK) return st;
  return BP_OK;
}

bp_status bp_trainer_create(const bp_model *model, const bp_train_options *options,
                            bp_trainer **trainer_out) {
  if (!model || !options || !trainer_out)
    return bp_fail(BP_ERR_INVALID, "bp_trainer_create: NULL argument");
  bp_status st = check_options(options);
  if (st != BP_OK) return st;
  if (options->eval_only && !options->resume_path && model->init_count == 0)
    return bp_fail(BP_ERR_INVALID, "evaluation only needs a checkpoint to evaluate (or a model "
                   "with its own initial values: an ONNX file's initializers)");
  bp_trainer *t = calloc(1, sizeof *t);
  if (!t) return bp_fail(BP_ERR_NOMEM, "out of memory creating a trainer");
  if ((st = setup(t, model, options)) != BP_OK) {
    char why[2048];
    snprintf(why, sizeof why, "%s", bp_last_error()); /* destroy must not lose it */
    bp_trainer_destroy(t);
    return bp_fail(st, "%s", why);
  }
  *trainer_out = t;
  return BP_OK;
}

bp_status bp_trainer_create_from_file(const char *model_path, const bp_train_options *options,
                                      bp_trainer **trainer_out) {
  if (!model_path) return bp_fail(BP_ERR_INVALID, "bp_trainer_create_from_file: NULL path");
  if (!options || !trainer_out)
    return bp_fail(BP_ERR_INVALID, "bp_trainer_create_from_file: NULL argument");
  /* the modules first: the model may use a layer type one of them registers */
  bp_train_options o = *options;
  bp_registry *own = NULL;
  bp_status st = BP_OK;
  if (!o.registry) {
    if ((st = bp_registry_create_with(o.registry_options, &own)) != BP_OK) return st;
    if ((st = bp_registry_discover(own, o.plugin_paths, o.plugin_path_count)) != BP_OK) {
      bp_registry_destroy(own);
      return st;
    }
    o.registry = own;
  }
  bp_model *m = NULL;
  if ((st = bp_model_load_file(model_path, o.registry, &m)) == BP_OK) /* YAML or ONNX */
    st = bp_trainer_create(m, &o, trainer_out);
  bp_model_destroy(m);
  if (st == BP_OK && own) (*trainer_out)->own_registry = 1; /* the trainer keeps it */
  else bp_registry_destroy(own);
  return st;
}

void bp_trainer_destroy(bp_trainer *t) {
  if (!t) return;
  bp_metrics_close(t->metrics);
  bp_rank_pool_stop(t);
  bp_train_graphs_close(t);
  for (int k = 0; k < BP_TRAIN_MAX_RANKS; k++) {
    if (t->ranks[k].lanes) (void)bp_devio_sync(&t->ranks[k].io); /* their events idle */
    bp_train_lanes_close(&t->ranks[k]);
    bp_devio_close(&t->ranks[k].io); /* drains the rank's streams first */
    bp_exec_destroy(t->ranks[k].exec);
    bp_exec_destroy(t->ranks[k].default_exec); /* a failed create's */
    bp_threads_destroy(t->ranks[k].threads); /* after the exec: its kernels borrow them */
    bp_arena_destroy(t->ranks[k].arena);
  }
  bp_mpi_shared_destroy(t->shared); /* after its arenas */
  if (t->comm_group) t->transport.close(t->comm_group); /* after the execs and graphs */
  bp_comm_destroy(t->comm);
  bp_session_destroy(t->session);
  if (t->own_registry) bp_registry_destroy(t->registry);
  bp_dataset_destroy(t->train_set);
  bp_dataset_destroy(t->test_set);
  bp_model_destroy(t->model);
  free(t->autotune_report);
  free(t->data_dir);
  free(t->device);
  free(t->devices);
  free(t->checkpoint_path);
  free(t->resume_path);
  free(t->metrics_path);
  free(t->kernels);
  free(t->autotune_cache);
  free(t->pins);
  free(t->kernel_uses);
  free(t->kernel_warnings);
  free(t);
}

/* ---- checkpoints --------------------------------------------------------------------- */

/* A sharded update leaves each rank's moments current in its own chunks
 * only: the STATE segment gathers them on every rank (graph.h). A
 * collective: every rank of every process runs it. */
static bp_status gather_state(bp_trainer *t) {
  if (t->v_train < 0 || bp_graph_node_count(t->graph, t->v_train, BP_SEGMENT_STATE) == 0)
    return BP_OK;
  bp_rank_step all[BP_TRAIN_MAX_RANKS];
  for (int k = 0; k < t->local; k++) all[k] = (bp_rank_step){t->v_train, 0, 0};
  return bp_rank_pool_run(t, all, (const bp_segment[]){BP_SEGMENT_STATE}, 1, 0, NULL, NULL);
}

/* Checkpoints reach the arenas through the ranks' io (device-io-impl.h). */
static bp_status arena_read(void *user, uint64_t offset, void *dst, uint64_t bytes) {
  return bp_devio_read(user, offset, dst, bytes);
}

/* Writes every local rank: the ranks start equal (invariant 1). */
static bp_status arena_write_all(void *user, uint64_t offset, const void *src, uint64_t bytes) {
  bp_trainer *t = user;
  for (int k = 0; k < t->local; k++) {
    bp_status st = bp_devio_write(&t->ranks[k].io, offset, src, bytes);
    if (st != BP_OK) return st;
  }
  return BP_OK;
}

bp_status bp_trainer_save(bp_trainer *t, const char *path) {
  if (!t || !path) return bp_fail(BP_ERR_INVALID, "bp_trainer_save: NULL argument");
  bp_status st = gather_state(t);
  if (st != BP_OK) return st;
  if ((st = bp_train_read_amp_state(t)) != BP_OK) return st;
  if (t->first_rank != 0) return BP_OK; /* under mpirun rank 0 writes the ranks' one state */
  char note[BP_NAME_MAX + 32];
  snprintf(note, sizeof note, "model %s", t->model->name);
  const bp_arena_access rank0 = {arena_read, NULL, &t->ranks[0].io};
  return bp_checkpoint_save_access(path, t->plan, &rank0, &t->state, note);
}

bp_status bp_train_save_finite(bp_trainer *t, const char *path, const char **non_finite_out) {
  *non_finite_out = NULL;
  bp_status st = gather_state(t);
  if (st != BP_OK) return st;
  if ((st = bp_train_read_amp_state(t)) != BP_OK) return st;
  /* every process checks its own copy of the one state: the same answer */
  const bp_arena_access rank0 = {arena_read, NULL, &t->ranks[0].io};
  if ((st = bp_checkpoint_state_finite(t->plan, &rank0, non_finite_out)) != BP_OK) return st;
  if (*non_finite_out || t->first_rank != 0) return BP_OK;
  char note[BP_NAME_MAX + 32];
  snprintf(note, sizeof note, "model %s", t->model->name);
  return bp_checkpoint_save_access(path, t->plan, &rank0, &t->state, note);
}

bp_status bp_trainer_load(bp_trainer *t, const char *path) {
  if (!t || !path) return bp_fail(BP_ERR_INVALID, "bp_trainer_load: NULL argument");
  /* the counters are checked before the arena changes */
  bp_checkpoint_info info;
  bp_status st = bp_checkpoint_read_info(path, &info);
  if (st != BP_OK) return st;
  const bp_train_state s = info.state;
  /* another plan first: load refuses it by name, before the counters mislead */
  const bp_arena_access all = {NULL, arena_write_all, t};
  if (info.plan_hash != bp_plan_hash(t->plan))
    return bp_checkpoint_load_access(path, t->plan, &all, &(bp_train_state){0});
  if (!t->opt.eval_only &&
      (s.epoch > (uint64_t)t->epochs || (int64_t)s.step >= t->steps_per_epoch ||
       (s.epoch == (uint64_t)t->epochs && s.step != 0)))
    return bp_fail(BP_ERR_INVALID,
                   "checkpoint '%s' stands at epoch %llu step %llu (%llu epochs done); this "
                   "run has %lld epochs of %lld steps (were the data limits or the batch "
                   "different?)",
                   path, (unsigned long long)s.epoch + 1, (unsigned long long)s.step,
                   (unsigned long long)s.epoch,
                   (long long)t->epochs, (long long)t->steps_per_epoch);
  bp_train_state loaded;
  st = bp_checkpoint_load_access(path, t->plan, &all, &loaded);
  bp_train_params_changed(t); /* even a failed load may have written some */
  if (st != BP_OK) return st;
  t->state = loaded;
  t->stopped = 0;
  return bp_train_write_amp_state(t); /* the device's counters continue from the file's */
}

/* ---- accessors ------------------------------------------------------------------------ */

int bp_trainer_done(const bp_trainer *t) {
  return !t || t->stopped || t->state.epoch >= (uint64_t)t->epochs ||
         (t->opt.stop_after_steps && t->state.global_step >= (uint64_t)t->opt.stop_after_steps);
}

const bp_model *bp_trainer_model(const bp_trainer *t) { return t ? t->model : NULL; }
const bp_plan *bp_trainer_plan(const bp_trainer *t) { return t ? t->plan : NULL; }
bp_train_state bp_trainer_state(const bp_trainer *t) {
  bp_train_state s = {.loss_scale = 0.0};
  return t ? t->state : s;
}
int64_t bp_trainer_steps_per_epoch(const bp_trainer *t) { return t ? t->steps_per_epoch : 0; }
int64_t bp_trainer_epochs(const bp_trainer *t) { return t ? t->epochs : 0; }
int64_t bp_trainer_train_samples(const bp_trainer *t) {
  return t && t->train_set ? bp_dataset_get_info(t->train_set)->count : 0;
}
int64_t bp_trainer_test_samples(const bp_trainer *t) {
  return t && t->test_set ? bp_dataset_get_info(t->test_set)->count : 0;
}

int bp_trainer_world(const bp_trainer *t) { return t ? t->world : 0; }
int bp_trainer_rank(const bp_trainer *t) { return t ? t->first_rank : 0; }
int bp_trainer_local_ranks(const bp_trainer *t) { return t ? t->local : 0; }
const char *bp_trainer_transport(const bp_trainer *t) {
  if (!t || t->world < 2) return NULL;
  if (t->comm_kind == BP_COMM_KIND_DEVICE) return t->transport.backend; /* the device's */
  if (!bp_train_multi_process(t)) return "threads";
  return strcmp(t->ranks[0].comm.backend, "threads") == 0 ? "mpi shared memory" : "mpi messages";
}

bp_status bp_trainer_read_tensor(const bp_trainer *t, const char *name, float *dst,
                                 uint64_t count) {
  return bp_trainer_read_rank_tensor(t, 0, name, dst, count);
}

bp_status bp_trainer_read_rank_tensor(const bp_trainer *t, int rank, const char *name, float *dst,
                                      uint64_t count) {
  if (!t || !name || !dst) return bp_fail(BP_ERR_INVALID, "bp_trainer_read_tensor: NULL argument");
  if (rank < 0 || rank >= t->local)
    return bp_fail(BP_ERR_INVALID, "bp_trainer_read_tensor: rank %d of the %d this process holds",
                   rank, t->local);
  const int32_t id = bp_plan_find_tensor(t->plan, name);
  const bp_dtensor *d = id >= 0 ? bp_plan_tensor(t->plan, 0, id) : NULL;
  if (!d) return bp_fail(BP_ERR_INVALID, "no tensor '%s' in the plan", name);
  if (d->dtype != BP_DTYPE_FP32 || count != bp_dtensor_host_elems(d))
    return bp_fail(BP_ERR_INVALID, "tensor '%s' is %s with %llu elements; asked for %llu fp32",
                   name, bp_dtype_name(d->dtype), (unsigned long long)bp_dtensor_host_elems(d),
                   (unsigned long long)count);
  /* the io is the rank's own; reading changes nothing the trainer shows */
  return bp_devio_read_tensor((bp_devio *)&t->ranks[rank].io, d, dst);
}

bp_status bp_trainer_write_tensor(bp_trainer *t, const char *name, const float *src,
                                  uint64_t count) {
  if (!t || !name || !src) return bp_fail(BP_ERR_INVALID, "bp_trainer_write_tensor: NULL argument");
  const int32_t id = bp_plan_find_tensor(t->plan, name);
  const bp_dtensor *d = id >= 0 ? bp_plan_tensor(t->plan, 0, id) : NULL;
  if (!d) return bp_fail(BP_ERR_INVALID, "no tensor '%s' in the plan", name);
  if (count != bp_dtensor_host_elems(d))
    return bp_fail(BP_ERR_INVALID, "tensor '%s' has %llu elements; %llu given", name,
                   (unsigned long long)bp_dtensor_host_elems(d), (unsigned long long)count);
  bp_status st = BP_OK;
  for (int k = 0; k < t->local && st == BP_OK; k++)
    st = bp_devio_write_tensor(&t->ranks[k].io, d, src);
  bp_train_params_changed(t); /* even a failed write may have written some */
  return st;
}
