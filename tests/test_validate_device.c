/* Kernel validation through a device plugin (validate/src/validate_device.c,
 * `blueprint validate --device KIND`), proven on the CPU with the "guarded"
 * test device (tests/modules/guarddev.c): its arena is PROT_NONE outside
 * the plugin's own copies and stream tasks, and it runs the cpu kernels
 * as host tasks, so a run that passes there went through the device ABI
 * only. Every reference and cpu kernel gives the same verdict on every
 * case as on host buffers; the wrong module's kernels fail with the same
 * reasons, but for the read past slot_bytes (no guard pages on a device);
 * an unwritten element and a write into an input are caught in the bytes
 * copied back; and the command line names a kind it cannot run. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "blueprint/validate.h"
#include "json_mini.h"
#include "modules/guarddev.h"
#include "run_util.h"
#include "validate-impl.h"

#define WRONG_PATH BP_TEST_MODULES "/wrong/wrong.so"
#define NODEV_PATH BP_TEST_MODULES "/plugins/nodev.so"
#define GUARDED_PATH BP_TEST_MODULES "/guarded/guarddev.so"

static bp_validate_report *validate(bp_registry *r, const char *device, const char *op,
                                    const char *impl) {
  bp_validate_options o = {.op_glob = op, .impl = impl, .device = device, .seed = 1,
                           .isolate = 1};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  return rep;
}

static guard_stats stats_of(const bp_registry *r) {
  const bp_abi_device *dev = bp_registry_find_device(r, "guarded");
  ck_assert_ptr_nonnull(dev);
  const bp_abi_ext_header *e = dev->extensions;
  while (e && e->type != GUARD_EXT_TYPE) e = e->next;
  ck_assert_ptr_nonnull(e);
  guard_stats s;
  ((const guard_ext *)(const void *)e)->read_stats(&s);
  return s;
}

/* ---- every cpu kernel, host and device ------------------------------------------ */

START_TEST(every_cpu_kernel_gives_the_same_verdicts_through_the_guarded_device) {
  bp_registry *r =
      load_modules((const char *[]){BP_OPS_REFERENCE_PATH, BP_OPS_CPU_PATH, GUARDED_PATH}, 3);
  const guard_stats before = stats_of(r);
  bp_validate_report *host = validate(r, "cpu", NULL, NULL);
  bp_validate_report *dev = validate(r, "guarded", NULL, NULL);
  const guard_stats after = stats_of(r);
  const int n = bp_validate_result_count(host);
  ck_assert_int_eq(bp_validate_result_count(dev), n);
  int passed = 0, impls_seen = 0;
  for (int i = 0; i < n; i++) {
    const bp_validate_result *h = bp_validate_result_get(host, i);
    const bp_validate_result *d = bp_validate_result_get(dev, i);
    ck_assert_str_eq(d->op, h->op);
    ck_assert_str_eq(d->impl, h->impl);
    ck_assert_str_eq(d->case_name, h->case_name);
    ck_assert_str_eq(d->device, "cpu");
    ck_assert_str_eq(h->run_device, "host");
    ck_assert_int_eq(h->device_index, -1);
    ck_assert_msg(d->verdict == h->verdict, "%s/%s %s: host %s (%s), guarded %s (%s)", d->op,
                  d->impl, d->case_name, bp_validate_verdict_name(h->verdict), h->detail,
                  bp_validate_verdict_name(d->verdict), d->detail);
    ck_assert_msg(d->verdict != BP_VALIDATE_FAIL, "%s/%s %s: %s", d->op, d->impl, d->case_name,
                  d->detail);
    if (d->verdict == BP_VALIDATE_SKIP) continue;
    ck_assert_str_eq(d->run_device, "guarded");
    ck_assert_int_eq(d->device_index, 0);
    ck_assert_int_eq(d->guard_pages, 0);
    ck_assert_int_eq(h->guard_pages, 1);
    passed++;
    impls_seen |= strcmp(d->impl, "reference") == 0 ? 1 : strcmp(d->impl, "cpu") == 0 ? 2 : 0;
  }
  ck_assert_int_gt(passed, 500);
  ck_assert_int_eq(impls_seen, 3); /* both modules ran */
  /* the runs went through the plugin: copies both ways, kernels as
   * compute-stream tasks, and the scratch arena was freed at the end */
  ck_assert_uint_ge(after.compute_host_tasks - before.compute_host_tasks, (uint64_t)passed);
  ck_assert_uint_ge(after.h2d_other - before.h2d_other, (uint64_t)passed);
  ck_assert_uint_ge(after.d2h - before.d2h, (uint64_t)passed);
  ck_assert_uint_eq(after.arenas, 0);
  bp_validate_report_destroy(host);
  bp_validate_report_destroy(dev);
  bp_registry_destroy(r);
}
END_TEST

/* ---- the wrong module --------------------------------------------------------------- */

/* Every non-skipped row of impl fails, at least one, each saying `needle`. */
static void expect_caught(const bp_validate_report *rep, const char *impl, const char *needle) {
  int failed = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, impl) != 0 || x->verdict != BP_VALIDATE_FAIL) continue;
    failed++;
    ck_assert_str_eq(x->run_device, "guarded");
    ck_assert_msg(strstr(x->detail, needle) != NULL, "%s, case '%s': '%s' lacks '%s'", impl,
                  x->case_name, x->detail, needle);
  }
  ck_assert_msg(failed > 0, "%s was never caught on the device", impl);
}

START_TEST(wrong_kernels_fail_through_the_guarded_device_but_for_the_overread) {
  bp_registry *r =
      load_modules((const char *[]){BP_OPS_REFERENCE_PATH, WRONG_PATH, GUARDED_PATH}, 3);
  bp_validate_report *rep = validate(r, "guarded", NULL, NULL);
  expect_caught(rep, "noacc", "accumulate=1 (out += result) is wrong");
  expect_caught(rep, "offset", "differs from the reference");
  expect_caught(rep, "padwrite", "wrote the channel padding of output 0");
  expect_caught(rep, "trunc16", "differs from the reference");
  expect_caught(rep, "noskip", "skip is 1, but element");
  int overread = 0, half = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    /* no guard page ends a slot on a device: the read past it goes unseen */
    if (strcmp(x->impl, "overread") == 0 && x->verdict != BP_VALIDATE_SKIP) {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s: %s", x->case_name, x->detail);
      ck_assert_int_eq(x->guard_pages, 0);
      overread++;
    }
    if (strcmp(x->impl, "half") == 0 && strstr(x->case_name, " fp16")) {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s: %s", x->case_name, x->detail);
      half++;
    }
  }
  ck_assert_int_gt(overread, 0);
  ck_assert_int_eq(half, 5);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- checks on the bytes copied back ------------------------------------------------- */

/* relu.fwd over the logical elements, but for the last one */
static int skiplast_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *t = &a->inputs[0], *yt = &a->outputs[0];
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  const int64_t n = vt_count(t);
  for (int64_t i = 0; i + 1 < n; i++) {
    const float v = x[vt_offset(t, i) / sizeof(float)];
    y[vt_offset(yt, i) / sizeof(float)] = v > 0 ? v : 0;
  }
  return BP_ABI_OK;
}

/* relu.fwd done right, then x's first element zeroed */
static int inputwrite_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *t = &a->inputs[0], *yt = &a->outputs[0];
  float *x = (float *)a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  for (int64_t i = 0; i < vt_count(t); i++) {
    const float v = x[vt_offset(t, i) / sizeof(float)];
    y[vt_offset(yt, i) / sizeof(float)] = v > 0 ? v : 0;
  }
  x[0] = 0;
  return BP_ABI_OK;
}

/* A kernel failing on the device names its reason as on the host. */
static int refuse_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  snprintf(a->reason, a->reason_size, "no luck on this device");
  return BP_ABI_ERR_UNSUPPORTED;
}

START_TEST(unwritten_elements_and_input_writes_are_caught_in_the_bytes_copied_back) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, GUARDED_PATH}, 2);
  const bp_abi_kernel *ref = vc_reference(r, "relu.fwd");
  ck_assert_ptr_nonnull(ref);
  int count = 0;
  const vc_case *all = vc_builtin_cases(&count), *c = NULL;
  for (int i = 0; i < count && !c; i++)
    if (strcmp(all[i].op, "relu.fwd") == 0 && strstr(all[i].name, "padded")) c = &all[i];
  ck_assert_ptr_nonnull(c);
  vc_device *dev = NULL;
  ck_assert_int_eq(vc_device_open(bp_registry_find_device(r, "guarded"), 1, &dev), BP_OK);
  ck_assert_str_eq(vc_device_kind(dev), "guarded");
  ck_assert_int_eq(vc_device_index(dev), 1);
  bp_threads *threads = NULL;
  ck_assert_int_eq(bp_threads_create(2, &threads), BP_OK);
  const vc_check_options o = {.seed = 1, .threads = bp_threads_abi(threads), .device = dev};
  static const struct {
    const char *impl;
    int (*run)(void *, const bp_abi_kernel_args *);
    const char *needle;
  } wrong[] = {
      {"skiplast", skiplast_run, "of output 0 unwritten (still poisoned)"},
      {"inputwrite", inputwrite_run, "wrote into input 0 (inputs are read-only)"},
      {"refuse", refuse_run, "run() returned status 2: no luck on this device"},
  };
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    const bp_abi_kernel k = {.struct_size = sizeof k, .op = "relu.fwd", .impl = wrong[i].impl,
                             .device = "cpu", .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
                             .run = wrong[i].run};
    vc_outcome out;
    vc_check(&k, ref, c, &o, &out);
    ck_assert_msg(out.verdict == BP_VALIDATE_FAIL && strstr(out.detail, wrong[i].needle),
                  "%s: %s", wrong[i].impl, out.detail);
  }
  /* the reference itself, on the device, against itself on the host */
  vc_outcome out;
  vc_check(ref, ref, c, &o, &out);
  ck_assert_msg(out.verdict == BP_VALIDATE_PASS, "%s", out.detail);
  ck_assert(out.error == 0);
  vc_device_close(dev);
  ck_assert_uint_eq(stats_of(r).arenas, 0);
  bp_threads_destroy(threads);
  bp_registry_destroy(r);
}
END_TEST

/* cuDNN and cuBLAS FP32 may run on TF32 tensor cores: their own tolerance,
 * the FP32 one again with no_tf32 (the CLI's BP_TF32=0). */
START_TEST(cudnn_and_cublas_fp32_outputs_get_the_tf32_tolerance_unless_bp_tf32_is_0) {
  ck_assert(vc_impl_fp32_tolerance("cudnn", 0) == VC_TF32_TOLERANCE);
  ck_assert(vc_impl_fp32_tolerance("cublaslt", 0) == VC_TF32_TOLERANCE);
  ck_assert(vc_impl_fp32_tolerance("cuda", 0) == vc_tolerance(BP_ABI_DTYPE_FP32));
  ck_assert(vc_impl_fp32_tolerance("reference", 0) == 1e-4);
  ck_assert(vc_impl_fp32_tolerance("cudnn", 1) == 1e-4);
  ck_assert(vc_impl_fp32_tolerance("cublas", 1) == 1e-4);
}
END_TEST

/* ---- the command line ---------------------------------------------------------------- */

START_TEST(validate_device_guarded_prints_where_the_cases_ran) {
  run_result r = RUN("validate", "--plugin", GUARDED_PATH, "--device", "guarded", "--op",
                     "relu.fwd", "--impl", "reference");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "validate: kernels of kind 'cpu' ran on device 'guarded' 0 "
                                      "through its plugin"));
  ck_assert_ptr_nonnull(strstr(r.out, "validate: 1 kernels, 10 cases: 10 passed, 0 failed"));
  run_free(&r);
  r = RUN("validate", "--json", "--plugin", GUARDED_PATH, "--device", "guarded", "--op",
          "relu.fwd", "--impl", "reference");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  char err[256];
  jm_value *v = jm_parse(r.out, r.out_len, err, sizeof err);
  ck_assert_msg(v != NULL, "%s", err);
  ck_assert_str_eq(jm_get(v, "device")->text, "guarded");
  const jm_value *results = jm_get(v, "results");
  ck_assert_uint_eq(results->count, 10);
  for (size_t i = 0; i < results->count; i++) {
    const jm_value *row = jm_at(results, i);
    ck_assert_str_eq(jm_get(row, "device")->text, "cpu");
    ck_assert_str_eq(jm_get(row, "run_device")->text, "guarded");
    uint64_t index = 1;
    ck_assert_int_eq(jm_u64(jm_get(row, "device_index"), &index), 0);
    ck_assert_uint_eq(index, 0);
    ck_assert_int_eq(jm_get(row, "guard_pages")->kind, JM_BOOL);
    ck_assert(!jm_get(row, "guard_pages")->boolean);
    ck_assert_str_eq(jm_get(row, "verdict")->text, "pass");
  }
  jm_free(v);
  run_free(&r);
  /* on the host: run_device "host", no device index, guard pages */
  r = RUN("validate", "--json", "--op", "relu.fwd", "--impl", "reference");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  v = jm_parse(r.out, r.out_len, err, sizeof err);
  ck_assert_msg(v != NULL, "%s", err);
  ck_assert_int_eq(jm_get(v, "device")->kind, JM_NULL);
  const jm_value *row = jm_at(jm_get(v, "results"), 0);
  ck_assert_str_eq(jm_get(row, "run_device")->text, "host");
  ck_assert(jm_get(row, "guard_pages")->boolean);
  ck_assert_int_eq(jm_get(row, "device_index")->kind, JM_NULL);
  ck_assert_int_eq(jm_get(row, "guard_pages")->kind, JM_BOOL);
  ck_assert_ptr_null(strstr(r.out, "ran on device"));
  jm_free(v);
  run_free(&r);
}
END_TEST

/* The last line of a validate table. */
static const char *summary_line(const run_result *r) {
  const char *last = strstr(r->out, "\nvalidate: ");
  for (const char *p = last; p; p = strstr(p + 1, "\nvalidate: ")) last = p;
  return last ? last + 1 : "";
}

/* Every module discovery finds (reference, cpu, BLAS, oneDNN, XNNPACK as
 * built): the same summary through the guarded device as on the host. */
START_TEST(every_loaded_cpu_kernel_passes_through_the_guarded_device) {
  run_result host = RUN("validate", "--device", "cpu");
  ck_assert_msg(host.status == 0, "%s%s", host.out, host.err);
  run_result dev = RUN("validate", "--plugin", GUARDED_PATH, "--device", "guarded");
  ck_assert_msg(dev.status == 0, "%s%s", dev.out, dev.err);
  ck_assert_ptr_nonnull(strstr(summary_line(&dev), " 0 failed, "));
  ck_assert_str_eq(summary_line(&dev), summary_line(&host));
  run_free(&host);
  run_free(&dev);
}
END_TEST

START_TEST(validate_device_names_a_kind_it_cannot_run_in_one_line) {
  /* nothing provides it */
  run_result r = RUN("validate", "--device", "nosuch");
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint validate: ",
                        "device 'nosuch': unknown device kind (no device plugin provides it");
  run_free(&r);
  /* kernels of a kind no plugin provides: skipped by default, an error by name */
  r = RUN("validate", "--plugin", NODEV_PATH, "--device", "npu");
  ck_assert_int_eq(r.status, 1);
  expect_one_line_error(&r, "blueprint validate: ",
                        "device 'npu': no device (no device plugin of that kind is loaded");
  run_free(&r);
  r = RUN("validate", "--plugin", NODEV_PATH, "--impl", "npu");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "skip: device 'npu': no device (no device plugin"));
  run_free(&r);
  /* cuda without a GPU: the plugin reports 0 devices and why (on a GPU
   * machine the kind resolves and the op filter matches nothing) */
#ifdef BP_DEVICE_CUDA_PATH
  r = RUN("validate", "--plugin", BP_DEVICE_CUDA_PATH, "--device", "cuda", "--op", "nosuch.*");
  if (r.status == 2) {
    expect_one_line_error(&r, "blueprint validate: ", "no loaded kernel matches --op nosuch.*");
  } else {
    ck_assert_int_eq(r.status, 1);
    expect_one_line_error(&r, "blueprint validate: ",
                          "device 'cuda': no device (the plugin reports 0 devices: ");
  }
#else
  r = RUN("validate", "--device", "cuda");
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint validate: ", "device 'cuda': unknown device kind");
#endif
  run_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("validate_device");
  TCase *tc = tcase_create("validate_device");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, every_cpu_kernel_gives_the_same_verdicts_through_the_guarded_device);
  tcase_add_test(tc, wrong_kernels_fail_through_the_guarded_device_but_for_the_overread);
  tcase_add_test(tc, unwritten_elements_and_input_writes_are_caught_in_the_bytes_copied_back);
  tcase_add_test(tc, cudnn_and_cublas_fp32_outputs_get_the_tf32_tolerance_unless_bp_tf32_is_0);
  tcase_add_test(tc, validate_device_guarded_prints_where_the_cases_ran);
  tcase_add_test(tc, every_loaded_cpu_kernel_passes_through_the_guarded_device);
  tcase_add_test(tc, validate_device_names_a_kind_it_cannot_run_in_one_line);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
