/* The executor of one rank: a graph bound to that rank's arena.
 *
 * Binding (bp_exec_create) happens once per (variant, rank): every node's
 * tensors are resolved to arena base + offset, their kernel descriptors
 * (bp_abi_tensor) and argument blocks (bp_abi_kernel_args) are built, and
 * each node's kernel is chosen through bp_registry_select (pins from the
 * options or BP_KERNELS, then supports(), autotune, priority; REFERENCE
 * kernels only as a last resort). One workspace per rank is allocated
 * here: a slice per lane (options.streams), each the largest any node of
 * that lane asks for, shared by the lane's nodes (they run one at a time).
 *
 * A sharded node (graph.h: bp_node.shard_domain) is bound to the slice of
 * its spans that lies in this rank's chunk of its bucket, the same slice of
 * every span (options.rank of options.world); a rank that owns none of it
 * leaves the node out of its bound segment.
 *
 * Collective nodes ("allreduce.*") are selected like any node; their
 * kernels (ops/allreduce) reach the other ranks through options.comm,
 * which every argument block carries (bp_abi_kernel_args.comm), and pick
 * themselves by its backend in supports(). Autotune never times them
 * (BP_ABI_KERNEL_COLLECTIVE): a collective cannot run on one rank alone.
 *
 * Running (bp_exec_run) a segment is a loop over its pre-bound nodes, each
 * a call of kernel.run(user, &args): no lookup, no allocation, no shape
 * arithmetic. Each node holds two argument blocks, one per input buffer:
 * they differ only in the pointers of tensors in I_A, which the B block
 * points at their I_B twins (graph.h invariant 3).
 *
 * Kernel state and services (ABI 1.4). Every argument block also carries
 * the rank's thread service (options.threads, or a 1-thread one the
 * executor makes), a pointer to the executor's parameter generation and
 * one reason buffer (BP_EXEC_REASON_BYTES) shared by the rank's nodes.
 * After selection and the workspace, a kernel's prepare() (when it has
 * one) is called once per bound node of every variant, with the node's A
 * args (state NULL); the state it makes goes into both argument blocks,
 * and bp_exec_destroy passes each non-NULL state to the kernel's release()
 * on the destroying thread. A failing prepare() fails the bind, naming the
 * rank, variant, node, op/impl and the kernel's reason. Autotune, which
 * runs candidates during selection, times a kernel with a state prepared
 * for the timing and released right after. Modules built
 * against 1.3 get the same blocks: struct_size tells them where their
 * fields end, and their kernels' missing prepare/release read as NULL.
 *
 * Invariants (checked at create):
 *  1. I_A and I_B have equal bytes, so tensor k of I_A and of I_B sit at the
 *     same relative offset;
 *  2. every bound pointer lies inside the arena with slot_bytes readable;
 *  3. every node's workspace need is at most the rank's workspace bytes.
 *
 * Lifetime: the graph, the registry and the arena are borrowed and must
 * outlive the executor. */
#ifndef BLUEPRINT_EXEC_H
#define BLUEPRINT_EXEC_H

#include <stdint.h>

#include "bp_abi.h"
#include "blueprint/graph.h"
#include "blueprint/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_exec bp_exec; /* opaque */

/* How a rank's steps reached its device (docs/training.md, "Steps as
 * graphs"): counts since the trainer was created, or over an epoch in
 * bp_epoch_report. On the cpu device only steps and kernel_calls move. */
typedef struct bp_exec_counts {
  uint64_t steps;          /* training steps and evaluation batches run */
  uint64_t graph_launches; /* captured step graphs launched (a capture's first run included) */
  uint64_t kernel_calls;   /* kernel run() calls made on the rank's thread (eager nodes, and
                              each node once while a graph is captured) */
  uint64_t host_tasks;     /* host tasks handed to the device (eager): one per job with one
                              stream, one per chunk of its program with more ("Streams") */
  uint64_t syncs;          /* host waits for the device (stream or event synchronize):
                              eager steps, metric reads, checkpoints, the epoch's end */
  uint64_t waits;          /* graph steps: waits for the step before the previous one,
                              before its input staging is reused (the one in flight is not
                              waited for) */
  uint64_t events;         /* streams: event records and stream waits enqueued between a
                              job's streams (fork, derived edges, join; docs/training.md,
                              "Streams"); in a captured step graph, once, at the capture */
  /* streams, eager training steps with collectives (--no-graph; a step
   * graph's events are edges, not clocks): microseconds the update stream
   * spent in the COMM segment's chunks, and of those, the ones inside the
   * backward pass (its first node's start to its last node's end), from
   * device events (event_elapsed_ms) */
  uint64_t comm_us, comm_overlap_us;
} bp_exec_counts;

/* Lanes of a rank's work (streams > 1): three compute lanes and the update
 * lane. MAIN: forward, loss and the data-gradient chain of backward; WGRAD:
 * the weight gradients (*.bwd_filter); SIDE: work off the chain (CAST's
 * working copies, ZERO_GRAD); UPDATE: CAST_GRAD, COMM (the bucket
 * collectives), UPDATE, GATHER, EMA. With 2 compute streams SIDE folds
 * into MAIN; with 1 every node is on MAIN. */
#define BP_EXEC_LANES 4
#define BP_EXEC_COMPUTE_LANES 3
enum { BP_EXEC_LANE_MAIN = 0, BP_EXEC_LANE_WGRAD = 1, BP_EXEC_LANE_SIDE = 2,
       BP_EXEC_LANE_UPDATE = 3 };

typedef struct bp_exec_options {
  const char *device;         /* the kind of kernels selected: "cpu" (for a device that runs
                                 another kind's kernels, bp_abi_device.kernel_kind) */
  const char *pins;           /* "op_glob=impl,..."; NULL: BP_KERNELS (registry.h) */
  int autotune;               /* time the kernels that support a node (runs them on the arena) */
  const char *autotune_cache; /* NULL: none */
  int rank, world;            /* this rank of `world` (kernel args) */
  const bp_abi_comm *comm;    /* (optional) this rank's communicator (comm.h), handed to
                                 every kernel; must outlive the executor */
  const bp_abi_threads *threads; /* (optional) this rank's threads (threads.h), lent to every
                                    kernel; borrowed, must outlive the executor. NULL: the
                                    executor makes a 1-thread service of its own */
  /* The device the rank runs on (the device seam, docs/architecture.md). */
  const char *memory_device;  /* (optional) the kind whose plugin allocates the workspace,
                                 the arena's; NULL: `device`. No plugin: host memory */
  int device_index;           /* that plugin's device the rank runs on (0) */
  void *stream;               /* (optional) what every kernel gets in args->stream: the
                                 native compute stream of the rank where kernels enqueue
                                 their work (stream_native); NULL: they run synchronously
                                 on the thread that calls bp_exec_run */
  /* Streams (docs/training.md, "Streams"). With streams > 1 every node
   * has a lane (bp_exec_node_lane), its kernel gets lane_stream[lane] in
   * args->stream (NULL there: `stream`) and a workspace slice of its
   * lane's own, so nodes of different lanes never share workspace bytes. */
  int streams;                /* compute streams, 1..BP_EXEC_COMPUTE_LANES; 0: 1 */
  void *lane_stream[BP_EXEC_LANES]; /* native handles, by lane */
} bp_exec_options;

/* Bytes of the reason buffer kernels write a failure into. */
#define BP_EXEC_REASON_BYTES 1024

/* Binds every variant of `graph` to the arena at `arena_base` (the plan's
 * total bytes, on the device). A node that no kernel supports is
 * BP_ERR_UNSUPPORTED with one line naming the variant, the node, its op,
 * its tensors' shapes and every candidate's reason. With autotune, the
 * arena's contents are overwritten: bind before filling it. */
bp_status bp_exec_create(const bp_graph *graph, bp_registry *registry, void *arena_base,
                         const bp_exec_options *options, bp_exec **exec_out);
void bp_exec_destroy(bp_exec *exec); /* NULL is a no-op */

/* Runs segment `segment` of `variant` with input buffer `buffer` (0: I_A,
 * 1: I_B). A kernel's failure stops the segment with the message
 * "rank R, variant 'V': node 'N' (op/impl) failed: <reason>" (the kernel's
 * reason, or the status name when it wrote none) and a status mapped from
 * the ABI's: NOMEM -> BP_ERR_NOMEM, UNSUPPORTED -> BP_ERR_UNSUPPORTED,
 * DEVICE -> BP_ERR_DEVICE, anything else BP_ERR_INVALID. */
bp_status bp_exec_run(bp_exec *exec, int variant, bp_segment segment, int buffer);

/* Adds 1 to the rank's parameter generation (bp_abi_kernel_args.
 * params_generation), telling kernels that cache something derived from
 * parameters (packed weights) to rebuild it. Whoever writes parameters
 * other than through the kernels' own outputs calls it once the writing is
 * done: the trainer after every training step (its UPDATE, GATHER and EMA
 * segments), after initialization and after a checkpoint load; a program
 * that writes parameters into the arena itself. Not thread-safe against a
 * running segment: call it between runs, ordered with the thread that runs
 * the executor. */
void bp_exec_params_changed(bp_exec *exec);
/* The current generation (starts at 1); 0 for NULL. */
uint64_t bp_exec_params_generation(const bp_exec *exec);

/* The kernel bound to node `index` of a segment; NULL when out of range. */
const bp_registered_kernel *bp_exec_kernel(const bp_exec *exec, int variant, bp_segment segment,
                                           int index);
/* The graph node bound at `index` of a segment (borrowed from the graph);
 * NULL when out of range. A rank may bind fewer nodes than the graph holds
 * (sharded nodes it owns none of), so index is not the graph's index. */
const bp_node *bp_exec_node(const bp_exec *exec, int variant, bp_segment segment, int index);
/* Bytes of the rank's workspace. */
uint64_t bp_exec_workspace_bytes(const bp_exec *exec);
/* Kernel run() calls the segment runs have made (nodes of the segments run,
 * a failed one's included). Read it on the thread that runs the executor. */
uint64_t bp_exec_kernel_calls(const bp_exec *exec);

/* For a fault handler (docs/reliability.md, "Kernels that crash"): the
 * line naming the kernel the calling thread runs now, else, while kernels
 * run in other threads (a kernel's own worker threads), the one started
 * last: "rank R, variant V, node 'N', op O, impl I, module PATH\n" (*len_out
 * bytes, no NUL needed); NULL when no kernel runs. Formatted at bind, so
 * reading it is async-signal-safe (two loads). A thread-local pointer and
 * one atomic count around every kernel call keep it. */
const char *bp_exec_fault_line(int *len_out);

/* ---- streams: programs (docs/training.md, "Streams") -----------------------------
 * A program is what a job of one variant running the segments in
 * `segment_mask` (bit 1 << segment, run in segment order) enqueues on the
 * lanes: its bound nodes in order, grouped into chunks (consecutive nodes
 * of one lane), and the cross-lane edges derived from the plan. Node j
 * conflicts with an earlier node i when a byte range one writes overlaps
 * a range the other reads or writes (RAW, WAR, WAW), on the arena's
 * actual offsets, so tensors that share bytes through liveness packing
 * conflict too; scalars and the loss-scale state are arena tensors like
 * any other. Workspace never conflicts across lanes (a slice each). For
 * each other lane, j waits for the latest conflicting node there, unless
 * its lane already waited for that node or a later one of that lane.
 * Only nodes some wait refers to record an event. */
typedef struct bp_exec_entry {
  int segment, index, lane; /* bound node `index` of `segment` */
} bp_exec_entry;

typedef struct bp_exec_chunk {
  int lane;
  int first, count;            /* entries [first, first + count) */
  int wait_first, wait_count;  /* events (program.waits[...]) waited for before it */
  int record;                  /* event recorded after it, or -1 */
  unsigned segments;           /* bit 1 << segment of each of its nodes; a chunk holds
                                  COMM nodes only or none (their time is measured) */
} bp_exec_chunk;

typedef struct bp_exec_program {
  int variant;
  unsigned segment_mask;
  bp_exec_entry *entries;
  int entry_count;
  bp_exec_chunk *chunks;
  int chunk_count;
  int *waits; /* event indices */
  int wait_total;
  int event_count;   /* events the program records (one per recording chunk) */
  unsigned lanes;    /* bit 1 << lane for every lane with a node */
  int edges_dropped; /* the test hook's doing (below): 0 or 1 */
} bp_exec_program;

/* The program of (variant, segment_mask), built on first use and kept by
 * the executor (valid until bp_exec_destroy). Only with streams > 1.
 * Tests may leave one wait out (core/src/exec-test.h) to show a missing
 * edge is caught. */
bp_status bp_exec_program_get(bp_exec *exec, int variant, unsigned segment_mask,
                              const bp_exec_program **program_out);
/* The lane of bound node `index` of a segment (0 with one stream). */
int bp_exec_node_lane(const bp_exec *exec, int variant, bp_segment segment, int index);
/* Runs bound nodes [first, first + count) of a segment with input buffer
 * `buffer`, as bp_exec_run does (no profile). Threads running nodes of
 * different lanes at once is allowed: each lane has its own reason
 * buffer and workspace slice. */
bp_status bp_exec_run_nodes(bp_exec *exec, int variant, bp_segment segment, int first, int count,
                            int buffer);

/* A node timer: what times a rank's kernels (the trainer's profile,
 * profile.h, is one). bp_exec_set_timer declares every variant and bound
 * node to it once; then, in every segment run made while recording(ctx)
 * is 1, the executor reads CLOCK_MONOTONIC (bp_exec_now_ns) once before the
 * first node and once after each, and charges a node the time from the
 * previous reading to its own: the node times of a run partition the run's
 * interval exactly, which run_time receives. Callbacks run on the thread
 * that runs the segment. */
typedef struct bp_exec_timer {
  void *ctx; /* borrowed: outlives the executor or its detaching */
  bp_status (*add_variant)(void *ctx, int variant, const char *name);
  /* *slot_out: what node_time receives for this node */
  bp_status (*add_node)(void *ctx, int variant, bp_segment segment, const char *name,
                        const char *op, const char *impl, const bp_abi_kernel_args *args,
                        int *slot_out);
  int (*recording)(const void *ctx);
  void (*node_time)(void *ctx, int slot, uint64_t ns);
  void (*run_time)(void *ctx, int variant, uint64_t ns);
} bp_exec_timer;

/* Attaches `timer` (copied; every callback set) and declares the bound
 * nodes to it; NULL detaches (no clock is read then). */
bp_status bp_exec_set_timer(bp_exec *exec, const bp_exec_timer *timer);
/* Nanoseconds on CLOCK_MONOTONIC: the executor's clock. */
uint64_t bp_exec_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif
