/* The host side of the cuDNN and cuBLAS modules that runs without a GPU
 * (ops/shared/cuda_weighted.h, ops/shared/cuda_tensor_ops.h): FP16 calls
 * checked with the reference's checks and reasons through the FP32-typed
 * view, mixed dtypes refused, which layouts are dense (the others are
 * staged), the dense layout, the bias-gradient split, the switches read
 * from the environment and the aligned workspace base. */
#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shared/cuda_weighted.h"

static bp_abi_tensor desc(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                          int64_t extra) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = dtype;
  t.shape[0] = n, t.shape[1] = h, t.shape[2] = w, t.shape[3] = c;
  t.padded_c = c + extra;
  t.stride[3] = 1, t.stride[2] = t.padded_c, t.stride[1] = w * t.padded_c;
  t.stride[0] = h * w * t.padded_c;
  t.slot_bytes = (uint64_t)(n * h * w * t.padded_c) * bp_sdk_dtype_size(dtype) + 16;
  return t;
}

typedef struct call {
  bp_abi_kernel_args a;
  bp_abi_tensor in[3], out[2];
} call;

/* fc.fwd x [4,1,1,6] (+2 padding), w [5,1,1,6], y [4,1,1,5], all `dtype`. */
static void fc_call(call *c, int32_t dtype, const bp_fc_attrs *attrs) {
  memset(c, 0, sizeof *c);
  c->in[0] = desc(dtype, 4, 1, 1, 6, 2);
  c->in[1] = desc(dtype, 5, 1, 1, 6, 0);
  c->out[0] = desc(dtype, 4, 1, 1, 5, 3);
  c->a.struct_size = sizeof c->a;
  c->a.num_inputs = 2, c->a.num_outputs = 1;
  c->a.inputs = c->in, c->a.outputs = c->out;
  c->a.attrs = attrs, c->a.attr_size = sizeof *attrs, c->a.attr_version = BP_ABI_ATTR_VERSION;
}

/* The view's verdict and reason equal the FP32 check's on the same call
 * made FP32. */
static void same_verdict(call *c16, const char *needle) {
  char r16[256] = "", r32[256] = "";
  ops_cuda_view v;
  ops_fc_geom g16, g32;
  const int ok16 = ops_cuda_view_make(&c16->a, &v, r16, sizeof r16) &&
                   ops_fc_check(&v.args, OPS_PASS_FWD, &g16, r16, sizeof r16);
  call c32 = *c16;
  c32.a.inputs = c32.in, c32.a.outputs = c32.out;
  for (int i = 0; i < 2; i++) {
    c32.in[i].dtype = BP_ABI_DTYPE_FP32;
    c32.in[i].slot_bytes = c16->in[i].slot_bytes * 2;
  }
  c32.out[0].dtype = BP_ABI_DTYPE_FP32;
  c32.out[0].slot_bytes = c16->out[0].slot_bytes * 2;
  const int ok32 = ops_fc_check(&c32.a, OPS_PASS_FWD, &g32, r32, sizeof r32);
  ck_assert_int_eq(ok16, ok32);
  ck_assert_str_eq(r16, r32);
  if (needle) ck_assert_msg(strstr(r16, needle) != NULL, "%s", r16);
  if (ok16) ck_assert_int_eq(v.dtype, BP_ABI_DTYPE_FP16);
}

START_TEST(fp16_calls_get_the_reference_checks) {
  const bp_fc_attrs ok = {.has_bias = 0, .accumulate = 0}, bad = {.has_bias = 2};
  call c;
  fc_call(&c, BP_ABI_DTYPE_FP16, &ok);
  same_verdict(&c, NULL);
  fc_call(&c, BP_ABI_DTYPE_FP16, &bad);
  same_verdict(&c, "has_bias is 2");
  fc_call(&c, BP_ABI_DTYPE_FP16, &ok);
  c.out[0].shape[3] = 4; /* y must have 5 outputs */
  same_verdict(&c, "expected [4,1,1,5]");
  fc_call(&c, BP_ABI_DTYPE_FP16, &ok);
  c.in[0].slot_bytes = 59; /* x spans 30 FP16 elements: 60 bytes */
  same_verdict(&c, "slot_bytes");
}
END_TEST

START_TEST(mixed_and_other_dtypes_are_refused) {
  const bp_fc_attrs ok = {.has_bias = 0, .accumulate = 0};
  call c;
  ops_cuda_view v;
  char why[256] = "";
  fc_call(&c, BP_ABI_DTYPE_FP16, &ok);
  c.in[1] = desc(BP_ABI_DTYPE_FP32, 5, 1, 1, 6, 0);
  ck_assert_int_eq(ops_cuda_view_make(&c.a, &v, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "input 1: dtype fp32, input 0 is fp16 (mixed dtypes)"), "%s", why);
  fc_call(&c, BP_ABI_DTYPE_INT8, &ok);
  ck_assert_int_eq(ops_cuda_view_make(&c.a, &v, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "expected fp32 or fp16"), "%s", why);
  fc_call(&c, BP_ABI_DTYPE_FP32, &ok);
  ck_assert_int_eq(ops_cuda_view_make(&c.a, &v, why, sizeof why), 1);
  ck_assert_int_eq(v.dtype, BP_ABI_DTYPE_FP32);
  ck_assert_uint_eq(v.in[0].slot_bytes, c.in[0].slot_bytes); /* FP32 is left as it is */
}
END_TEST

START_TEST(padded_layouts_are_not_dense) {
  bp_abi_tensor t = desc(BP_ABI_DTYPE_FP16, 2, 3, 3, 5, 3);
  ops_cuda_layout l = ops_cuda_layout_of(&t);
  ck_assert_int_eq(ops_cuda_is_dense(&l), 0);
  ck_assert_int_eq(ops_cuda_count(&l), 2 * 3 * 3 * 5);
  t = desc(BP_ABI_DTYPE_FP16, 2, 3, 3, 8, 0);
  l = ops_cuda_layout_of(&t);
  ck_assert_int_eq(ops_cuda_is_dense(&l), 1);
  /* extent-1 dimensions may carry any stride */
  t = desc(BP_ABI_DTYPE_FP32, 1, 1, 1, 7, 1);
  l = ops_cuda_layout_of(&t);
  ck_assert_int_eq(ops_cuda_is_dense(&l), 1);
  const int64_t shape[4] = {2, 3, 4, 5};
  const ops_cuda_layout d = ops_cuda_dense_layout(shape);
  ck_assert_int_eq(d.stride[3], 1);
  ck_assert_int_eq(d.stride[2], 5);
  ck_assert_int_eq(d.stride[1], 20);
  ck_assert_int_eq(d.stride[0], 60);
  ck_assert_int_eq(ops_cuda_is_dense(&d), 1);
  const ops_cuda_layout b = ops_cuda_bias_layout(&d, 3);
  ck_assert_int_eq(b.stride[0] + b.stride[1] + b.stride[2], 0);
  ck_assert_int_eq(b.stride[3], 3);
  ck_assert_int_eq(b.shape[1], 3);
}
END_TEST

START_TEST(bias_chunks_and_workspace_base) {
  ck_assert_int_eq(ops_cuda_bias_chunks(1), 1);
  ck_assert_int_eq(ops_cuda_bias_chunks(OPS_CUDA_BIAS_ROWS_PER_CHUNK), 1);
  ck_assert_int_eq(ops_cuda_bias_chunks(OPS_CUDA_BIAS_ROWS_PER_CHUNK + 1), 2);
  ck_assert_int_eq(ops_cuda_bias_chunks(INT64_C(128) * 224 * 224), OPS_CUDA_BIAS_MAX_CHUNKS);
  ck_assert_uint_eq(ops_cuda_round(1), OPS_CUDA_ALIGN);
  ck_assert_uint_eq(ops_cuda_round(OPS_CUDA_ALIGN), OPS_CUDA_ALIGN);
  ck_assert_uint_eq(ops_cuda_round(0), 0);
  static unsigned char buf[4 * OPS_CUDA_ALIGN];
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < OPS_CUDA_ALIGN; k += 37) {
    a.workspace = buf + k;
    char *base = ops_cuda_workspace_base(&a);
    ck_assert_uint_eq((uintptr_t)base % OPS_CUDA_ALIGN, 0);
    ck_assert(base >= (char *)buf + k && base < (char *)buf + k + OPS_CUDA_ALIGN);
  }
  a.workspace = NULL;
  ck_assert_ptr_null(ops_cuda_workspace_base(&a));
}
END_TEST

/* The host's module options (ABI 1.6) in a fake host: "tf32", "deterministic". */
static const char *fake_tf32, *fake_det;
static const char *fake_option(void *ctx, const char *name) {
  (void)ctx;
  return strcmp(name, "tf32") == 0 ? fake_tf32 : strcmp(name, "deterministic") == 0 ? fake_det
                                                                                      : NULL;
}

START_TEST(switches_come_from_the_host_options) {
  bp_abi_host host = {.struct_size = sizeof host, .option = fake_option};
  setenv("BP_TF32", "0", 1), setenv("BP_DETERMINISTIC", "1", 1); /* never read */
  fake_tf32 = fake_det = NULL;
  ck_assert_int_eq(ops_cuda_option_tf32(&host), 1);
  ck_assert_int_eq(ops_cuda_option_deterministic(&host), 0);
  fake_tf32 = "0", fake_det = "1";
  ck_assert_int_eq(ops_cuda_option_tf32(&host), 0);
  ck_assert_int_eq(ops_cuda_option_deterministic(&host), 1);
  fake_tf32 = "1", fake_det = "0";
  ck_assert_int_eq(ops_cuda_option_tf32(&host), 1);
  ck_assert_int_eq(ops_cuda_option_deterministic(&host), 0);
  /* a host before 1.6 has no options: the defaults */
  fake_tf32 = "0", fake_det = "1";
  host.struct_size = (uint32_t)offsetof(bp_abi_host, option);
  ck_assert_int_eq(ops_cuda_option_tf32(&host), 1);
  ck_assert_int_eq(ops_cuda_option_deterministic(&host), 0);
  unsetenv("BP_TF32"), unsetenv("BP_DETERMINISTIC");
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_weighted");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, fp16_calls_get_the_reference_checks);
  tcase_add_test(tc, mixed_and_other_dtypes_are_refused);
  tcase_add_test(tc, padded_layouts_are_not_dense);
  tcase_add_test(tc, bias_chunks_and_workspace_base);
  tcase_add_test(tc, switches_come_from_the_host_options);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
