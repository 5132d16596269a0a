/* Thread services for kernel tests (thread_modes.h). */
#include "thread_modes.h"

#include <check.h>
#include <pthread.h>

const char *const mode_names[MODES] = {"no threads", "reverse order", "four threads"};

static void reverse_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  for (int64_t i = n - 1; i >= 0; i--) fn(arg, i);
}

/* Thread `first` of four runs tasks first, first + 4, ... */
typedef struct strided_for {
  void (*fn)(void *, int64_t);
  void *arg;
  int64_t n, first;
} strided_for;

static void *strided_main(void *p) {
  strided_for *s = p;
  for (int64_t i = s->first; i < s->n; i += 4) s->fn(s->arg, i);
  return NULL;
}

static void four_threads_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  pthread_t th[3];
  strided_for s[4];
  for (int t = 0; t < 4; t++) s[t] = (strided_for){fn, arg, n, t};
  for (int t = 1; t < 4; t++)
    ck_assert_int_eq(pthread_create(&th[t - 1], NULL, strided_main, &s[t]), 0);
  strided_main(&s[0]);
  for (int t = 1; t < 4; t++) pthread_join(th[t - 1], NULL);
}

const bp_abi_threads *thread_mode_service(int mode) {
  static const bp_abi_threads reverse = {sizeof reverse, 4, NULL, reverse_for};
  static const bp_abi_threads four = {sizeof four, 4, NULL, four_threads_for};
  return mode == REVERSE ? &reverse : mode == FOUR_THREADS ? &four : NULL;
}
