/* Internals of a rank's executor (bind.c: binding and running;
 * exec_program.c: stream programs). Not installed. */
#ifndef BLUEPRINT_EXEC_IMPL_H
#define BLUEPRINT_EXEC_IMPL_H

#include "blueprint/exec.h"
#include "blueprint/threads.h"

#define T_MAX BP_NODE_MAX_TENSORS

/* A node ready to run: its kernel and its two argument blocks (buffer A,
 * buffer B), which point into the descriptor and pointer arrays below. */
typedef struct bound_node {
  int (*run)(void *user, const bp_abi_kernel_args *args);
  void *user;
  bp_abi_kernel_args args[2];
  bp_abi_tensor inputs[T_MAX], outputs[T_MAX];
  const void *in_ptrs[2][T_MAX];
  void *out_ptrs[2][T_MAX];
  const bp_node *node;                /* borrowed from the graph */
  const bp_registered_kernel *kernel; /* borrowed from the registry */
  uint64_t workspace_bytes;
  void *state; /* what the kernel's prepare() made, or NULL; released at destroy */
  int timer_slot; /* its node in the attached timer (bp_exec_set_timer) */
  int lane;         /* bp_exec_node_lane */
  /* bp_exec_fault_line: "rank R, variant V, node N, op O, impl I, module
   * PATH\n", formatted at bind so a signal handler only write()s it */
  int fault_len;
  char fault_line[480];
} bound_node;

typedef struct bound_segment {
  bound_node *nodes;
  int count;
} bound_segment;

struct bp_exec {
  const bp_graph *graph;
  const bp_plan *plan;
  bp_exec_options options;
  char device[64];
  char *base; /* arena base on the device */
  uint64_t arena_bytes;
  int variant_count;
  bound_segment (*segments)[BP_SEGMENT_COUNT]; /* [variant_count] */
  void *workspace;
  uint64_t workspace_bytes;
  uint64_t lane_workspace[BP_EXEC_LANES]; /* bytes of each lane's slice, in lane order */
  const bp_abi_device *dev; /* the device plugin that allocated the workspace, or NULL */
  bp_span ia, ib;
  const bp_abi_threads *threads; /* options.threads, or own_threads' */
  bp_threads *own_threads;       /* made when options.threads is NULL */
  uint64_t params_generation;    /* args->params_generation points here */
  char reason[BP_EXEC_LANES][BP_EXEC_REASON_BYTES]; /* args->reason, by the node's lane */
  bp_exec_timer timer; /* (optional) bp_exec_set_timer; its ctx borrowed */
  int timed;           /* 1 when timer is set */
  uint64_t calls;      /* nodes of the segments run (bp_exec_kernel_calls; atomic) */
  bp_exec_program **programs; /* built so far (bp_exec_program_get), owned */
  int program_count, program_cap;
};

/* exec_program.c: frees the programs (bp_exec_destroy). */
void bp_exec_programs_free(bp_exec *x);

#endif


