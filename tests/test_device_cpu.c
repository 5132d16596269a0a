/* The cpu device plugin (plugins/cpu) through the ABI: arenas, in-order
 * streams, events with CUDA semantics, copies, and error codes on bad
 * arguments. The plugin is loaded through the registry from its build path
 * (BP_DEVICE_CPU_PATH). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blueprint/registry.h"
#include "blueprint/status.h"

static bp_registry *registry;
static const bp_abi_device *dev;

/* Loads the plugin from its build path through the registry. */
static void load_plugin(void) {
  ck_assert_int_eq(bp_registry_create(&registry), BP_OK);
  ck_assert_msg(bp_registry_load(registry, BP_DEVICE_CPU_PATH) == BP_OK, "%s", bp_last_error());
  const bp_load_record *rec = bp_registry_record(registry, bp_registry_record_count(registry) - 1);
  ck_assert_int_eq(rec->outcome, BP_LOAD_LOADED);
  ck_assert_str_eq(rec->name, "device-cpu");
  dev = bp_registry_find_device(registry, "cpu");
  ck_assert_ptr_nonnull(dev);
}

static void unload_plugin(void) {
  dev = NULL;
  bp_registry_destroy(registry);
  registry = NULL;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static bp_abi_stream *new_stream(int role) {
  bp_abi_stream *s = NULL;
  ck_assert_int_eq(dev->stream_create(0, role, &s), BP_ABI_OK);
  ck_assert_ptr_nonnull(s);
  return s;
}

static bp_abi_event *new_event(void) {
  bp_abi_event *e = NULL;
  ck_assert_int_eq(dev->event_create(0, &e), BP_ABI_OK);
  ck_assert_ptr_nonnull(e);
  return e;
}

/* ---- descriptor ------------------------------------------------------------- */

START_TEST(descriptor_is_complete) {
  ck_assert_str_eq(dev->kind, "cpu");
  ck_assert_uint_ge(dev->struct_size, sizeof(bp_abi_device));
  ck_assert_ptr_null(dev->extensions); /* no graph capture on the CPU */
  ck_assert_ptr_nonnull(dev->last_error);
  int count = -1;
  ck_assert_int_eq(dev->device_count(&count), BP_ABI_OK);
  ck_assert_int_eq(count, 1);
  bp_abi_stream *s = new_stream(BP_ABI_STREAM_COMPUTE);
  ck_assert_ptr_eq(dev->stream_native(s), s);
  dev->stream_destroy(s);
}
END_TEST

/* ---- arenas ----------------------------------------------------------------- */

START_TEST(arenas_are_aligned_and_zeroed) {
  const uint64_t sizes[] = {1, 255, 4096, 1u << 20, (5u << 20) + 3};
  const uint64_t aligns[] = {256, 4096, 1u << 21};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    for (size_t j = 0; j < sizeof aligns / sizeof *aligns; j++) {
      void *p = NULL;
      ck_assert_int_eq(dev->arena_alloc(0, sizes[i], aligns[j], &p), BP_ABI_OK);
      ck_assert_ptr_nonnull(p);
      ck_assert_uint_eq((uintptr_t)p % aligns[j], 0);
      unsigned char *b = p;
      ck_assert_uint_eq(b[0], 0);
      ck_assert_uint_eq(b[sizes[i] - 1], 0);
      memset(p, 0xab, (size_t)sizes[i]);
      dev->arena_free(0, p, sizes[i]);
    }
  }
  dev->arena_free(0, NULL, 0); /* no-op */
}
END_TEST

START_TEST(huge_arena_works) {
  const uint64_t bytes = 64ull << 20;
  void *p = NULL;
  ck_assert_int_eq(dev->arena_alloc(0, bytes, 256, &p), BP_ABI_OK);
  ck_assert_uint_eq((uintptr_t)p % 256, 0);
  uint32_t *w = p;
  size_t n = (size_t)(bytes / sizeof *w);
  for (size_t i = 0; i < n; i += 1024) ck_assert_uint_eq(w[i], 0);
  for (size_t i = 0; i < n; i++) w[i] = (uint32_t)i * 2654435761u;
  for (size_t i = 0; i < n; i += 4099) ck_assert_uint_eq(w[i], (uint32_t)i * 2654435761u);
  ck_assert_uint_eq(w[n - 1], (uint32_t)(n - 1) * 2654435761u);
  dev->arena_free(0, p, bytes);
}
END_TEST

START_TEST(pinned_memory_is_usable) {
  void *p = NULL;
  ck_assert_int_eq(dev->host_alloc_pinned(1000, &p), BP_ABI_OK);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq((uintptr_t)p % 256, 0);
  memset(p, 1, 1000);
  dev->host_free_pinned(p);
  dev->host_free_pinned(NULL);
}
END_TEST

/* ---- streams ---------------------------------------------------------------- */

enum { FIFO_TASKS = 20000 };

typedef struct order_log {
  int next;            /* written only by the stream's worker */
  int seen[FIFO_TASKS];
} order_log;

typedef struct order_task {
  order_log *log;
  int index;
} order_task;

static void log_order(void *arg) {
  order_task *t = arg;
  t->log->seen[t->log->next++] = t->index;
}

START_TEST(stream_runs_many_tasks_in_fifo_order) {
  bp_abi_stream *s = new_stream(BP_ABI_STREAM_COMPUTE);
  order_log *log = calloc(1, sizeof *log);
  order_task *tasks = calloc(FIFO_TASKS, sizeof *tasks);
  ck_assert_ptr_nonnull(log);
  ck_assert_ptr_nonnull(tasks);
  for (int i = 0; i < FIFO_TASKS; i++) {
    tasks[i] = (order_task){log, i};
    ck_assert_int_eq(dev->stream_enqueue_host(s, log_order, &tasks[i]), BP_ABI_OK);
  }
  ck_assert_int_eq(dev->stream_synchronize(s), BP_ABI_OK);
  ck_assert_int_eq(log->next, FIFO_TASKS);
  for (int i = 0; i < FIFO_TASKS; i++) ck_assert_int_eq(log->seen[i], i);
  /* synchronize on an idle stream returns at once; destroy drains */
  ck_assert_int_eq(dev->stream_synchronize(s), BP_ABI_OK);
  log->next = 0;
  for (int i = 0; i < 100; i++)
    ck_assert_int_eq(dev->stream_enqueue_host(s, log_order, &tasks[i]), BP_ABI_OK);
  dev->stream_destroy(s);
  ck_assert_int_eq(log->next, 100);
  free(tasks);
  free(log);
}
END_TEST

/* Ranks as threads: each thread drives its own streams at the same time. */
typedef struct rank_job {
  order_log log;
  order_task tasks[2000];
  int failed;
} rank_job;

static void *rank_thread(void *arg) {
  rank_job *job = arg;
  bp_abi_stream *s = NULL;
  if (dev->stream_create(0, BP_ABI_STREAM_COMPUTE, &s) != BP_ABI_OK) {
    job->failed = 1;
    return NULL;
  }
  for (int i = 0; i < 2000; i++) {
    job->tasks[i] = (order_task){&job->log, i};
    if (dev->stream_enqueue_host(s, log_order, &job->tasks[i]) != BP_ABI_OK) job->failed = 1;
  }
  if (dev->stream_synchronize(s) != BP_ABI_OK) job->failed = 1;
  dev->stream_destroy(s);
  for (int i = 0; i < 2000; i++)
    if (job->log.seen[i] != i) job->failed = 1;
  return NULL;
}

START_TEST(ranks_as_threads_share_the_device) {
  enum { RANKS = 8 };
  rank_job *jobs = calloc(RANKS, sizeof *jobs);
  pthread_t threads[RANKS];
  ck_assert_ptr_nonnull(jobs);
  for (int r = 0; r < RANKS; r++) ck_assert_int_eq(pthread_create(&threads[r], NULL, rank_thread, &jobs[r]), 0);
  for (int r = 0; r < RANKS; r++) pthread_join(threads[r], NULL);
  for (int r = 0; r < RANKS; r++) {
    ck_assert_int_eq(jobs[r].failed, 0);
    ck_assert_int_eq(jobs[r].log.next, 2000);
  }
  free(jobs);
}
END_TEST

/* ---- events ----------------------------------------------------------------- */

typedef struct handoff {
  volatile int value; /* ordered by the streams, not by the memory model */
  int observed;
  int delay_ms;
} handoff;

static void slow_write(void *arg) {
  handoff *h = arg;
  if (h->delay_ms) sleep_ms(h->delay_ms);
  h->value = 1;
}

static void read_value(void *arg) {
  handoff *h = arg;
  h->observed = h->value;
}

START_TEST(stream_waits_for_event_recorded_on_another_stream) {
  bp_abi_stream *a = new_stream(BP_ABI_STREAM_COMPUTE);
  bp_abi_stream *b = new_stream(BP_ABI_STREAM_TRANSFER);
  bp_abi_event *e = new_event();
  for (int round = 0; round < 200; round++) {
    handoff h = {0, -1, round == 0 ? 100 : round % 3};
    ck_assert_int_eq(dev->stream_enqueue_host(a, slow_write, &h), BP_ABI_OK);
    ck_assert_int_eq(dev->event_record(e, a), BP_ABI_OK);
    ck_assert_int_eq(dev->stream_wait_event(b, e), BP_ABI_OK);
    ck_assert_int_eq(dev->stream_enqueue_host(b, read_value, &h), BP_ABI_OK);
    ck_assert_int_eq(dev->stream_synchronize(b), BP_ABI_OK);
    ck_assert_int_eq(h.observed, 1);
    ck_assert_int_eq(dev->stream_synchronize(a), BP_ABI_OK);
  }
  dev->event_destroy(e);
  dev->stream_destroy(b);
  dev->stream_destroy(a);
}
END_TEST

static void set_flag(void *arg) { *(volatile int *)arg = 1; }

static void wait_for_gate(void *arg) {
  atomic_int *gate = arg;
  while (!atomic_load(gate)) sleep_ms(1);
}

START_TEST(wait_keeps_the_record_it_saw) {
  /* A wait captures the event's latest record at the time of the call;
   * recording the event again later (here behind a task that blocks until
   * the test opens a gate) must not hold the waiting stream, or the
   * synchronize below would never return. */
  bp_abi_stream *a = new_stream(BP_ABI_STREAM_COMPUTE);
  bp_abi_stream *b = new_stream(BP_ABI_STREAM_COMPUTE);
  bp_abi_stream *c = new_stream(BP_ABI_STREAM_COMPUTE);
  bp_abi_event *e = new_event();
  bp_abi_event *never = new_event();
  atomic_int gate = 0;
  volatile int released = 0, b_done = 0;
  ck_assert_int_eq(dev->event_record(e, a), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_wait_event(b, e), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_enqueue_host(c, wait_for_gate, &gate), BP_ABI_OK);
  ck_assert_int_eq(dev->event_record(e, c), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_enqueue_host(b, set_flag, (void *)&b_done), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_synchronize(b), BP_ABI_OK);
  ck_assert_int_eq(b_done, 1);
  /* a wait issued now sees the second record and holds stream a */
  ck_assert_int_eq(dev->stream_wait_event(a, e), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_enqueue_host(a, set_flag, (void *)&released), BP_ABI_OK);
  sleep_ms(20);
  ck_assert_int_eq(released, 0);
  atomic_store(&gate, 1);
  ck_assert_int_eq(dev->event_synchronize(e), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_synchronize(a), BP_ABI_OK);
  ck_assert_int_eq(released, 1);
  /* a never-recorded event is complete: waiting on it is a no-op */
  ck_assert_int_eq(dev->stream_wait_event(b, never), BP_ABI_OK);
  ck_assert_int_eq(dev->event_synchronize(never), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_synchronize(b), BP_ABI_OK);
  dev->event_destroy(never);
  dev->event_destroy(e);
  dev->stream_destroy(c);
  dev->stream_destroy(b);
  dev->stream_destroy(a);
}
END_TEST

START_TEST(event_synchronize_blocks_until_the_point) {
  bp_abi_stream *a = new_stream(BP_ABI_STREAM_UPDATE);
  bp_abi_event *e = new_event();
  handoff h = {0, -1, 50};
  ck_assert_int_eq(dev->stream_enqueue_host(a, slow_write, &h), BP_ABI_OK);
  ck_assert_int_eq(dev->event_record(e, a), BP_ABI_OK);
  ck_assert_int_eq(dev->event_synchronize(e), BP_ABI_OK);
  ck_assert_int_eq(h.value, 1);
  /* an event destroyed while its record is still pending is safe */
  handoff h2 = {0, -1, 30};
  bp_abi_event *e2 = new_event();
  ck_assert_int_eq(dev->stream_enqueue_host(a, slow_write, &h2), BP_ABI_OK);
  ck_assert_int_eq(dev->event_record(e2, a), BP_ABI_OK);
  dev->event_destroy(e2);
  ck_assert_int_eq(dev->stream_synchronize(a), BP_ABI_OK);
  ck_assert_int_eq(h2.value, 1);
  dev->event_destroy(e);
  dev->stream_destroy(a);
}
END_TEST

START_TEST(elapsed_time_is_non_negative) {
  bp_abi_stream *a = new_stream(BP_ABI_STREAM_COMPUTE);
  bp_abi_event *start = new_event(), *end = new_event();
  float ms = -1;
  /* not recorded yet: an error, not a crash */
  ck_assert_int_ne(dev->event_elapsed_ms(start, end, &ms), BP_ABI_OK);
  ck_assert_str_ne(dev->last_error(), "");
  handoff h = {0, -1, 5};
  ck_assert_int_eq(dev->event_record(start, a), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_enqueue_host(a, slow_write, &h), BP_ABI_OK);
  ck_assert_int_eq(dev->event_record(end, a), BP_ABI_OK);
  ck_assert_int_eq(dev->event_synchronize(end), BP_ABI_OK);
  ck_assert_int_eq(dev->event_elapsed_ms(start, end, &ms), BP_ABI_OK);
  ck_assert_float_ge(ms, 0.0f);
  dev->event_destroy(end);
  dev->event_destroy(start);
  dev->stream_destroy(a);
}
END_TEST

/* ---- copies ----------------------------------------------------------------- */

typedef struct fill_job {
  float *buf;
  int n;
  float value;
} fill_job;

static void fill(void *arg) {
  fill_job *f = arg;
  for (int i = 0; i < f->n; i++) f->buf[i] = f->value + (float)i;
}

START_TEST(copies_run_in_stream_order) {
  enum { N = 1 << 16 };
  const uint64_t bytes = N * sizeof(float);
  bp_abi_stream *s = new_stream(BP_ABI_STREAM_TRANSFER);
  float *host = NULL, *back = NULL;
  void *d0 = NULL, *d1 = NULL;
  ck_assert_int_eq(dev->host_alloc_pinned(bytes, (void **)&host), BP_ABI_OK);
  ck_assert_int_eq(dev->host_alloc_pinned(bytes, (void **)&back), BP_ABI_OK);
  ck_assert_int_eq(dev->arena_alloc(0, bytes, 256, &d0), BP_ABI_OK);
  ck_assert_int_eq(dev->arena_alloc(0, bytes, 256, &d1), BP_ABI_OK);
  /* the copies must see the fills enqueued before them, and the second
   * fill must not reach the first h2d */
  fill_job f1 = {host, N, 1.0f}, f2 = {host, N, 1000.0f};
  ck_assert_int_eq(dev->stream_enqueue_host(s, fill, &f1), BP_ABI_OK);
  ck_assert_int_eq(dev->copy_h2d(d0, host, bytes, s), BP_ABI_OK);
  ck_assert_int_eq(dev->copy_d2d(d1, d0, bytes, s), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_enqueue_host(s, fill, &f2), BP_ABI_OK);
  ck_assert_int_eq(dev->copy_h2d(d0, host, bytes, s), BP_ABI_OK);
  ck_assert_int_eq(dev->copy_d2h(back, d1, bytes, s), BP_ABI_OK);
  ck_assert_int_eq(dev->copy_d2h(back, d1, 0, s), BP_ABI_OK); /* empty copy */
  ck_assert_int_eq(dev->stream_synchronize(s), BP_ABI_OK);
  for (int i = 0; i < N; i++) ck_assert_float_eq(back[i], 1.0f + (float)i);
  const float *d0f = d0;
  for (int i = 0; i < N; i += 97) ck_assert_float_eq(d0f[i], 1000.0f + (float)i);
  dev->arena_free(0, d1, bytes);
  dev->arena_free(0, d0, bytes);
  dev->host_free_pinned(back);
  dev->host_free_pinned(host);
  dev->stream_destroy(s);
}
END_TEST

/* ---- errors ----------------------------------------------------------------- */

typedef struct self_sync {
  bp_abi_stream *stream;
  int rc;
} self_sync;

static void sync_own_stream(void *arg) {
  self_sync *x = arg;
  x->rc = dev->stream_synchronize(x->stream);
}

START_TEST(bad_arguments_return_codes) {
  void *p = NULL;
  bp_abi_stream *s = NULL;
  bp_abi_event *e = NULL;
  float ms = 0;
  ck_assert_int_eq(dev->device_count(NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->arena_alloc(0, 1024, 256, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->arena_alloc(1, 1024, 256, &p), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->arena_alloc(-1, 1024, 256, &p), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->arena_alloc(0, 0, 256, &p), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->arena_alloc(0, 1024, 128, &p), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->arena_alloc(0, 1024, 300, &p), BP_ABI_ERR_INVALID);
  ck_assert_str_ne(dev->last_error(), "");
  ck_assert_int_eq(dev->arena_alloc(0, UINT64_MAX, 256, &p), BP_ABI_ERR_NOMEM);
  ck_assert_int_eq(dev->arena_alloc(0, 1ull << 60, 256, &p), BP_ABI_ERR_NOMEM);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(dev->host_alloc_pinned(0, &p), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->host_alloc_pinned(16, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_create(0, 0, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_create(3, 0, &s), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_create(0, 42, &s), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_create(0, -1, &s), BP_ABI_ERR_INVALID);
  ck_assert_ptr_null(s);
  ck_assert_int_eq(dev->event_create(0, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_create(2, &e), BP_ABI_ERR_INVALID);
  ck_assert_ptr_null(e);
  ck_assert_int_eq(dev->stream_synchronize(NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_enqueue_host(NULL, set_flag, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_record(NULL, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_wait_event(NULL, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_synchronize(NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_elapsed_ms(NULL, NULL, &ms), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->copy_h2d(&ms, &ms, 4, NULL), BP_ABI_ERR_INVALID);

  s = new_stream(BP_ABI_STREAM_COMPUTE);
  e = new_event();
  ck_assert_int_eq(dev->stream_enqueue_host(s, NULL, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_record(e, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_record(NULL, s), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->stream_wait_event(s, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->event_elapsed_ms(e, e, NULL), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->copy_h2d(NULL, &ms, 4, s), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->copy_d2h(&ms, NULL, 4, s), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(dev->copy_d2d(NULL, NULL, 4, s), BP_ABI_ERR_INVALID);
  /* synchronizing a stream from its own task would deadlock: refused */
  self_sync x = {s, -1};
  ck_assert_int_eq(dev->stream_enqueue_host(s, sync_own_stream, &x), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_synchronize(s), BP_ABI_OK);
  ck_assert_int_eq(x.rc, BP_ABI_ERR_INVALID);
  /* the stream still works after the errors */
  volatile int flag = 0;
  ck_assert_int_eq(dev->stream_enqueue_host(s, set_flag, (void *)&flag), BP_ABI_OK);
  ck_assert_int_eq(dev->stream_synchronize(s), BP_ABI_OK);
  ck_assert_int_eq(flag, 1);
  dev->event_destroy(e);
  dev->stream_destroy(s);
  dev->stream_destroy(NULL);
  dev->event_destroy(NULL);
}
END_TEST

int main(void) {
  Suite *suite = suite_create("device_cpu");
  TCase *tc = tcase_create("device_cpu");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, load_plugin, unload_plugin);
  tcase_add_test(tc, descriptor_is_complete);
  tcase_add_test(tc, arenas_are_aligned_and_zeroed);
  tcase_add_test(tc, huge_arena_works);
  tcase_add_test(tc, pinned_memory_is_usable);
  tcase_add_test(tc, stream_runs_many_tasks_in_fifo_order);
  tcase_add_test(tc, ranks_as_threads_share_the_device);
  tcase_add_test(tc, stream_waits_for_event_recorded_on_another_stream);
  tcase_add_test(tc, wait_keeps_the_record_it_saw);
  tcase_add_test(tc, event_synchronize_blocks_until_the_point);
  tcase_add_test(tc, elapsed_time_is_non_negative);
  tcase_add_test(tc, copies_run_in_stream_order);
  tcase_add_test(tc, bad_arguments_return_codes);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
