/* examples/custom-op end to end: install blueprint into a temporary prefix,
 * build the example there (CMake package and pkg-config), install it, load
 * it through the registry's search path (the CLI's BP_PLUGIN_PATH), pin
 * its relu.fwd kernel with the registry's pins (the CLI's BP_KERNELS) and
 * run it, run the kernel of the op kind it adds (scale_shift.fwd), and
 * train and plan a model that uses the layer type it adds (leaky_relu). */
#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "run_util.h"

#include "blueprint/registry.h"
#include "blueprint/status.h"

static char tmp_dir[] = "/tmp/bp-custom-op-XXXXXX";
static char prefix[256];     /* blueprint installed here */
static char modules[320];    /* the example's installed module directory */


/* Configures and builds the example in <tmp>/<build> with this build's
 * compiler and sanitizer flags, finding blueprint through its CMake package
 * or (pkg_config) through pkg-config. */
static int build_example(const char *build, int pkg_config) {
  char find[600];
  if (pkg_config)
    snprintf(find, sizeof find, "-DCUSTOM_OPS_USE_PKG_CONFIG=ON");
  else
    snprintf(find, sizeof find, "-DCMAKE_PREFIX_PATH='%s'", prefix);
  return sh("PKG_CONFIG_PATH='%1$s/lib/pkgconfig' cmake -S '%2$s/examples/custom-op' "
            "-B '%3$s/%4$s' %5$s -DCMAKE_C_COMPILER=%6$s -DCMAKE_C_FLAGS='%7$s' "
            "-DCMAKE_MODULE_LINKER_FLAGS='%7$s' -DCUSTOM_OPS_NO_UNDEFINED=%8$s "
            "-DCMAKE_INSTALL_LIBDIR=lib >/dev/null && cmake --build '%3$s/%4$s' >/dev/null",
            prefix, getenv("BP_SOURCE_DIR"), tmp_dir, build, find, BP_TEST_CC, BP_TEST_CFLAGS,
            BP_TEST_NO_UNDEFINED);
}

static void install_and_build(void) {
  ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
  snprintf(prefix, sizeof prefix, "%s/prefix", tmp_dir);
  snprintf(modules, sizeof modules, "%s/example/lib/blueprint/modules", tmp_dir);
  ck_assert_int_eq(sh("cmake --install '%s' --prefix '%s' >/dev/null", getenv("BP_BINARY_DIR"),
                      prefix),
                   0);
  ck_assert_int_eq(build_example("build", 0), 0);
  ck_assert_int_eq(sh("cmake --install '%s/build' --prefix '%s/example' >/dev/null", tmp_dir,
                      tmp_dir),
                   0);
}

static void remove_tree(void) { sh("rm -rf '%s'", tmp_dir); }

/* ---- helpers ---------------------------------------------------------------- */

/* A registry with the installed example found through its search path
 * (and whatever else discovery finds: the build tree's own modules), and
 * default pins `pins` (NULL: none). Sets BP_PLUGIN_PATH too, for the
 * command lines the tests run after. */
static bp_registry *open_registry_pinned(const char *pins) {
  ck_assert_int_eq(setenv("BP_PLUGIN_PATH", modules, 1), 0);
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  ro.search_path = modules;
  ro.pins = pins;
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  ck_assert_int_eq(bp_registry_discover(r, NULL, 0), BP_OK);
  return r;
}

static bp_registry *open_registry(void) { return open_registry_pinned(NULL); }

/* The load record of the example module. */
static const bp_load_record *example_record(const bp_registry *r) {
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    if (strstr(rec->path, "/custom_ops.so")) return rec;
  }
  return NULL;
}

/* [2,2,3,3] fp32 with channels padded to 4: padding must stay untouched. */
enum { N = 2, H = 2, W = 3, C = 3, PC = 4, ELEMS = N * H * W * PC };
#define SENTINEL 1234.5f

static bp_abi_tensor padded_tensor(void) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = BP_ABI_DTYPE_FP32;
  t.shape[0] = N, t.shape[1] = H, t.shape[2] = W, t.shape[3] = C;
  t.padded_c = PC;
  t.stride[0] = H * W * PC, t.stride[1] = W * PC, t.stride[2] = PC, t.stride[3] = 1;
  t.slot_bytes = ELEMS * sizeof(float) + 16;
  return t;
}

static float input_value(int i) { return (float)((i * 7) % 11) - 5.0f; }

static bp_abi_kernel_args unary_args(const bp_abi_tensor *x, const bp_abi_tensor *y,
                                     const void *const *in, void *const *out) {
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.num_inputs = 1;
  a.num_outputs = 1;
  a.inputs = x;
  a.outputs = y;
  a.input_ptrs = in;
  a.output_ptrs = out;
  a.world_size = 1;
  return a;
}

/* ---- tests ------------------------------------------------------------------ */

START_TEST(module_loads_through_bp_plugin_path) {
  bp_registry *r = open_registry();
  const bp_load_record *rec = example_record(r);
  ck_assert_msg(rec != NULL, "custom_ops.so was not tried");
  ck_assert_msg(rec->outcome == BP_LOAD_LOADED, "custom_ops.so: %s", rec->message);
  ck_assert_str_eq(rec->name, "custom-ops");
  ck_assert_str_eq(rec->version, "1.0.0");
  ck_assert_int_eq(rec->abi_major, BP_ABI_MAJOR);
  const bp_abi_op *op = bp_registry_find_op(r, "scale_shift.fwd");
  ck_assert_ptr_nonnull(op);
  ck_assert_int_eq(op->num_inputs, 1);
  ck_assert_int_eq(op->num_outputs, 1);
  ck_assert_uint_eq(op->attr_size, 8);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(pinned_relu_kernel_is_selected_and_runs) {
  bp_registry *r = open_registry_pinned("relu.fwd=custom");
  bp_abi_tensor x = padded_tensor(), y = padded_tensor();
  float xb[ELEMS], yb[ELEMS];
  for (int i = 0; i < ELEMS; i++) xb[i] = input_value(i), yb[i] = SENTINEL;
  const void *in[1] = {xb};
  void *out[1] = {yb};
  bp_abi_kernel_args args = unary_args(&x, &y, in, out);
  char report[2048] = "";
  bp_select_options options = {.report = report, .report_size = sizeof report}; /* the registry's pins */
  const bp_registered_kernel *k = NULL;
  ck_assert_msg(bp_registry_select(r, "relu.fwd", "cpu", &args, &options, &k) == BP_OK, "%s",
                bp_last_error());
  ck_assert_str_eq(k->kernel.impl, "custom");
  ck_assert_str_eq(k->kernel.op, "relu.fwd");
  ck_assert_msg(strstr(k->path, "/custom_ops.so") != NULL, "picked from %s", k->path);
  ck_assert_msg(strstr(report, "pinned") != NULL, "report: %s", report);
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  for (int i = 0; i < ELEMS; i++) {
    if (i % PC == C)
      ck_assert_float_eq(yb[i], SENTINEL); /* padding untouched */
    else
      ck_assert_float_eq(yb[i], input_value(i) > 0 ? input_value(i) : 0.0f);
  }
  /* in place */
  out[0] = xb;
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  for (int i = 0; i < ELEMS; i++)
    if (i % PC != C) ck_assert_float_eq(xb[i], yb[i]);

  /* a pinned kernel that cannot run the node is an error, with its reason */
  x.stride[3] = 2;
  k = NULL;
  ck_assert_int_eq(bp_registry_select(r, "relu.fwd", "cpu", &args, &options, &k),
                   BP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(bp_last_error(), "channel stride") != NULL, "%s", bp_last_error());
  bp_registry_destroy(r);
}
END_TEST

START_TEST(new_op_kind_runs) {
  bp_registry *r = open_registry();
  bp_abi_tensor x = padded_tensor(), y = padded_tensor();
  float xb[ELEMS], yb[ELEMS];
  for (int i = 0; i < ELEMS; i++) xb[i] = input_value(i), yb[i] = SENTINEL;
  const void *in[1] = {xb};
  void *out[1] = {yb};
  const float attrs[2] = {2.0f, 0.5f}; /* scale, shift */
  bp_abi_kernel_args args = unary_args(&x, &y, in, out);
  args.attrs = attrs;
  args.attr_size = sizeof attrs;
  args.attr_version = 1;
  bp_select_options options = {.pins = ""}; /* no pins */
  const bp_registered_kernel *k = NULL;
  ck_assert_msg(bp_registry_select(r, "scale_shift.fwd", "cpu", &args, &options, &k) == BP_OK,
                "%s", bp_last_error());
  ck_assert_str_eq(k->kernel.impl, "custom");
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  for (int i = 0; i < ELEMS; i++) {
    if (i % PC == C)
      ck_assert_float_eq(yb[i], SENTINEL);
    else
      ck_assert_float_eq(yb[i], input_value(i) * 2.0f + 0.5f);
  }
  /* infer_shape: y takes x's shape */
  const bp_abi_op *op = bp_registry_find_op(r, "scale_shift.fwd");
  ck_assert_ptr_nonnull(op->infer_shape);
  bp_abi_tensor inferred;
  memset(&inferred, 0, sizeof inferred);
  char reason[128] = "";
  ck_assert_int_eq(op->infer_shape(attrs, &x, &inferred, reason, sizeof reason), 0);
  ck_assert_int_eq(inferred.shape[2], W);
  /* without its attribute block the node is not supported, with a reason */
  args.attrs = NULL;
  args.attr_size = 0;
  ck_assert_int_eq(bp_registry_select(r, "scale_shift.fwd", "cpu", &args, &options, &k),
                   BP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(bp_last_error(), "attributes missing") != NULL, "%s", bp_last_error());
  bp_registry_destroy(r);
}
END_TEST

/* ---- the leaky_relu layer type and a model that uses it ------------------------ */

/* examples/custom-op/<file>, malloc'ed. */
static char *example_file(const char *file) {
  char *dir = path_in(getenv("BP_SOURCE_DIR"), "examples/custom-op");
  char *p = path_in(dir, file);
  free(dir);
  return p;
}

START_TEST(leaky_relu_kernels_handle_strides_and_accumulate) {
  bp_registry *r = open_registry();
  const bp_registered_layer *l = bp_registry_find_layer(r, "leaky_relu");
  ck_assert_ptr_nonnull(l);
  ck_assert_str_eq(l->layer.forward_op, "leaky_relu.fwd");
  ck_assert_str_eq(l->layer.backward_op, "leaky_relu.bwd");
  ck_assert_int_eq(l->layer.num_attrs, 1);
  ck_assert_str_eq(l->attrs[0].key, "slope");
  bp_abi_tensor t[3] = {padded_tensor(), padded_tensor(), padded_tensor()}, out = padded_tensor();
  float xb[ELEMS], yb[ELEMS], dyb[ELEMS], dxb[ELEMS];
  for (int i = 0; i < ELEMS; i++)
    xb[i] = input_value(i), dyb[i] = 0.5f * input_value(i + 3), yb[i] = dxb[i] = SENTINEL;
  const float attrs[2] = {0.25f, 0.0f}; /* slope, accumulate (int 0 has the bits of 0.0f) */
  const void *in[3] = {xb, yb, dyb};
  void *outs[1] = {yb};
  bp_abi_kernel_args args = unary_args(&t[0], &out, in, outs);
  args.attrs = attrs;
  args.attr_size = sizeof attrs;
  args.attr_version = 1;
  bp_select_options options = {.pins = ""};
  const bp_registered_kernel *k = NULL;
  ck_assert_msg(bp_registry_select(r, "leaky_relu.fwd", "cpu", &args, &options, &k) == BP_OK,
                "%s", bp_last_error());
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  for (int i = 0; i < ELEMS; i++) {
    const float x = input_value(i);
    ck_assert_float_eq(yb[i], i % PC == C ? SENTINEL : (x > 0 ? x : 0.25f * x));
  }
  /* backward, overwrite then accumulate: dx = dy * (x > 0 ? 1 : slope) */
  args.num_inputs = 3;
  args.inputs = t;
  outs[0] = dxb;
  ck_assert_msg(bp_registry_select(r, "leaky_relu.bwd", "cpu", &args, &options, &k) == BP_OK,
                "%s", bp_last_error());
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  int32_t acc_attrs[2];
  memcpy(acc_attrs, attrs, sizeof attrs);
  acc_attrs[1] = 1;
  args.attrs = acc_attrs;
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &args), BP_ABI_OK);
  for (int i = 0; i < ELEMS; i++) {
    const float x = input_value(i), g = 0.5f * input_value(i + 3) * (x > 0 ? 1.0f : 0.25f);
    ck_assert_float_eq(dxb[i], i % PC == C ? SENTINEL : 2.0f * g);
  }
  bp_registry_destroy(r);
}
END_TEST

START_TEST(model_with_leaky_relu_trains_and_plans) {
  bp_registry_destroy(open_registry()); /* sets BP_PLUGIN_PATH for the runs below */
  char *model = example_file("mlp_leaky.yaml"), *dir = tmp_dir_create();
  char *metrics = path_in(dir, "m.jsonl"), *data = path_in(dir, "data");
  /* Fashion-MNIST where the dataset package is installed, else toy data */
  const char *data_args[2] = {"--train-limit", "12800"};
  if (!have_fashion_mnist()) {
    ck_assert_int_eq(sh("mkdir -p '%s'", data), 0);
    write_toy_mnist(data, 2048, 512, 7);
    data_args[0] = "--data";
    data_args[1] = data;
  }
  run_result r = RUN("train", model, data_args[0], data_args[1], "--test-limit", "1000",
                     "--batch", "64", "--epochs", "1", "--metrics", metrics, "--log-every", "20");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "leaky_relu.fwd") && strstr(r.out, "leaky_relu.bwd"),
                "the kernel table lacks the layer's ops: %s", r.out);
  int steps = 0;
  const double first = jsonl_number(metrics, "step", 0, "train_loss", &steps);
  const double last = jsonl_number(metrics, "step", steps - 1, "train_loss", NULL);
  const double acc = jsonl_number(metrics, "epoch", 0, "test_accuracy", NULL);
  ck_assert_int_ge(steps, 5);
  ck_assert_msg(last < first, "loss does not fall: %g -> %g", first, last);
  ck_assert_msg(acc > 0.5, "test accuracy %g is not well above chance (10%%)", acc);
  run_free(&r);

  r = RUN("plan", model);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "plan of model mlp_leaky"));
  run_free(&r);
  r = RUN("plan", model, "--json");
  ck_assert_msg(r.status == 0 && strstr(r.out, "\"act1.out\"") && strstr(r.out, "\"act1.dout\""),
                "status %d: %s", r.status, r.out);
  run_free(&r);
  free(metrics);
  free(data);
  free(model);
  tmp_dir_remove(dir);
}
END_TEST

START_TEST(plugins_lists_the_layer_type) {
  bp_registry_destroy(open_registry()); /* sets BP_PLUGIN_PATH */
  run_result r = RUN("plugins");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "layer types: 1 from modules") &&
                    strstr(r.out, "leaky_relu.fwd / leaky_relu.bwd") &&
                    strstr(r.out, "slope (float, default 0.01, [0, 1])"),
                "%s", r.out);
  run_free(&r);
  r = RUN("plugins", "--json");
  ck_assert_int_eq(r.status, 0);
  ck_assert_msg(strstr(r.out, "\"layers\": [") && strstr(r.out, "{\"type\": \"leaky_relu\"") &&
                    strstr(r.out, "\"backward_op\": \"leaky_relu.bwd\"") &&
                    strstr(r.out, "{\"key\": \"slope\", \"type\": \"float\", \"default\": 0.01"),
                "%s", r.out);
  run_free(&r);
}
END_TEST

START_TEST(leaky_relu_without_the_module_is_one_clear_error) {
  char *model = example_file("mlp_leaky.yaml");
  const char *saved = getenv("BP_PLUGIN_PATH");
  char *keep = saved ? strdup(saved) : NULL;
  unsetenv("BP_PLUGIN_PATH");
  run_result r = RUN("plan", model);
  expect_one_line_error(&r, "blueprint plan: ", "mlp_leaky.yaml:9:12: unknown layer type "
                                                "'leaky_relu'");
  ck_assert_ptr_nonnull(strstr(r.err, "no loaded op module registers it"));
  run_free(&r);
  r = RUN("train", model, "--epochs", "1");
  expect_one_line_error(&r, "blueprint train: ", "unknown layer type 'leaky_relu'");
  run_free(&r);
  if (keep) setenv("BP_PLUGIN_PATH", keep, 1);
  free(keep);
  free(model);
}
END_TEST

START_TEST(bad_slope_is_refused_at_its_line_and_column) {
  bp_registry_destroy(open_registry()); /* sets BP_PLUGIN_PATH */
  char *dir = tmp_dir_create(), *model = path_in(dir, "bad.yaml");
  FILE *f = fopen(model, "w");
  ck_assert_ptr_nonnull(f);
  fputs("input: {height: 28, width: 28, channels: 1, classes: 10}\n"
        "layers:\n"
        "  - {type: fc, units: 32}\n"
        "  - {type: leaky_relu, slope: 1.5}\n"
        "  - {type: fc, units: 10}\n"
        "  - {type: softmax_ce}\n",
        f);
  ck_assert_int_eq(fclose(f), 0);
  run_result r = RUN("plan", model);
  expect_one_line_error(&r, "blueprint plan: ", "bad.yaml:4:31: 'slope' of leaky_relu layer "
                                                "'leaky_relu1' must be <= 1, got 1.5");
  run_free(&r);
  free(model);
  tmp_dir_remove(dir);
}
END_TEST

START_TEST(pkg_config_build_works_too) {
  ck_assert_int_eq(build_example("build-pc", 1), 0);
  /* only the entry symbol leaves the module */
  ck_assert_int_eq(sh("nm -D --defined-only '%s/build-pc/custom_ops.so' > '%s/symbols' && "
                      "grep -qw bp_abi_module_entry_v1 '%s/symbols' && "
                      "! grep -Eqw 'relu_run|custom_init|check_tensor' '%s/symbols'",
                      tmp_dir, tmp_dir, tmp_dir, tmp_dir),
                   0);
}
END_TEST

/* Without a build type the example builds optimized (Release, not CMake's
 * flagless default), and its module links libm (expf and friends resolve
 * under --no-undefined). */
START_TEST(example_builds_optimized_and_links_libm) {
  ck_assert_int_eq(sh("grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' '%s/build/CMakeCache.txt'",
                      tmp_dir),
                   0);
  ck_assert_int_eq(sh("grep -rqsE -- '(^| )-lm( |$)' '%1$s/build/build.ninja' "
                      "'%1$s/build/CMakeFiles/custom_ops.dir/link.txt'",
                      tmp_dir),
                   0);
}
END_TEST

/* `blueprint validate` finds nothing wrong with the example's kernels: its
 * relu.fwd against the reference, its own ops on the cases their
 * infer_shape gives (leaky_relu with the layer's defaults and accumulate)
 * and on the nodes of its model. */
START_TEST(example_module_validates_clean) {
  char path[400];
  snprintf(path, sizeof path, "%s/custom_ops.so", modules);
  run_result r = RUN("validate", "--plugin", path, "--impl", "custom");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "relu.fwd             custom"));
  ck_assert_ptr_nonnull(strstr(r.out, "scale_shift.fwd      custom"));
  ck_assert_ptr_nonnull(strstr(r.out, "leaky_relu.bwd       custom"));
  ck_assert_ptr_nonnull(strstr(r.out, " 0 failed, 0 skipped\n"));
  run_free(&r);
  /* and on the nodes of the example's model, leaky_relu layers included */
  char *model = example_file("mlp_leaky.yaml");
  r = RUN("validate", "--plugin", path, "--model", model, "--op", "leaky_relu.*");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "leaky_relu.bwd       custom     cpu    "));
  ck_assert_ptr_nonnull(strstr(r.out, " 0 failed, 0 skipped\n"));
  run_free(&r);
  free(model);
  /* its layer's backward against central differences of its forward;
   * scale_shift.fwd (no layer type) says why it has no gradient check */
  r = RUN("validate", "--plugin", path, "--gradcheck", "--op", "[ls][ec]a[kl]*"); /* 2 ops */
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "leaky_relu.bwd       custom     cpu    gradcheck "));
  ck_assert_ptr_nonnull(strstr(r.out, "scale_shift.fwd      -          cpu    gradcheck "));
  ck_assert_ptr_nonnull(strstr(r.out, "skip: no gradient check: scale_shift.fwd is neither"));
  ck_assert_ptr_nonnull(strstr(r.out, " 0 failed, "));
  run_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("custom_op");
  TCase *tc = tcase_create("custom_op");
  tcase_set_timeout(tc, 240);
  tcase_add_unchecked_fixture(tc, install_and_build, remove_tree);
  tcase_add_test(tc, module_loads_through_bp_plugin_path);
  tcase_add_test(tc, pinned_relu_kernel_is_selected_and_runs);
  tcase_add_test(tc, new_op_kind_runs);
  tcase_add_test(tc, leaky_relu_kernels_handle_strides_and_accumulate);
  tcase_add_test(tc, model_with_leaky_relu_trains_and_plans);
  tcase_add_test(tc, plugins_lists_the_layer_type);
  tcase_add_test(tc, leaky_relu_without_the_module_is_one_clear_error);
  tcase_add_test(tc, bad_slope_is_refused_at_its_line_and_column);
  tcase_add_test(tc, pkg_config_build_works_too);
  tcase_add_test(tc, example_module_validates_clean);
  tcase_add_test(tc, example_builds_optimized_and_links_libm);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
