/* Models: a layer graph read from YAML (or built in C), compiled into a
 * MemoryPlan with one variant per shape configuration. */
#ifndef BLUEPRINT_MODEL_H
#define BLUEPRINT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bp_layer_type {
  BP_LAYER_CONV = 0,      /* conv2d: filters, kernel, stride, pad, dilation, groups, bias */
  BP_LAYER_BATCHNORM,     /* batch norm over C: eps, momentum */
  BP_LAYER_RELU,
  BP_LAYER_MAXPOOL,       /* kernel, stride, pad */
  BP_LAYER_AVGPOOL,       /* kernel, stride, pad */
  BP_LAYER_GLOBAL_AVGPOOL,
  BP_LAYER_FC,            /* units, bias; flattens H*W*C */
  BP_LAYER_ADD,           /* element-wise sum of two inputs (residual) */
  BP_LAYER_SOFTMAX_CE,    /* softmax cross-entropy: label_smoothing; the loss */
  BP_LAYER_MODULE,        /* a type an op module registered (bp_layer.module) */
  BP_LAYER_GELU,          /* y = x * Phi(x), the exact (erf) form */
  BP_LAYER_ATTENTION,     /* multi-head self-attention over packed [q|k|v]: heads, causal */
  /* ViT layer types */
  BP_LAYER_GELU_TANH,     /* y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  BP_LAYER_LAYERNORM,     /* layer norm over C at each position: eps */
  BP_LAYER_POS_EMBED,     /* y = x + P[H,W,C], P learned */
  /* end of the ViT layer types */
  BP_LAYER_TYPE_COUNT
} bp_layer_type;

/* Bytes of a module layer's attribute block (bp_abi_layer.attr_size). */
#define BP_LAYER_ATTR_MAX 64

struct bp_registered_layer; /* registry.h */

#define BP_MODEL_INPUT (-1) /* producer index meaning "the model's input" */

typedef struct bp_layer {
  bp_layer_type type;
  char name[BP_NAME_MAX]; /* unique; "<type><index>" when the file names none */
  int inputs[2];          /* producer layer indices or BP_MODEL_INPUT */
  int input_count;        /* 1, or 2 for add */
  int64_t units;          /* conv filters / fc units */
  int64_t kernel_h, kernel_w, stride, pad, dilation, groups;
  int bias;               /* conv / fc */
  float eps, momentum;    /* batchnorm */
  float label_smoothing;  /* softmax_ce */
  int line, column;       /* where the layer starts in its file (1-based; 0 if built in C) */
  /* BP_LAYER_MODULE: the type (borrowed from the registry that resolved
   * it, which must outlive the model, its plans and graphs) and its
   * attribute block, filled from the YAML keys by the type's schema. */
  const struct bp_registered_layer *module;
  unsigned char attrs[BP_LAYER_ATTR_MAX];
  int64_t heads; /* attention: heads (divides D) */
  int causal;    /* attention: 1 masks keys after the query */
} bp_layer;

/* Learning-rate schedules (the trainer's bp_schedule_lr runs them, train.h).
 * Every schedule may start with a linear warmup. */
typedef enum bp_lr_schedule {
  BP_LR_CONSTANT = 0, /* lr */
  BP_LR_STEP,         /* lr * gamma^floor(epoch / step_epochs) */
  BP_LR_COSINE,       /* 0.5 * lr * (1 + cos(pi * t / T)) after the warmup */
} bp_lr_schedule;

const char *bp_lr_schedule_name(bp_lr_schedule schedule); /* "constant", "step", "cosine" */
int bp_lr_schedule_from_name(const char *name, bp_lr_schedule *out); /* 0 on success */

/* Training settings a model file may carry; the command line overrides them. */
typedef struct bp_train_settings {
  int64_t batch;        /* training batch (default 128) */
  int64_t eval_batch;   /* evaluation batch (default 200) */
  int64_t train_size;   /* images per epoch (default 60000); sets the last partial batch */
  int64_t epochs;       /* default 3 */
  bp_optimizer optimizer; /* default sgd */
  double lr, momentum, weight_decay; /* defaults 0.05, 0.9, 5e-4 */
  int amp, ema;         /* default off */
  char kernels[256];    /* kernel pins "op_glob=impl,..." (registry.h); "" for none */
  bp_lr_schedule schedule; /* default constant */
  double warmup_epochs;    /* linear warmup over this many epochs' steps (default 0) */
} bp_train_settings;

/* Initial values of one parameter or statistic tensor ("conv1.w",
 * "bn1.running_mean"): compact NHWC FP32, in the plan's layout (model.h's
 * shapes; core/src/compile.c lists the names). A front end that reads
 * trained weights (an ONNX file's initializers) fills them. */
typedef struct bp_model_init {
  char name[BP_NAME_MAX];
  float *values; /* [count], owned by the model */
  uint64_t count;
} bp_model_init;

typedef struct bp_model {
  char name[BP_NAME_MAX];
  char path[4096];      /* file it came from ("" if built in C) */
  int64_t height, width, channels, classes; /* input and label space */
  bp_layer *layers;     /* [layer_count], owned */
  int layer_count;
  bp_train_settings train;
  /* Values that replace the init rules of the tensors they name, before
   * the first step (a trainer writes them after filling the rules; the
   * EMA and FP16 copies follow); owned; NULL and 0: none. */
  bp_model_init *inits;
  int init_count;
} bp_model;

/* Models are read from YAML by the front end (model_yaml.h) or built in C. */
struct bp_registry; /* registry.h */
void bp_model_destroy(bp_model *model); /* NULL is a no-op */

/* "conv", ...; "module" for BP_LAYER_MODULE (a layer's own name of its
 * type is its module's: bp_registered_layer.layer.type). */
const char *bp_layer_type_name(bp_layer_type type);

/* One extra variant: a name, a batch and a resolution. A batch, height or
 * width of 0 stands for the training batch or the model's resolution. */
typedef struct bp_variant_spec {
  char name[BP_NAME_MAX];
  int64_t batch, height, width;
} bp_variant_spec;

typedef struct bp_compile_options {
  bp_plan_options plan;    /* amp, ema, optimizer */
  int64_t batch;           /* global training batch B over all ranks: the "train*" variants */
  int64_t eval_batch;      /* "eval" variant (one rank evaluates the whole batch) */
  int64_t train_size;      /* images per epoch n: "train_last*" variants when n % B != 0 */
  const bp_variant_spec *extra; /* more variants (other batches or resolutions); borrowed */
  int extra_count;
  int64_t eval_size;       /* "eval_last" variant when eval_size % eval_batch != 0 (0: none) */
  int world;               /* ranks R sharing each global batch (0 or 1: one rank); appended */
  int no_reuse;            /* 1: every feature and gradient slot keeps its own bytes (no
                              liveness packing of F32/F16; docs/plan.md) */
  int fuse_bn_relu;        /* 1: each batchnorm whose only reader is a relu runs fused with
                              it, one batchnorm_relu node per pass (FP32 features only:
                              ignored with amp; docs/plan.md, "Fusion"). The plan keeps the
                              choice: liveness packing follows the graph, so the features'
                              offsets differ (not the checkpoint's state). From the model:
                              1 (callers clear it to opt out: bp_train_options.no_fuse;
                              the CLI's BP_FUSE=0); a session then drops it where the
                              run's device or a pin lacks the fused kernels (session.h) */
} bp_compile_options;

/* Options from the model's own training settings (no extra variants, world 1). */
bp_compile_options bp_compile_options_from_model(const bp_model *model);

/* 1 when a run on `device` with kernel `pins` (registry.h; NULL or "" for
 * none) may compile with fuse_bn_relu: `registry` (borrowed) serves all
 * three batchnorm_relu ops there, a pin that applies to one of them names
 * an impl that has it, and no pin names an unfused batchnorm or relu op
 * without also naming the fused ones (a pin is never silently ignored).
 * Else 0, with the reason in `why` (why_size bytes). A session given the
 * run's registry clears fuse_bn_relu when this says 0 (session.h). */
int bp_fuse_bn_relu_allowed(const struct bp_registry *registry, const char *device,
                            const char *pins, char *why, size_t why_size);

/* Lays out every tensor of the model for each variant and finalizes the
 * plan. The plan holds ONE rank's tensors; the training variants are the
 * per-rank batches of data.h's sharding rule (rank r of R takes
 * b / R + (r < b % R) samples of a global batch of b), in this order:
 *   "train"            ceil(B / R)   every step but the epoch's last
 *   "train_small"      floor(B / R)  only when B % R != 0 and it is > 0
 *   "train_last"       ceil(L / R)   the epoch's last batch, L = n % B != 0
 *   "train_last_small" floor(L / R)  only when L % R != 0 and it is > 0
 *   "eval"             eval_batch
 *   "eval_last"        eval_size % eval_batch, when given and nonzero
 * then the extras (a batch of 0 stands for ceil(B / R)). A rank whose share
 * is 0 samples (L < R, or B < R) has no variant of its own: it runs only
 * the segments that need no samples (graph.h). With R = 1 this is "train"
 * (B), "train_last" (L), "eval", "eval_last": the plan of one rank. Every
 * variant shares the offsets (slots are the max over variants, so the
 * smaller per-rank variants never change them); "train" is variant 0 and
 * the largest training batch. Then, unless options->no_reuse, the feature
 * and gradient slots (F32, F16) whose live ranges in the step never
 * overlap share bytes (liveness packing, docs/plan.md; plan.h invariant 8),
 * over the step's graph built with default graph options (session.c; a
 * session keeps the graph it packed over, session.h).
 * The tensors and their names ("input.a", "<layer>.w", "<layer>.out", ...)
 * are listed at the top of core/src/compile.c. Errors are one line naming
 * "file:line:column", the layer and the variant: BP_ERR_INVALID (the model
 * or the options), BP_ERR_SHAPE (shapes or channels that do not fit,
 * including a parameter whose shape would change across variants),
 * BP_ERR_OVERFLOW (a tensor or the plan too large). *plan_out is written
 * only on success; the caller destroys it. */
bp_status bp_model_compile(const bp_model *model, const bp_compile_options *options,
                           bp_plan **plan_out);

#ifdef __cplusplus
}
#endif
#endif
