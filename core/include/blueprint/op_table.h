/* The built-in op table: every fact about a built-in op kind
 * (abi/bp_abi_ops.h) in one entry, core/src/op_table.c. The registry
 * registers the kinds from it, the graph builder reads where a backward
 * op's accumulate flag lives, validate reads value ranges, in-place pairs,
 * AMP dtypes, tolerances and gradient-check roles, the profile reads
 * FLOPs. Adding a built-in op is one entry here plus its ABI contract and
 * kernels; ops a module adds are not in this table (their facts come with
 * their bp_abi_layer). */
#ifndef BLUEPRINT_OP_TABLE_H
#define BLUEPRINT_OP_TABLE_H

#include <stdint.h>

#include "bp_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How validate fills one tensor of a case (beyond uniform [-1, 1)). */
typedef enum bp_op_fill_kind {
  BP_OP_FILL_NONE = 0,  /* the end of a fill list */
  BP_OP_FILL_UNIFORM,   /* uniform in [lo, hi) */
  BP_OP_FILL_INT,       /* integers uniform in [lo, hi] */
  BP_OP_FILL_CONST,     /* every element lo */
  BP_OP_FILL_POOL_MASK, /* maxpool mask: an in-bounds window index per element */
  BP_OP_FILL_SEGMENTS,  /* LARS segment table: 0 < ... < the span's elements */
  BP_OP_FILL_RELU_Y,    /* max(0, uniform in [lo, hi)): a relu output */
  BP_OP_FILL_CLASS,     /* integers in [0, channels of input 0): class labels */
} bp_op_fill_kind;

/* One tensor's fill; rmw: an output read before it is written (optimizer
 * state, an accumulating loss), filled by this rule instead of poisoned. */
typedef struct bp_op_fill {
  uint8_t output; /* 0: inputs[index], 1: outputs[index] */
  uint8_t index;
  uint8_t kind; /* bp_op_fill_kind */
  uint8_t rmw;
  double lo, hi;
} bp_op_fill;

/* An FP16 output's tolerance class (validate maps each to its bound). */
typedef enum bp_op_tolerance {
  BP_OP_TOL_LONG_SUM = 0, /* GEMMs, convolutions: long FP16 dot products */
  BP_OP_TOL_WINDOW,       /* window and plane sums */
  BP_OP_TOL_REDUCTION,    /* FP32 sums in another order (statistics, softmax) */
  BP_OP_TOL_SELECT,       /* a selection or a sum of a few terms */
  BP_OP_TOL_EXACT,        /* copies, casts, collectives */
} bp_op_tolerance;

/* Validate's built-in cases of an op, where a generic family covers it;
 * BP_OP_CASES_OWN: validate_cases.c builds them for the op. */
typedef enum bp_op_cases {
  BP_OP_CASES_OWN = 0,
  BP_OP_CASES_SAME_SHAPE, /* every input and output one shape, per plain geometry */
} bp_op_cases;

/* A tensor of an op's node: an input or an output by index. */
typedef struct bp_op_ref {
  uint8_t output;
  uint8_t index;
} bp_op_ref;

/* A backward op's inputs for the gradient check, in terms of its forward
 * op: 'x' the forward input, 'y' the forward output, 'r' the random
 * cotangent of forward output `index`. */
typedef struct bp_op_grad_src {
  char of;
  uint8_t index;
} bp_op_grad_src;

#define BP_OP_MAX_FILLS 6
#define BP_OP_MAX_TENSORS 6 /* graph.h's BP_NODE_MAX_TENSORS */
#define BP_OP_ALL 0xffu     /* a mask of every tensor */

typedef struct bp_op_info {
  bp_abi_op abi; /* name, tensor counts (the most it takes), attribute block */
  /* a backward op's int32 accumulate flag: its byte offset in the block */
  uint8_t accumulates;
  uint32_t accumulate_offset;
  /* the input an IN_PLACE kernel's output 0 may be */
  uint8_t has_inplace, inplace_in;
  /* outputs that are always the very buffers of the same-index inputs
   * (updated in place: batch norm's running statistics, range.scale) */
  uint8_t alias_outputs;
  /* (1.5) the trailing skip input: its index, and the byte offset of
   * has_skip in the attribute block */
  uint8_t has_skip, skip_in;
  uint32_t skip_flag_offset;
  uint8_t collective; /* allreduce.*: run by the communicator, never alone */
  bp_op_fill fills[BP_OP_MAX_FILLS];
  bp_op_cases cases;
  bp_op_tolerance fp16_tolerance;
  /* AMP: no FP16 twin (range ops, the fused ops, collectives); else, per
   * side (bit i: tensor i), tensors an AMP plan keeps FP32, parameters in
   * the compact parameter layout, and a layer input that may be the
   * model's first (padded to 4) */
  uint8_t amp_none;
  uint8_t amp_fp32_in, amp_fp32_out, amp_param_in, amp_param_out, amp_first_in;
  /* FLOPs: 2 * (rows: elements of dims 0..2) * (weight: every element) */
  uint8_t has_flops;
  bp_op_ref flops_rows, flops_weight;
  /* gradient check: a forward op checked by finite differences (kink:
   * 1 inputs away from 0, 2 and 3 input 0 spaced 0.03 / evenly over
   * [-1, 1]); a backward op names its forward op, where each input comes
   * from and which forward input each output is the gradient of */
  uint8_t grad_check;
  uint8_t grad_kink;
  const char *grad_of;
  bp_op_grad_src grad_in[BP_OP_MAX_TENSORS];
  uint8_t grad_out[3];
} bp_op_info;

/* Every entry, in registration order (entries are only appended). */
const bp_op_info *bp_op_table(int *count_out);
/* The entry of a built-in op kind, or NULL (a module's op). */
const bp_op_info *bp_op_find(const char *op);

#ifdef __cplusplus
}
#endif

#endif
