/* Where the time of a training step goes: kernel time per bound node
 * (`blueprint train --profile`, docs/profile.md).
 *
 * A profile is attached to one executor (bp_exec_set_profile: the trainer
 * attaches the one in bp_train_options.profile to its first local rank,
 * rank 0 of the run) and records, per bound node of every variant, how many
 * times its kernel ran and the nanoseconds it took, and per variant the wall
 * time of the steps (bp_profile_step_begin/_end, called by the trainer around
 * a training step or an evaluation batch). Nodes run outside a step (the
 * RESET segment, the CAST before an evaluation) are not recorded.
 *
 * Clock: CLOCK_MONOTONIC. In a profiled segment run the executor reads the
 * clock once before the first node and once after each node, and charges a
 * node the time from the previous reading to its own: the node times of a
 * segment run partition that run's interval exactly (the loop's own few
 * instructions go to the node they follow). On the cpu device kernels run
 * synchronously on the rank's thread, so a node's time is its kernel's; on
 * a device with a stream it is only the time to enqueue its work.
 *
 * Invariants (of every variant v, at any point between steps):
 *  1. sum of the ns of v's nodes == v's run_ns (the summed intervals of its
 *     profiled segment runs), exactly;
 *  2. run_ns <= step_ns: segment runs nest inside the steps' intervals.
 *  step_ns - run_ns is the step's time outside kernels (scalars written,
 *  batches taken, ranks waiting for each other).
 *
 * Cost when off: the executor tests one pointer per segment run and per
 * node, and reads no clock. Threads: recording and reading happen on the
 * thread that runs the rank's segments and, ordered with it, the trainer's;
 * a profile is not safe to read while a step runs. */
#ifndef BLUEPRINT_PROFILE_H
#define BLUEPRINT_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_profile bp_profile; /* opaque */

/* Side of the square SGEMM whose rate is the yardstick (M = N = K). */
#define BP_PROFILE_SGEMM_SIZE 1024
/* Timed runs of one measurement of the yardstick, at most. */
#define BP_PROFILE_SGEMM_MAX_RUNS 50
/* Timed runs a profile pools over all its measurements, at most: later
 * measurements are skipped once it holds this many. */
#define BP_PROFILE_SGEMM_POOL 1000

typedef struct bp_profile_options {
  int64_t sgemm_size; /* M = N = K of the rate measurement; 0: BP_PROFILE_SGEMM_SIZE;
                         < 0: not measured */
} bp_profile_options;

/* One bound node. Strings are borrowed from the graph, plan and registry
 * the executor was bound to: they live as long as those. */
typedef struct bp_profile_node {
  int variant;         /* plan variant index */
  bp_segment segment;
  const char *name;    /* graph node name */
  const char *op, *impl;
  uint64_t flops;      /* floating-point operations of one call: conv2d.* and fc.* only
                          (bp_profile_op_flops), else 0 */
  uint64_t calls;      /* kernel runs recorded */
  uint64_t ns;         /* their summed time */
} bp_profile_node;

typedef struct bp_profile_variant {
  const char *name;    /* "train", "eval", ... (borrowed from the plan) */
  uint64_t steps;      /* steps (evaluation batches for eval variants) timed */
  uint64_t step_ns;    /* their wall time */
  uint64_t run_ns;     /* time of the profiled segment runs (invariant 1) */
} bp_profile_variant;

/* Time of the nodes of one op (and kernel) in a variant. */
typedef struct bp_profile_op {
  const char *op, *impl;
  int nodes;           /* nodes of the variant bound to it */
  uint64_t calls, ns;
  uint64_t flops;      /* summed over the calls */
} bp_profile_op;

/* The yardstick: the rate of the fc.fwd kernel the registry picks for an
 * M x K times K x N FP32 product, on the rank's threads. A profile's
 * yardstick pools every measurement of it (bp_profile_measure_sgemm: the
 * trainer measures before the first step and after each epoch's steps),
 * so that a machine whose speed drifts during the run is held against
 * its speed over the run, not at its start. */
typedef struct bp_profile_sgemm {
  int measured;        /* 0: see why */
  int64_t m, n, k;
  const char *impl;    /* the kernel picked (borrowed from the registry) */
  int threads;         /* threads it ran on */
  int measurements;    /* measurements pooled (1 for bp_profile_sgemm_measure) */
  int runs;            /* timed runs of the measurements pooled (each warms up once) */
  double best_seconds; /* the fastest run */
  double gflops;       /* 2*m*n*k / best_seconds / 1e9 */
  double median_gflops; /* the same of the median run: what a run sustains on
                           a busy or drifting machine, often 10-25% less */
  uint64_t run_ns[BP_PROFILE_SGEMM_MAX_RUNS]; /* each run's time of the (last)
                                                 measurement, fastest first */
  char why[256];       /* when not measured: why */
} bp_profile_sgemm;

/* options: NULL for the defaults. Destroy NULL is a no-op. */
bp_status bp_profile_create(const bp_profile_options *options, bp_profile **profile_out);
void bp_profile_destroy(bp_profile *profile);

/* FLOPs of one call of a node (2 per multiply-add), from its op and bound
 * shapes: conv2d.fwd, .bwd_data and .bwd_filter 2*N*OH*OW*K*kh*kw*C/groups
 * (N, OH, OW, K from y or dy; kh, kw, C/groups from w or dw); fc.fwd,
 * .bwd_data and .bwd_filter 2*N*in*out. 0 for every other op. */
uint64_t bp_profile_op_flops(const char *op, const bp_abi_kernel_args *args);

/* ---- recording (the executor and the trainer) ---------------------------- */

/* Declares variant v (0, 1, ... in order) and each bound node; the slot is
 * what bp_profile_node_time takes. BP_ERR_NOMEM, or BP_ERR_STATE once a
 * step was recorded. */
bp_status bp_profile_add_variant(bp_profile *p, int variant, const char *name);
bp_status bp_profile_add_node(bp_profile *p, int variant, bp_segment segment, const char *name,
                              const char *op, const char *impl, const bp_abi_kernel_args *args,
                              int *slot_out);

/* A step of `variant` starts / ends; segment runs in between are recorded. */
void bp_profile_step_begin(bp_profile *p, int variant);
void bp_profile_step_end(bp_profile *p);
/* 1 between step_begin and step_end. */
int bp_profile_recording(const bp_profile *p);
/* The recorded time of one kernel run, and of one segment run of `variant`. */
void bp_profile_node_time(bp_profile *p, int slot, uint64_t ns);
void bp_profile_run_time(bp_profile *p, int variant, uint64_t ns);

/* Nanoseconds on CLOCK_MONOTONIC (the executor's clock, bp_exec_now_ns). */
uint64_t bp_profile_now_ns(void);

/* Attaches `profile` (borrowed, must outlive the executor) as the
 * executor's timer (exec.h, bp_exec_timer): declares every variant and
 * bound node in it, then times each node of the segment runs made while it
 * records. One profile per executor, and only before its first step. NULL
 * detaches (no clock is read then). */
bp_status bp_exec_set_profile(bp_exec *exec, bp_profile *profile);

/* Measures the yardstick of the profile (its options' sgemm_size; none
 * when negative) with bp_profile_sgemm_measure and pools the runs with
 * those of its earlier measurements (up to BP_PROFILE_SGEMM_POOL runs):
 * the rate is then that of the fastest and of the median run of the pool.
 * A measurement that fails leaves an earlier one as it was. */
void bp_profile_measure_sgemm(bp_profile *p, bp_registry *registry, const char *device,
                              const bp_abi_threads *threads);
/* Times the fc.fwd kernel that `registry` picks on `device` (no pins, no
 * autotune) for a size x size by size x size FP32 product in host memory
 * (so the cpu device only) on `threads` (borrowed for the call): one
 * warm-up, then at least 3 runs and up to 0.25 s (and
 * BP_PROFILE_SGEMM_MAX_RUNS); the fastest counts. A failure to measure is
 * no error: out->measured 0 and out->why say so. */
void bp_profile_sgemm_measure(bp_registry *registry, const char *device,
                              const bp_abi_threads *threads, int64_t size, bp_profile_sgemm *out);

/* ---- reading ------------------------------------------------------------- */

int bp_profile_variant_count(const bp_profile *p);
const bp_profile_variant *bp_profile_variant_at(const bp_profile *p, int variant);
/* Index of the variant named `name`, -1 when none. */
int bp_profile_variant_find(const bp_profile *p, const char *name);
/* Nodes in variant, segment and binding order. */
int bp_profile_node_count(const bp_profile *p);
const bp_profile_node *bp_profile_node_at(const bp_profile *p, int index);
/* The ops of `variant` by (op, impl), most time first; writes at most
 * `max` and returns how many there are. */
int bp_profile_ops(const bp_profile *p, int variant, bp_profile_op *out, int max);
const bp_profile_sgemm *bp_profile_sgemm_rate(const bp_profile *p);
/* The work one step of `variant` stands for, in FLOPs: the FLOPs of its
 * forward conv and fc nodes (per call), times 3 when the variant trains
 * (has backward nodes: backward-data and backward-filter cost what the
 * forward does; the first layer's backward-data counts though it never
 * runs). *trains (may be NULL) says which. At the yardstick's rate this
 * work is the step's SGEMM floor (docs/profile.md). */
uint64_t bp_profile_work_flops(const bp_profile *p, int variant, int *trains);
/* The share of that floor a step of `variant` reaches at `gflops`: the
 * work's time at that rate over the mean step time. NaN when the variant
 * has no work or no steps, or gflops is not > 0. */
double bp_profile_floor_share(const bp_profile *p, int variant, double gflops);

/* Writes the members of the metrics file's "profile" object after its
 * "event" member (each starting with ','; docs/metrics-jsonl.md): the
 * yardstick and every variant with steps, its ops and nodes. BP_ERR_IO
 * when the stream failed. */
bp_status bp_profile_write_json(const bp_profile *p, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
