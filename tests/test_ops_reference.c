/* The reference op module as a whole: its entry and descriptor, the kernel
 * table it registers (through the registry), only the entry exported,
 * selection through bp_registry_select, and how init fails against a host
 * that refuses a registration or speaks another major. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/op_table.h"
#include "ops_ref_util.h"

/* The module is the oracle of every built-in op (blueprint/op_table.h)
 * but the collectives, which the communicators run. */
static const char *expected_op(int e) {
  int count = 0;
  const bp_op_info *t = bp_op_table(&count);
  for (int i = 0; i < count; i++)
    if (!t[i].collective && e-- == 0) return t[i].abi.name;
  return NULL;
}
static int expected_count(void) {
  int n = 0;
  while (expected_op(n)) n++;
  return n;
}
#define EXPECTED_COUNT expected_count()

static void *open_module(const bp_abi_module **module_out) {
  void *handle = dlopen(BP_OPS_REFERENCE_PATH, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(handle != NULL, "dlopen: %s", dlerror());
  bp_abi_module_entry_fn entry;
  *(void **)&entry = dlsym(handle, BP_ABI_ENTRY_SYMBOL);
  ck_assert_msg(entry != NULL, "dlsym: %s", dlerror());
  *module_out = entry();
  return handle;
}

START_TEST(descriptor) {
  const bp_abi_module *m;
  void *handle = open_module(&m);
  ck_assert_uint_eq(m->struct_size, sizeof(bp_abi_module));
  ck_assert_uint_eq(m->abi_major, BP_ABI_MAJOR);
  ck_assert_uint_eq(m->abi_minor_built, BP_ABI_MINOR);
  ck_assert_uint_le(m->abi_minor_required, m->abi_minor_built);
  ck_assert_str_eq(m->name, "ops-reference");
  ck_assert_ptr_nonnull(m->version);
  ck_assert_uint_eq(strlen(m->build_id), 16); /* hash of the sources and settings */
  ck_assert_ptr_nonnull(m->init);
  /* only the entry is exported */
  const char *hidden[] = {"ref_conv2d_fwd",      "ref_dot",        "ref_softmax_ce_fwd_bwd",
                          "bp_sdk_check_tensor", "ops_conv_check", "ops_bn_train_channels"};
  for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
    ck_assert_msg(dlsym(handle, hidden[i]) == NULL, "%s is exported", hidden[i]);
  dlclose(handle);
}
END_TEST

START_TEST(registers_every_op_once) {
  const bp_registry *r = ops_registry_get();
  ck_assert_int_eq(bp_registry_kernel_count(r), EXPECTED_COUNT);
  for (int e = 0; e < EXPECTED_COUNT; e++) {
    int found = 0;
    for (int i = 0; i < bp_registry_kernel_count(r); i++) {
      const bp_registered_kernel *rk = bp_registry_kernel(r, i);
      if (strcmp(rk->kernel.op, expected_op(e)) != 0) continue;
      found++;
      const bp_abi_kernel *k = &rk->kernel;
      ck_assert_str_eq(k->impl, "reference");
      ck_assert_str_eq(k->device, "cpu");
      ck_assert_uint_eq(k->flags & (BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC),
                        BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC);
      ck_assert_uint_eq(k->flags & BP_ABI_KERNEL_GRAPH_CAPTURABLE, 0);
      ck_assert(k->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32));
      ck_assert_ptr_nonnull(k->supports);
      ck_assert_ptr_nonnull(k->run);
      ck_assert_int_eq(k->priority, 0);
      ck_assert_str_eq(rk->path, bp_registry_record(r, 0)->path);
    }
    ck_assert_msg(found == 1, "%s registered %d times", expected_op(e), found);
  }
  /* the auxiliary dtypes are in the masks (the registry checks every tensor's dtype) */
  ck_assert(ops_kernel("maxpool.fwd")->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8));
  ck_assert(ops_kernel("maxpool.bwd")->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8));
  ck_assert(ops_kernel("softmax_ce.fwd_bwd")->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));
  const bp_load_record *rec = bp_registry_record(r, 0);
  ck_assert_int_eq(rec->outcome, BP_LOAD_LOADED);
  ck_assert_str_eq(rec->name, "ops-reference");
}
END_TEST

START_TEST(selected_through_the_registry) {
  /* a conv node: the reference is the only kernel, so selection picks it;
   * a node it cannot run is unsupported, with the kernel's reason */
  bp_registry *r = ops_registry_get();
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 3, 1), w = tt_new(BP_ABI_DTYPE_FP32, 4, 3, 3, 3, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 4, 0);
  bp_conv2d_attrs a = {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
  bp_abi_tensor in[2] = {x.d, w.d}, out[1] = {y.d};
  bp_abi_kernel_args args = {.struct_size = sizeof args, .num_inputs = 2, .num_outputs = 1,
                             .inputs = in, .outputs = out, .attrs = &a, .attr_size = sizeof a,
                             .attr_version = BP_ABI_ATTR_VERSION, .world_size = 1};
  bp_select_options opt = {.pins = ""};
  const bp_registered_kernel *k = NULL;
  ck_assert_int_eq(bp_registry_select(r, "conv2d.fwd", "cpu", &args, &opt, &k), BP_OK);
  ck_assert_str_eq(k->kernel.impl, "reference");
  ck_assert_str_eq(k->kernel.op, "conv2d.fwd");
  a.groups = 5;
  k = NULL;
  ck_assert_int_ne(bp_registry_select(r, "conv2d.fwd", "cpu", &args, &opt, &k), BP_OK);
  ck_assert_msg(strstr(bp_last_error(), "groups 5 must divide") != NULL, "%s", bp_last_error());
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

/* A host of our own, to see init fail. */
typedef struct fake_host {
  int registered, fail_at;
  char error[256];
} fake_host;

static int fake_register(void *ctx, const bp_abi_kernel *k) {
  fake_host *h = ctx;
  (void)k;
  if (h->registered == h->fail_at) return BP_ABI_ERR_DUPLICATE;
  h->registered++;
  return BP_ABI_OK;
}
static void fake_error(void *ctx, const char *message) {
  fake_host *h = ctx;
  snprintf(h->error, sizeof h->error, "%s", message);
}

START_TEST(init_reports_a_refused_registration) {
  const bp_abi_module *m;
  void *handle = open_module(&m);
  fake_host fh = {0, 4, ""};
  bp_abi_host host = {.struct_size = sizeof host, .abi_major = BP_ABI_MAJOR,
                      .abi_minor = BP_ABI_MINOR, .ctx = &fh, .error = fake_error,
                      .register_kernel = fake_register};
  ck_assert_int_eq(m->init(&host), BP_ABI_ERR_DUPLICATE);
  ck_assert_int_eq(fh.registered, 4);
  /* the fifth kernel of the table is fc.bwd_data */
  ck_assert_msg(strstr(fh.error, "fc.bwd_data") != NULL, "%s", fh.error);
  /* a host of another major, or one without register_kernel, is refused */
  fake_host fh2 = {0, -1, ""};
  host.ctx = &fh2;
  host.abi_major = BP_ABI_MAJOR + 1;
  ck_assert_int_ne(m->init(&host), BP_ABI_OK);
  ck_assert_int_eq(fh2.registered, 0);
  ck_assert(strstr(fh2.error, "major") != NULL);
  host.abi_major = BP_ABI_MAJOR;
  host.register_kernel = NULL;
  ck_assert_int_ne(m->init(&host), BP_ABI_OK);
  /* a complete host gets every kernel */
  host.register_kernel = fake_register;
  ck_assert_int_eq(m->init(&host), BP_ABI_OK);
  ck_assert_int_eq(fh2.registered, EXPECTED_COUNT);
  dlclose(handle);
}
END_TEST

START_TEST(supports_handles_odd_args) {
  /* every kernel: NULL args and an args struct that is too small are
   * refused with a reason, never a crash */
  bp_abi_kernel_args tiny;
  memset(&tiny, 0, sizeof tiny);
  tiny.struct_size = 8;
  for (int e = 0; e < EXPECTED_COUNT; e++) {
    const bp_abi_kernel *k = ops_kernel(expected_op(e));
    char reason[128] = "";
    ck_assert_int_eq(k->supports(k->user, NULL, reason, sizeof reason), 0);
    ck_assert_msg(reason[0] != '\0', "%s", expected_op(e));
    reason[0] = '\0';
    ck_assert_int_eq(k->supports(k->user, &tiny, reason, sizeof reason), 0);
    ck_assert_msg(reason[0] != '\0', "%s", expected_op(e));
    ck_assert_int_eq(k->supports(k->user, &tiny, NULL, 0), 0); /* no reason buffer */
    ck_assert_int_eq(k->run(k->user, NULL), BP_ABI_ERR_INVALID);
    ck_assert_int_eq(k->run(k->user, &tiny), BP_ABI_ERR_INVALID);
  }
}
END_TEST

/* run() of the call's kernel with a host reason buffer (ABI 1.4); returns
 * its status and leaves the reason in `reason`. */
static int run_with_reason(const ops_call *call, char *reason, size_t reason_size) {
  ops_args a;
  ops_args_make(&a, call, 1);
  reason[0] = '\0';
  a.args.reason = reason, a.args.reason_size = reason_size;
  const bp_abi_kernel *k = ops_kernel(call->op);
  return k->run(k->user, &a.args);
}

START_TEST(a_refused_run_says_why_in_the_hosts_buffer) {
  char reason[256];
  /* a label outside [0, K): found at run time, before anything is written */
  tt z = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 3, 0), lab = tt_new(BP_ABI_DTYPE_INT32, 2, 1, 1, 1, 0);
  tt loss = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt hits = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  *tt_i32(&lab, 1, 0, 0, 0) = 7;
  bp_softmax_ce_attrs ca = {0.0f, 1.0f, 0, 0};
  ops_call ce = {"softmax_ce.fwd_bwd", {&z, &lab}, {&loss, &hits}, 2, 2, &ca, sizeof ca};
  ck_assert_int_eq(run_with_reason(&ce, reason, sizeof reason), BP_ABI_ERR_INVALID);
  ck_assert_msg(strstr(reason, "sample 1 has label 7, outside [0, 3)"), "%s", reason);
  /* a check that fails in run(): the same reason supports() gives */
  bp_softmax_ce_attrs bad = {2.0f, 1.0f, 0, 0};
  ce.attrs = &bad;
  ck_assert_int_eq(run_with_reason(&ce, reason, sizeof reason), BP_ABI_ERR_INVALID);
  ck_assert_msg(strstr(reason, "label_smoothing 2 must be in [0, 1]"), "%s", reason);
  /* overlapping tensors (rule 5 of bp_abi_ops.h) */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 4, 0);
  bp_elementwise_attrs ea = {0};
  ops_call add = {"add.fwd", {&x, &x}, {&x}, 2, 1, &ea, sizeof ea};
  ck_assert_int_eq(run_with_reason(&add, reason, sizeof reason), BP_ABI_ERR_INVALID);
  ck_assert_msg(strstr(reason, "output 0 overlaps input 0"), "%s", reason);
  /* a learning rate that is not finite */
  tt g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), w = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0);
  tt m = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), lr = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  *tt_f(&lr, 0, 0, 0, 0) = INFINITY;
  bp_optimizer_attrs oa = {.momentum = 0.9f};
  ops_call sgd = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &oa, sizeof oa};
  ck_assert_int_eq(run_with_reason(&sgd, reason, sizeof reason), BP_ABI_ERR_INVALID);
  ck_assert_msg(strstr(reason, "lr inf must be finite"), "%s", reason);
  tt *all[] = {&z, &lab, &loss, &hits, &x, &g, &w, &m, &lr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_reference");
  TCase *tc = tcase_create("module");
  tcase_add_test(tc, descriptor);
  tcase_add_test(tc, registers_every_op_once);
  tcase_add_test(tc, selected_through_the_registry);
  tcase_add_test(tc, init_reports_a_refused_registration);
  tcase_add_test(tc, supports_handles_odd_args);
  tcase_add_test(tc, a_refused_run_says_why_in_the_hosts_buffer);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
