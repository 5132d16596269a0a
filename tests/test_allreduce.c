/* The all-reduce modules (ops/allreduce, bp_abi_ops.h allreduce.*): the
 * "threads" kernels give every rank the bits of a reference sum in rank
 * order, then scaled (allreduce.sum; reduce_scatter in the rank's own chunk
 * of bp_abi_chunk_start), or every chunk's owner's bits (all_gather), for
 * world sizes 1..8 and spans of 1 element to 4 MB, odd sizes, and spans
 * that start and end at region boundaries of a real plan (bytes outside
 * the span untouched); supports() refuses what is not
 * its contract; selection picks the kernel by the communicator's backend
 * and never autotunes a collective. Ranks that are processes (the "mpi"
 * kernel, and "threads" over shared arenas) are checked by
 * test_allreduce_mpi under mpirun. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/comm.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "bp_abi_ops.h"
#include "allreduce_util.h"
#include "run_util.h"

static bp_registry *registry(void) {
  static bp_registry *r;
  if (!r) {
    ck_assert_int_eq(bp_registry_create(&r), BP_OK);
    ck_assert_msg(bp_registry_load(r, BP_OPS_ALLREDUCE_PATH) == BP_OK, "%s", bp_last_error());
#ifdef BP_OPS_ALLREDUCE_MPI_PATH
    ck_assert_msg(bp_registry_load(r, BP_OPS_ALLREDUCE_MPI_PATH) == BP_OK, "%s", bp_last_error());
#endif
  }
  return r;
}

static const bp_abi_kernel *kernel_of(const char *op, const char *impl) {
  const bp_abi_kernel *k = ar_kernel(registry(), op, impl);
  if (!k) ck_abort_msg("no %s kernel '%s'", op, impl);
  return k;
}
static const bp_abi_kernel *kernel(const char *impl) { return kernel_of("allreduce.sum", impl); }

static const char *const ops[] = {"allreduce.sum", "allreduce.reduce_scatter",
                                  "allreduce.all_gather"};
#define OP_COUNT 3

typedef struct ar_job {
  const bp_abi_kernel *k;
  ar_node node;
  int rank, repeats, rc;
  uint64_t first, count; /* the span: elements [first, first + count) of data */
  float *data;
} ar_job;

static void *ar_thread(void *arg) {
  ar_job *j = arg;
  for (int k = 0; k < j->repeats && j->rc == BP_ABI_OK; k++) {
    for (uint64_t i = 0; i < j->count; i++) j->data[j->first + i] = ar_value_of(j->rank, i);
    j->rc = j->k->run(j->k->user, &j->node.args);
  }
  return NULL;
}

/* world ranks run `op` over elements [first, first + count) of buffers of
 * `total` elements; everything outside the span must keep its guard value. */
static void check_span_op(const char *op, int world, uint64_t total, uint64_t first,
                          uint64_t count, float scale) {
  const bp_abi_kernel *k = kernel_of(op, "threads");
  bp_comm *comm = NULL;
  ck_assert_int_eq(bp_comm_create(world, &comm), BP_OK);
  float *bufs[8];
  ar_job jobs[8];
  pthread_t th[8];
  for (int r = 0; r < world; r++) {
    bufs[r] = malloc((size_t)(total ? total : 1) * sizeof(float));
    ck_assert_ptr_nonnull(bufs[r]);
    for (uint64_t i = 0; i < total; i++) bufs[r][i] = -7.0f;
    const bp_abi_comm c = bp_comm_abi(comm, r);
    jobs[r] = (ar_job){.k = k, .rank = r, .repeats = 2, .first = first, .count = count,
                       .data = bufs[r]};
    ar_node_init(&jobs[r].node, bufs[r] + first, count, scale, &c);
    char why[256] = "";
    ck_assert_msg(k->supports(k->user, &jobs[r].node.args, why, sizeof why), "%s", why);
  }
  for (int r = 1; r < world; r++)
    ck_assert_int_eq(pthread_create(&th[r], NULL, ar_thread, &jobs[r]), 0);
  ar_thread(&jobs[0]);
  for (int r = 1; r < world; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < world; r++) ck_assert_int_eq(jobs[r].rc, BP_ABI_OK);
  for (uint64_t i = 0; i < count; i++)
    for (int r = 0; r < world; r++) {
      float s;
      if (ar_expected(op, world, r, count, i, scale, &s) &&
          memcmp(&bufs[r][first + i], &s, sizeof s) != 0)
        ck_abort_msg("%s, world %d, count %llu: rank %d element %llu is %a, the reference %a",
                     op, world, (unsigned long long)count, r, (unsigned long long)i,
                     (double)bufs[r][first + i], (double)s);
    }
  for (int r = 0; r < world; r++) {
    for (uint64_t i = 0; i < total; i++)
      /* no ck_assert per element: Check logs every one */
      if ((i < first || i >= first + count) && bufs[r][i] != -7.0f)
        ck_abort_msg("rank %d wrote element %llu outside its span", r, (unsigned long long)i);
    free(bufs[r]);
  }
  bp_comm_destroy(comm);
}

static void check_span(int world, uint64_t total, uint64_t first, uint64_t count, float scale) {
  for (int o = 0; o < OP_COUNT; o++) check_span_op(ops[o], world, total, first, count, scale);
}

START_TEST(threads_match_rank_order_sum) {
  /* odd sizes, sizes below the world, 4 MB */
  const uint64_t small[] = {1, 2, 3, 7, 8, 9, 255, 256, 1023, 1025, 4097, 65537};
  for (int world = 1; world <= 8; world++) {
    for (size_t k = 0; k < sizeof small / sizeof small[0]; k++)
      check_span(world, small[k], 0, small[k], k % 2 ? 1.0f : 1.0f / (float)world);
    if (world == 1 || world == 2 || world == 3 || world == 8)
      check_span(world, (1u << 20) + 3, 0, (1u << 20) + 3, 1.0f); /* 4 MB and 12 bytes */
  }
}
END_TEST

START_TEST(threads_spans_at_region_boundaries) {
  /* the gradient buckets of a real plan: spans from region starts to
   * region ends inside an arena-sized buffer */
  char path[4096];
  snprintf(path, sizeof path, "%s/models/mlp.yaml", getenv("BP_SOURCE_DIR"));
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  bp_compile_options co = bp_compile_options_from_model(m);
  co.batch = 32;
  co.train_size = 320;
  bp_plan *plan = NULL;
  ck_assert_msg(bp_model_compile(m, &co, &plan) == BP_OK, "%s", bp_last_error());
  const uint64_t total = bp_plan_total_bytes(plan) / sizeof(float);
  const bp_region pairs[][2] = {
      {bp_region_of_param(BP_FAMILY_G, BP_PARAM_BN_BIAS),
       bp_region_of_param(BP_FAMILY_G, BP_PARAM_CONV_FIRST)},
      {bp_region_of_param(BP_FAMILY_G, BP_PARAM_FC_WEIGHT),
       bp_region_of_param(BP_FAMILY_G, BP_PARAM_FC_WEIGHT)},
      {BP_REGION_R, BP_REGION_R}};
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
    bp_span s;
    ck_assert_int_eq(bp_plan_resolve(plan, pairs[p][0], pairs[p][1], &s), BP_OK);
    ck_assert_uint_gt(s.bytes, 0);
    ck_assert_uint_eq(s.offset % sizeof(float), 0);
    for (int world = 2; world <= 3; world++)
      check_span(world, total, s.offset / sizeof(float), s.bytes / sizeof(float), 1.0f);
  }
  bp_plan_destroy(plan);
  bp_model_destroy(m);
}
END_TEST

START_TEST(threads_refuses_what_is_not_its_contract) {
  const bp_abi_kernel *k = kernel("threads");
  ck_assert_uint_ne(k->flags & BP_ABI_KERNEL_COLLECTIVE, 0);
  bp_comm *comm = NULL;
  ck_assert_int_eq(bp_comm_create(2, &comm), BP_OK);
  const bp_abi_comm c = bp_comm_abi(comm, 1);
  ck_assert_str_eq(c.backend, "threads");
  ck_assert_int_eq(c.rank, 1);
  ck_assert_int_eq(c.world, 2);
  float data[4] = {0};
  ar_node n;
  char why[256];
  /* no communicator */
  ar_node_init(&n, data, 4, 1.0f, NULL);
  ck_assert(!k->supports(k->user, &n.args, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "no communicator"));
  ck_assert_int_eq(k->run(k->user, &n.args), BP_ABI_ERR_INVALID);
  /* another backend */
  bp_abi_comm other = c;
  other.backend = "mpi";
  ar_node_init(&n, data, 4, 1.0f, &other);
  ck_assert(!k->supports(k->user, &n.args, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "backend 'mpi'"));
  /* a 1.0 host: the args end before comm */
  ar_node_init(&n, data, 4, 1.0f, &c);
  n.args.struct_size = (uint32_t)offsetof(bp_abi_kernel_args, comm);
  ck_assert(!k->supports(k->user, &n.args, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "older than 1.1"));
  /* an FP16 span, a rank outside the world */
  ar_node_init(&n, data, 4, 1.0f, &c);
  n.span.dtype = BP_ABI_DTYPE_FP16;
  ck_assert(!k->supports(k->user, &n.args, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "FP32 span"));
  ar_node_init(&n, data, 4, 1.0f, &c);
  n.comm.rank = 2;
  ck_assert(!k->supports(k->user, &n.args, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "rank 2 of world 2"));
  /* no attribute block: reduce_scatter needs its scale, all_gather has none */
  const bp_abi_kernel *rs = kernel_of("allreduce.reduce_scatter", "threads");
  const bp_abi_kernel *ag = kernel_of("allreduce.all_gather", "threads");
  ar_node_init(&n, data, 4, 1.0f, &c);
  n.args.attrs = NULL;
  n.args.attr_size = 0;
  ck_assert(!rs->supports(rs->user, &n.args, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "attribute block"));
  ck_assert_msg(ag->supports(ag->user, &n.args, why, sizeof why), "%s", why);
  ck_assert_uint_ne(rs->flags & ag->flags & BP_ABI_KERNEL_COLLECTIVE, 0);
  bp_comm_destroy(comm);
}
END_TEST

START_TEST(selection_follows_the_backend) {
  bp_registry *r = registry();
  bp_comm *comm = NULL;
  ck_assert_int_eq(bp_comm_create(2, &comm), BP_OK);
  const bp_abi_comm c = bp_comm_abi(comm, 0);
  float data[4] = {0};
  ar_node n;
  ar_node_init(&n, data, 4, 1.0f, &c);
  bp_select_options o = {.pins = "", .autotune = 1}; /* autotune on: a collective is never timed */
  const bp_registered_kernel *k = NULL;
  ck_assert_msg(bp_registry_select(r, "allreduce.sum", "cpu", &n.args, &o, &k) == BP_OK, "%s",
                bp_last_error());
  ck_assert_str_eq(k->kernel.impl, "threads");
  bp_abi_comm mpi = c;
  mpi.backend = "mpi";
  ar_node_init(&n, data, 4, 1.0f, &mpi);
#ifdef BP_OPS_ALLREDUCE_MPI_PATH
  ck_assert_msg(bp_registry_select(r, "allreduce.sum", "cpu", &n.args, &o, &k) == BP_OK, "%s",
                bp_last_error());
  ck_assert_str_eq(k->kernel.impl, "mpi");
  bp_abi_comm nccl = c;
  nccl.backend = "nccl";
  ar_node_init(&n, data, 4, 1.0f, &nccl);
#endif
  ck_assert_int_eq(bp_registry_select(r, "allreduce.sum", "cpu", &n.args, &o, &k),
                   BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "not 'threads'"));
  bp_comm_destroy(comm);
}
END_TEST

START_TEST(comm_refuses_bad_worlds) {
  bp_comm *c = NULL;
  ck_assert_int_eq(bp_comm_create(0, &c), BP_ERR_INVALID);
  ck_assert_int_eq(bp_comm_create(BP_COMM_MAX_WORLD + 1, &c), BP_ERR_INVALID);
  ck_assert_ptr_null(c);
  bp_comm_destroy(NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("allreduce");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, threads_match_rank_order_sum);
  tcase_add_test(tc, threads_spans_at_region_boundaries);
  tcase_add_test(tc, threads_refuses_what_is_not_its_contract);
  tcase_add_test(tc, selection_follows_the_backend);
  tcase_add_test(tc, comm_refuses_bad_worlds);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
