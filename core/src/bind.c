/* Binding a graph to one rank's arena, and running its segments (exec.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bp_abi_sdk.h"
#include "exec-impl.h"

/* ---- descriptors ------------------------------------------------------------ */

static void desc_of_dtensor(const bp_dtensor *t, bp_abi_tensor *out) {
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->dtype = (int32_t)t->dtype;
  out->shape[0] = t->shape.n;
  out->shape[1] = t->shape.h;
  out->shape[2] = t->shape.w;
  out->shape[3] = t->shape.c;
  out->padded_c = t->padded_c;
  for (int k = 0; k < 4; k++) out->stride[k] = t->dev_stride[k];
  out->slot_bytes = t->slot_bytes;
}

static void desc_of_span(bp_span s, bp_dtype dtype, bp_abi_tensor *out) {
  const int64_t n = (int64_t)(s.bytes / bp_dtype_size(dtype));
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->dtype = (int32_t)dtype;
  out->shape[0] = out->shape[1] = out->shape[2] = 1;
  out->shape[3] = n;
  out->padded_c = n;
  out->stride[0] = out->stride[1] = out->stride[2] = n;
  out->stride[3] = 1;
  out->slot_bytes = s.bytes;
}

/* Descriptor and offset of one node tensor in variant v. */
static void resolve_tensor(const bp_exec *x, int v, const bp_node_tensor *nt, bp_abi_tensor *desc,
                           uint64_t *offset) {
  if (nt->id >= 0) {
    const bp_dtensor *t = bp_plan_tensor(x->plan, v, nt->id);
    BP_ASSERT(t != NULL); /* graph invariant 1 */
    desc_of_dtensor(t, desc);
    *offset = t->offset;
  } else {
    desc_of_span(nt->span, nt->dtype, desc);
    *offset = nt->span.offset;
  }
  BP_ASSERT(*offset <= x->arena_bytes && desc->slot_bytes <= x->arena_bytes - *offset);
}

/* Pointer of a tensor at `offset` for input buffer `buffer`: tensors in I_A
 * move to their I_B twin (invariant 1). */
static char *pointer(const bp_exec *x, uint64_t offset, int buffer) {
  if (buffer == 1 && offset >= x->ia.offset && offset < x->ia.offset + x->ia.bytes)
    offset = offset - x->ia.offset + x->ib.offset;
  return x->base + offset;
}

/* ---- binding ------------------------------------------------------------------ */

static void fill_args(bp_exec *x, bound_node *b, int buffer) {
  bp_abi_kernel_args *a = &b->args[buffer];
  memset(a, 0, sizeof *a);
  a->struct_size = sizeof *a;
  a->num_inputs = b->node->num_inputs;
  a->num_outputs = b->node->num_outputs;
  a->inputs = b->inputs;
  a->outputs = b->outputs;
  a->input_ptrs = b->in_ptrs[buffer];
  a->output_ptrs = b->out_ptrs[buffer];
  a->attrs = b->node->attr_size ? (const void *)&b->node->attrs : NULL;
  a->attr_size = b->node->attr_size;
  a->attr_version = b->node->attr_version ? b->node->attr_version : BP_ABI_ATTR_VERSION;
  /* NULL: kernels run synchronously on the caller's thread */
  a->stream = x->options.lane_stream[b->lane] ? x->options.lane_stream[b->lane] : x->options.stream;
  a->rank = x->options.rank;
  a->world_size = x->options.world;
  a->comm = x->options.comm;
  a->state = NULL; /* set once prepare() ran */
  a->params_generation = &x->params_generation;
  a->reason = x->reason[b->lane];
  a->reason_size = sizeof x->reason[b->lane];
  a->threads = x->threads;
}

/* The elements [*first, *end) of a sharded node's spans that lie in this
 * rank's chunk of the node's bucket (graph.h, bp_node.shard_domain); the
 * whole spans for a node that is not sharded. */
static void shard_slice(const bp_exec *x, const bp_node *n, uint64_t *first, uint64_t *end) {
  *first = 0;
  *end = UINT64_MAX;
  if (!n->shard_domain) return;
  const uint64_t count = n->inputs[0].span.bytes / bp_dtype_size(n->inputs[0].dtype);
  const int world = x->options.world, rank = x->options.rank;
  const uint64_t lo = bp_abi_chunk_start(n->shard_domain, world, rank);
  const uint64_t hi = bp_abi_chunk_start(n->shard_domain, world, rank + 1);
  const uint64_t a = n->shard_first, z = n->shard_first + count; /* graph invariant 5 */
  *first = lo > a ? lo - a : 0;
  *end = hi < z ? (hi > a ? hi - a : 0) : count;
  if (*end < *first) *end = *first;
}

static int ends_with(const char *s, const char *tail) {
  const size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

/* The lane of a node of segment s (exec.h, BP_EXEC_LANE_*). */
static int lane_of(const bp_exec_options *o, bp_segment s, const char *op) {
  if (o->streams <= 1) return BP_EXEC_LANE_MAIN;
  switch (s) {
  case BP_SEGMENT_CAST_GRAD:
  case BP_SEGMENT_COMM:
  case BP_SEGMENT_UPDATE:
  case BP_SEGMENT_GATHER:
  case BP_SEGMENT_EMA: return BP_EXEC_LANE_UPDATE;
  case BP_SEGMENT_CAST:
  case BP_SEGMENT_ZERO_GRAD: return o->streams >= 3 ? BP_EXEC_LANE_SIDE : BP_EXEC_LANE_MAIN;
  case BP_SEGMENT_BACKWARD:
    return ends_with(op, ".bwd_filter") ? BP_EXEC_LANE_WGRAD : BP_EXEC_LANE_MAIN;
  default: return BP_EXEC_LANE_MAIN;
  }
}

/* Binds node n of variant v; *bound = 0 for a sharded node of which this
 * rank owns nothing (it is left out of the bound segment). */
static bp_status bind_node(bp_exec *x, bp_registry *r, int v, bp_segment seg, const bp_node *n,
                           bound_node *b, int *bound) {
  b->node = n;
  b->lane = lane_of(&x->options, seg, n->op);
  uint64_t first, end;
  shard_slice(x, n, &first, &end);
  *bound = end > first;
  if (!*bound) return BP_OK;
  for (int side = 0; side < 2; side++) {
    const int count = side ? n->num_outputs : n->num_inputs;
    for (int i = 0; i < count; i++) {
      uint64_t off;
      bp_node_tensor nt = side ? n->outputs[i] : n->inputs[i];
      if (n->shard_domain && nt.id < 0) { /* the same slice of every span */
        const uint64_t size = bp_dtype_size(nt.dtype);
        nt.span = (bp_span){nt.span.offset + first * size, (end - first) * size};
      }
      resolve_tensor(x, v, &nt, side ? &b->outputs[i] : &b->inputs[i], &off);
      for (int buf = 0; buf < 2; buf++) {
        if (side)
          b->out_ptrs[buf][i] = pointer(x, off, buf);
        else
          b->in_ptrs[buf][i] = pointer(x, off, buf);
      }
    }
  }
  fill_args(x, b, 0);
  fill_args(x, b, 1);
  bp_select_options so;
  memset(&so, 0, sizeof so);
  so.pins = x->options.pins;
  so.autotune = x->options.autotune;
  so.autotune_cache = x->options.autotune_cache;
  so.node = n->name;
  so.device_index = x->options.device_index;
  const bp_registered_kernel *k = NULL;
  bp_status st = bp_registry_select(r, n->op, x->device, &b->args[0], &so, &k);
  x->reason[b->lane][0] = '\0'; /* what autotune's runs may have left */
  if (st != BP_OK) {
    char why[3072];
    snprintf(why, sizeof why, "%s", bp_last_error()); /* copied: bp_fail rewrites it */
    return bp_fail(st, "bind: variant '%s', node '%s' (%s): %s", bp_plan_variant(x->plan, v)->name,
                   n->name, n->op, why);
  }
  b->kernel = k;
  b->run = k->kernel.run;
  b->user = k->kernel.user;
  int len = snprintf(b->fault_line, sizeof b->fault_line,
                     "rank %d, variant '%s', node '%s', op %s, impl %s, module %s\n",
                     x->options.rank, bp_plan_variant(x->plan, v)->name, n->name, k->kernel.op,
                     k->kernel.impl, k->path ? k->path : "(built in)");
  if (len < 0) len = 0;
  if ((size_t)len >= sizeof b->fault_line) { /* a long path: cut, the line still ends */
    len = (int)sizeof b->fault_line - 1;
    b->fault_line[len - 1] = '\n';
  }
  b->fault_len = len;
  if (!b->run)
    return bp_fail(BP_ERR_UNSUPPORTED, "bind: kernel %s/%s/%s of node '%s' has no run()",
                   k->kernel.op, k->kernel.impl, k->kernel.device, n->name);
  if (k->kernel.workspace_size) {
    bp_abi_kernel_args meta = b->args[0];
    meta.input_ptrs = NULL;
    meta.output_ptrs = NULL;
    meta.params_generation = NULL;
    meta.reason = NULL;
    meta.reason_size = 0;
    b->workspace_bytes = k->kernel.workspace_size(k->kernel.user, &meta);
  }
  if (b->workspace_bytes > x->lane_workspace[b->lane])
    x->lane_workspace[b->lane] = b->workspace_bytes;
  return BP_OK;
}

/* Where lane `lane`'s slice starts in the workspace: the slices of the
 * lanes before it, each rounded up to 256 bytes. */
static uint64_t lane_offset(const bp_exec *x, int lane) {
  uint64_t at = 0;
  for (int l = 0; l < lane; l++) at += (x->lane_workspace[l] + 255) / 256 * 256;
  return at;
}

static bp_status alloc_workspace(bp_exec *x) {
  x->workspace_bytes = lane_offset(x, BP_EXEC_LANES);
  if (x->workspace_bytes == 0) return BP_OK;
  const uint64_t bytes = x->workspace_bytes;
  if (x->dev && x->dev->arena_alloc) { /* on the rank's device, beside its arena */
    if (x->dev->arena_alloc(x->options.device_index, bytes, 256, &x->workspace) != BP_ABI_OK)
      return bp_fail(BP_ERR_NOMEM,
                     "bind: the %s device %d could not allocate a workspace of %llu "
                     "bytes: %s",
                     x->dev->kind, x->options.device_index, (unsigned long long)bytes,
                     x->dev->last_error ? x->dev->last_error() : "no reason given");
    x->workspace_bytes = bytes;
    return BP_OK;
  }
  /* no device plugin: the arena is host memory, and so is the workspace */
  if (posix_memalign(&x->workspace, 256, (size_t)bytes) != 0)
    return bp_fail(BP_ERR_NOMEM, "bind: out of memory for a workspace of %llu bytes",
                   (unsigned long long)bytes);
  x->workspace_bytes = bytes;
  return BP_OK;
}

/* The kernel's reason, or `fallback` when it wrote none; then clears the
 * buffer for the next failure. */
static void take_reason(bp_exec *x, int lane, char *out, size_t size, const char *fallback) {
  char *reason = x->reason[lane];
  reason[BP_EXEC_REASON_BYTES - 1] = '\0'; /* a kernel that ignored reason_size */
  snprintf(out, size, "%s", reason[0] ? reason : fallback);
  reason[0] = '\0';
}

static bp_status status_of_abi(int rc) {
  switch (rc) {
  case BP_ABI_ERR_NOMEM: return BP_ERR_NOMEM;
  case BP_ABI_ERR_UNSUPPORTED: return BP_ERR_UNSUPPORTED;
  case BP_ABI_ERR_DEVICE: return BP_ERR_DEVICE;
  default: return BP_ERR_INVALID;
  }
}

/* Calls the kernel's prepare() for bound node b of variant v (its
 * workspace set) and stores the state in both argument blocks. */
static bp_status prepare_node(bp_exec *x, int v, bound_node *b) {
  int (*prepare)(void *, const bp_abi_kernel_args *, void **) = b->kernel->kernel.prepare;
  if (!prepare) return BP_OK;
  void *state = NULL;
  const int rc = prepare(b->user, &b->args[0], &state);
  if (rc != BP_ABI_OK) {
    char why[BP_EXEC_REASON_BYTES];
    take_reason(x, b->lane, why, sizeof why, bp_status_str(status_of_abi(rc)));
    /* a state made despite the failure is still the kernel's to free */
    if (state && b->kernel->kernel.release) b->kernel->kernel.release(b->user, state);
    return bp_fail(status_of_abi(rc),
                   "bind: rank %d, variant '%s': prepare() of node '%s' (%s/%s) failed: %s",
                   x->options.rank, bp_plan_variant(x->plan, v)->name, b->node->name,
                   b->kernel->kernel.op, b->kernel->kernel.impl, why);
  }
  b->state = state;
  b->args[0].state = b->args[1].state = state;
  return BP_OK;
}

bp_status bp_exec_create(const bp_graph *graph, bp_registry *registry, void *arena_base,
                         const bp_exec_options *options, bp_exec **exec_out) {
  if (!graph || !registry || !arena_base || !options || !exec_out || !options->device)
    return bp_fail(BP_ERR_INVALID, "bp_exec_create: NULL argument");
  if (options->world < 1 || options->rank < 0 || options->rank >= options->world)
    return bp_fail(BP_ERR_INVALID, "bp_exec_create: rank %d of world %d", options->rank,
                   options->world);
  if (strlen(options->device) >= sizeof((bp_exec *)0)->device)
    return bp_fail(BP_ERR_INVALID, "bp_exec_create: device name too long");
  bp_exec *x = calloc(1, sizeof *x);
  if (!x) return bp_fail(BP_ERR_NOMEM, "out of memory binding a graph");
  x->graph = graph;
  x->plan = bp_graph_plan(graph);
  x->options = *options;
  x->params_generation = 1;
  x->threads = options->threads;
  if (!x->threads) {
    bp_status ts = bp_threads_create(1, &x->own_threads);
    if (ts != BP_OK) {
      free(x);
      return ts;
    }
    x->threads = bp_threads_abi(x->own_threads);
  }
  snprintf(x->device, sizeof x->device, "%s", options->device);
  x->options.device = x->device;
  if (x->options.streams < 1) x->options.streams = 1;
  if (x->options.streams > BP_EXEC_COMPUTE_LANES) x->options.streams = BP_EXEC_COMPUTE_LANES;
  x->base = arena_base;
  x->arena_bytes = bp_plan_total_bytes(x->plan);
  x->dev = bp_registry_find_device(registry, options->memory_device ? options->memory_device
                                                                    : x->device);
  x->ia = bp_plan_region_span(x->plan, BP_REGION_I_A);
  x->ib = bp_plan_region_span(x->plan, BP_REGION_I_B);
  BP_ASSERT(x->ia.bytes == x->ib.bytes); /* invariant 1 */
  x->variant_count = bp_plan_variant_count(x->plan);
  x->segments = calloc((size_t)x->variant_count, sizeof *x->segments);
  bp_status st = x->segments ? BP_OK : bp_fail(BP_ERR_NOMEM, "out of memory binding a graph");
  for (int v = 0; st == BP_OK && v < x->variant_count; v++)
    for (int s = 0; st == BP_OK && s < BP_SEGMENT_COUNT; s++) {
      const int count = bp_graph_node_count(graph, v, (bp_segment)s);
      if (count == 0) continue;
      bound_segment *bs = &x->segments[v][s];
      bs->nodes = calloc((size_t)count, sizeof *bs->nodes);
      if (!bs->nodes) {
        st = bp_fail(BP_ERR_NOMEM, "out of memory binding a graph");
        break;
      }
      for (int k = 0; st == BP_OK && k < count; k++) {
        int bound = 0;
        st = bind_node(x, registry, v, (bp_segment)s, bp_graph_node(graph, v, (bp_segment)s, k),
                       &bs->nodes[bs->count], &bound);
        bs->count += bound;
      }
    }
  if (st == BP_OK) st = alloc_workspace(x);
  if (st != BP_OK) {
    bp_exec_destroy(x);
    return st;
  }
  for (int v = 0; v < x->variant_count; v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int k = 0; k < x->segments[v][s].count; k++) {
        bound_node *b = &x->segments[v][s].nodes[k];
        BP_ASSERT(b->workspace_bytes <= x->lane_workspace[b->lane]); /* invariant 3 */
        for (int buf = 0; buf < 2; buf++) {
          b->args[buf].workspace =
              b->workspace_bytes ? (char *)x->workspace + lane_offset(x, b->lane) : NULL;
          b->args[buf].workspace_bytes = b->workspace_bytes;
        }
      }
  for (int v = 0; st == BP_OK && v < x->variant_count; v++)
    for (int s = 0; st == BP_OK && s < BP_SEGMENT_COUNT; s++)
      for (int k = 0; st == BP_OK && k < x->segments[v][s].count; k++)
        st = prepare_node(x, v, &x->segments[v][s].nodes[k]);
  if (st != BP_OK) {
    bp_exec_destroy(x);
    return st;
  }
  *exec_out = x;
  return BP_OK;
}

/* The node the calling thread runs (initial-exec: a plain load in a signal
 * handler), the one any thread started last, and how many run now
 * (bp_exec_fault_line). */
static __thread const bound_node *running_here __attribute__((tls_model("initial-exec")));
static const bound_node *started_last;
static int running_count;

void bp_exec_destroy(bp_exec *x) {
  if (!x) return;
  if (x->segments)
    for (int v = 0; v < x->variant_count; v++)
      for (int s = 0; s < BP_SEGMENT_COUNT; s++) {
        const bound_segment *bs = &x->segments[v][s];
        for (int k = 0; k < bs->count; k++) {
          if (bs->nodes[k].state && bs->nodes[k].kernel->kernel.release)
            bs->nodes[k].kernel->kernel.release(bs->nodes[k].user, bs->nodes[k].state);
          const bound_node *mine = &bs->nodes[k]; /* never a freed node for the handler */
          __atomic_compare_exchange_n(&started_last, &mine, NULL, 0, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED);
        }
        free(bs->nodes);
      }
  free(x->segments);
  bp_exec_programs_free(x);
  if (x->workspace) {
    if (x->dev && x->dev->arena_free)
      x->dev->arena_free(x->options.device_index, x->workspace, x->workspace_bytes);
    else
      free(x->workspace);
  }
  bp_threads_destroy(x->own_threads);
  free(x);
}

/* ---- running ---------------------------------------------------------------- */

/* One kernel call, marked for a fault handler. */
static inline int run_node(const bound_node *b, int buffer) {
  const bound_node *outer = running_here;
  running_here = b;
  __atomic_store_n(&started_last, b, __ATOMIC_RELAXED);
  __atomic_fetch_add(&running_count, 1, __ATOMIC_RELAXED);
  const int rc = b->run(b->user, &b->args[buffer]);
  __atomic_fetch_sub(&running_count, 1, __ATOMIC_RELAXED);
  running_here = outer;
  return rc;
}

const char *bp_exec_fault_line(int *len_out) {
  const bound_node *b = running_here;
  if (!b && __atomic_load_n(&running_count, __ATOMIC_RELAXED) > 0)
    b = __atomic_load_n(&started_last, __ATOMIC_RELAXED);
  if (!b) return NULL;
  if (len_out) *len_out = b->fault_len;
  return b->fault_line;
}

/* Off the hot path: the message of a failed run, then the reason buffer
 * cleared for the next one. */
static bp_status node_failed(bp_exec *x, int v, const bound_node *b, int rc) {
  char why[BP_EXEC_REASON_BYTES + 32];
  char fallback[64];
  snprintf(fallback, sizeof fallback, "%s (ABI status %d)", bp_status_str(status_of_abi(rc)), rc);
  take_reason(x, b->lane, why, sizeof why, fallback);
  return bp_fail(status_of_abi(rc), "rank %d, variant '%s': node '%s' (%s/%s) failed: %s",
                 x->options.rank, bp_plan_variant(x->plan, v)->name, b->node->name,
                 b->kernel->kernel.op, b->kernel->kernel.impl, why);
}

bp_status bp_exec_run(bp_exec *x, int variant, bp_segment segment, int buffer) {
  if (!x || variant < 0 || variant >= x->variant_count || (int)segment < 0 ||
      segment >= BP_SEGMENT_COUNT || buffer < 0 || buffer > 1)
    return bp_fail(BP_ERR_INVALID, "bp_exec_run: variant %d, segment %d, buffer %d", variant,
                   (int)segment, buffer);
  const bound_segment *s = &x->segments[variant][segment];
  __atomic_fetch_add(&x->calls, (uint64_t)s->count, __ATOMIC_RELAXED);
  /* timed: one clock reading before the first node and one after each,
   * so the node times partition the run (exec.h, bp_exec_timer) */
  const bp_exec_timer *tm = x->timed && x->timer.recording(x->timer.ctx) ? &x->timer : NULL;
  const uint64_t t0 = tm ? bp_exec_now_ns() : 0;
  uint64_t t = t0;
  for (int k = 0; k < s->count; k++) {
    const bound_node *b = &s->nodes[k];
    const int rc = run_node(b, buffer);
    if (tm) {
      const uint64_t now = bp_exec_now_ns();
      tm->node_time(tm->ctx, b->timer_slot, now - t);
      t = now;
    }
    if (rc != BP_ABI_OK) return node_failed(x, variant, b, rc);
  }
  if (tm) tm->run_time(tm->ctx, variant, t - t0);
  return BP_OK;
}

uint64_t bp_exec_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

bp_status bp_exec_set_timer(bp_exec *x, const bp_exec_timer *timer) {
  if (!x) return bp_fail(BP_ERR_INVALID, "bp_exec_set_timer: NULL executor");
  x->timed = 0;
  if (!timer) return BP_OK;
  if (!timer->add_variant || !timer->add_node || !timer->recording || !timer->node_time ||
      !timer->run_time)
    return bp_fail(BP_ERR_INVALID, "bp_exec_set_timer: a callback is NULL");
  bp_status st = BP_OK;
  for (int v = 0; st == BP_OK && v < x->variant_count; v++) {
    st = timer->add_variant(timer->ctx, v, bp_plan_variant(x->plan, v)->name);
    for (int s = 0; st == BP_OK && s < BP_SEGMENT_COUNT; s++)
      for (int k = 0; st == BP_OK && k < x->segments[v][s].count; k++) {
        bound_node *b = &x->segments[v][s].nodes[k];
        st = timer->add_node(timer->ctx, v, (bp_segment)s, b->node->name, b->kernel->kernel.op,
                             b->kernel->kernel.impl, &b->args[0], &b->timer_slot);
      }
  }
  if (st == BP_OK) {
    x->timer = *timer;
    x->timed = 1;
  }
  return st;
}

const bp_registered_kernel *bp_exec_kernel(const bp_exec *x, int variant, bp_segment segment,
                                           int index) {
  if (!x || variant < 0 || variant >= x->variant_count || (int)segment < 0 ||
      segment >= BP_SEGMENT_COUNT || index < 0 || index >= x->segments[variant][segment].count)
    return NULL;
  return x->segments[variant][segment].nodes[index].kernel;
}

const bp_node *bp_exec_node(const bp_exec *x, int variant, bp_segment segment, int index) {
  if (!x || variant < 0 || variant >= x->variant_count || (int)segment < 0 ||
      segment >= BP_SEGMENT_COUNT || index < 0 || index >= x->segments[variant][segment].count)
    return NULL;
  return x->segments[variant][segment].nodes[index].node;
}

uint64_t bp_exec_workspace_bytes(const bp_exec *x) { return x ? x->workspace_bytes : 0; }

uint64_t bp_exec_kernel_calls(const bp_exec *x) {
  return x ? __atomic_load_n(&x->calls, __ATOMIC_RELAXED) : 0;
}

bp_status bp_exec_run_nodes(bp_exec *x, int variant, bp_segment segment, int first, int count,
                            int buffer) {
  if (!x || variant < 0 || variant >= x->variant_count || (int)segment < 0 ||
      segment >= BP_SEGMENT_COUNT || buffer < 0 || buffer > 1 || first < 0 || count < 0 ||
      first > x->segments[variant][segment].count - count)
    return bp_fail(BP_ERR_INVALID, "bp_exec_run_nodes: variant %d, segment %d, nodes %d+%d",
                   variant, (int)segment, first, count);
  const bound_node *nodes = x->segments[variant][segment].nodes;
  __atomic_fetch_add(&x->calls, (uint64_t)count, __ATOMIC_RELAXED);
  for (int k = first; k < first + count; k++) {
    const int rc = run_node(&nodes[k], buffer);
    if (rc != BP_ABI_OK) return node_failed(x, variant, &nodes[k], rc);
  }
  return BP_OK;
}

int bp_exec_node_lane(const bp_exec *x, int variant, bp_segment segment, int index) {
  if (!x || variant < 0 || variant >= x->variant_count || (int)segment < 0 ||
      segment >= BP_SEGMENT_COUNT || index < 0 || index >= x->segments[variant][segment].count)
    return BP_EXEC_LANE_MAIN;
  return x->segments[variant][segment].nodes[index].lane;
}

void bp_exec_params_changed(bp_exec *x) {
  if (x) x->params_generation++;
}

uint64_t bp_exec_params_generation(const bp_exec *x) { return x ? x->params_generation : 0; }
