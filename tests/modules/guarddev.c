/* The "guarded" device plugin, for tests only: a device whose arena the
 * host cannot touch. It proves that the core reaches arena memory only
 * through the device ABI (copies, stream tasks), as it must on a GPU.
 *
 * Model:
 *  - Two devices (0 and 1), so that ranks map to devices. Arena memory is
 *    anonymous mappings kept PROT_NONE: any host load or store outside the
 *    plugin's own work is a SIGSEGV.
 *  - The "window": while any stream task runs (a copy or a host function),
 *    every arena of the plugin is readable and writable; when the last one
 *    ends they go back to PROT_NONE. A counter under one lock; mprotect at
 *    its 0 <-> 1 edges. Ranks as threads read each other's arenas inside
 *    their collectives, hence one window for all arenas.
 *  - Kernels are the "cpu" ones (kernel_kind) and are synchronous host code,
 *    so the host runs them inside stream_enqueue_host tasks on the compute
 *    stream (BP_ABI_DEVICE_HOST_TASK_KERNELS): inside the window.
 *  - A stream is one worker thread and a FIFO (the cpu plugin's
 *    plugins/cpu/stream_worker.c, compiled in); events are sequence numbers
 *    (recorded / completed) under the event's lock. An event is destroyed
 *    only when no task refers to it (the host's streams are idle then).
 *  - Counters for the tests (copies per stream role, waits of compute
 *    streams on events a transfer stream recorded, host tasks, uploads
 *    enqueued after a compute task and run before it was done) are reached
 *    through an extension of the device (GUARD_EXT_TYPE, below): the only
 *    exported symbol stays the entry. GUARD_COMPUTE_DELAY_MS (read at
 *    stream creation) makes every compute task sleep that long first, so a
 *    test sees the overlap of uploads with steps reliably.
 *  - A fake graph capture (BP_ABI_EXT_GRAPH_CAPTURE, unless built with
 *    GUARD_NO_GRAPH), strict where CUDA is: while a stream captures, the
 *    host tasks and copies enqueued on it are recorded, not run; another
 *    stream joins the capture by waiting on an event recorded in it and
 *    must be joined back (the origin waits on an event it recorded after
 *    its last work) before capture_end; synchronizing a capturing stream or
 *    a captured event, or a capturing stream waiting on an event recorded
 *    outside the capture, fails the call and the capture. Launching the
 *    graph enqueues copies of the recorded tasks on the launch stream, in
 *    the order they were recorded, each on the stream that recorded it (the
 *    origin's on the launch stream), the captured event records and waits
 *    becoming marks and waits on events of the graph's own: the graph runs
 *    with the concurrency it was captured with.
 *  - GUARD_SCHEDULE (read at the first stream's creation) replaces the
 *    threads by an adversary: per device one thread runs the tasks of all
 *    its streams, one at a time, and only while the host waits for that
 *    device (a synchronize), so everything the host enqueued before its
 *    wait is there to choose from; of the streams whose first task may run
 *    (a wait whose event is done, or any other task) it runs event marks
 *    and satisfied waits at once, and of the rest "latest": the one
 *    enqueued last, or with a number: a pick by a random generator seeded
 *    with it. A missing cross-stream wait then runs a consumer
 *    before its producer, deterministically; the results show it. One
 *    rank per device (a collective inside a task holds its device).
 *  - Its own collective transport (ABI 1.6): "threads" for the ranks of one
 *    process, on one device or several (SPANS_DEVICES | SHARES_DEVICE), a
 *    threads communicator the plugin makes (plugins/shared/threads_group.c),
 *    so the "threads" kernels serve it inside the compute tasks. Opens and
 *    closes are counted; the extension can make open fail.
 *  - GUARD_ABI15 builds it as a 1.5 plugin (its bp_abi_device ends before
 *    the transports), registering two devices: "guarded15" (kernels in host
 *    tasks: the host's own threads communicator serves its ranks) and
 *    "guarded15_opaque" (no host flags: a multi-rank run is refused). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bp_abi.h"
#include "bp_abi_device.h"
#include "guarddev.h"
#include "stream_worker.h"
#include "threads_group.h"

#define GUARD_DEVICES 2

static _Thread_local char guard_error[256];

static int guard_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int guard_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(guard_error, sizeof guard_error, fmt, ap);
  va_end(ap);
  return code;
}

static const char *guard_last_error(void) { return guard_error; }

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- arenas and the window ------------------------------------------------- */

typedef struct arena {
  struct arena *next;
  void *ptr;     /* what arena_alloc returned */
  void *map;     /* the mapping */
  size_t length; /* of the mapping */
} arena;

static pthread_mutex_t window_mu = PTHREAD_MUTEX_INITIALIZER;
static arena *arenas;    /* under window_mu */
static int window_open;  /* tasks running now; under window_mu */
/* compute host tasks enqueued, and run to the end; under window_mu */
static uint64_t compute_enqueued, compute_done;
static guard_stats stats; /* under window_mu */

static void protect_all(int prot) {
  for (arena *a = arenas; a; a = a->next)
    if (mprotect(a->map, a->length, prot) != 0) {
      fprintf(stderr, "guarddev: mprotect: %s\n", strerror(errno));
      abort();
    }
}

static void window_enter(void) {
  pthread_mutex_lock(&window_mu);
  if (window_open++ == 0) protect_all(PROT_READ | PROT_WRITE);
  pthread_mutex_unlock(&window_mu);
}

static void window_leave(void) {
  pthread_mutex_lock(&window_mu);
  if (--window_open == 0) protect_all(PROT_NONE);
  pthread_mutex_unlock(&window_mu);
}

static void count(uint64_t *counter) {
  pthread_mutex_lock(&window_mu);
  (*counter)++;
  pthread_mutex_unlock(&window_mu);
}

static int guard_arena_alloc(int device, uint64_t bytes, uint64_t alignment, void **ptr_out) {
  if (!ptr_out) return guard_fail(BP_ABI_ERR_INVALID, "arena_alloc: ptr_out is NULL");
  if (device < 0 || device >= GUARD_DEVICES)
    return guard_fail(BP_ABI_ERR_INVALID, "arena_alloc: no device %d (0..%d)", device,
                      GUARD_DEVICES - 1);
  if (bytes == 0 || alignment < 256 || (alignment & (alignment - 1)))
    return guard_fail(BP_ABI_ERR_INVALID, "arena_alloc: %llu bytes aligned to %llu",
                      (unsigned long long)bytes, (unsigned long long)alignment);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t align = alignment > page ? (size_t)alignment : page;
  const size_t length = ((size_t)bytes + page - 1) / page * page + align;
  arena *a = calloc(1, sizeof *a);
  if (!a) return guard_fail(BP_ABI_ERR_NOMEM, "arena_alloc: out of memory");
  pthread_mutex_lock(&window_mu);
  const int prot = window_open ? PROT_READ | PROT_WRITE : PROT_NONE;
  a->map = mmap(NULL, length, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a->map == MAP_FAILED) {
    pthread_mutex_unlock(&window_mu);
    free(a);
    return guard_fail(BP_ABI_ERR_NOMEM, "arena_alloc: mmap: %s", strerror(errno));
  }
  a->length = length;
  a->ptr = (void *)(((uintptr_t)a->map + align - 1) / align * align);
  a->next = arenas;
  arenas = a;
  stats.arenas++;
  pthread_mutex_unlock(&window_mu);
  *ptr_out = a->ptr; /* zero-filled */
  return BP_ABI_OK;
}

static void guard_arena_free(int device, void *ptr, uint64_t bytes) {
  (void)device;
  (void)bytes;
  if (!ptr) return;
  pthread_mutex_lock(&window_mu);
  arena **link = &arenas;
  while (*link && (*link)->ptr != ptr) link = &(*link)->next;
  arena *a = *link;
  if (a) {
    *link = a->next;
    munmap(a->map, a->length);
    stats.arenas--;
  }
  pthread_mutex_unlock(&window_mu);
  free(a);
}

/* ---- events ------------------------------------------------------------------ */

struct bp_abi_event {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded, completed; /* sequence numbers */
  int recorded_role;            /* the role of the stream of the last record */
  double done_ms;
  /* the last record was made in a capture: that graph's id (0: not), the
   * stream and the capture's operation count at that point */
  uint64_t capture_id;
  bp_abi_stream *capture_stream;
  uint64_t capture_op;
  int capture_gevent; /* the graph's event that record became */
  int device;
};

static int guard_event_create(int device, bp_abi_event **out) {
  if (!out) return guard_fail(BP_ABI_ERR_INVALID, "event_create: event_out is NULL");
  if (device < 0 || device >= GUARD_DEVICES)
    return guard_fail(BP_ABI_ERR_INVALID, "event_create: no device %d", device);
  bp_abi_event *e = calloc(1, sizeof *e);
  if (!e) return guard_fail(BP_ABI_ERR_NOMEM, "event_create: out of memory");
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->recorded_role = -1;
  e->device = device;
  *out = e;
  return BP_ABI_OK;
}

static void guard_event_destroy(bp_abi_event *e) {
  if (!e) return;
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

static void event_wait_for(bp_abi_event *e, uint64_t seq) {
  pthread_mutex_lock(&e->mu);
  while (e->completed < seq) pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}

/* ---- streams ----------------------------------------------------------------- */

typedef enum { TASK_HOST, TASK_COPY, TASK_RECORD, TASK_WAIT } task_kind;

typedef struct task {
  stream_task base; /* first: the worker's view */
  task_kind kind;
  void (*fn)(void *);
  void *arg;
  void *dst;
  const void *src;
  uint64_t bytes;
  bp_abi_event *event;
  uint64_t seq;
  int upload;  /* COPY: host to device on a transfer stream */
  uint64_t after; /* COPY: compute_enqueued when it was enqueued */
  int compute; /* HOST: on a compute stream */
  int delay_ms;
  bp_abi_stream *stream; /* captured: the stream that recorded it */
  int gevent;            /* captured RECORD / WAIT: the graph's event */
  uint64_t order;        /* GUARD_SCHEDULE: enqueue order on its device */
} task;

typedef struct guard_graph guard_graph;

/* ---- the adversary (GUARD_SCHEDULE) ------------------------------------------- */

typedef struct sched {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int streams;          /* live streams of the device: the thread runs while > 0 */
  int waiters;          /* host threads draining a stream of this device now */
  uint64_t order, rng;
  bp_abi_stream *list;  /* the device's streams */
} sched;

/* Host threads waiting for any device now (atomic): every adversary runs
 * then, since a task of one device may wait in a collective for a task of
 * another that nobody waits for. */
static int host_waiters;

#define SCHED_INIT {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER}
static sched scheds[GUARD_DEVICES] = {SCHED_INIT, SCHED_INIT};

/* GUARD_SCHEDULE now: 0 off, 1 latest, 2 seeded (*seed set). */
static int schedule_env(uint64_t *seed) {
  const char *e = getenv("GUARD_SCHEDULE");
  if (!e || !*e) return 0;
  if (strcmp(e, "latest") == 0) return 1;
  *seed = strtoull(e, NULL, 10) * 2654435761u + 88172645463325252u;
  return 2;
}

struct bp_abi_stream {
  stream_worker worker;
  int sched; /* run by the device's adversary (GUARD_SCHEDULE's mode), not the worker */
  /* GUARD_SCHEDULE: the stream's FIFO on its device's thread (under its mu) */
  task *head, *tail;
  int running;
  bp_abi_stream *next_in_device;
  int role, device;
  int delay_ms; /* GUARD_COMPUTE_DELAY_MS, compute streams */
  guard_graph *capture; /* the graph this stream records into, or NULL */
  uint64_t last_op;     /* capture: the operation count after its last recorded work */
  uint64_t joined_back; /* capture: the latest of its operations the origin waited for */
};

/* ---- graph capture (fake) ------------------------------------------------------- */

#define GUARD_GRAPH_STREAMS 8

struct guard_graph {
  guard_graph *next_open; /* the open captures, under window_mu */
  uint64_t id;
  bp_abi_stream *origin;
  bp_abi_stream *joined[GUARD_GRAPH_STREAMS];
  int joined_count;
  uint64_t ops; /* operations recorded so far (tasks, event records) */
  int gevents;  /* the graph's own events: one per event record in the capture */
  task **tasks;
  int count, cap;
  char failed[160]; /* an illegal call during the capture: capture_end fails with it */
};

typedef struct guard_exec {
  task *tasks; /* copies */
  int count;
  bp_abi_stream *origin; /* its tasks run on the launch stream */
  bp_abi_event **events; /* the graph's own (task.gevent) */
  int event_count;
} guard_exec;

static guard_graph *open_graphs; /* under window_mu */

static guard_graph *open_graph(uint64_t id) {
  pthread_mutex_lock(&window_mu);
  guard_graph *g = open_graphs;
  while (g && g->id != id) g = g->next_open;
  pthread_mutex_unlock(&window_mu);
  return g;
}

/* A call CUDA refuses during a capture: it fails, and so does the capture. */
static int capture_refuse(guard_graph *g, const char *what) {
  count(&stats.capture_errors);
  if (g && !g->failed[0]) snprintf(g->failed, sizeof g->failed, "%s during a capture", what);
  return guard_fail(BP_ABI_ERR_DEVICE, "%s: not allowed while capturing (as on CUDA)", what);
}

/* Runs on the stream's worker thread; frees t. */
static void task_run(stream_task *base) {
  task *t = (task *)base;
  switch (t->kind) {
  case TASK_HOST:
    if (t->compute && t->delay_ms)
      nanosleep(&(struct timespec){0, t->delay_ms * 1000000L}, NULL);
    window_enter();
    t->fn(t->arg);
    window_leave();
    if (t->compute) {
      pthread_mutex_lock(&window_mu);
      compute_done++;
      pthread_mutex_unlock(&window_mu);
    }
    break;
  case TASK_COPY:
    window_enter();
    if (t->upload) {
      pthread_mutex_lock(&window_mu);
      /* a compute task enqueued before this copy is not done yet (tasks of
       * one stream end in order; the tests run one compute stream) */
      if (compute_done < t->after) stats.uploads_during_compute++;
      pthread_mutex_unlock(&window_mu);
    }
    if (t->bytes) memmove(t->dst, t->src, (size_t)t->bytes);
    window_leave();
    break;
  case TASK_RECORD:
    pthread_mutex_lock(&t->event->mu);
    if (t->seq > t->event->completed) t->event->completed = t->seq;
    t->event->done_ms = now_ms();
    pthread_cond_broadcast(&t->event->cv);
    pthread_mutex_unlock(&t->event->mu);
    break;
  case TASK_WAIT:
    event_wait_for(t->event, t->seq);
    break;
  }
  free(t);
}

/* Hands t to s's worker, or to the device's adversary. */
static void stream_push(bp_abi_stream *s, task *t) {
  if (!s->sched) {
    stream_worker_push(&s->worker, &t->base);
    return;
  }
  sched *d = &scheds[s->device];
  pthread_mutex_lock(&d->mu);
  t->order = ++d->order;
  t->base.next = NULL;
  if (s->tail)
    s->tail->base.next = &t->base;
  else
    s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

static int push(bp_abi_stream *s, task *t) {
  if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "out of memory");
  guard_graph *g = s->capture;
  if (g) { /* recorded, not run; only this stream's thread records into g */
    if (g->count == g->cap) {
      const int cap = g->cap ? 2 * g->cap : 16;
      task **grown = realloc(g->tasks, (size_t)cap * sizeof *grown);
      if (!grown) {
        free(t);
        return guard_fail(BP_ABI_ERR_NOMEM, "out of memory recording a capture");
      }
      g->tasks = grown;
      g->cap = cap;
    }
    t->stream = s;
    g->tasks[g->count++] = t;
    s->last_op = ++g->ops;
    return BP_ABI_OK;
  }
  stream_push(s, t);
  return BP_ABI_OK;
}

static int task_ready(task *t) {
  if (t->kind != TASK_WAIT) return 1;
  pthread_mutex_lock(&t->event->mu);
  const int ready = t->event->completed >= t->seq;
  pthread_mutex_unlock(&t->event->mu);
  return ready;
}

/* The adversary's choice among the streams whose first task may run. */
static bp_abi_stream *sched_pick(sched *d, int mode) {
  bp_abi_stream *ready[64];
  int n = 0;
  for (bp_abi_stream *s = d->list; s && n < 64; s = s->next_in_device)
    if (s->head && task_ready(s->head)) {
      /* event marks and satisfied waits do no work: at once, so that the
       * choice is among tasks that do (the first on its stream may run) */
      if (s->head->kind == TASK_RECORD || s->head->kind == TASK_WAIT) return s;
      ready[n++] = s;
    }
  if (n == 0) return NULL;
  int pick = 0;
  if (mode == 1) {
    for (int i = 1; i < n; i++)
      if (ready[i]->head->order > ready[pick]->head->order) pick = i;
  } else {
    d->rng ^= d->rng << 13; /* xorshift64 */
    d->rng ^= d->rng >> 7;
    d->rng ^= d->rng << 17;
    pick = (int)(d->rng % (uint64_t)n);
  }
  return ready[pick];
}

/* A device's adversary: runs one task at a time while the host waits. */
static void *sched_main(void *arg) {
  sched *d = arg;
  pthread_mutex_lock(&d->mu);
  while (d->streams > 0) {
    const int waited = d->waiters > 0 || __atomic_load_n(&host_waiters, __ATOMIC_ACQUIRE) > 0;
    bp_abi_stream *s = waited ? sched_pick(d, d->list ? d->list->sched : 1) : NULL;
    if (!s) { /* events of other devices complete without telling us: poll */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 1000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&d->cv, &d->mu, &ts);
      continue;
    }
    task *t = s->head;
    s->head = (task *)(void *)t->base.next;
    if (!s->head) s->tail = NULL;
    s->running = 1;
    pthread_mutex_unlock(&d->mu);
    t->base.run(&t->base); /* frees t */
    pthread_mutex_lock(&d->mu);
    s->running = 0;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* The host waits for a device: the adversaries run meanwhile. */
static void sched_wait_begin(void) {
  __atomic_fetch_add(&host_waiters, 1, __ATOMIC_ACQ_REL);
  for (int i = 0; i < GUARD_DEVICES; i++) {
    pthread_mutex_lock(&scheds[i].mu);
    pthread_cond_broadcast(&scheds[i].cv);
    pthread_mutex_unlock(&scheds[i].mu);
  }
}

static void sched_wait_end(void) { __atomic_fetch_sub(&host_waiters, 1, __ATOMIC_ACQ_REL); }

/* Until every task pushed to s so far has run. */
static void sched_drain(bp_abi_stream *s) {
  sched *d = &scheds[s->device];
  sched_wait_begin();
  pthread_mutex_lock(&d->mu);
  d->waiters++;
  pthread_cond_broadcast(&d->cv);
  while (s->head || s->running) pthread_cond_wait(&d->cv, &d->mu);
  d->waiters--;
  pthread_mutex_unlock(&d->mu);
  sched_wait_end();
}

static int on_sched_thread(const bp_abi_stream *s) {
  sched *d = &scheds[s->device];
  pthread_mutex_lock(&d->mu);
  const int here = d->streams > 0 && pthread_equal(d->thread, pthread_self());
  pthread_mutex_unlock(&d->mu);
  return here;
}

static task *task_new(task_kind kind) {
  task *t = calloc(1, sizeof *t);
  if (t) {
    t->base.run = task_run;
    t->kind = kind;
  }
  return t;
}

static int guard_stream_create(int device, int role, bp_abi_stream **out) {
  if (!out) return guard_fail(BP_ABI_ERR_INVALID, "stream_create: stream_out is NULL");
  if (device < 0 || device >= GUARD_DEVICES)
    return guard_fail(BP_ABI_ERR_INVALID, "stream_create: no device %d", device);
  if (role < BP_ABI_STREAM_COMPUTE || role > BP_ABI_STREAM_UPDATE)
    return guard_fail(BP_ABI_ERR_INVALID, "stream_create: unknown role %d", role);
  bp_abi_stream *s = calloc(1, sizeof *s);
  if (!s) return guard_fail(BP_ABI_ERR_NOMEM, "stream_create: out of memory");
  s->role = role;
  s->device = device;
  const char *delay = getenv("GUARD_COMPUTE_DELAY_MS");
  if (delay && role == BP_ABI_STREAM_COMPUTE) s->delay_ms = atoi(delay) % 1000;
  uint64_t seed = 1;
  s->sched = schedule_env(&seed);
  if (s->sched) {
    sched *d = &scheds[device];
    pthread_mutex_lock(&d->mu);
    s->next_in_device = d->list;
    d->list = s;
    int rc = 0;
    if (d->streams++ == 0) {
      d->rng = seed;
      d->order = 0;
      rc = pthread_create(&d->thread, NULL, sched_main, d);
      if (rc) {
        d->streams = 0;
        d->list = NULL;
      }
    }
    pthread_mutex_unlock(&d->mu);
    if (rc) {
      free(s);
      return guard_fail(BP_ABI_ERR_DEVICE, "stream_create: %s", strerror(rc));
    }
    *out = s;
    return BP_ABI_OK;
  }
  const int rc = stream_worker_start(&s->worker);
  if (rc != 0) {
    free(s);
    return guard_fail(BP_ABI_ERR_DEVICE, "stream_create: %s", strerror(rc));
  }
  *out = s;
  return BP_ABI_OK;
}

static void guard_stream_destroy(bp_abi_stream *s) {
  if (!s) return;
  if (!s->sched) {
    stream_worker_stop(&s->worker);
    free(s);
    return;
  }
  sched_drain(s);
  sched *d = &scheds[s->device];
  pthread_mutex_lock(&d->mu);
  bp_abi_stream **link = &d->list;
  while (*link != s) link = &(*link)->next_in_device;
  *link = s->next_in_device;
  const int last = --d->streams == 0;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  if (last) pthread_join(d->thread, NULL);
  free(s);
}

static int guard_stream_synchronize(bp_abi_stream *s) {
  if (!s) return guard_fail(BP_ABI_ERR_INVALID, "stream_synchronize: stream is NULL");
  if (s->sched ? on_sched_thread(s) : stream_worker_is_current(&s->worker))
    return guard_fail(BP_ABI_ERR_INVALID, "stream_synchronize: from the stream's own task");
  if (s->capture) return capture_refuse(s->capture, "stream_synchronize");
  if (s->sched)
    sched_drain(s);
  else
    stream_worker_drain(&s->worker);
  return BP_ABI_OK;
}

static int guard_stream_enqueue_host(bp_abi_stream *s, void (*fn)(void *), void *arg) {
  if (!s || !fn) return guard_fail(BP_ABI_ERR_INVALID, "stream_enqueue_host: NULL argument");
  count(s->role == BP_ABI_STREAM_COMPUTE ? &stats.compute_host_tasks : &stats.other_host_tasks);
  task *t = task_new(TASK_HOST);
  if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "stream_enqueue_host: out of memory");
  t->fn = fn;
  t->arg = arg;
  t->compute = s->role == BP_ABI_STREAM_COMPUTE;
  t->delay_ms = s->delay_ms;
  if (t->compute && !s->capture) { /* a recorded one counts when launched */
    pthread_mutex_lock(&window_mu);
    compute_enqueued++;
    pthread_mutex_unlock(&window_mu);
  }
  return push(s, t);
}

static void *guard_stream_native(bp_abi_stream *s) { return s; }

static int guard_event_record(bp_abi_event *e, bp_abi_stream *s) {
  if (!e || !s) return guard_fail(BP_ABI_ERR_INVALID, "event_record: NULL argument");
  if (s->capture) { /* a point of the capture other streams may wait for: a mark */
    task *t = task_new(TASK_RECORD);
    if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "event_record: out of memory");
    t->gevent = s->capture->gevents++;
    const int rc = push(s, t);
    if (rc != BP_ABI_OK) return rc;
    pthread_mutex_lock(&e->mu);
    e->capture_id = s->capture->id;
    e->capture_stream = s;
    e->capture_op = s->last_op;
    e->capture_gevent = t->gevent;
    e->recorded_role = s->role;
    pthread_mutex_unlock(&e->mu);
    return BP_ABI_OK;
  }
  pthread_mutex_lock(&e->mu);
  e->capture_id = 0;
  pthread_mutex_unlock(&e->mu);
  task *t = task_new(TASK_RECORD);
  if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "event_record: out of memory");
  pthread_mutex_lock(&e->mu);
  t->seq = ++e->recorded;
  e->recorded_role = s->role;
  pthread_mutex_unlock(&e->mu);
  t->event = e;
  return push(s, t);
}

static int guard_stream_wait_event(bp_abi_stream *s, bp_abi_event *e) {
  if (!s || !e) return guard_fail(BP_ABI_ERR_INVALID, "stream_wait_event: NULL argument");
  pthread_mutex_lock(&e->mu);
  const uint64_t seq = e->recorded;
  const int from = e->recorded_role;
  const uint64_t capture_id = e->capture_id, capture_op = e->capture_op;
  const int capture_gevent = e->capture_gevent;
  bp_abi_stream *capture_stream = e->capture_stream;
  pthread_mutex_unlock(&e->mu);
  if (capture_id) {
    guard_graph *g = open_graph(capture_id);
    if (!g) return capture_refuse(s->capture, "stream_wait_event on an event of an ended capture");
    if (s->capture && s->capture != g)
      return capture_refuse(s->capture, "stream_wait_event across two captures");
    if (!s->capture) { /* s joins the capture */
      if (g->joined_count == GUARD_GRAPH_STREAMS)
        return capture_refuse(g, "stream_wait_event: too many streams joined");
      g->joined[g->joined_count++] = s;
      s->capture = g;
      s->last_op = s->joined_back = 0;
    }
    if (s == g->origin && capture_stream != g->origin && capture_op > capture_stream->joined_back)
      capture_stream->joined_back = capture_op; /* joined back up to there */
    task *t = task_new(TASK_WAIT); /* an edge of the graph */
    if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "stream_wait_event: out of memory");
    t->gevent = capture_gevent;
    return push(s, t);
  }
  if (s->capture && seq)
    return capture_refuse(s->capture, "stream_wait_event on an event recorded outside the capture");
  if (seq == 0) return BP_ABI_OK; /* never recorded */
  if (s->role == BP_ABI_STREAM_COMPUTE && from == BP_ABI_STREAM_TRANSFER)
    count(&stats.compute_waits_on_transfer);
  task *t = task_new(TASK_WAIT);
  if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "stream_wait_event: out of memory");
  t->event = e;
  t->seq = seq;
  return push(s, t);
}

static int guard_event_synchronize(bp_abi_event *e) {
  if (!e) return guard_fail(BP_ABI_ERR_INVALID, "event_synchronize: event is NULL");
  pthread_mutex_lock(&e->mu);
  const uint64_t seq = e->recorded;
  const uint64_t capture_id = e->capture_id;
  pthread_mutex_unlock(&e->mu);
  if (capture_id)
    return capture_refuse(open_graph(capture_id), "event_synchronize on a captured event");
  pthread_mutex_lock(&scheds[e->device].mu);
  const int sched_mode = scheds[e->device].streams > 0; /* its device has an adversary */
  pthread_mutex_unlock(&scheds[e->device].mu);
  if (sched_mode) sched_wait_begin();
  event_wait_for(e, seq);
  if (sched_mode) sched_wait_end();
  return BP_ABI_OK;
}

static int guard_event_elapsed_ms(bp_abi_event *a, bp_abi_event *b, float *ms) {
  if (!a || !b || !ms) return guard_fail(BP_ABI_ERR_INVALID, "event_elapsed_ms: NULL argument");
  *ms = (float)(b->done_ms - a->done_ms);
  return BP_ABI_OK;
}

static int copy(const char *what, void *dst, const void *src, uint64_t bytes, bp_abi_stream *s,
                uint64_t *counter, int upload) {
  if (!s) return guard_fail(BP_ABI_ERR_INVALID, "%s: stream is NULL", what);
  if (bytes && (!dst || !src)) return guard_fail(BP_ABI_ERR_INVALID, "%s: NULL pointer", what);
  count(counter);
  task *t = task_new(TASK_COPY);
  if (t) {
    t->dst = dst;
    t->src = src;
    t->bytes = bytes;
    t->upload = upload;
    pthread_mutex_lock(&window_mu);
    t->after = compute_enqueued;
    pthread_mutex_unlock(&window_mu);
  }
  return push(s, t);
}

static int guard_copy_h2d(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  const int transfer = s && s->role == BP_ABI_STREAM_TRANSFER;
  return copy("copy_h2d", dst, src, bytes, s, transfer ? &stats.h2d_transfer : &stats.h2d_other,
              transfer);
}
static int guard_copy_d2h(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return copy("copy_d2h", dst, src, bytes, s, &stats.d2h, 0);
}
static int guard_copy_d2d(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return copy("copy_d2d", dst, src, bytes, s, &stats.d2d, 0);
}

static int guard_host_alloc_pinned(uint64_t bytes, void **out) {
  if (!out || bytes == 0) return guard_fail(BP_ABI_ERR_INVALID, "host_alloc_pinned: bad argument");
  void *p = NULL;
  if (posix_memalign(&p, 256, (size_t)bytes) != 0)
    return guard_fail(BP_ABI_ERR_NOMEM, "host_alloc_pinned: out of memory");
  *out = p;
  return BP_ABI_OK;
}

static void guard_host_free_pinned(void *p) { free(p); }

static int guard_device_count(int *out) {
  if (!out) return guard_fail(BP_ABI_ERR_INVALID, "device_count: NULL");
  *out = GUARD_DEVICES;
  return BP_ABI_OK;
}

/* ---- the capture extension -------------------------------------------------------- */
#ifndef GUARD_NO_GRAPH

static uint64_t next_graph_id; /* under window_mu */

static void graph_free(guard_graph *g) {
  for (int i = 0; i < g->count; i++) free(g->tasks[i]);
  free(g->tasks);
  free(g);
}

static int guard_capture_begin(bp_abi_stream *s) {
  if (!s) return guard_fail(BP_ABI_ERR_INVALID, "capture_begin: stream is NULL");
  if (s->capture) return capture_refuse(s->capture, "capture_begin");
  guard_graph *g = calloc(1, sizeof *g);
  if (!g) return guard_fail(BP_ABI_ERR_NOMEM, "capture_begin: out of memory");
  g->origin = s;
  pthread_mutex_lock(&window_mu);
  g->id = ++next_graph_id;
  g->next_open = open_graphs;
  open_graphs = g;
  pthread_mutex_unlock(&window_mu);
  s->capture = g;
  s->last_op = s->joined_back = 0;
  return BP_ABI_OK;
}

static int guard_capture_end(bp_abi_stream *s, void **graph_out) {
  if (!s || !graph_out) return guard_fail(BP_ABI_ERR_INVALID, "capture_end: NULL argument");
  guard_graph *g = s->capture;
  if (!g || g->origin != s)
    return guard_fail(BP_ABI_ERR_INVALID, "capture_end: the stream did not begin a capture");
  pthread_mutex_lock(&window_mu);
  guard_graph **link = &open_graphs;
  while (*link != g) link = &(*link)->next_open;
  *link = g->next_open;
  pthread_mutex_unlock(&window_mu);
  char unjoined[96] = "";
  for (int i = 0; i < g->joined_count; i++) {
    bp_abi_stream *j = g->joined[i];
    if (j->last_op > j->joined_back && !unjoined[0])
      snprintf(unjoined, sizeof unjoined, "a stream of role %d was not joined back", j->role);
    j->capture = NULL;
  }
  s->capture = NULL;
  *graph_out = NULL;
  if (getenv("GUARD_CAPTURE_FAIL") && !g->failed[0]) /* tests: a capture CUDA refuses */
    snprintf(g->failed, sizeof g->failed, "GUARD_CAPTURE_FAIL is set");
  if (g->failed[0] || unjoined[0]) {
    const int rc = guard_fail(BP_ABI_ERR_DEVICE, "capture_end: the capture failed: %s",
                              g->failed[0] ? g->failed : unjoined);
    graph_free(g);
    return rc;
  }
  count(&stats.captures);
  *graph_out = g;
  return BP_ABI_OK;
}

static void guard_exec_destroy(void *exec);

static int guard_instantiate(void *graph, void **exec_out) {
  if (!graph || !exec_out) return guard_fail(BP_ABI_ERR_INVALID, "instantiate: NULL argument");
  const guard_graph *g = graph;
  guard_exec *x = calloc(1, sizeof *x);
  if (x && g->count) x->tasks = malloc((size_t)g->count * sizeof *x->tasks);
  if (!x || (g->count && !x->tasks)) {
    free(x);
    return guard_fail(BP_ABI_ERR_NOMEM, "instantiate: out of memory");
  }
  for (int i = 0; i < g->count; i++) x->tasks[i] = *g->tasks[i];
  x->count = g->count;
  x->origin = g->origin;
  x->events = calloc((size_t)g->gevents + 1, sizeof *x->events);
  for (int i = 0; x->events && i < g->gevents; i++)
    if (guard_event_create(g->origin->device, &x->events[x->event_count++]) != BP_ABI_OK) break;
  if (!x->events || x->event_count < g->gevents) {
    guard_exec_destroy(x);
    return guard_fail(BP_ABI_ERR_NOMEM, "instantiate: out of memory");
  }
  *exec_out = x;
  return BP_ABI_OK;
}

static int guard_launch(void *exec, bp_abi_stream *s) {
  if (!exec || !s) return guard_fail(BP_ABI_ERR_INVALID, "launch: NULL argument");
  if (s->capture) return capture_refuse(s->capture, "launch");
  const guard_exec *x = exec;
  count(&stats.graph_launches);
  for (int i = 0; i < x->count; i++) {
    task *t = task_new(x->tasks[i].kind);
    if (!t) return guard_fail(BP_ABI_ERR_NOMEM, "launch: out of memory");
    *t = x->tasks[i];
    bp_abi_stream *on = t->stream == x->origin ? s : t->stream;
    t->base.run = task_run;
    t->upload = 0; /* on the launch stream now */
    t->compute = t->kind == TASK_HOST && on->role == BP_ABI_STREAM_COMPUTE;
    t->delay_ms = on->delay_ms;
    if (t->kind == TASK_RECORD || t->kind == TASK_WAIT) { /* the graph's own events */
      t->event = x->events[t->gevent];
      pthread_mutex_lock(&t->event->mu);
      t->seq = t->kind == TASK_RECORD ? ++t->event->recorded : t->event->recorded;
      pthread_mutex_unlock(&t->event->mu);
    }
    pthread_mutex_lock(&window_mu);
    if (t->compute) compute_enqueued++;
    t->after = compute_enqueued;
    pthread_mutex_unlock(&window_mu);
    stream_push(on, t);
  }
  return BP_ABI_OK;
}

static void guard_graph_destroy(void *graph) {
  if (graph) graph_free(graph);
}

static void guard_exec_destroy(void *exec) {
  guard_exec *x = exec;
  if (!x) return;
  for (int i = 0; i < x->event_count; i++) guard_event_destroy(x->events[i]);
  free(x->events);
  free(x->tasks);
  free(x);
}
#endif

/* ---- the collective transport ------------------------------------------------- */

static int comm_open_fails; /* under window_mu */

#ifndef GUARD_ABI15

static int guard_comm_open(void *user, const bp_abi_comm_open_args *a, void **group_out) {
  (void)user;
  pthread_mutex_lock(&window_mu);
  const int fail = comm_open_fails;
  pthread_mutex_unlock(&window_mu);
  if (fail) {
    snprintf(a->reason, a->reason_size, "guarded: opening refused (the test asked for it)");
    return BP_ABI_ERR_DEVICE;
  }
  if (a->bootstrap || a->first_rank != 0 || a->local != a->world) {
    snprintf(a->reason, a->reason_size, "guarded: its transport serves ranks of one process");
    return BP_ABI_ERR_UNSUPPORTED;
  }
  for (int32_t k = 0; k < a->local; k++)
    if (a->devices[k] < 0 || a->devices[k] >= GUARD_DEVICES) {
      snprintf(a->reason, a->reason_size, "guarded: rank %d on device %d", (int)k,
               (int)a->devices[k]);
      return BP_ABI_ERR_INVALID;
    }
  threads_group *g = NULL;
  const int rc = threads_group_open(a->world, &g, a->reason, a->reason_size);
  if (rc != BP_ABI_OK) return rc;
  count(&stats.comm_opens);
  *group_out = g;
  return BP_ABI_OK;
}

static int guard_comm(void *group, int32_t k, bp_abi_comm *out) {
  return threads_group_comm(group, k, out);
}

static void guard_comm_close(void *group) {
  count(&stats.comm_closes);
  threads_group_close(group);
}

static const bp_abi_comm_transport transports[] = {{
    .struct_size = sizeof(bp_abi_comm_transport),
    .backend = "threads",
    .flags = BP_ABI_COMM_SPANS_DEVICES | BP_ABI_COMM_SHARES_DEVICE,
    .open = guard_comm_open,
    .comm = guard_comm,
    .close = guard_comm_close,
}};
#endif

/* ---- the tests' extension ------------------------------------------------------ */

static void guard_read_stats(guard_stats *out) {
  pthread_mutex_lock(&window_mu);
  *out = stats;
  pthread_mutex_unlock(&window_mu);
}

static void guard_fail_comm_open(int fail) {
  pthread_mutex_lock(&window_mu);
  comm_open_fails = fail;
  pthread_mutex_unlock(&window_mu);
}

#ifdef GUARD_NO_GRAPH
#define GUARD_GRAPH_EXT NULL
#else
static const bp_abi_device_graph_ext graph_ext = {
    .header = {.struct_size = sizeof(bp_abi_device_graph_ext),
               .type = BP_ABI_EXT_GRAPH_CAPTURE,
               .next = NULL},
    .capture_begin = guard_capture_begin,
    .capture_end = guard_capture_end,
    .instantiate = guard_instantiate,
    .launch = guard_launch,
    .graph_destroy = guard_graph_destroy,
    .exec_destroy = guard_exec_destroy,
};
#define GUARD_GRAPH_EXT (&graph_ext.header)
#endif

static const guard_ext ext = {
    .header = {.struct_size = sizeof(guard_ext), .type = GUARD_EXT_TYPE, .next = GUARD_GRAPH_EXT},
    .read_stats = guard_read_stats,
    .fail_comm_open = guard_fail_comm_open,
};

#define GUARD_FUNCTIONS                                \
  .device_count = guard_device_count,                  \
  .arena_alloc = guard_arena_alloc,                    \
  .arena_free = guard_arena_free,                      \
  .stream_create = guard_stream_create,                \
  .stream_destroy = guard_stream_destroy,              \
  .stream_synchronize = guard_stream_synchronize,      \
  .stream_enqueue_host = guard_stream_enqueue_host,    \
  .stream_native = guard_stream_native,                \
  .event_create = guard_event_create,                  \
  .event_destroy = guard_event_destroy,                \
  .event_record = guard_event_record,                  \
  .stream_wait_event = guard_stream_wait_event,        \
  .event_synchronize = guard_event_synchronize,        \
  .event_elapsed_ms = guard_event_elapsed_ms,          \
  .copy_h2d = guard_copy_h2d,                          \
  .copy_d2h = guard_copy_d2h,                          \
  .copy_d2d = guard_copy_d2d,                          \
  .host_alloc_pinned = guard_host_alloc_pinned,        \
  .host_free_pinned = guard_host_free_pinned,          \
  .last_error = guard_last_error,                      \
  .extensions = &ext.header

#ifdef GUARD_ABI15
/* A plugin built against 1.5: its struct ends at kernel_kind. */
#define GUARD_ABI15_SIZE (offsetof(bp_abi_device, kernel_kind) + sizeof(const char *))
static const bp_abi_device device = {
    .struct_size = GUARD_ABI15_SIZE,
    .kind = "guarded15",
    GUARD_FUNCTIONS,
    .flags = BP_ABI_DEVICE_HOST_TASK_KERNELS,
    .kernel_kind = "cpu",
};
/* Neither host flag: the host cannot run a collective on its memory. */
static const bp_abi_device opaque = {
    .struct_size = GUARD_ABI15_SIZE,
    .kind = "guarded15_opaque",
    GUARD_FUNCTIONS,
    .kernel_kind = "cpu",
};

static int init(const bp_abi_host *host) {
  const int rc = host->register_device(host->ctx, &device);
  return rc != BP_ABI_OK ? rc : host->register_device(host->ctx, &opaque);
}
#else
static const bp_abi_device device = {
    .struct_size = sizeof(bp_abi_device),
    .kind = "guarded",
    GUARD_FUNCTIONS,
#ifdef GUARD_CLAIMS_HOST
    /* a lie, for the test that the guard catches the host's own accesses */
    .flags = BP_ABI_DEVICE_HOST_ACCESSIBLE,
#else
    .flags = BP_ABI_DEVICE_HOST_TASK_KERNELS,
#endif
    .kernel_kind = "cpu",
    .transports = transports,
    .num_transports = sizeof transports / sizeof transports[0],
};

static int init(const bp_abi_host *host) { return host->register_device(host->ctx, &device); }
#endif

static const bp_abi_module module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
#ifdef GUARD_ABI15
    .abi_minor_built = 5,
#else
    .abi_minor_built = BP_ABI_MINOR,
#endif
    .abi_minor_required = 4,
    .name = "device-guarded",
    .version = "0.0.0",
    .build_id = "test",
    .init = init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &module; }
