/* Module contexts (ABI 1.6, bp_abi_module.init_ctx / fini_ctx) through the
 * registry, with tests/modules/ctx.c: a context per registry that loads
 * the module (each with its registry's options), kernels reading their
 * context through `user`, fini_ctx exactly once per successful init_ctx
 * with the same pointer, a failed init_ctx refused with the module's
 * message and never finished, and a 1.5-sized descriptor loading through
 * init. The test holds each module file open itself (dlopen of the same
 * path returns the registries' handle), so the module's log survives the
 * registries and is read through its exported tm_ctx_record(). */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "blueprint/registry.h"
#include "bp_abi.h"
#include "cpu-impl.h" /* cpu_user: what ops-cpu's kernels get as user */
#include "test_module.h"

static const char *module_path(const char *name) {
  static char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/ctx/%s.so", BP_TEST_MODULES, name);
  return path;
}

/* Opens the module file for the test's whole life and returns its log. */
static tm_ctx_log *hold_module(const char *name, void **handle_out) {
  void *h = dlopen(module_path(name), RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "dlopen %s: %s", module_path(name), dlerror());
  void *sym = dlsym(h, "tm_ctx_record");
  ck_assert_ptr_nonnull(sym);
  tm_ctx_record_fn record;
  memcpy(&record, &sym, sizeof record);
  *handle_out = h;
  return record();
}

/* A registry whose module options are `options` (NULL-terminated). */
static bp_registry *registry_with(const char *const *options) {
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  int n = 0;
  while (options && options[n]) n++;
  ro.module_options = options;
  ro.module_option_count = n;
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  return r;
}

static const bp_registered_kernel *find_kernel(const bp_registry *r, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    if (!strcmp(k->kernel.op, "relu.fwd") && !strcmp(k->kernel.impl, impl)) return k;
  }
  return NULL;
}

/* Runs the kernel and returns what it wrote: its context's value. */
static float run_kernel(const bp_registered_kernel *k) {
  float out = -1000.0f;
  void *const ptrs[1] = {&out};
  bp_abi_tensor t = {.struct_size = sizeof t, .dtype = BP_ABI_DTYPE_FP32,
                     .shape = {1, 1, 1, 1}, .padded_c = 1, .stride = {1, 1, 1, 1},
                     .slot_bytes = 4};
  bp_abi_kernel_args args = {.struct_size = sizeof args, .num_outputs = 1, .outputs = &t,
                             .output_ptrs = ptrs};
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  return out;
}

static const bp_load_record *last_record(const bp_registry *r) {
  ck_assert_int_gt(bp_registry_record_count(r), 0);
  return bp_registry_record(r, bp_registry_record_count(r) - 1);
}

START_TEST(two_registries_get_two_contexts_each_with_its_options) {
  void *h;
  tm_ctx_log *log = hold_module("ctx", &h);
  static const char *const o1[] = {"tm_value=11", NULL}, *const o2[] = {"tm_value=22", NULL};
  bp_registry *r1 = registry_with(o1), *r2 = registry_with(o2);
  ck_assert_int_eq(bp_registry_load(r1, module_path("ctx")), BP_OK);
  ck_assert_int_eq(bp_registry_load(r2, module_path("ctx")), BP_OK);
  ck_assert_int_eq(log->init_ctx_calls, 2);
  ck_assert_int_eq(log->init_ctx_ok, 2);
  const bp_registered_kernel *k1 = find_kernel(r1, "ctx"), *k2 = find_kernel(r2, "ctx");
  ck_assert_ptr_nonnull(k1);
  ck_assert_ptr_nonnull(k2);
  ck_assert_ptr_ne(k1->kernel.user, k2->kernel.user);
  /* each kernel reads its own registry's value, in either order */
  ck_assert_float_eq(run_kernel(k2), 22.0f);
  ck_assert_float_eq(run_kernel(k1), 11.0f);
  ck_assert_float_eq(run_kernel(k2), 22.0f);
  void *c1 = k1->kernel.user, *c2 = k2->kernel.user;
  ck_assert_int_eq(log->live_count, 2);
  bp_registry_destroy(r1);
  ck_assert_int_eq(log->fini_ctx_calls, 1);
  ck_assert_int_eq(log->finished_count, 1);
  ck_assert_ptr_eq(log->finished[0], c1);
  ck_assert_int_eq(log->live_count, 1);
  ck_assert_ptr_eq(log->live[0], c2);
  ck_assert_float_eq(run_kernel(k2), 22.0f); /* r2's context outlives r1 */
  bp_registry_destroy(r2);
  ck_assert_int_eq(log->fini_ctx_calls, 2);
  ck_assert_ptr_eq(log->finished[1], c2);
  ck_assert_int_eq(log->live_count, 0);
  ck_assert_int_eq(log->fini_ctx_unknown, 0);
  ck_assert_int_eq(log->init_calls + log->fini_calls, 0); /* never the plain pair */
  dlclose(h);
}
END_TEST

START_TEST(failing_init_ctx_is_refused_with_its_message_and_never_finished) {
  void *h;
  tm_ctx_log *log = hold_module("ctx", &h);
  static const char *const o[] = {"tm_value=5", "tm_fail=1", NULL};
  bp_registry *r = registry_with(o);
  ck_assert_int_eq(bp_registry_load(r, module_path("ctx")), BP_ERR_INVALID);
  const bp_load_record *rec = last_record(r);
  ck_assert_int_eq(rec->outcome, BP_LOAD_REFUSED);
  ck_assert_str_eq(bp_load_stage_name(rec->stage), bp_load_stage_name(BP_LOAD_STAGE_INIT));
  ck_assert_msg(strstr(rec->message, "test-ctx: tm_fail asks init_ctx to fail") != NULL,
                "record message: %s", rec->message);
  ck_assert_ptr_nonnull(strstr(rec->message, "status 3"));
  ck_assert_ptr_null(find_kernel(r, "ctx")); /* its staged kernel went too */
  ck_assert_int_eq(log->init_ctx_calls, 1);
  ck_assert_int_eq(log->init_ctx_ok, 0);
  ck_assert_int_eq(log->fini_ctx_calls, 0);
  bp_registry_destroy(r);
  ck_assert_int_eq(log->fini_ctx_calls, 0);
  ck_assert_int_eq(log->init_calls + log->fini_calls, 0);
  dlclose(h);
}
END_TEST

START_TEST(refused_registration_finishes_the_context_init_ctx_made) {
  void *h;
  tm_ctx_log *log = hold_module("ctx", &h);
  static const char *const o[] = {"tm_dup=1", NULL};
  bp_registry *r = registry_with(o);
  ck_assert_int_eq(bp_registry_load(r, module_path("ctx")), BP_ERR_INVALID);
  const bp_load_record *rec = last_record(r);
  ck_assert_str_eq(bp_load_stage_name(rec->stage), bp_load_stage_name(BP_LOAD_STAGE_REGISTER));
  ck_assert_ptr_nonnull(strstr(rec->message, "duplicate kernel relu.fwd/ctx/cpu"));
  ck_assert_int_eq(log->init_ctx_ok, 1);
  /* finished at once, not at destroy, with the pointer init_ctx made */
  ck_assert_int_eq(log->fini_ctx_calls, 1);
  ck_assert_int_eq(log->live_count, 0);
  ck_assert_int_eq(log->finished_count, 1);
  ck_assert_int_eq(log->fini_ctx_unknown, 0);
  bp_registry_destroy(r);
  ck_assert_int_eq(log->fini_ctx_calls, 1);
  dlclose(h);
}
END_TEST

START_TEST(a_module_of_abi_1_5_size_loads_through_init) {
  void *h;
  tm_ctx_log *log = hold_module("ctx15", &h);
  static const char *const o[] = {"tm_value=7", NULL};
  bp_registry *r = registry_with(o);
  ck_assert_int_eq(bp_registry_load(r, module_path("ctx15")), BP_OK);
  ck_assert_int_eq(last_record(r)->abi_minor_built, 5);
  const bp_registered_kernel *k = find_kernel(r, "ctx15");
  ck_assert_ptr_nonnull(k);
  /* init ran, not the init_ctx beyond its struct_size */
  ck_assert_float_eq(run_kernel(k), -15.0f);
  ck_assert_int_eq(log->init_calls, 1);
  ck_assert_int_eq(log->init_ctx_calls, 0);
  bp_registry_destroy(r);
  ck_assert_int_eq(log->fini_calls, 1);
  ck_assert_int_eq(log->fini_ctx_calls, 0);
  dlclose(h);
}
END_TEST

START_TEST(init_ctx_alone_is_enough_and_the_same_registry_skips_a_second_load) {
  void *h;
  tm_ctx_log *log = hold_module("ctx", &h);
  bp_registry *r = registry_with(NULL);
  ck_assert_int_eq(bp_registry_load(r, module_path("ctx")), BP_OK);
  ck_assert_int_eq(bp_registry_load(r, module_path("ctx")), BP_OK); /* skipped: same file */
  ck_assert_int_eq(log->init_ctx_calls, 1);
  ck_assert_float_eq(run_kernel(find_kernel(r, "ctx")), 0.0f); /* tm_value unset */
  bp_registry_destroy(r);
  ck_assert_int_eq(log->fini_ctx_calls, 1);
  ck_assert_int_eq(log->fini_ctx_unknown, 0);
  dlclose(h);
}
END_TEST

/* The real ops-cpu: two registries with different cpu_isa options each get
 * their own context, and each kernel (the FP16 adapter's and the
 * batchnorm_relu flavour included) runs the set its registry asked for. */
START_TEST(ops_cpu_keeps_each_registrys_instruction_set) {
  static const char *const o1[] = {"cpu_isa=default", NULL}, *const o2[] = {"cpu_isa=avx2", NULL};
  bp_registry *r1 = registry_with(o1), *r2 = registry_with(o2);
  ck_assert_int_eq(bp_registry_load(r1, BP_OPS_CPU_PATH), BP_OK);
  ck_assert_int_eq(bp_registry_load(r2, BP_OPS_CPU_PATH), BP_OK);
  __builtin_cpu_init();
  const int avx2 = __builtin_cpu_supports("avx2");
  static const char *const ops[] = {"range.sgd", "batchnorm_relu.fwd_train"};
  for (int i = 0; i < 2; i++) {
    const bp_registered_kernel *k1 = NULL, *k2 = NULL;
    for (int j = 0; j < bp_registry_kernel_count(r1); j++)
      if (!strcmp(bp_registry_kernel(r1, j)->kernel.op, ops[i]) &&
          !strcmp(bp_registry_kernel(r1, j)->kernel.impl, "cpu"))
        k1 = bp_registry_kernel(r1, j);
    for (int j = 0; j < bp_registry_kernel_count(r2); j++)
      if (!strcmp(bp_registry_kernel(r2, j)->kernel.op, ops[i]) &&
          !strcmp(bp_registry_kernel(r2, j)->kernel.impl, "cpu"))
        k2 = bp_registry_kernel(r2, j);
    ck_assert_ptr_nonnull(k1);
    ck_assert_ptr_nonnull(k2);
    ck_assert_ptr_ne(k1->kernel.user, k2->kernel.user);
    const cpu_user *u1 = k1->kernel.user, *u2 = k2->kernel.user;
    ck_assert_int_eq(u1->isa, CPU_ISA_DEFAULT);
    ck_assert_int_eq(u2->isa, avx2 ? CPU_ISA_AVX2 : CPU_ISA_DEFAULT);
    ck_assert_int_eq(u1->bn_relu, i == 1);
    ck_assert_int_eq(u2->bn_relu, i == 1);
  }
  bp_registry_destroy(r1);
  bp_registry_destroy(r2);
}
END_TEST

int main(void) {
  Suite *s = suite_create("registry_ctx");
  TCase *tc = tcase_create("contexts");
  tcase_add_test(tc, two_registries_get_two_contexts_each_with_its_options);
  tcase_add_test(tc, failing_init_ctx_is_refused_with_its_message_and_never_finished);
  tcase_add_test(tc, refused_registration_finishes_the_context_init_ctx_made);
  tcase_add_test(tc, a_module_of_abi_1_5_size_loads_through_init);
  tcase_add_test(tc, init_ctx_alone_is_enough_and_the_same_registry_skips_a_second_load);
  tcase_add_test(tc, ops_cpu_keeps_each_registrys_instruction_set);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
