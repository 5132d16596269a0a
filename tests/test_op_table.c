/* The built-in op table (blueprint/op_table.h): the registry knows exactly
 * its ops, and every fact in it is consistent with the op's contract
 * (abi/bp_abi_ops.h): flags inside their attribute blocks, tensor indices
 * inside the op's lists, gradient roles naming real ops and tensors, and
 * the FLOPs the profile counts. */
#include <check.h>
#include <string.h>

#include "blueprint/op_table.h"
#include "blueprint/profile.h"
#include "blueprint/registry.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"

START_TEST(the_registry_registers_every_table_op_and_names_are_unique) {
  int count = 0;
  const bp_op_info *t = bp_op_table(&count);
  ck_assert_int_ge(count, 37);
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  for (int i = 0; i < count; i++) {
    ck_assert_ptr_eq(bp_op_find(t[i].abi.name), &t[i]);
    const bp_abi_op *op = bp_registry_find_op(r, t[i].abi.name);
    ck_assert_msg(op != NULL, "%s is not registered", t[i].abi.name);
    ck_assert_int_eq(op->num_inputs, t[i].abi.num_inputs);
    ck_assert_int_eq(op->num_outputs, t[i].abi.num_outputs);
    ck_assert_uint_eq(op->attr_size, t[i].abi.attr_size);
    ck_assert_int_le(t[i].abi.num_inputs, BP_OP_MAX_TENSORS);
    ck_assert_int_le(t[i].abi.num_outputs, BP_OP_MAX_TENSORS);
  }
  ck_assert_ptr_null(bp_op_find("gemm.fwd"));
  ck_assert_ptr_null(bp_op_find(NULL));
  bp_registry_destroy(r);
}
END_TEST

START_TEST(backward_ops_and_only_they_accumulate_inside_their_blocks) {
  int count = 0;
  const bp_op_info *t = bp_op_table(&count);
  for (int i = 0; i < count; i++) {
    const char *name = t[i].abi.name;
    const int backward = strstr(name, ".bwd") != NULL;
    ck_assert_msg(t[i].accumulates == backward, "%s: accumulates %d", name, t[i].accumulates);
    if (t[i].accumulates) ck_assert_uint_le(t[i].accumulate_offset + 4, t[i].abi.attr_size);
    if (t[i].has_skip) {
      ck_assert_uint_le(t[i].skip_flag_offset + 4, t[i].abi.attr_size);
      ck_assert_int_eq(t[i].skip_in, t[i].abi.num_inputs - 1); /* the trailing input */
    }
    if (t[i].has_inplace) ck_assert_int_lt(t[i].inplace_in, t[i].abi.num_inputs);
    ck_assert_uint_eq(t[i].alias_outputs >> t[i].abi.num_inputs, 0);
  }
  /* the offsets are the contract's own */
  ck_assert_uint_eq(bp_op_find("conv2d.bwd_data")->accumulate_offset,
                    offsetof(bp_conv2d_attrs, accumulate));
  ck_assert_uint_eq(bp_op_find("batchnorm_relu.bwd")->accumulate_offset,
                    offsetof(bp_batchnorm_attrs, accumulate));
  ck_assert_uint_eq(bp_op_find("range.ema")->skip_flag_offset, offsetof(bp_range_attrs, has_skip));
  ck_assert_uint_eq(bp_op_find("range.adamw")->skip_flag_offset,
                    offsetof(bp_optimizer_attrs, has_skip));
}
END_TEST

START_TEST(fills_name_tensors_the_op_has) {
  int count = 0;
  const bp_op_info *t = bp_op_table(&count);
  for (int i = 0; i < count; i++)
    for (int f = 0; f < BP_OP_MAX_FILLS && t[i].fills[f].kind != BP_OP_FILL_NONE; f++) {
      const bp_op_fill *r = &t[i].fills[f];
      const int n = r->output ? t[i].abi.num_outputs : t[i].abi.num_inputs;
      ck_assert_msg(r->index < n, "%s fill %d: tensor %d of %d", t[i].abi.name, f, r->index, n);
      ck_assert_msg(!r->rmw || r->output, "%s fill %d: rmw on an input", t[i].abi.name, f);
      if (r->kind == BP_OP_FILL_UNIFORM || r->kind == BP_OP_FILL_INT || r->kind == BP_OP_FILL_RELU_Y)
        ck_assert_msg(r->lo < r->hi, "%s fill %d: empty range", t[i].abi.name, f);
    }
}
END_TEST

START_TEST(gradient_roles_name_forward_tensors) {
  int count = 0, backwards = 0;
  const bp_op_info *t = bp_op_table(&count);
  for (int i = 0; i < count; i++) {
    if (!t[i].grad_of) continue;
    backwards++;
    const bp_op_info *f = bp_op_find(t[i].grad_of);
    ck_assert_msg(f && f->grad_check, "%s: grad_of %s", t[i].abi.name, t[i].grad_of);
    for (int k = 0; k < t[i].abi.num_inputs; k++) {
      const bp_op_grad_src s = t[i].grad_in[k];
      ck_assert_msg(s.of == 'x' || s.of == 'y' || s.of == 'r', "%s input %d", t[i].abi.name, k);
      if (s.of == 'x') ck_assert_int_lt(s.index, f->abi.num_inputs);
      if (s.of != 'x') ck_assert_int_lt(s.index, f->abi.num_outputs);
    }
    for (int k = 0; k < t[i].abi.num_outputs; k++)
      ck_assert_int_lt(t[i].grad_out[k], f->abi.num_inputs);
  }
  ck_assert_int_ge(backwards, 10);
}
END_TEST

static bp_abi_tensor desc(int64_t n, int64_t h, int64_t w, int64_t c) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = BP_ABI_DTYPE_FP32;
  t.shape[0] = n;
  t.shape[1] = h;
  t.shape[2] = w;
  t.shape[3] = c;
  return t;
}

START_TEST(flops_follow_the_table) {
  /* conv: x[2,8,8,3], w[4,3,3,3], y[2,6,6,4]: 2 * (2*6*6) * (4*3*3*3) */
  bp_abi_tensor x = desc(2, 8, 8, 3), w = desc(4, 3, 3, 3), y = desc(2, 6, 6, 4);
  bp_abi_tensor ins[2] = {x, w}, outs[1] = {y};
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.inputs = ins;
  a.outputs = outs;
  a.num_inputs = 2;
  a.num_outputs = 1;
  ck_assert_uint_eq(bp_profile_op_flops("conv2d.fwd", &a), 2ull * 72 * 108);
  /* bwd_filter: x, dy -> dw: the same multiply-adds */
  bp_abi_tensor bin[2] = {x, y}, bout[1] = {w};
  a.inputs = bin;
  a.outputs = bout;
  ck_assert_uint_eq(bp_profile_op_flops("conv2d.bwd_filter", &a), 2ull * 72 * 108);
  /* fc: x[5,1,1,7], w[3,1,1,7] -> y[5,1,1,3] */
  bp_abi_tensor fx = desc(5, 1, 1, 7), fw = desc(3, 1, 1, 7), fy = desc(5, 1, 1, 3);
  bp_abi_tensor fin[2] = {fx, fw}, fout[1] = {fy};
  a.inputs = fin;
  a.outputs = fout;
  ck_assert_uint_eq(bp_profile_op_flops("fc.fwd", &a), 2ull * 5 * 21);
  ck_assert_uint_eq(bp_profile_op_flops("relu.fwd", &a), 0); /* counted by no one */
  ck_assert_uint_eq(bp_profile_op_flops("my.module_op", &a), 0);
  a.num_inputs = 1; /* a list too short for the table's tensors */
  ck_assert_uint_eq(bp_profile_op_flops("fc.fwd", &a), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("op_table");
  TCase *tc = tcase_create("op_table");
  tcase_add_test(tc, the_registry_registers_every_table_op_and_names_are_unique);
  tcase_add_test(tc, backward_ops_and_only_they_accumulate_inside_their_blocks);
  tcase_add_test(tc, fills_name_tensors_the_op_has);
  tcase_add_test(tc, gradient_roles_name_forward_tensors);
  tcase_add_test(tc, flops_follow_the_table);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
