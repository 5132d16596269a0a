/* Layer types: one descriptor per type, the only place that says what a
 * type reads from a model file, which shape it has, which tensors it gets
 * in the plan and which nodes it adds to the graph. The parser
 * (model_yaml.c), the model checks (model.c), the compiler (compile.c) and
 * the graph build (graph_build.c) loop over these descriptors; none of them
 * switches on a layer type. Not installed.
 *
 * Files: layers.c (the table, keys and defaults), layer_conv_fc.c (conv,
 * fc), layer_norm_act.c (batchnorm, layernorm, relu, gelu, gelu_tanh, add),
 * layer_pos_embed.c (pos_embed), layer_pool.c (maxpool,
 * avgpool, global_avgpool), layer_loss.c (softmax_ce), layer_module.c
 * (types op modules register through host->register_layer),
 * layer_attention.c (attention).
 *
 * Tensor ids flow from the compiler to the graph build: compile.c records
 * the ids of every layer's tensors (bp_layer_tensors) while it allocates
 * them, once (they are the same in every variant, plan.h), and keeps the
 * record with the plan; the graph build reads ids, never names. */
#ifndef BLUEPRINT_LAYER_IMPL_H
#define BLUEPRINT_LAYER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/graph.h"
#include "blueprint/registry.h"
#include "model-impl.h"
#include "plan-impl.h"

/* ---- YAML keys ------------------------------------------------------------ */

typedef enum bp_key_kind {
  BP_KEY_INT,    /* int64_t field: a plain integer */
  BP_KEY_KERNEL, /* kernel_h and kernel_w: `3` or `[3, 5]` */
  BP_KEY_NUMBER, /* float field: a plain decimal number */
  BP_KEY_BOOL,   /* int field: true or false */
} bp_key_kind;

/* One YAML key of a built-in type, the bp_layer field it fills, and the
 * values it accepts. The same descriptor serves every type that takes the
 * key (kernel, stride and pad of conv and the pools), so a key has one
 * default and one range. */
typedef struct bp_layer_key {
  const char *key;      /* in the file: "filters" */
  const char *field;    /* the bp_layer member, for models built in C: "units" */
  bp_key_kind kind;
  size_t offset;        /* of that member in bp_layer (KERNEL: of kernel_h) */
  double lo, hi;        /* accepted values: lo <= x <= hi ... */
  int lo_open, hi_open; /* ... or lo < x, x < hi */
  double default_value; /* what bp_layer_set_defaults writes */
  int required;         /* 1: a file must give it */
} bp_layer_key;

/* ---- compiling one layer in one variant ------------------------------------ */

/* Ids of one layer's tensors in the plan, the same in every variant; -1
 * for what the layer does not have. */
typedef struct bp_layer_tensors {
  int32_t out, dout;       /* feature and its gradient slot (softmax_ce: none) */
  bp_param_ids weight;     /* conv/fc "w"; batchnorm "weight" (gamma) */
  bp_param_ids bias;       /* conv/fc "b"; batchnorm "bias" (beta) */
  int32_t running[2];      /* batchnorm running mean, var (B) */
  int32_t saved[2];        /* batchnorm save_mean, save_invstd; attention [0]: lse */
  int32_t mask;            /* maxpool argmax */
  int32_t prob;            /* softmax_ce probabilities (T) */
  int32_t saved_by_module[BP_ABI_LAYER_SAVED_MAX]; /* a module layer's "<l>.saved<k>" */
} bp_layer_tensors;

/* Ids of the tensors every model has (compile.c lists them). */
typedef struct bp_global_tensors {
  int32_t input[2], label[2]; /* I_A, I_B */
  int32_t lr, loss_scale, step;
  int32_t loss, correct;
  int32_t lars_segments, lars_norms; /* -1 unless LARS with weights */
  int32_t found_inf, good_steps, skipped; /* -1 unless AMP (dynamic loss scaling) */
} bp_global_tensors;

/* What compile.c keeps with the plan for the graph build (plan-impl.h). */
typedef struct bp_model_tensors {
  int layer_count;
  bp_layer_tensors *layers;     /* [layer_count] */
  char (*names)[BP_NAME_MAX];   /* [layer_count] the layers it was compiled from */
  bp_layer_type *types;         /* [layer_count] */
  bp_global_tensors globals;
  int fuse_bn_relu; /* the graph fuses batchnorm + relu (bp_compile_options) */
} bp_model_tensors;

/* The record kept with a plan bp_model_compile made; NULL for any other. */
static inline const bp_model_tensors *bp_model_tensors_of(const bp_plan *plan) {
  return bp_plan_attachment(plan);
}

/* One layer being compiled in one variant (compile.c fills it). */
typedef struct bp_layer_compile {
  const bp_model *model;
  const bp_layer *layer;
  int index;            /* of the layer in the model */
  bp_plan *plan;
  const char *variant;  /* the open variant's name */
  bp_dtype fx;          /* feature dtype: FP16 under AMP, else FP32 */
  bp_shape in[2];       /* the producers' output shapes (input_count of them) */
  bp_shape out;         /* the layer's output shape: shape() writes it */
  bp_layer_tensors *t;  /* the record to fill (written in every variant, equal ids) */
  bp_global_tensors *globals; /* the loss writes "loss" and "correct" there */
  void *impl;           /* compile.c's own context */
} bp_layer_compile;

/* "file:line:column: layer 'name' (variant 'v'): <fmt>" with status st. */
bp_status bp_layer_fail(const bp_layer_compile *c, bp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The plan's last error with the layer's context in front. */
bp_status bp_layer_plan_fail(const bp_layer_compile *c, bp_status st);
/* A parameter "<layer>.<what>" and its family (plan.h), seeded by its name. */
bp_status bp_layer_param(const bp_layer_compile *c, bp_param_kind kind, const char *what,
                         bp_shape shape, bp_init_kind rule, bp_param_ids *ids);
/* The same with the rule's arguments (init.a, init.b; its seed is ignored:
 * the name's): a normal(0, 0.02) initialization. */
bp_status bp_layer_param_init(const bp_layer_compile *c, bp_param_kind kind, const char *what,
                              bp_shape shape, bp_init init, bp_param_ids *ids);
/* A feature "<layer>.<what>" (F32 or F16 by dtype). */
bp_status bp_layer_feature(const bp_layer_compile *c, const char *what, bp_shape shape,
                           bp_dtype dtype, int32_t *id);
/* "<layer>.<what>" into out (BP_NAME_MAX bytes). */
const char *bp_layer_tensor_name(char *out, const bp_layer *l, const char *what);
/* The output of a sliding window (conv, pools) into c->out, channels
 * kept: (in + 2*pad - (dilation*(k-1)+1)) / stride + 1 (layer_conv_fc.c). */
bp_status bp_layer_window_shape(bp_layer_compile *c, int64_t dilation);
/* "[n,h,w,c]" */
const char *bp_shape_str(bp_shape s, char *buf, size_t size);
/* The name of producer p for messages ("input" for the model's input). */
const char *bp_layer_producer_name(const bp_model *m, int p);

/* ---- building one layer's nodes ------------------------------------------- */

/* One layer in the graph of one variant (graph_build.c fills it). */
typedef struct bp_layer_graph {
  const bp_model *model;
  const bp_layer *layer;
  int index;
  const bp_layer_tensors *t;     /* this layer's tensors */
  const bp_global_tensors *globals;
  int eval;                      /* forward: evaluation mode (BN on running statistics) */
  int64_t global_batch;          /* samples of one step over all ranks (grad_scale) */
  /* batchnorm: the tensors of the relu fused into it (its only reader;
   * graph_build.c decides), or NULL: the layer then writes relu(BN(x))
   * into that relu's ".out" and takes its gradient from its ".dout" */
  const bp_layer_tensors *fused_relu;
  void *impl;                    /* graph_build.c's own context */
} bp_layer_graph;

/* A forward node "<layer>.<what>" running `op`, appended to the segment
 * being built. */
bp_node *bp_layer_node(bp_layer_graph *g, const char *op, const char *what);
/* A backward node "<layer>.<what>" of a built-in op: its accumulate flag
 * (where the op table says) is set once every writer of its gradient
 * slots is known (graph.h, BACKWARD). */
bp_node *bp_layer_backward_node(bp_layer_graph *g, const char *op, const char *what);
/* The same for a module's op, its flag an int32_t at byte
 * accumulate_offset of the attribute block. */
bp_node *bp_layer_backward_node_at(bp_layer_graph *g, const char *op, const char *what,
                                   size_t accumulate_offset);
void bp_node_in(bp_node *n, int32_t id);
void bp_node_out(bp_node *n, int32_t id);
/* An output of the last backward node that is a gradient slot (counted
 * for accumulate). */
void bp_layer_grad_out(bp_layer_graph *g, bp_node *n, int32_t id);
/* The id input k reads in the forward pass. */
int32_t bp_layer_input(const bp_layer_graph *g, int k);
/* Where the gradient of input k goes: the producer's ".dout", or the
 * layer's own ".out" as a sink for the model's input (graph_build.c). */
int32_t bp_layer_input_grad(const bp_layer_graph *g, int k);
/* 1 when input k's producer needs its gradient. */
int bp_layer_input_needs_grad(const bp_layer_graph *g, int k);
/* The parameter a forward reads (A under AMP, E in an EMA evaluation, else
 * W) and the gradient slot of a parameter (G16 under AMP, else G). */
int32_t bp_layer_param_in(const bp_layer_graph *g, const bp_param_ids *p);
int32_t bp_layer_param_grad(const bp_layer_graph *g, const bp_param_ids *p);

/* Sets a node's attribute block: member `m` of bp_node_attrs has the type
 * bp_<m>_attrs (bp_abi_ops.h). */
#define BP_SET_ATTRS(node, member, ...)                      \
  do {                                                       \
    (node)->attrs.member = (bp_##member##_attrs)__VA_ARGS__; \
    (node)->attr_size = sizeof((node)->attrs.member);        \
  } while (0)

/* ---- the descriptor ------------------------------------------------------- */

typedef struct bp_layer_desc {
  const char *name;   /* the `type:` of a model file */
  int inputs;         /* 1 (`input:`), or 2 (`inputs: [a, b]`) */
  const bp_layer_key *const *keys; /* the YAML keys besides type, name, input(s) */
  int key_count;
  int stride_is_kernel; /* a window that moves by its own size unless `stride:` says */
  int has_params;       /* parameters: gradients upstream of it matter */
  int decayed_weights;  /* weights it puts in the decayed span (LARS counts them) */
  int no_feature;       /* no ".out"/".dout" (the loss) */
  /* (optional; NULL: yes) whether the loss's gradient flows back through
   * the layer to its inputs. */
  int (*passes_grad)(const bp_layer *l);
  /* (optional) checks across fields; 0, or -1 with a message in why. */
  int (*check)(const bp_layer *l, char *why, size_t why_size);
  /* Writes c->out from c->in, or fails through bp_layer_fail. */
  bp_status (*shape)(bp_layer_compile *c);
  /* (optional) parameters and tensors besides ".out" and ".dout", which
   * follow them unless no_feature. Records the ids in c->t. */
  bp_status (*alloc)(bp_layer_compile *c);
  /* The forward node(s) into the segment being built. */
  void (*forward)(bp_layer_graph *g);
  /* (optional) the backward node(s), in run order; called only when the
   * layer reaches the loss and needs its gradient. */
  void (*backward)(bp_layer_graph *g);
} bp_layer_desc;

/* The descriptor of `type`, or NULL when out of range. */
const bp_layer_desc *bp_layer_desc_of(bp_layer_type type);
/* The descriptor a layer uses: its type's (a module layer's is generic). */
const bp_layer_desc *bp_layer_desc_for(const bp_layer *l);
/* The layer's type name as a file writes it ("conv", or a module's type). */
const char *bp_layer_kind(const bp_layer *l);

/* Every key some built-in type takes, each once, into out[cap]; returns
 * the count. */
#define BP_LAYER_KEYS_MAX 32
int bp_layer_all_keys(const bp_layer_key **out, int cap);

/* Built-in descriptors, one per family file. */
extern const bp_layer_desc bp_layer_conv, bp_layer_fc;
extern const bp_layer_desc bp_layer_batchnorm, bp_layer_relu, bp_layer_gelu, bp_layer_add;
extern const bp_layer_desc bp_layer_maxpool, bp_layer_avgpool, bp_layer_global_avgpool;
extern const bp_layer_desc bp_layer_softmax_ce;
extern const bp_layer_desc bp_layer_module;
extern const bp_layer_desc bp_layer_attention; /* layer_attention.c */
extern const bp_layer_desc bp_layer_gelu_tanh, bp_layer_layernorm; /* layer_norm_act.c */
extern const bp_layer_desc bp_layer_pos_embed;                     /* layer_pos_embed.c */

/* Shared keys (layers.c). */
extern const bp_layer_key bp_key_kernel, bp_key_stride, bp_key_pad, bp_key_bias;

/* ---- module layers (layer_module.c) --------------------------------------- */

/* Checks a module layer's attribute block against its schema (values in
 * range); 0, or -1 with a message in why. */
int bp_layer_module_check(const bp_layer *l, char *why, size_t why_size);

#endif
