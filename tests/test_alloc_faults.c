/* Allocation failures at every allocation site of parsing, planning, graph
 * building and binding (and of a checkpoint save and load): a countdown
 * allocator fails the k-th allocation, for k = 1, 2, ... until a run needs
 * fewer. Each run must end in a clean error (one line, BP_ERR_NOMEM or the
 * status the site maps it to), never a crash, and give back every byte it
 * took: the allocations still live after the cleanup are counted.
 *
 * The allocator is this executable's malloc/calloc/realloc/free, which
 * interpose on libc's for the whole process (libblueprint, libyaml) and
 * forward to glibc's __libc_* functions. Sanitizer builds own malloc, so
 * there the test only runs the operations once, unfailed. */
#include <check.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blueprint/arena.h"
#include "blueprint/checkpoint.h"
#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/registry.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BP_OWN_MALLOC 0
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#undef BP_OWN_MALLOC
#define BP_OWN_MALLOC 0
#endif
#ifndef BP_OWN_MALLOC
#define BP_OWN_MALLOC 1
#endif

static long countdown = -1; /* allocations left before one fails; -1: none fails */
static long live;           /* allocations taken and not given back */
static long failed;         /* allocations refused in this run */

#if BP_OWN_MALLOC
void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void __libc_free(void *p);
void *__libc_memalign(size_t align, size_t size);

/* The dynamic loader's own allocations (dynamic TLS of a thread or module)
 * abort the process when they fail ("cannot allocate memory for
 * thread-local data"): that is glibc's rule, not ours, so they never fail
 * and are not counted (they live as long as the thread). */
static int from_loader(const void *caller) {
  Dl_info info;
  return dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "/ld-linux");
}

/* 1: this allocation fails. *counted: whether it counts as live. */
static int refuse_from(const void *caller, int *counted) {
  *counted = !from_loader(caller);
  if (countdown < 0 || !*counted) return 0;
  if (countdown == 0) {
    failed++;
    return 1;
  }
  countdown--;
  return 0;
}

static void *taken(void *p, int counted) {
  if (p && counted) __atomic_add_fetch(&live, 1, __ATOMIC_RELAXED);
  return p;
}

#define REFUSE() refuse_from(__builtin_return_address(0), &counted)

void *malloc(size_t size) {
  int counted;
  return REFUSE() ? NULL : taken(__libc_malloc(size), counted);
}

void *calloc(size_t n, size_t size) {
  int counted;
  return REFUSE() ? NULL : taken(__libc_calloc(n, size), counted);
}

void *realloc(void *old, size_t size) {
  int counted;
  if (REFUSE()) return NULL;
  void *p = __libc_realloc(old, size);
  if (p && !old && counted) __atomic_add_fetch(&live, 1, __ATOMIC_RELAXED);
  if (!p && old && size == 0 && counted) __atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
  return p;
}

void *aligned_alloc(size_t align, size_t size) {
  int counted;
  return REFUSE() ? NULL : taken(__libc_memalign(align, size), counted);
}

int posix_memalign(void **out, size_t align, size_t size) {
  int counted;
  void *p = REFUSE() ? NULL : taken(__libc_memalign(align, size), counted);
  if (!p) return 12; /* ENOMEM */
  *out = p;
  return 0;
}

void free(void *p) {
  if (p && !from_loader(__builtin_return_address(0)))
    __atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
  __libc_free(p);
}
#endif

static const char model_text[] =
    "name: faults\n"
    "input: {height: 8, width: 8, channels: 1, classes: 4}\n"
    "layers:\n"
    "  - {type: conv, name: c1, filters: 4, kernel: 3, pad: 1}\n"
    "  - {type: batchnorm, name: bn}\n"
    "  - {type: relu, name: r1}\n"
    "  - {type: add, name: sum, inputs: [r1, c1]}\n"
    "  - {type: maxpool, name: p1, kernel: 2}\n"
    "  - {type: fc, name: fc, units: 4}\n"
    "  - {type: softmax_ce, name: loss}\n"
    "train: {batch: 4, optimizer: adamw, ema: true}\n";

static bp_registry *registry(void) {
  static bp_registry *r = NULL;
  if (!r) {
    ck_assert_int_eq(bp_registry_create(&r), BP_OK);
    ck_assert_msg(bp_registry_discover(r, NULL, 0) == BP_OK, "%s", bp_last_error());
  }
  return r;
}

/* Parse, compile, build, bind, then (with `ckpt`) save a checkpoint and
 * load it back; everything made is destroyed. Returns the first failure. */
static bp_status pipeline(const char *ckpt) {
  bp_model *m = NULL;
  bp_plan *p = NULL;
  bp_graph *g = NULL;
  bp_arena *a = NULL;
  bp_exec *x = NULL;
  bp_status st = bp_model_parse(model_text, strlen(model_text), "faults.yaml", &m);
  bp_compile_options co;
  if (st == BP_OK) {
    co = bp_compile_options_from_model(m);
    st = bp_model_compile(m, &co, &p);
  }
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = 4;
  go.train_size = 4;
  if (st == BP_OK) st = bp_graph_build(m, p, &go, &g);
  if (st == BP_OK) st = bp_arena_create(p, bp_host_allocator(), 0, &a);
  /* oneDNN 2.6 itself dereferences a failed allocation (inside
   * dnnl_primitive_attr_create, which ops/onednn's supports() calls), so
   * the convolutions are pinned to OpenBLAS: this test is about our code */
  bp_exec_options eo = {.device = "cpu", .pins = "conv2d.*=blas", .rank = 0, .world = 1};
  if (st == BP_OK) st = bp_exec_create(g, registry(), bp_arena_base(a), &eo, &x);
  bp_train_state s = {.seed = 1, .loss_scale = 1.0};
  if (st == BP_OK && ckpt) st = bp_checkpoint_save(ckpt, p, bp_arena_base(a), &s);
  if (st == BP_OK && ckpt) st = bp_checkpoint_load(ckpt, p, bp_arena_base(a), &s);
  bp_exec_destroy(x);
  bp_arena_destroy(a);
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  return st;
}

static void countdown_over(const char *ckpt) {
  ck_assert_msg(pipeline(ckpt) == BP_OK, "%s", bp_last_error()); /* warm caches up */
  if (!BP_OWN_MALLOC) {
    printf("SKIP allocation countdown: a sanitizer owns malloc in this build\n");
    return;
  }
  int runs = 0;
  for (long k = 0; k < 100000; k++, runs++) {
    const long before = __atomic_load_n(&live, __ATOMIC_RELAXED);
    failed = 0;
    countdown = k;
    bp_status st = pipeline(ckpt);
    countdown = -1;
    const long after = __atomic_load_n(&live, __ATOMIC_RELAXED);
    if (!failed) {
      ck_assert_msg(st == BP_OK, "unfailed run: %s", bp_last_error());
      break;
    }
    const char *msg = bp_last_error();
    ck_assert_msg(st != BP_OK, "allocation %ld failed but the pipeline reported success", k + 1);
    ck_assert_msg(msg[0] != '\0' && strchr(msg, '\n') == NULL,
                  "allocation %ld: not one line: [%s]", k + 1, msg);
    ck_assert_msg(after == before, "allocation %ld failed (%s: %s): %ld allocations leaked", k + 1,
                  bp_status_str(st), msg, after - before);
  }
  ck_assert_int_gt(runs, 50);
  printf("allocation countdown: %d failing runs, all clean\n", runs);
}

START_TEST(every_allocation_of_plan_and_bind_can_fail_cleanly) { countdown_over(NULL); }
END_TEST

START_TEST(every_allocation_of_a_checkpoint_save_and_load_can_fail_cleanly) {
  char dir[] = "/tmp/bp-alloc-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/ck.bin", dir);
  countdown_over(path);
  unlink(path);
  rmdir(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("alloc_faults");
  TCase *tc = tcase_create("alloc_faults");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, every_allocation_of_plan_and_bind_can_fail_cleanly);
  tcase_add_test(tc, every_allocation_of_a_checkpoint_save_and_load_can_fail_cleanly);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nfailed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nfailed ? EXIT_FAILURE : EXIT_SUCCESS;
}
