/* The per-rank parallel-for pool (threads.h): every index exactly once,
 * count 1 inline, many jobs in a row, several pools at once. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/threads.h"

typedef struct {
  _Atomic int *hits;     /* [n]: calls per index */
  _Atomic int off_caller; /* calls not on the thread that called parallel_for */
  pthread_t caller;
} count_job;

static void count_one(void *arg, int64_t i) {
  count_job *j = arg;
  atomic_fetch_add(&j->hits[i], 1);
  if (!pthread_equal(pthread_self(), j->caller)) atomic_fetch_add(&j->off_caller, 1);
}

/* Runs parallel_for over n indices and checks each was called once;
 * returns how many calls ran off the calling thread. */
static int run_and_check(const bp_abi_threads *abi, int64_t n) {
  count_job j = {.hits = calloc((size_t)(n > 0 ? n : 1), sizeof(_Atomic int)),
                 .caller = pthread_self()};
  ck_assert_ptr_nonnull(j.hits);
  abi->parallel_for(abi->ctx, count_one, &j, n);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(atomic_load(&j.hits[i]) == 1, "index %lld of %lld called %d times",
                  (long long)i, (long long)n, atomic_load(&j.hits[i]));
  free(j.hits);
  return atomic_load(&j.off_caller);
}

START_TEST(every_index_is_called_exactly_once) {
  bp_threads *t = NULL;
  ck_assert_int_eq(bp_threads_create(4, &t), BP_OK);
  const bp_abi_threads *abi = bp_threads_abi(t);
  ck_assert_uint_eq(abi->struct_size, sizeof(bp_abi_threads));
  ck_assert_int_eq(abi->count, 4);
  const int64_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 100003};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) run_and_check(abi, sizes[k]);
  bp_threads_destroy(t);
}
END_TEST

START_TEST(count_one_runs_inline_on_the_caller) {
  bp_threads *t = NULL;
  ck_assert_int_eq(bp_threads_create(1, &t), BP_OK);
  ck_assert_int_eq(bp_threads_abi(t)->count, 1);
  ck_assert_int_eq(run_and_check(bp_threads_abi(t), 1000), 0);
  bp_threads_destroy(t);
}
END_TEST

START_TEST(many_jobs_in_a_row_reuse_the_pool) {
  bp_threads *t = NULL;
  ck_assert_int_eq(bp_threads_create(3, &t), BP_OK);
  for (int r = 0; r < 2000; r++) run_and_check(bp_threads_abi(t), 1 + r % 37);
  bp_threads_destroy(t);
}
END_TEST

/* Each of several threads drives its own pool, as ranks of one process do. */
static void *drive_pool(void *p) {
  const bp_abi_threads *abi = p;
  for (int r = 0; r < 300; r++) run_and_check(abi, 64 + r);
  return NULL;
}

START_TEST(concurrent_pools_do_not_interfere) {
  enum { pools = 4 };
  bp_threads *t[pools];
  pthread_t th[pools];
  for (int i = 0; i < pools; i++) ck_assert_int_eq(bp_threads_create(2 + i % 2, &t[i]), BP_OK);
  for (int i = 0; i < pools; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, drive_pool, (void *)bp_threads_abi(t[i])), 0);
  for (int i = 0; i < pools; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < pools; i++) bp_threads_destroy(t[i]);
}
END_TEST

/* Two threads share one pool: their jobs are served one at a time. */
START_TEST(callers_sharing_a_pool_are_served_in_turn) {
  bp_threads *t = NULL;
  ck_assert_int_eq(bp_threads_create(3, &t), BP_OK);
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, drive_pool, (void *)bp_threads_abi(t)), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  bp_threads_destroy(t);
}
END_TEST

typedef struct {
  const bp_abi_threads *abi;
  _Atomic int64_t sum;
} nest_job;

static void add_i(void *arg, int64_t i) {
  nest_job *j = arg;
  atomic_fetch_add(&j->sum, i);
}

static void nested(void *arg, int64_t i) {
  (void)i;
  nest_job *j = arg;
  j->abi->parallel_for(j->abi->ctx, add_i, j, 10); /* runs inline */
}

START_TEST(parallel_for_inside_fn_runs_inline) {
  bp_threads *t = NULL;
  ck_assert_int_eq(bp_threads_create(4, &t), BP_OK);
  nest_job j = {.abi = bp_threads_abi(t)};
  j.abi->parallel_for(j.abi->ctx, nested, &j, 20);
  ck_assert_int_eq(atomic_load(&j.sum), 20 * 45);
  bp_threads_destroy(t);
}
END_TEST

START_TEST(bad_counts_are_refused_and_destroy_null_is_a_no_op) {
  bp_threads *t = NULL;
  ck_assert_int_eq(bp_threads_create(0, &t), BP_ERR_INVALID);
  ck_assert_int_eq(bp_threads_create(-3, &t), BP_ERR_INVALID);
  ck_assert_int_eq(bp_threads_create(1025, &t), BP_ERR_INVALID);
  ck_assert_ptr_null(t);
  ck_assert_ptr_null(bp_threads_abi(NULL));
  bp_threads_destroy(NULL);
}
END_TEST

START_TEST(share_divides_cores_among_ranks_and_is_at_least_one) {
  int all = bp_threads_share(1);
  ck_assert_int_ge(all, 1);
  ck_assert_int_ge(bp_threads_share(2), 1);
  ck_assert_int_le(bp_threads_share(2), all);
  ck_assert_int_eq(bp_threads_share(100000), 1);
  ck_assert_int_eq(bp_threads_share(0), all);
  /* the cores alone: BP_THREADS is the CLI's (bp_train_options.threads) */
  const char *saved = getenv("BP_THREADS");
  char *keep = saved ? strdup(saved) : NULL;
  setenv("BP_THREADS", all > 1 ? "1" : "2", 1);
  ck_assert_int_eq(bp_threads_share(1), all);
  if (keep) setenv("BP_THREADS", keep, 1);
  else unsetenv("BP_THREADS");
  free(keep);
}
END_TEST

int main(void) {
  Suite *s = suite_create("threads");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, every_index_is_called_exactly_once);
  tcase_add_test(tc, count_one_runs_inline_on_the_caller);
  tcase_add_test(tc, many_jobs_in_a_row_reuse_the_pool);
  tcase_add_test(tc, concurrent_pools_do_not_interfere);
  tcase_add_test(tc, callers_sharing_a_pool_are_served_in_turn);
  tcase_add_test(tc, parallel_for_inside_fn_runs_inline);
  tcase_add_test(tc, bad_counts_are_refused_and_destroy_null_is_a_no_op);
  tcase_add_test(tc, share_divides_cores_among_ranks_and_is_at_least_one);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
