/* Kernel validation (validate/src/validate*.c, validate.h) and `blueprint
 * validate`: the reference kernels pass their own checks and the gradient
 * checks, every kernel of the deliberately wrong module (tests/modules/
 * wrong.c) fails with its case named, autotune never picks a wrong
 * kernel, and the command line prints its table, summary, JSON and
 * errors. The in-tree modules against the reference: test_conformance.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/autotune.h"
#include "blueprint/registry.h"
#include "blueprint/validate.h"
#include "blueprint/op_table.h"
#include "bp_abi_ops.h"
#include "json_mini.h"
#include "run_util.h"
#include "validate-impl.h"

#define WRONG_PATH BP_TEST_MODULES "/wrong/wrong.so"

static bp_registry *load(const char *const *paths, int count) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  for (int i = 0; i < count; i++)
    ck_assert_msg(bp_registry_load(r, paths[i]) == BP_OK, "loading %s: %s", paths[i],
                  bp_last_error());
  ck_assert_int_eq(bp_autotune_install(r), BP_OK);
  return r;
}

static bp_validate_report *validate(bp_registry *r, const char *op, const char *impl,
                                    int isolate, int gradcheck) {
  bp_validate_options o = {.op_glob = op, .impl = impl, .seed = 1, .isolate = isolate,
                           .gradcheck = gradcheck};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  return rep;
}

static void print_failures(const bp_validate_report *rep) {
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (x->verdict == BP_VALIDATE_FAIL)
      fprintf(stderr, "FAIL %s/%s %s: %s\n", x->op, x->impl, x->case_name, x->detail);
  }
}

/* ---- the oracle ------------------------------------------------------------------ */

START_TEST(reference_kernels_pass_every_builtin_case_of_every_op) {
  bp_registry *r = load((const char *[]){BP_OPS_REFERENCE_PATH}, 1);
  bp_validate_report *rep = validate(r, NULL, NULL, 1, 0);
  print_failures(rep);
  const bp_validate_summary s = bp_validate_summarize(rep);
  ck_assert_int_eq(s.failed, 0);
  ck_assert_int_eq(s.skipped, 0); /* the reference takes every case of the table */
  /* every op the host registers has passing cases, but the collectives */
  for (int i = 0; i < bp_registry_op_count(r); i++) {
    const char *op = bp_registry_op(r, i)->name;
    if (strncmp(op, "allreduce.", 10) == 0) continue;
    int passed = 0;
    for (int j = 0; j < bp_validate_result_count(rep); j++) {
      const bp_validate_result *x = bp_validate_result_get(rep, j);
      passed += strcmp(x->op, op) == 0 && x->verdict == BP_VALIDATE_PASS && x->reference;
    }
    ck_assert_msg(passed >= 3, "op %s has %d passing cases", op, passed);
  }
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* The op table's facts reach every built-in case: accumulate flags,
 * in-place inputs, class labels as integers below the class count. */
START_TEST(builtin_cases_carry_the_op_tables_facts) {
  int count = 0, labels = 0;
  const vc_case *cases = vc_builtin_cases(&count);
  for (int i = 0; i < count; i++) {
    const vc_case *c = &cases[i];
    const bp_op_info *info = bp_op_find(c->op);
    ck_assert_msg(info != NULL, "%s is not in the op table", c->op);
    ck_assert_int_eq(c->accumulate_offset >= 0, info->accumulates);
    ck_assert_int_eq(c->inplace_in, info->has_inplace ? info->inplace_in : -1);
    ck_assert_int_eq(c->collective, info->collective);
    if (strcmp(c->op, "softmax_ce.fwd_bwd") == 0) {
      ck_assert_int_eq(c->in[1].fill, VC_FILL_INT);
      ck_assert(c->in[1].lo == 0 && c->in[1].hi == (double)c->in[0].d.shape[3] - 1);
      labels++;
    }
  }
  ck_assert_int_gt(labels, 0);
}
END_TEST

START_TEST(reference_backwards_agree_with_finite_differences) {
  bp_registry *r = load((const char *[]){BP_OPS_REFERENCE_PATH}, 1);
  bp_validate_report *rep = validate(r, "*", "reference", 1, 1);
  static const char *const ops[] = {"conv2d.bwd_data", "conv2d.bwd_filter", "fc.bwd_data",
                                    "fc.bwd_filter", "relu.bwd", "add.bwd", "maxpool.bwd",
                                    "avgpool.bwd", "global_avgpool.bwd", "batchnorm.bwd",
                                    "softmax_ce.fwd_bwd"};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    int rows = 0;
    for (int i = 0; i < bp_validate_result_count(rep); i++) {
      const bp_validate_result *x = bp_validate_result_get(rep, i);
      if (strcmp(x->op, ops[k]) != 0 || strncmp(x->case_name, "gradcheck ", 10) != 0) continue;
      rows++;
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s %s: %s", x->op, x->case_name, x->detail);
      ck_assert(x->error <= 1e-3);
    }
    ck_assert_msg(rows >= 3, "%s: %d gradient checks", ops[k], rows);
  }
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- AMP twins and the oracle's case ------------------------------------------------ */

static int op_is(const vc_case *c, const char *op) { return strcmp(c->op, op) == 0; }

/* Tensors of an AMP plan (`blueprint plan --amp`): batch norm and layer
 * norm statistics, the loss, its count and the loss scale FP32; the mask INT8; labels
 * INT32; features and gradients FP16 padded to 8 (the model input: 4);
 * parameters FP16. */
START_TEST(amp_twins_take_the_dtypes_and_paddings_of_an_amp_plan) {
  int count = 0, twins = 0, input4 = 0;
  const vc_case *all = vc_builtin_cases(&count);
  for (int i = 0; i < count; i++) {
    vc_case t;
    const int made = vc_case_amp(&all[i], &t);
    /* batchnorm_relu is FP32 only (an AMP plan never fuses) */
    ck_assert_int_eq(made, strncmp(all[i].op, "range.", 6) != 0 &&
                               strncmp(all[i].op, "batchnorm_relu.", 15) != 0 &&
                               !all[i].collective);
    if (!made) continue;
    twins++;
    const size_t len = strlen(t.name);
    ck_assert(len > 5 && strcmp(t.name + len - 5, " fp16") == 0);
    for (int side = 0; side < 2; side++)
      for (int k = 0; k < (side ? t.num_outputs : t.num_inputs); k++) {
        const bp_abi_tensor *d = side ? &t.out[k].d : &t.in[k].d;
        const bp_abi_tensor *was = side ? &all[i].out[k].d : &all[i].in[k].d;
        const int bn_stats = (op_is(&t, "batchnorm.fwd_train") && (side ? k >= 1 : k >= 3)) ||
                             ((op_is(&t, "batchnorm.fwd_eval") || op_is(&t, "batchnorm.bwd")) &&
                              !side && k >= 3) ||
                             (op_is(&t, "layernorm.fwd") && side && k >= 1) ||
                             (op_is(&t, "layernorm.bwd") && !side && k >= 3);
        const int loss = op_is(&t, "softmax_ce.fwd_bwd") && (side ? k <= 1 : k == 2);
        /* attention's saved lse stays FP32 */
        const int lse = (op_is(&t, "attention.fwd") && side && k == 1) ||
                        (op_is(&t, "attention.bwd") && !side && k == 2);
        if (was->dtype != BP_ABI_DTYPE_FP32 || bn_stats || loss || lse) {
          ck_assert_msg(memcmp(d, was, sizeof *d) == 0, "%s %s: %s %d changed", t.op, t.name,
                        side ? "output" : "input", k);
          continue;
        }
        ck_assert_int_eq(d->dtype, BP_ABI_DTYPE_FP16);
        ck_assert(d->shape[0] == was->shape[0] && d->shape[3] == was->shape[3]);
        ck_assert(d->slot_bytes > 0 && d->stride[2] == d->padded_c);
        /* features: 8, or 4 for the compact x of a first layer; parameters
         * keep theirs */
        const int64_t c = d->shape[3], by8 = (c + 7) / 8 * 8, by4 = (c + 3) / 4 * 4;
        const int first = !side && k == 0 && was->padded_c == c &&
                          (op_is(&t, "conv2d.fwd") || op_is(&t, "conv2d.bwd_filter") ||
                           op_is(&t, "fc.fwd") || op_is(&t, "fc.bwd_filter"));
        const int params = strncmp(t.op, "conv2d.", 7) == 0 || strncmp(t.op, "fc.", 3) == 0 ||
                           strncmp(t.op, "batchnorm.", 10) == 0 ||
                           strncmp(t.op, "layernorm.", 10) == 0 ||
                           strncmp(t.op, "pos_embed.", 10) == 0;
        ck_assert_msg((params && d->padded_c == was->padded_c) ||
                          d->padded_c == (first ? by4 : by8),
                      "%s %s: %s %d padded_c %lld", t.op, t.name, side ? "output" : "input", k,
                      (long long)d->padded_c);
        input4 += first && d->padded_c == by4 && by4 != by8;
      }
    /* the oracle's case: every FP16 tensor back to FP32, same layout */
    vc_case o;
    ck_assert_int_eq(vc_case_oracle(&t, &o), 1);
    for (int k = 0; k < o.num_inputs; k++) {
      ck_assert_int_ne(o.in[k].d.dtype, BP_ABI_DTYPE_FP16);
      ck_assert_int_eq(o.in[k].d.padded_c, t.in[k].d.padded_c);
    }
    for (int k = 0; k < o.num_outputs; k++) ck_assert_int_ne(o.out[k].d.dtype, BP_ABI_DTYPE_FP16);
  }
  ck_assert_int_gt(twins, 150);
  ck_assert_int_gt(input4, 0); /* the CNN's first conv: C1 -> padded_c 4 */
  /* skip 0: the oracle runs without the skip input; skip 1: the very case */
  int skips = 0;
  for (int i = 0; i < count; i++) {
    if (all[i].skip_in < 0) continue;
    vc_case o;
    const int zero = all[i].in[all[i].skip_in].lo == 0;
    ck_assert_int_eq(vc_case_oracle(&all[i], &o), zero);
    if (zero) {
      ck_assert_int_eq(o.num_inputs, all[i].num_inputs - 1);
      ck_assert_int_eq(o.skip_in, -1);
    } else {
      for (int k = 0; k < all[i].num_outputs; k++) ck_assert(all[i].rmw[k]);
    }
    skips++;
  }
  ck_assert_int_eq(skips, 16);
}
END_TEST

/* ---- the wrong module ---------------------------------------------------------------- */

/* The first failing row of impl, which must name its case and say `needle`. */
static void expect_caught(const bp_validate_report *rep, const char *impl, const char *needle) {
  int failed = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, impl) != 0) continue;
    ck_assert_msg(x->verdict != BP_VALIDATE_PASS, "%s passed case '%s'", impl, x->case_name);
    if (x->verdict != BP_VALIDATE_FAIL) continue;
    failed++;
    ck_assert(x->case_name[0] != '\0' && strcmp(x->case_name, "-") != 0);
    ck_assert_msg(strstr(x->detail, needle) != NULL, "%s, case '%s': '%s' lacks '%s'", impl,
                  x->case_name, x->detail, needle);
  }
  ck_assert_msg(failed > 0, "%s was never caught", impl);
}

START_TEST(every_wrong_kernel_fails_with_its_case_named) {
  bp_registry *r = load((const char *[]){BP_OPS_REFERENCE_PATH, WRONG_PATH}, 2);
  bp_validate_report *rep = validate(r, NULL, NULL, 1, 0);
  expect_caught(rep, "noacc", "accumulate=1");
  expect_caught(rep, "offset", "differs from the reference");
  expect_caught(rep, "overread", "read past slot_bytes of input 0");
  /* padwrite is right where there is no padding, caught where there is */
  int caught = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, "padwrite") != 0 || x->verdict != BP_VALIDATE_FAIL) continue;
    ck_assert_ptr_nonnull(strstr(x->case_name, "padded"));
    ck_assert_ptr_nonnull(strstr(x->detail, "wrote the channel padding of output 0"));
    caught++;
  }
  ck_assert_int_gt(caught, 0);
  /* the one right kernel, FP16 only: its FP16 cases (the AMP twins) pass
   * against the FP32 reference within relu's FP16 tolerance (one rounding
   * plus 1e-5), its FP32 cases are not its dtype */
  int half = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, "half") != 0) continue;
    if (strstr(x->case_name, " fp16")) {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s: %s", x->case_name, x->detail);
      ck_assert(x->tolerance == 1e-5 && x->error <= x->tolerance);
      half++;
    } else {
      ck_assert_int_eq(x->verdict, BP_VALIDATE_SKIP);
    }
  }
  ck_assert_int_eq(half, 5);
  /* truncating instead of rounding to nearest passes a 1e-2 bound, not
   * the FP16 one of add (one rounding plus 1e-5) */
  int trunc = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, "trunc16") != 0 || x->verdict != BP_VALIDATE_FAIL) continue;
    ck_assert_ptr_nonnull(strstr(x->detail, "differs from the reference"));
    ck_assert(x->error < 1e-2);
    trunc++;
  }
  ck_assert_int_gt(trunc, 0);
  /* ignoring skip = 1 is caught; skip = 0 and no skip input are right */
  int skipped = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, "noskip") != 0 || x->verdict == BP_VALIDATE_SKIP) continue;
    if (strstr(x->case_name, "skip 1")) {
      ck_assert_int_eq(x->verdict, BP_VALIDATE_FAIL);
      ck_assert_msg(strstr(x->detail, "skip is 1, but element") != NULL, "%s", x->detail);
      skipped++;
    } else {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s: %s", x->case_name, x->detail);
    }
  }
  ck_assert_int_eq(skipped, 2);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- autotune ------------------------------------------------------------------------- */

START_TEST(autotune_excludes_the_wrong_kernels_and_never_picks_them) {
  /* fc.bwd_data of a node: dy [4,1,1,6], w [6,1,1,10], dx [4,1,1,10] */
  bp_abi_tensor t[3];
  const int64_t shapes[3][4] = {{4, 1, 1, 6}, {6, 1, 1, 10}, {4, 1, 1, 10}};
  float *buf[3];
  for (int i = 0; i < 3; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].struct_size = sizeof t[i];
    t[i].dtype = BP_ABI_DTYPE_FP32;
    memcpy(t[i].shape, shapes[i], sizeof shapes[i]);
    t[i].padded_c = shapes[i][3];
    t[i].stride[3] = 1;
    t[i].stride[2] = shapes[i][3];
    t[i].stride[1] = shapes[i][3];
    t[i].stride[0] = shapes[i][3];
    t[i].slot_bytes = 512;
    buf[i] = calloc(1, 512);
  }
  const bp_fc_attrs attrs = {.has_bias = 0, .accumulate = 1};
  const void *in_ptrs[2] = {buf[0], buf[1]};
  void *out_ptrs[1] = {buf[2]};
  const bp_abi_kernel_args args = {.struct_size = sizeof args, .num_inputs = 2, .num_outputs = 1,
                                   .inputs = t, .outputs = &t[2], .input_ptrs = in_ptrs,
                                   .output_ptrs = out_ptrs, .attrs = &attrs,
                                   .attr_size = sizeof attrs, .attr_version = 1, .world_size = 1};
  for (int round = 0; round < 3; round++) {
    bp_registry *r = load((const char *[]){BP_OPS_REFERENCE_PATH, WRONG_PATH}, 2);
    /* without autotune, priority picks a wrong kernel: that is the hazard */
    const bp_registered_kernel *k = NULL;
    bp_select_options plain = {.pins = ""};
    ck_assert_int_eq(bp_registry_select(r, "fc.bwd_data", "cpu", &args, &plain, &k), BP_OK);
    ck_assert_str_eq(k->kernel.impl, "noacc");
    char report[4096];
    bp_select_options o = {.pins = "", .autotune = 1, .report = report,
                           .report_size = sizeof report, .node = "fc1.bwd_data"};
    ck_assert_msg(bp_registry_select(r, "fc.bwd_data", "cpu", &args, &o, &k) == BP_OK, "%s",
                  bp_last_error());
    ck_assert_msg(strcmp(k->kernel.impl, "reference") == 0, "picked %s:\n%s", k->kernel.impl,
                  report);
    ck_assert_ptr_nonnull(
        strstr(report, "autotune: excluded fc.bwd_data/noacc for node 'fc1.bwd_data': "));
    ck_assert_ptr_nonnull(
        strstr(report, "autotune: excluded fc.bwd_data/offset for node 'fc1.bwd_data': "));
    ck_assert_ptr_nonnull(strstr(report, "every candidate was excluded"));
    bp_registry_destroy(r);
  }
  for (int i = 0; i < 3; i++) free(buf[i]);
}
END_TEST

/* A training run with --autotune and the wrong module: the wrong kernels are
 * named and never run (relu.fwd/overread is caught by the guard pages of
 * the in-process check; relu.fwd/padwrite is right on these unpadded FP32
 * features, so it may win). */
START_TEST(train_with_autotune_names_and_skips_the_wrong_kernels) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS "train: {batch: 16, eval_batch: 20, epochs: 1}\n",
                           64, 40, 5);
  setenv("BP_FUSE", "0", 1); /* relu1 its own node, not fused with bn1 (docs/plan.md) */
  run_result r = RUN("train", e.model, "--data", e.data, "--autotune", "--plugin", WRONG_PATH);
  unsetenv("BP_FUSE");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(
      strstr(r.err, "autotune: excluded fc.bwd_data/noacc for node 'fc.bwd_data': accumulate=1"));
  ck_assert_ptr_nonnull(
      strstr(r.err, "autotune: excluded fc.bwd_data/offset for node 'fc.bwd_data'"));
  ck_assert_ptr_nonnull(strstr(r.err, "autotune: excluded relu.fwd/overread for node 'relu1.fwd': "
                                      "read past slot_bytes of input 0"));
  /* the default selection (noacc by priority) is no alternative to time */
  ck_assert_ptr_nonnull(strstr(r.err, "autotune: kept the tuned kernels without timing whole "
                                      "steps: the default selection binds noacc to node "
                                      "'fc.bwd_data'"));
  ck_assert_ptr_null(strstr(r.out, "noacc"));
  ck_assert_ptr_null(strstr(r.out, "offset"));
  ck_assert_ptr_null(strstr(r.out, "overread"));
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

/* ---- the command line -------------------------------------------------------------------- */

START_TEST(validate_help_and_bad_command_lines) {
  run_result r = RUN("validate", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "usage: blueprint validate"));
  run_free(&r);
  static const char *const bad[][3] = {
      {"--bogus", NULL, "unknown argument '--bogus'"},
      {"--seed", "x", "--seed 'x' is not a non-negative integer"},
      {"--op", NULL, "--op needs a value"},
      {"--impl", "nosuch", "no loaded kernel matches --impl nosuch"},
      {"--op", "nosuch.*", "no loaded kernel matches --op nosuch.*"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    r = bad[i][1] ? RUN("validate", bad[i][0], bad[i][1]) : RUN("validate", bad[i][0]);
    ck_assert_int_eq(r.status, 2);
    expect_one_line_error(&r, "blueprint validate: ", bad[i][2]);
    run_free(&r);
  }
}
END_TEST

START_TEST(validate_prints_a_table_and_a_summary) {
  /* the reference kernels only: other modules (ops/xnnpack) add rows;
   * 5 cases and their 5 AMP twins each (the reference claims FP16) */
  run_result r = RUN("validate", "--op", "add.*", "--impl", "reference");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "op "));
  ck_assert_ptr_nonnull(strstr(r.out, "tolerance"));
  ck_assert_ptr_nonnull(strstr(r.out, "add.bwd              reference"));
  ck_assert_ptr_nonnull(
      strstr(r.out, "validate: 2 kernels, 20 cases: 20 passed, 0 failed, 0 skipped"));
  run_free(&r);
}
END_TEST

START_TEST(validate_dtype_fp16_runs_only_the_fp16_cases) {
  run_result r = RUN("validate", "--json", "--impl", "reference", "--dtype", "fp16");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  char err[256];
  jm_value *v = jm_parse(r.out, r.out_len, err, sizeof err);
  ck_assert_msg(v != NULL, "%s", err);
  ck_assert_str_eq(jm_get(v, "dtype")->text, "fp16");
  const jm_value *results = jm_get(v, "results");
  int twins = 0, unscale = 0;
  for (size_t i = 0; i < results->count; i++) {
    const jm_value *row = jm_at(results, i);
    const char *op = jm_get(row, "op")->text, *name = jm_get(row, "case")->text;
    ck_assert_str_eq(jm_get(row, "verdict")->text, "pass");
    if (strncmp(op, "range.", 6) == 0) { /* cases of FP16 spans */
      ck_assert_msg(strstr(name, "fp16") || strcmp(op, "range.unscale") == 0, "%s %s", op, name);
      unscale += strcmp(op, "range.unscale") == 0;
      continue;
    }
    const size_t len = strlen(name);
    ck_assert_msg(len > 5 && strcmp(name + len - 5, " fp16") == 0, "%s %s", op, name);
    twins++;
  }
  ck_assert_int_gt(twins, 100);
  ck_assert_int_eq(unscale, 5);
  jm_free(v);
  run_free(&r);
  r = RUN("validate", "--dtype", "fp64");
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint validate: ", "--dtype 'fp64' is not");
  run_free(&r);
}
END_TEST

START_TEST(validate_exits_1_and_names_the_case_of_a_wrong_kernel) {
  run_result r = RUN("validate", "--plugin", WRONG_PATH, "--impl", "noacc");
  ck_assert_int_eq(r.status, 1);
  ck_assert_ptr_nonnull(strstr(r.out, "N3 1x1x7->5 bias"));
  ck_assert_ptr_nonnull(strstr(r.out, "FAIL: accumulate=1 (out += result) is wrong"));
  ck_assert_ptr_nonnull(strstr(r.out, "\nvalidate: 1 kernels, "));
  ck_assert_ptr_nonnull(strstr(r.out, " cases: 0 passed, "));
  run_free(&r);
}
END_TEST

START_TEST(validate_json_has_the_documented_fields) {
  run_result r = RUN("validate", "--json", "--op", "relu.fwd", "--impl", "reference",
                     "--gradcheck");
  ck_assert_msg(r.status == 0, "%s", r.err);
  char err[256];
  jm_value *v = jm_parse(r.out, r.out_len, err, sizeof err);
  ck_assert_msg(v != NULL, "%s", err);
  ck_assert_int_eq(jm_get(v, "seed")->kind, JM_NUMBER);
  ck_assert_int_eq(jm_get(v, "model")->kind, JM_NULL);
  ck_assert_int_eq(jm_get(v, "dtype")->kind, JM_NULL);
  ck_assert_int_eq(jm_get(v, "gradcheck")->kind, JM_BOOL);
  const jm_value *results = jm_get(v, "results");
  ck_assert_int_eq(results->kind, JM_ARRAY);
  ck_assert_uint_eq(results->count, 10); /* 5 cases, 5 AMP twins */
  const jm_value *row = jm_at(results, 0);
  static const char *const keys[] = {"op", "impl", "device", "case", "reference", "verdict",
                                     "error", "tolerance", "detail"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    ck_assert_msg(jm_get(row, keys[i]) != NULL, "no %s", keys[i]);
  ck_assert_str_eq(jm_get(row, "verdict")->text, "pass");
  const jm_value *s = jm_get(v, "summary");
  uint64_t cases = 0, failed = 1;
  ck_assert_int_eq(jm_u64(jm_get(s, "cases"), &cases), 0);
  ck_assert_int_eq(jm_u64(jm_get(s, "failed"), &failed), 0);
  ck_assert_uint_eq(cases, 10);
  ck_assert_uint_eq(failed, 0);
  jm_free(v);
  run_free(&r);
}
END_TEST

START_TEST(validate_takes_the_nodes_of_a_model_as_cases) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS
                           "train: {batch: 6, eval_batch: 4, train_size: 20}\n",
                           1, 1, 1);
  run_result r = RUN("validate", "--model", e.model, "--impl", "cpu");
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "relu.fwd             cpu        cpu    relu1.fwd "));
  ck_assert_ptr_nonnull(strstr(r.out, "batchnorm.fwd_train"));
  ck_assert_ptr_nonnull(strstr(r.out, "@train_last"));
  ck_assert_ptr_nonnull(strstr(r.out, " 0 failed, 0 skipped"));
  run_free(&r);
  /* an AMP plan: FP16 nodes against the FP32 reference, the AMP range ops */
  toy_env a = toy_env_open(TOY_BN_MODEL_LAYERS
                           "train: {batch: 6, eval_batch: 4, train_size: 20, amp: true}\n",
                           1, 1, 1);
  run_result ra = RUN("validate", "--model", a.model, "--impl", "reference");
  ck_assert_msg(ra.status == 0, "%s%s", ra.out, ra.err);
  ck_assert_ptr_nonnull(strstr(ra.out, "range.unscale "));
  ck_assert_ptr_nonnull(strstr(ra.out, "range.loss_scale "));
  ck_assert_ptr_nonnull(strstr(ra.out, " 0 failed, 0 skipped"));
  run_free(&ra);
  toy_env_close(&a);
  r = RUN("validate", "--model", "/nonexistent/model.yaml");
  ck_assert_int_eq(r.status, 1);
  expect_one_line_error(&r, "blueprint validate: ", "/nonexistent/model.yaml");
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("validate");
  TCase *tc = tcase_create("validate");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, reference_kernels_pass_every_builtin_case_of_every_op);
  tcase_add_test(tc, builtin_cases_carry_the_op_tables_facts);
  tcase_add_test(tc, reference_backwards_agree_with_finite_differences);
  tcase_add_test(tc, amp_twins_take_the_dtypes_and_paddings_of_an_amp_plan);
  tcase_add_test(tc, every_wrong_kernel_fails_with_its_case_named);
  tcase_add_test(tc, autotune_excludes_the_wrong_kernels_and_never_picks_them);
  tcase_add_test(tc, train_with_autotune_names_and_skips_the_wrong_kernels);
  tcase_add_test(tc, validate_help_and_bad_command_lines);
  tcase_add_test(tc, validate_prints_a_table_and_a_summary);
  tcase_add_test(tc, validate_dtype_fp16_runs_only_the_fp16_cases);
  tcase_add_test(tc, validate_exits_1_and_names_the_case_of_a_wrong_kernel);
  tcase_add_test(tc, validate_json_has_the_documented_fields);
  tcase_add_test(tc, validate_takes_the_nodes_of_a_model_as_cases);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
