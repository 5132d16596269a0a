/* Stream programs (exec.h, "streams: programs"): the order a job's nodes
 * are handed to the lanes, and the cross-lane edges derived from the byte
 * ranges they read and write in the arena. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "exec-impl.h"
#include "exec-test.h"

/* The arena bytes a bound node reads and writes: [lo, hi) each. */
typedef struct access {
  uint64_t lo[2 * T_MAX], hi[2 * T_MAX];
  unsigned char write[2 * T_MAX];
  int n;
} access;

static void add_range(access *a, const bp_exec *x, const void *ptr, uint64_t bytes, int write) {
  if (!ptr || !bytes) return;
  const uint64_t lo = (uint64_t)((const char *)ptr - x->base);
  a->lo[a->n] = lo;
  a->hi[a->n] = lo + bytes;
  a->write[a->n] = (unsigned char)write;
  a->n++;
}

/* On input buffer 0's pointers: a job runs on one buffer, and buffer 1's
 * pointers are buffer 0's with I_A moved to I_B as a whole. */
static void access_of(const bp_exec *x, const bound_node *b, access *a) {
  a->n = 0;
  for (int i = 0; i < b->node->num_inputs; i++)
    add_range(a, x, b->in_ptrs[0][i], b->inputs[i].slot_bytes, 0);
  for (int i = 0; i < b->node->num_outputs; i++)
    add_range(a, x, b->out_ptrs[0][i], b->outputs[i].slot_bytes, 1);
}

/* Whether two nodes must keep their order: a write of one overlaps a
 * read or write of the other (RAW, WAR, WAW). */
static int conflict(const access *a, const access *b) {
  for (int i = 0; i < a->n; i++)
    for (int j = 0; j < b->n; j++)
      if ((a->write[i] || b->write[j]) && a->lo[i] < b->hi[j] && b->lo[j] < a->hi[i]) return 1;
  return 0;
}

static void program_free(bp_exec_program *p) {
  if (!p) return;
  free(p->entries);
  free(p->chunks);
  free(p->waits);
  free(p);
}

void bp_exec_programs_free(bp_exec *x) {
  for (int i = 0; i < x->program_count; i++) program_free(x->programs[i]);
  free(x->programs);
  x->programs = NULL;
  x->program_count = x->program_cap = 0;
}

/* The test hook's wait to leave out (exec-test.h), or -1. Atomic: the
 * trainer's rank threads build programs while a test may set it. */
static _Atomic long drop_wait = -1;

void bp_exec_test_drop_wait(long wait) { atomic_store(&drop_wait, wait); }

static long dropped_wait(void) { return atomic_load(&drop_wait); }

static bp_status build(bp_exec *x, int v, unsigned mask, bp_exec_program *p) {
  int n = 0;
  for (int s = 0; s < BP_SEGMENT_COUNT; s++)
    if (mask & (1u << s)) n += x->segments[v][s].count;
  p->variant = v;
  p->segment_mask = mask;
  p->entries = calloc((size_t)n + 1, sizeof *p->entries);
  p->chunks = calloc((size_t)n + 1, sizeof *p->chunks);
  p->waits = calloc((size_t)n * BP_EXEC_LANES + 1, sizeof *p->waits);
  access *acc = calloc((size_t)n + 1, sizeof *acc);
  int *from = calloc((size_t)n * BP_EXEC_LANES + 1, sizeof *from); /* [j][lane]: waited entry */
  int *event = calloc((size_t)n + 1, sizeof *event);               /* entry's event, or -1 */
  int *snap = calloc((size_t)n * BP_EXEC_LANES + 1, sizeof *snap);
  bp_status st = BP_OK;
  if (!p->entries || !p->chunks || !p->waits || !acc || !from || !event || !snap) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory deriving a stream program");
    goto done;
  }
  for (int s = 0; s < BP_SEGMENT_COUNT; s++) {
    if (!(mask & (1u << s))) continue;
    const bound_segment *bs = &x->segments[v][s];
    for (int k = 0; k < bs->count; k++) {
      p->entries[p->entry_count] = (bp_exec_entry){s, k, bs->nodes[k].lane};
      access_of(x, &bs->nodes[k], &acc[p->entry_count]);
      p->lanes |= 1u << bs->nodes[k].lane;
      p->entry_count++;
    }
  }
  /* edges: for each other lane, the latest conflicting node there, unless
   * this lane already knows it done: known[to][l] is the latest node of
   * lane l that lane `to` has (transitively) waited for; snap[i] is what
   * node i's lane knew when i ran, which a waiter on i learns too */
  int known[BP_EXEC_LANES][BP_EXEC_LANES];
  for (int a = 0; a < BP_EXEC_LANES; a++)
    for (int b = 0; b < BP_EXEC_LANES; b++) known[a][b] = -1;
  const long drop = dropped_wait();
  long waits = 0;
  for (int j = 0; j < n; j++) {
    event[j] = -1;
    const int to = p->entries[j].lane;
    int want[BP_EXEC_LANES]; /* the latest conflicting node of each lane, or -1 */
    for (int l = 0; l < BP_EXEC_LANES; l++) {
      from[j * BP_EXEC_LANES + l] = want[l] = -1;
      if (l == to) continue;
      int i = j - 1;
      for (; i > known[to][l]; i--)
        if (p->entries[i].lane == l && conflict(&acc[i], &acc[j])) break;
      if (i > known[to][l]) want[l] = i;
    }
    for (int l = 0; l < BP_EXEC_LANES; l++) { /* left out: what another wait implies */
      const int i = want[l];
      int implied = 0;
      for (int m = 0; m < BP_EXEC_LANES && i >= 0; m++)
        implied |= m != l && want[m] >= 0 && snap[want[m] * BP_EXEC_LANES + l] >= i;
      if (i < 0 || implied) continue;
      if (waits++ == drop) {
        p->edges_dropped = 1;
        continue;
      }
      from[j * BP_EXEC_LANES + l] = i;
    }
    for (int l = 0; l < BP_EXEC_LANES; l++) {
      const int i = from[j * BP_EXEC_LANES + l];
      if (i < 0) continue;
      for (int m = 0; m < BP_EXEC_LANES; m++)
        if (snap[i * BP_EXEC_LANES + m] > known[to][m]) known[to][m] = snap[i * BP_EXEC_LANES + m];
      if (i > known[to][l]) known[to][l] = i;
    }
    for (int m = 0; m < BP_EXEC_LANES; m++) snap[j * BP_EXEC_LANES + m] = known[to][m];
  }
  for (int j = 0; j < n; j++)
    for (int l = 0; l < BP_EXEC_LANES; l++) {
      const int i = from[j * BP_EXEC_LANES + l];
      if (i >= 0 && event[i] < 0) event[i] = -2; /* records; numbered below */
    }
  /* chunks: a new one at a change of lane, at a node that waits, after a
   * node that records, where COMM begins or ends */
  for (int j = 0; j < n; j++) {
    int waits_here = 0;
    for (int l = 0; l < BP_EXEC_LANES; l++) waits_here += from[j * BP_EXEC_LANES + l] >= 0;
    bp_exec_chunk *c = p->chunk_count ? &p->chunks[p->chunk_count - 1] : NULL;
    const unsigned comm = 1u << BP_SEGMENT_COMM, seg = 1u << p->entries[j].segment;
    if (!c || c->lane != p->entries[j].lane || waits_here || c->record >= 0 ||
        (c->segments & comm) != (seg & comm)) {
      c = &p->chunks[p->chunk_count++];
      *c = (bp_exec_chunk){.lane = p->entries[j].lane, .first = j, .record = -1,
                           .wait_first = p->wait_total};
      for (int l = 0; l < BP_EXEC_LANES; l++) {
        const int i = from[j * BP_EXEC_LANES + l];
        if (i >= 0) p->waits[p->wait_total++] = event[i];
      }
      c->wait_count = p->wait_total - c->wait_first;
    }
    c->count++;
    c->segments |= seg;
    if (event[j] == -2) {
      event[j] = p->event_count++;
      c->record = event[j];
    }
  }
done:
  free(acc);
  free(from);
  free(event);
  free(snap);
  return st;
}

bp_status bp_exec_program_get(bp_exec *x, int variant, unsigned segment_mask,
                              const bp_exec_program **out) {
  if (!x || !out || variant < 0 || variant >= x->variant_count)
    return bp_fail(BP_ERR_INVALID, "bp_exec_program_get: variant %d", variant);
  for (int i = 0; i < x->program_count; i++)
    if (x->programs[i]->variant == variant && x->programs[i]->segment_mask == segment_mask) {
      *out = x->programs[i];
      return BP_OK;
    }
  if (x->program_count == x->program_cap) {
    const int cap = x->program_cap ? 2 * x->program_cap : 8;
    bp_exec_program **grown = realloc(x->programs, (size_t)cap * sizeof *grown);
    if (!grown) return bp_fail(BP_ERR_NOMEM, "out of memory deriving a stream program");
    x->programs = grown;
    x->program_cap = cap;
  }
  bp_exec_program *p = calloc(1, sizeof *p);
  if (!p) return bp_fail(BP_ERR_NOMEM, "out of memory deriving a stream program");
  bp_status st = build(x, variant, segment_mask, p);
  if (st != BP_OK) {
    program_free(p);
    return st;
  }
  x->programs[x->program_count++] = p;
  *out = p;
  return BP_OK;
}
