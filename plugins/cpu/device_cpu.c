/* The "cpu" device plugin: host arenas, and streams and events with the
 * semantics a CUDA stream has, built on pthreads.
 *
 * Model:
 *  - One device (device 0). Ranks as threads share it; each rank allocates
 *    its own arena.
 *  - A stream is one worker thread and a FIFO of tasks (host functions,
 *    copies, event records, event waits; stream_worker.h). The worker runs
 *    them one at a time in enqueue order, so work on one stream is ordered;
 *    work on different streams runs concurrently.
 *  - An event record enqueues a marker. The marker completes, and stamps
 *    the completion time, when the worker reaches it, i.e. when everything
 *    enqueued before it on that stream is done. Each record creates a new
 *    "point" (refcounted) that the event then names; waits and synchronize
 *    calls hold the point they captured, so recording the event again later
 *    does not change what an earlier wait waits for (as in CUDA).
 *  - stream_wait_event enqueues a wait task: the worker blocks on the
 *    captured point before it runs anything enqueued after the wait. An
 *    event that was never recorded is already complete (a no-op wait).
 *
 * Invariants (checked where they are kept):
 *  1. A stream's completed <= enqueued; they are equal exactly when the
 *     FIFO is empty and the worker is idle (kept by stream_worker.c).
 *  2. A point's refcount counts the event naming it plus every pending
 *     marker, wait task and waiter holding it; it is freed at zero.
 *  3. A point goes from pending to done once and never back.
 *
 * Errors: every function returns BP_ABI_OK or an error code and leaves a
 * message for last_error() on the calling thread. Nothing aborts on a
 * caller's arguments; a broken internal invariant aborts through
 * BP_ASSERT (bp_abi_sdk.h). */
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
#include "bp_abi_sdk.h"
#include "stream_worker.h"

#ifndef BP_PLUGIN_VERSION
#define BP_PLUGIN_VERSION "0.0.0"
#endif

/* Arenas of at least this many bytes are mapped (2 MiB aligned) and
 * advised to use transparent huge pages. */
#define CPU_HUGE_THRESHOLD (4ull << 20)
#define CPU_HUGE_PAGE (2ull << 20)
#define CPU_MIN_ALIGN 256ull

/* ---- per-thread error text ------------------------------------------------ */

static _Thread_local char cpu_error[512];

static int cpu_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cpu_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cpu_error, sizeof cpu_error, fmt, ap);
  va_end(ap);
  return code;
}

static const char *cpu_last_error(void) { return cpu_error; }

static double cpu_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- points: one record of an event --------------------------------------- */

typedef struct cpu_point {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;          /* invariant 2 */
  int done;          /* invariant 3 */
  double done_ms;    /* CLOCK_MONOTONIC at completion */
} cpu_point;

static cpu_point *cpu_point_create(void) {
  cpu_point *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  if (pthread_mutex_init(&p->mu, NULL) != 0) {
    free(p);
    return NULL;
  }
  if (pthread_cond_init(&p->cv, NULL) != 0) {
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
  }
  p->refs = 1;
  return p;
}

static void cpu_point_ref(cpu_point *p) {
  pthread_mutex_lock(&p->mu);
  BP_ASSERT(p->refs > 0);
  p->refs++;
  pthread_mutex_unlock(&p->mu);
}

static void cpu_point_unref(cpu_point *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  BP_ASSERT(p->refs > 0);
  int last = --p->refs == 0;
  pthread_mutex_unlock(&p->mu);
  if (last) {
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
  }
}

static void cpu_point_complete(cpu_point *p) {
  pthread_mutex_lock(&p->mu);
  BP_ASSERT(!p->done);
  p->done_ms = cpu_now_ms();
  p->done = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

static void cpu_point_wait(cpu_point *p) {
  pthread_mutex_lock(&p->mu);
  while (!p->done) pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/* ---- streams --------------------------------------------------------------- */

typedef enum cpu_task_kind {
  CPU_TASK_HOST = 0, /* fn(arg) */
  CPU_TASK_COPY,     /* memmove(dst, src, bytes) */
  CPU_TASK_RECORD,   /* complete point */
  CPU_TASK_WAIT,     /* block until point is done */
} cpu_task_kind;

typedef struct cpu_task {
  stream_task base; /* first: the worker's view */
  cpu_task_kind kind;
  void (*fn)(void *arg);
  void *arg;
  void *dst;
  const void *src;
  uint64_t bytes;
  cpu_point *point; /* RECORD, WAIT: one reference held by the task */
} cpu_task;

struct bp_abi_stream {
  stream_worker worker; /* invariant 1 */
  int role;
};

/* Runs on the stream's worker thread; frees t. */
static void cpu_task_run(stream_task *base) {
  cpu_task *t = (cpu_task *)base;
  switch (t->kind) {
    case CPU_TASK_HOST:
      t->fn(t->arg);
      break;
    case CPU_TASK_COPY:
      if (t->bytes) memmove(t->dst, t->src, (size_t)t->bytes);
      break;
    case CPU_TASK_RECORD:
      cpu_point_complete(t->point);
      break;
    case CPU_TASK_WAIT:
      cpu_point_wait(t->point);
      break;
  }
  cpu_point_unref(t->point);
  free(t);
}

/* Appends t (handed over) to the FIFO. */
static void cpu_stream_push(bp_abi_stream *s, cpu_task *t) {
  stream_worker_push(&s->worker, &t->base);
}

static cpu_task *cpu_task_new(cpu_task_kind kind) {
  cpu_task *t = calloc(1, sizeof *t);
  if (t) {
    t->base.run = cpu_task_run;
    t->kind = kind;
  }
  return t;
}

static int cpu_stream_create(int device, int role, bp_abi_stream **stream_out) {
  if (!stream_out) return cpu_fail(BP_ABI_ERR_INVALID, "stream_create: stream_out is NULL");
  if (device != 0)
    return cpu_fail(BP_ABI_ERR_INVALID, "stream_create: device %d (the cpu device has only 0)",
                    device);
  if (role < BP_ABI_STREAM_COMPUTE || role > BP_ABI_STREAM_UPDATE)
    return cpu_fail(BP_ABI_ERR_INVALID, "stream_create: unknown role %d", role);
  bp_abi_stream *s = calloc(1, sizeof *s);
  if (!s) return cpu_fail(BP_ABI_ERR_NOMEM, "stream_create: out of memory");
  s->role = role;
  const int rc = stream_worker_start(&s->worker);
  if (rc != 0) {
    free(s);
    return cpu_fail(BP_ABI_ERR_DEVICE, "stream_create: %s", strerror(rc));
  }
  *stream_out = s;
  return BP_ABI_OK;
}

/* Runs what is enqueued, then stops the worker (a stream's own task may
 * not destroy it). */
static void cpu_stream_destroy(bp_abi_stream *s) {
  if (!s) return;
  stream_worker_stop(&s->worker);
  free(s);
}

static int cpu_stream_synchronize(bp_abi_stream *s) {
  if (!s) return cpu_fail(BP_ABI_ERR_INVALID, "stream_synchronize: stream is NULL");
  if (stream_worker_is_current(&s->worker))
    return cpu_fail(BP_ABI_ERR_INVALID,
                    "stream_synchronize: called from a task of the same stream (would deadlock)");
  stream_worker_drain(&s->worker);
  return BP_ABI_OK;
}

static int cpu_stream_enqueue_host(bp_abi_stream *s, void (*fn)(void *arg), void *arg) {
  if (!s) return cpu_fail(BP_ABI_ERR_INVALID, "stream_enqueue_host: stream is NULL");
  if (!fn) return cpu_fail(BP_ABI_ERR_INVALID, "stream_enqueue_host: fn is NULL");
  cpu_task *t = cpu_task_new(CPU_TASK_HOST);
  if (!t) return cpu_fail(BP_ABI_ERR_NOMEM, "stream_enqueue_host: out of memory");
  t->fn = fn;
  t->arg = arg;
  cpu_stream_push(s, t);
  return BP_ABI_OK;
}

static void *cpu_stream_native(bp_abi_stream *s) { return s; }

/* ---- events ---------------------------------------------------------------- */

struct bp_abi_event {
  pthread_mutex_t mu;
  cpu_point *point; /* the latest record; NULL: never recorded */
};

static int cpu_event_create(int device, bp_abi_event **event_out) {
  if (!event_out) return cpu_fail(BP_ABI_ERR_INVALID, "event_create: event_out is NULL");
  if (device != 0)
    return cpu_fail(BP_ABI_ERR_INVALID, "event_create: device %d (the cpu device has only 0)",
                    device);
  bp_abi_event *e = calloc(1, sizeof *e);
  if (!e) return cpu_fail(BP_ABI_ERR_NOMEM, "event_create: out of memory");
  int rc = pthread_mutex_init(&e->mu, NULL);
  if (rc != 0) {
    free(e);
    return cpu_fail(BP_ABI_ERR_DEVICE, "event_create: %s", strerror(rc));
  }
  *event_out = e;
  return BP_ABI_OK;
}

/* Pending markers keep their point alive, so destroying an event with a
 * record in flight is safe (as in CUDA). */
static void cpu_event_destroy(bp_abi_event *e) {
  if (!e) return;
  cpu_point_unref(e->point);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

/* The event's latest point with a reference for the caller, or NULL. */
static cpu_point *cpu_event_take_point(bp_abi_event *e) {
  pthread_mutex_lock(&e->mu);
  cpu_point *p = e->point;
  if (p) cpu_point_ref(p);
  pthread_mutex_unlock(&e->mu);
  return p;
}

static int cpu_event_record(bp_abi_event *e, bp_abi_stream *s) {
  if (!e) return cpu_fail(BP_ABI_ERR_INVALID, "event_record: event is NULL");
  if (!s) return cpu_fail(BP_ABI_ERR_INVALID, "event_record: stream is NULL");
  cpu_task *t = cpu_task_new(CPU_TASK_RECORD);
  cpu_point *p = cpu_point_create();
  if (!t || !p) {
    free(t);
    cpu_point_unref(p);
    return cpu_fail(BP_ABI_ERR_NOMEM, "event_record: out of memory");
  }
  cpu_point_ref(p); /* one for the event, one for the marker */
  t->point = p;
  pthread_mutex_lock(&e->mu);
  cpu_point *old = e->point;
  e->point = p;
  pthread_mutex_unlock(&e->mu);
  cpu_point_unref(old);
  cpu_stream_push(s, t);
  return BP_ABI_OK;
}

static int cpu_stream_wait_event(bp_abi_stream *s, bp_abi_event *e) {
  if (!s) return cpu_fail(BP_ABI_ERR_INVALID, "stream_wait_event: stream is NULL");
  if (!e) return cpu_fail(BP_ABI_ERR_INVALID, "stream_wait_event: event is NULL");
  cpu_point *p = cpu_event_take_point(e);
  if (!p) return BP_ABI_OK; /* never recorded: nothing to wait for */
  cpu_task *t = cpu_task_new(CPU_TASK_WAIT);
  if (!t) {
    cpu_point_unref(p);
    return cpu_fail(BP_ABI_ERR_NOMEM, "stream_wait_event: out of memory");
  }
  t->point = p;
  cpu_stream_push(s, t);
  return BP_ABI_OK;
}

static int cpu_event_synchronize(bp_abi_event *e) {
  if (!e) return cpu_fail(BP_ABI_ERR_INVALID, "event_synchronize: event is NULL");
  cpu_point *p = cpu_event_take_point(e);
  if (!p) return BP_ABI_OK;
  cpu_point_wait(p);
  cpu_point_unref(p);
  return BP_ABI_OK;
}

/* Completion time of e's latest record; 0 if it has not completed. */
static int cpu_event_done_ms(bp_abi_event *e, double *ms_out) {
  cpu_point *p = cpu_event_take_point(e);
  if (!p) return 0;
  pthread_mutex_lock(&p->mu);
  int done = p->done;
  *ms_out = p->done_ms;
  pthread_mutex_unlock(&p->mu);
  cpu_point_unref(p);
  return done;
}

static int cpu_event_elapsed_ms(bp_abi_event *start, bp_abi_event *end, float *ms_out) {
  if (!start || !end || !ms_out)
    return cpu_fail(BP_ABI_ERR_INVALID, "event_elapsed_ms: start, end and ms_out must be set");
  double t0 = 0, t1 = 0;
  if (!cpu_event_done_ms(start, &t0) || !cpu_event_done_ms(end, &t1))
    return cpu_fail(BP_ABI_ERR_INVALID,
                    "event_elapsed_ms: an event was not recorded or has not completed");
  *ms_out = (float)(t1 - t0);
  return BP_ABI_OK;
}

/* ---- copies ---------------------------------------------------------------- */

static int cpu_copy(const char *what, void *dst, const void *src, uint64_t bytes,
                    bp_abi_stream *s) {
  if (!s) return cpu_fail(BP_ABI_ERR_INVALID, "%s: stream is NULL", what);
  if (bytes && (!dst || !src))
    return cpu_fail(BP_ABI_ERR_INVALID, "%s: NULL %s with %llu bytes", what,
                    dst ? "src" : "dst", (unsigned long long)bytes);
  if (bytes > SIZE_MAX)
    return cpu_fail(BP_ABI_ERR_INVALID, "%s: %llu bytes do not fit in memory", what,
                    (unsigned long long)bytes);
  cpu_task *t = cpu_task_new(CPU_TASK_COPY);
  if (!t) return cpu_fail(BP_ABI_ERR_NOMEM, "%s: out of memory", what);
  t->dst = dst;
  t->src = src;
  t->bytes = bytes;
  cpu_stream_push(s, t);
  return BP_ABI_OK;
}

static int cpu_copy_h2d(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return cpu_copy("copy_h2d", dst, src, bytes, s);
}
static int cpu_copy_d2h(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return cpu_copy("copy_d2h", dst, src, bytes, s);
}
static int cpu_copy_d2d(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return cpu_copy("copy_d2d", dst, src, bytes, s);
}

/* ---- memory ---------------------------------------------------------------- */

/* Mapped arenas, so arena_free knows how each block was made (an arena that
 * could not be mapped falls back to posix_memalign). */
typedef struct cpu_mapping {
  struct cpu_mapping *next;
  void *ptr;
  size_t length;
} cpu_mapping;

/* Process-wide on purpose: the device ABI's arena_alloc/arena_free carry
 * no context (bp_abi_device.h), and an arena pointer is unique in the
 * process, so one list under one lock serves every registry. */
static pthread_mutex_t cpu_mappings_mu = PTHREAD_MUTEX_INITIALIZER;
static cpu_mapping *cpu_mappings;

static int cpu_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static uint64_t cpu_round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* bytes (page rounded) at an `align`-aligned address, advised for huge
 * pages; NULL if the system refuses the mapping. */
static void *cpu_map_aligned(uint64_t bytes, uint64_t align, size_t *length_out) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  if (page == 0 || page == (uint64_t)-1) page = 4096;
  uint64_t length = cpu_round_up(bytes, page);
  if (align < page) align = page;
  if (length > SIZE_MAX - align) {
    errno = ENOMEM;
    return NULL;
  }
  size_t span = (size_t)(length + align - page);
  char *base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  uintptr_t start = (uintptr_t)cpu_round_up((uint64_t)(uintptr_t)base, align);
  size_t head = (size_t)(start - (uintptr_t)base);
  size_t tail = span - head - (size_t)length;
  if (head) munmap(base, head);
  if (tail) munmap((char *)start + length, tail);
#ifdef MADV_HUGEPAGE
  (void)madvise((void *)start, (size_t)length, MADV_HUGEPAGE); /* advice only */
#endif
  *length_out = (size_t)length;
  return (void *)start;
}

/* Zero-filled arena memory aligned to `alignment` (a power of two >= 256). */
static int cpu_arena_alloc(int device, uint64_t bytes, uint64_t alignment, void **ptr_out) {
  if (!ptr_out) return cpu_fail(BP_ABI_ERR_INVALID, "arena_alloc: ptr_out is NULL");
  if (device != 0)
    return cpu_fail(BP_ABI_ERR_INVALID, "arena_alloc: device %d (the cpu device has only 0)",
                    device);
  if (bytes == 0) return cpu_fail(BP_ABI_ERR_INVALID, "arena_alloc: 0 bytes");
  if (alignment < CPU_MIN_ALIGN || !cpu_is_pow2(alignment))
    return cpu_fail(BP_ABI_ERR_INVALID,
                    "arena_alloc: alignment %llu (must be a power of two >= %llu)",
                    (unsigned long long)alignment, CPU_MIN_ALIGN);
  if (bytes > SIZE_MAX / 2 || alignment > SIZE_MAX / 2)
    return cpu_fail(BP_ABI_ERR_NOMEM, "arena_alloc: %llu bytes do not fit in memory",
                    (unsigned long long)bytes);
  if (bytes >= CPU_HUGE_THRESHOLD) {
    cpu_mapping *m = malloc(sizeof *m);
    void *p = NULL;
    if (m) p = cpu_map_aligned(bytes, alignment > CPU_HUGE_PAGE ? alignment : CPU_HUGE_PAGE,
                               &m->length);
    int map_errno = errno;
    if (!p && m && map_errno == ENOMEM) {
      /* the heap would ask the kernel for the same memory: give up here */
      free(m);
      return cpu_fail(BP_ABI_ERR_NOMEM, "arena_alloc: mmap of %llu bytes: %s",
                      (unsigned long long)bytes, strerror(map_errno));
    }
    if (p) {
      m->ptr = p;
      pthread_mutex_lock(&cpu_mappings_mu);
      m->next = cpu_mappings;
      cpu_mappings = m;
      pthread_mutex_unlock(&cpu_mappings_mu);
      *ptr_out = p; /* anonymous mappings are zero-filled */
      return BP_ABI_OK;
    }
    free(m); /* mapping refused for another reason: fall back to the heap */
  }
  void *p = NULL;
  int rc = posix_memalign(&p, (size_t)alignment, (size_t)bytes);
  if (rc != 0)
    return cpu_fail(BP_ABI_ERR_NOMEM, "arena_alloc: %llu bytes aligned to %llu: %s",
                    (unsigned long long)bytes, (unsigned long long)alignment, strerror(rc));
  memset(p, 0, (size_t)bytes);
  *ptr_out = p;
  return BP_ABI_OK;
}

static void cpu_arena_free(int device, void *ptr, uint64_t bytes) {
  (void)device;
  (void)bytes;
  if (!ptr) return;
  pthread_mutex_lock(&cpu_mappings_mu);
  cpu_mapping **link = &cpu_mappings;
  while (*link && (*link)->ptr != ptr) link = &(*link)->next;
  cpu_mapping *m = *link;
  if (m) *link = m->next;
  pthread_mutex_unlock(&cpu_mappings_mu);
  if (m) {
    munmap(m->ptr, m->length);
    free(m);
  } else {
    free(ptr);
  }
}

/* Pinned memory on the CPU is plain aligned host memory. */
static int cpu_host_alloc_pinned(uint64_t bytes, void **ptr_out) {
  if (!ptr_out) return cpu_fail(BP_ABI_ERR_INVALID, "host_alloc_pinned: ptr_out is NULL");
  if (bytes == 0) return cpu_fail(BP_ABI_ERR_INVALID, "host_alloc_pinned: 0 bytes");
  if (bytes > SIZE_MAX / 2)
    return cpu_fail(BP_ABI_ERR_NOMEM, "host_alloc_pinned: %llu bytes do not fit in memory",
                    (unsigned long long)bytes);
  void *p = NULL;
  int rc = posix_memalign(&p, (size_t)CPU_MIN_ALIGN, (size_t)bytes);
  if (rc != 0)
    return cpu_fail(BP_ABI_ERR_NOMEM, "host_alloc_pinned: %llu bytes: %s",
                    (unsigned long long)bytes, strerror(rc));
  *ptr_out = p;
  return BP_ABI_OK;
}

static void cpu_host_free_pinned(void *ptr) { free(ptr); }

static int cpu_device_count(int *count_out) {
  if (!count_out) return cpu_fail(BP_ABI_ERR_INVALID, "device_count: count_out is NULL");
  *count_out = 1;
  return BP_ABI_OK;
}

/* ---- registration ---------------------------------------------------------- */

static const bp_abi_device cpu_device = {
    .struct_size = sizeof(bp_abi_device),
    .kind = "cpu",
    .device_count = cpu_device_count,
    .arena_alloc = cpu_arena_alloc,
    .arena_free = cpu_arena_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .stream_enqueue_host = cpu_stream_enqueue_host,
    .stream_native = cpu_stream_native,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .copy_h2d = cpu_copy_h2d,
    .copy_d2h = cpu_copy_d2h,
    .copy_d2d = cpu_copy_d2d,
    .host_alloc_pinned = cpu_host_alloc_pinned,
    .host_free_pinned = cpu_host_free_pinned,
    .last_error = cpu_last_error,
    .extensions = NULL, /* no graph capture on the CPU */
    /* host memory: the host reads and writes the arena itself, and the
     * kernels run on the rank's thread */
    .flags = BP_ABI_DEVICE_HOST_ACCESSIBLE,
    .kernel_kind = NULL,
};

static int cpu_init(const bp_abi_host *host) {
  if (!host || !host->register_device) {
    if (host && host->error) host->error(host->ctx, "device-cpu: the host cannot register devices");
    return BP_ABI_ERR_UNSUPPORTED;
  }
  int rc = host->register_device(host->ctx, &cpu_device);
  if (rc != BP_ABI_OK && host->error) host->error(host->ctx, "device-cpu: register_device failed");
  return rc;
}

static const bp_abi_module cpu_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 0,
    .name = "device-cpu",
    .version = BP_PLUGIN_VERSION,
    .build_id = "device-cpu " BP_PLUGIN_VERSION " " __DATE__ " " __TIME__,
    .init = cpu_init,
    .fini = NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cpu_module; }
