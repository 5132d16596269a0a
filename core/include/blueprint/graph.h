/* Graphs: what runs in a training step, in which order, over which tensors
 * of the plan (docs/architecture.md, "Data flow").
 *
 * A graph is built once from a model and its compiled plan, per variant.
 * Each variant's nodes are grouped in segments; the executor (exec.h) runs
 * one segment at a time. A node is either
 *  - a compute node: an op of abi/bp_abi_ops.h over DTensor ids, with the
 *    op's attribute block; or
 *  - a range node: a range.* / allreduce.* op over byte spans of the arena
 *    (bp_plan_resolve), each span seen by the kernel as one tensor
 *    [1,1,1,bytes/dtype size]; scalars (lr, step) are DTensor ids.
 *
 * Segments of a training step, in the order the trainer runs them:
 *   TRANSFER   host staging -> I_A/I_B. Empty on the cpu device: the loader
 *              writes the arena's input buffers itself.
 *   ZERO_GRAD  one range.zero over the gradient span (G_BN_BIAS..G_CONV_DEEP;
 *              G16 under AMP, where the backward writes FP16 gradients). Run
 *              only by a rank with no samples in the step: BACKWARD
 *              overwrites every gradient it reaches, and a gradient it
 *              never reaches (and the slots' padding) stays 0 from the
 *              zeroed arena, as the reductions of zeros give zeros.
 *   CAST       AMP: range.cast of the W span into the A span (2:1).
 *   FORWARD    one node per layer, training mode (batch norm on batch
 *              statistics, running statistics updated in B).
 *   LOSS       softmax_ce.fwd_bwd: loss and correct count added into R,
 *              dlogits written into the logits' gradient slot,
 *              grad_scale = 1 / global batch of the variant: the samples
 *              of the step over all ranks, B for "train" and "train_small",
 *              L = train_size % B for "train_last" and "train_last_small"
 *              (each rank's share may differ; the sum over ranks is the
 *              gradient of the mean loss of the global batch).
 *   BACKWARD   layers in reverse order: parameter gradients into their G
 *              slots and data gradients into the producers' ".dout" slots.
 *              A slot written by several nodes (a residual branch) is
 *              written with accumulate = 1 by every one of them, after a
 *              range.zero of the slot placed right before its first
 *              writer; a slot with one writer is overwritten
 *              (accumulate = 0) and never zeroed. A node has one flag for
 *              all its outputs: when one of its slots accumulates, its
 *              other slots are zeroed before it too.
 *   CAST_GRAD  AMP: range.zero of the S scalar found_inf, then range.unscale
 *              of the G16 span into the G span (g = g16 / loss_scale, one
 *              node per span, the loss scale an input from S).
 *   COMM       world > 1: the gradient spans in two buckets, deep conv
 *              first, then the rest; the BN running statistics by
 *              allreduce.sum scaled by 1/world: an unweighted mean over the
 *              ranks, each rank having normalized with its own local batch
 *              statistics (like PyTorch DDP without SyncBN), whatever its
 *              share of the batch. Sharded update (the default for SGD and
 *              AdamW): allreduce.reduce_scatter of each gradient bucket, so
 *              each rank holds the sum of its own chunk (bp_abi_chunk_start)
 *              of it. Replicated (LARS, whose trust ratios need whole
 *              tensors, options.replicate_update, or AMP): allreduce.sum of each
 *              bucket. Empty for one rank. AMP always replicates: every
 *              rank then holds the same G bits, so the overflow check
 *              below gives every rank the same decision (docs/amp.md).
 *   UPDATE     AMP first: range.nan_check over the whole G span into the
 *              S scalar found_inf (zeroed in CAST_GRAD), and every node
 *              below (and EMA's) takes found_inf as its skip input
 *              (has_skip): a step whose gradients overflowed changes no
 *              parameter, moment or EMA copy.
 *              One optimizer node per span, never one per tensor: the
 *              decayed span W_FC_WEIGHT..W_CONV_DEEP (weights) and the
 *              bias-like span W_BN_BIAS..W_FC_BIAS (no weight decay); with
 *              a sharded update the decayed span is cut at the bucket
 *              boundary (deep conv, the rest), and each node carries its
 *              place in its bucket (bp_node.shard_domain/shard_first): the
 *              executor binds it to the slice the rank's chunk covers, so a
 *              rank updates only the parameters and moments it owns.
 *              SGD: range.sgd, weight decay coupled (added to the gradient,
 *              as PyTorch's SGD). AdamW: range.adamw, decay decoupled
 *              (w -= lr*wd*w). LARS: range.lars on the weights (trust ratio
 *              per weight, from the lars.segments table), range.sgd with
 *              no decay on the bias-like span (as LARS papers exclude
 *              biases and BN parameters).
 *   GATHER     sharded update: allreduce.all_gather of the W span of each
 *              bucket, so every rank holds every updated parameter (the
 *              same bits as a replicated update). Empty otherwise.
 *   EMA        range.ema of the W span into the E span. AMP, last in the
 *              step: range.loss_scale (in: found_inf; out: the S scalars
 *              loss_scale, good_steps, step, skipped), after every node
 *              that reads the loss scale or the step counter.
 * Other segments:
 *   EVAL       evaluation forward: batch norm on running statistics,
 *              softmax_ce without a gradient (loss and correct into R);
 *              parameters from E (EMA copies) when options ask for them.
 *              Under AMP the eval variant's CAST casts W (or E) into A.
 *   RESET      range.zero over R, before an epoch or an evaluation: R
 *              accumulates loss and correct counts until it is read.
 *   INIT       run once before the first step of a run (not on resume):
 *              range.copy of W into E (EMA).
 *   STATE      sharded update: allreduce.all_gather of the M (and V) spans
 *              of each bucket, run on every rank before a checkpoint, so
 *              rank 0 holds every moment. Between checkpoints a rank's
 *              moments are current only in its own chunks.
 * Training variants ("train", "train_small", "train_last",
 * "train_last_small" and the extras; model.h) get TRANSFER .. EMA, RESET
 * and INIT; evaluation variants ("eval", "eval_last") get TRANSFER, CAST,
 * EVAL and RESET.
 *
 * A rank with no samples in a step (its share of a global batch smaller
 * than the rank count is 0) runs only ZERO_GRAD, CAST_GRAD, COMM, UPDATE,
 * GATHER and EMA of a training variant of that step: it adds zero gradients to
 * the sum and applies the same update as the others. It skips TRANSFER,
 * CAST, FORWARD, LOSS and BACKWARD, so its BN running statistics enter the
 * mean as they were before the step, its R is unchanged, and under AMP its
 * A copy is refreshed only by its next CAST.
 *
 * Invariants (bp_graph_build checks them and refuses a graph that breaks one):
 *  1. every DTensor id a node names exists in the plan; every span lies
 *     inside the arena and its bytes are a multiple of the dtype size;
 *  2. the spans of one optimizer node have equal bytes (W, G, M, V mirror
 *     each other, plan invariant 6), and a cast's FP32 span is twice its
 *     FP16 span;
 *  3. inputs read I_A; the executor substitutes the I_B twin (same relative
 *     offset) for steps that use buffer B;
 *  4. a node has at most BP_NODE_MAX_TENSORS inputs and as many outputs;
 *  5. a sharded node's spans lie inside its bucket: shard_first + the
 *     elements of its spans <= shard_domain. */
#ifndef BLUEPRINT_GRAPH_H
#define BLUEPRINT_GRAPH_H

#include <stdint.h>

#include "blueprint/model.h"
#include "blueprint/plan.h"
#include "bp_abi_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bp_segment {
  BP_SEGMENT_TRANSFER = 0,
  BP_SEGMENT_ZERO_GRAD,
  BP_SEGMENT_CAST,
  BP_SEGMENT_FORWARD,
  BP_SEGMENT_LOSS,
  BP_SEGMENT_BACKWARD,
  BP_SEGMENT_CAST_GRAD,
  BP_SEGMENT_COMM,
  BP_SEGMENT_UPDATE,
  BP_SEGMENT_GATHER,
  BP_SEGMENT_EMA,
  BP_SEGMENT_EVAL,
  BP_SEGMENT_RESET,
  BP_SEGMENT_INIT,
  BP_SEGMENT_STATE,
  BP_SEGMENT_COUNT
} bp_segment;

/* "transfer", "zero_grad", ... */
const char *bp_segment_name(bp_segment segment);

#define BP_NODE_MAX_TENSORS 6

/* One tensor of a node: a DTensor of the plan, or a span of the arena. A
 * span also says what it covers, so that when the plan is laid out again
 * (liveness packing, session.h) the graph moves it with the plan instead of
 * being built again: the slot of DTensor `slot` in the node's variant, or
 * (slot == -1) the plan's regions [first, last]. */
typedef struct bp_node_tensor {
  int32_t id;     /* DTensor id, or -1 for a span */
  bp_span span;   /* id == -1: the bytes, seen as [1,1,1,bytes/size of dtype] */
  bp_dtype dtype; /* id == -1: the span's dtype (a DTensor carries its own) */
  int32_t slot;   /* id == -1: the DTensor whose slot the span is, or -1 */
  bp_region first, last; /* id == -1 and slot == -1: the regions it spans */
} bp_node_tensor;

/* Every attribute block of abi/bp_abi_ops.h; `attr_size` says which. */
typedef union bp_node_attrs {
  bp_conv2d_attrs conv2d;
  bp_fc_attrs fc;
  bp_elementwise_attrs elementwise;
  bp_pool_attrs pool;
  bp_batchnorm_attrs batchnorm;
  bp_softmax_ce_attrs softmax_ce;
  bp_range_attrs range;
  bp_optimizer_attrs optimizer;
  bp_allreduce_attrs allreduce;
  bp_loss_scale_attrs loss_scale;
  bp_attention_attrs attention;
  bp_layernorm_attrs layernorm; /* ViT ops */
  unsigned char bytes[BP_LAYER_ATTR_MAX]; /* a module layer's block (bp_abi_layer) */
} bp_node_attrs;

typedef struct bp_node {
  const char *op; /* "conv2d.fwd", "range.sgd", ...; static storage, or the
                     registry's for a module layer's op (model.h) */
  char name[96];  /* for messages: "conv1.fwd", "update.decay", ... */
  int layer;      /* the model layer it comes from, or -1 */
  int num_inputs, num_outputs;
  bp_node_tensor inputs[BP_NODE_MAX_TENSORS];
  bp_node_tensor outputs[BP_NODE_MAX_TENSORS];
  bp_node_attrs attrs;
  uint32_t attr_size; /* bytes of the op's block in attrs (0: none) */
  uint32_t attr_version; /* the block's version; 0 means BP_ABI_ATTR_VERSION */
  /* A sharded range node (shard_domain > 0): its spans (of equal element
   * counts) are elements [shard_first, shard_first + E) of a bucket of
   * shard_domain elements, and a rank runs it only on the part that lies in
   * its own chunk of the bucket (bp_abi_chunk_start), the same part of
   * every span. 0: every rank runs the whole node. */
  uint64_t shard_domain, shard_first;
} bp_node;

/* Data the trainer writes into a tensor once, before the first step (the
 * LARS segment table). */
typedef struct bp_graph_constant {
  int32_t id;       /* DTensor id */
  const void *data; /* host bytes, owned by the graph */
  uint64_t bytes;
} bp_graph_constant;

/* Optimizer hyper-parameters of the update nodes. The optimizer itself is
 * the plan's (bp_plan_options). */
typedef struct bp_graph_optimizer {
  float momentum;          /* sgd, lars */
  float weight_decay;      /* on the decayed span only */
  int nesterov;            /* sgd */
  float beta1, beta2, eps; /* adamw */
  float eta;               /* lars trust coefficient */
} bp_graph_optimizer;

typedef struct bp_graph_options {
  int world;            /* ranks (>= 1); COMM is built when > 1 */
  int64_t global_batch; /* samples per step over all ranks ("train", "train_small") */
  int64_t train_size;   /* samples per epoch: sets the "train_last*" global batch */
  bp_graph_optimizer optimizer;
  int eval_ema;    /* 1: EVAL reads the E copies (needs the plan's ema) */
  float ema_decay; /* range.ema */
  int replicate_update; /* 1: every rank updates every parameter (allreduce.sum)
                           instead of its own chunk (sharded; SGD and AdamW) */
  /* AMP (the plan's): range.loss_scale's attributes (bp_abi_ops.h) */
  bp_loss_scale_attrs loss_scale; /* growth 2, backoff 0.5, interval 2000; 0: static */
} bp_graph_options;

/* Defaults: world 1, momentum 0.9, weight decay 5e-4, no nesterov, beta1
 * 0.9, beta2 0.999, eps 1e-8, eta 0.001, ema decay 0.999; loss scale
 * growth 2 every 2000 clean steps, backoff 0.5 (PyTorch's GradScaler).
 * The batch and train size must still be set. */
void bp_graph_options_init(bp_graph_options *options);

typedef struct bp_graph bp_graph; /* opaque */

/* Builds the graph of every variant of `plan` (compiled from `model` by
 * bp_model_compile; both borrowed and must outlive the graph). Tensors are
 * the ids the compiler recorded with the plan, never looked up by name.
 * BP_ERR_INVALID for bad options,
 * BP_ERR_UNSUPPORTED for a model the graph cannot express (an add of a
 * layer with itself), BP_ERR_STATE when the plan does not match the model
 * or breaks an invariant above. *graph_out is written only on success. */
bp_status bp_graph_build(const bp_model *model, const bp_plan *plan,
                         const bp_graph_options *options, bp_graph **graph_out);
void bp_graph_destroy(bp_graph *graph); /* NULL is a no-op */

const bp_plan *bp_graph_plan(const bp_graph *graph);
const bp_graph_options *bp_graph_get_options(const bp_graph *graph);
/* 1 for "eval" and "eval_last", 0 for training variants. */
int bp_graph_variant_is_eval(const bp_graph *graph, int variant);
/* Samples over all ranks of one step of `variant` (sets grad_scale). */
int64_t bp_graph_variant_global_batch(const bp_graph *graph, int variant);

/* Nodes of one segment of one variant, in run order; NULL / 0 when out of
 * range. Borrowed from the graph. */
int bp_graph_node_count(const bp_graph *graph, int variant, bp_segment segment);
const bp_node *bp_graph_node(const bp_graph *graph, int variant, bp_segment segment, int index);

/* Ids of the tensors every compiled model has (core/src/compile.c lists
 * them), as the compiler recorded them: the input and label in I_A ([0])
 * and I_B ([1]), the scalars and the results; the AMP scalars (-1 without
 * AMP). */
typedef struct bp_graph_tensors {
  int32_t input[2], label[2];
  int32_t lr, loss_scale, step;
  int32_t loss, correct;
  int32_t found_inf, good_steps, skipped;
} bp_graph_tensors;
/* Borrowed from the graph; NULL for NULL. */
const bp_graph_tensors *bp_graph_get_tensors(const bp_graph *graph);

int bp_graph_constant_count(const bp_graph *graph);
const bp_graph_constant *bp_graph_constant_get(const bp_graph *graph, int index);

#ifdef __cplusplus
}
#endif
#endif
