/* The "nccl" collectives (ops/allreduce/nccl.c) on this machine's GPUs,
 * one rank per GPU as threads of this process, over NCCL communicators
 * the cuda device plugin's "nccl" transport opens (bp_abi_device.h,
 * collective transports), at every world 1..G (G = the
 * GPUs, at most 8):
 *  - allreduce.sum and reduce_scatter against the rank-order reference sum
 *    of allreduce-impl.h, within |got - want| <= world * FLT_EPSILON *
 *    |scale| * sum_k |x_k| (the bound of any summation order: NCCL's order
 *    is not rank order), exactly at world 1; all_gather exactly;
 *  - every rank ends allreduce.sum with the same bits, and reduce_scatter
 *    gives a rank's chunk exactly the bits allreduce.sum gives it (what a
 *    sharded update relies on);
 *  - spans whose size is a multiple of the world (ncclReduceScatter and
 *    ncclAllGather) and spans that are not (one ncclReduce/ncclBroadcast
 *    per chunk), and a span of one element;
 *  - allreduce.sum captured in a CUDA graph replays the eager bits;
 *  - supports() refuses a communicator of another backend, with the reason.
 * Without a GPU or without the module the test prints why and exits 77
 * (CTest's SKIP_RETURN_CODE). CUDA does not survive fork(), so the suite
 * runs without Check's fork; rank threads record failures, the main
 * thread asserts. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bp_abi_device.h"
#include "blueprint/registry.h"
#include "blueprint/status.h"
#include "allreduce_util.h"

#define SKIP_CODE 77
#define MAX_GPUS 8

static bp_registry *registry;
static const bp_abi_comm_transport *nccl_transport; /* the cuda plugin's "nccl" */

/* The group of `world` ranks on GPUs 0..world-1, opened by the transport. */
static void *nccl_open_world(int world) {
  int32_t devices[MAX_GPUS];
  for (int r = 0; r < world; r++) devices[r] = r;
  char reason[512] = "";
  const bp_abi_comm_open_args a = {sizeof a, world, devices, 0, world, NULL, reason,
                                   sizeof reason};
  void *group = NULL;
  ck_assert_msg(nccl_transport->open(nccl_transport->user, &a, &group) == BP_ABI_OK,
                "opening NCCL on %d GPU(s): %s", world, reason);
  return group;
}

static bp_abi_comm nccl_rank(void *group, int r) {
  bp_abi_comm c;
  ck_assert_int_eq(nccl_transport->comm(group, r, &c), BP_ABI_OK);
  return c;
}
static int gpus; /* ranks tested up to: min(GPUs, MAX_GPUS) */

static const char *const ops[] = {"allreduce.sum", "allreduce.reduce_scatter",
                                  "allreduce.all_gather"};
#define OP_COUNT 3

static const bp_abi_kernel *kernel_of(const char *op) {
  const bp_abi_kernel *k = ar_kernel(registry, op, "nccl");
  if (!k) ck_abort_msg("no %s kernel 'nccl'", op);
  return k;
}

/* One rank's call: its GPU, its communicator, the span's host copies. */
typedef struct rank_job {
  const bp_abi_kernel *k;
  int device;
  bp_abi_comm comm;
  uint64_t count;
  float scale;
  int capture; /* capture the call in a graph and replay it, instead of running it */
  float *in, *out; /* host: the values put in, the values read back */
  char why[512];   /* empty, or what failed */
} rank_job;

#define CUDA_TRY(job, call)                                                                    \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      snprintf((job)->why, sizeof (job)->why, "%s: %s", #call, cudaGetErrorString(e_));        \
      goto done;                                                                               \
    }                                                                                          \
  } while (0)

static void *rank_main(void *arg) {
  rank_job *j = arg;
  float *data = NULL;
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  const size_t bytes = (size_t)j->count * sizeof(float);
  CUDA_TRY(j, cudaSetDevice(j->device));
  CUDA_TRY(j, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_TRY(j, cudaMalloc((void **)&data, bytes));
  CUDA_TRY(j, cudaMemcpy(data, j->in, bytes, cudaMemcpyHostToDevice));
  ar_node n;
  ar_node_init(&n, data, j->count, j->scale, &j->comm);
  char reason[256] = "";
  n.args.stream = stream;
  n.args.reason = reason;
  n.args.reason_size = sizeof reason;
  if (j->capture) CUDA_TRY(j, cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const int rc = j->k->run(j->k->user, &n.args);
  if (j->capture) {
    const cudaError_t e = cudaStreamEndCapture(stream, &graph);
    if (rc == BP_ABI_OK) CUDA_TRY(j, e);
  }
  if (rc != BP_ABI_OK) {
    snprintf(j->why, sizeof j->why, "%s run: %d: %s", j->k->op, rc, reason);
    goto done;
  }
  if (j->capture) {
    CUDA_TRY(j, cudaGraphInstantiate(&exec, graph, 0));
    CUDA_TRY(j, cudaGraphLaunch(exec, stream));
  }
  CUDA_TRY(j, cudaStreamSynchronize(stream));
  CUDA_TRY(j, cudaMemcpy(j->out, data, bytes, cudaMemcpyDeviceToHost));
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (data) cudaFree(data);
  if (stream) cudaStreamDestroy(stream);
  return NULL;
}

/* Runs `op` on world ranks (GPUs 0..world-1) as threads, each starting from
 * ar_value_of(r, i); out[r] gets rank r's span afterwards. */
static void run_world(void *nccl, int world, const char *op, uint64_t count, float scale,
                      int capture, float **out) {
  rank_job jobs[MAX_GPUS];
  pthread_t threads[MAX_GPUS];
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){.k = kernel_of(op), .device = r, .comm = nccl_rank(nccl, r),
                         .count = count, .scale = scale, .capture = capture, .out = out[r]};
    jobs[r].in = malloc((size_t)count * sizeof(float));
    ck_assert_ptr_nonnull(jobs[r].in);
    for (uint64_t i = 0; i < count; i++) jobs[r].in[i] = ar_value_of(r, i);
  }
  for (int r = 0; r < world; r++)
    ck_assert_int_eq(pthread_create(&threads[r], NULL, rank_main, &jobs[r]), 0);
  for (int r = 0; r < world; r++) pthread_join(threads[r], NULL);
  for (int r = 0; r < world; r++) {
    free(jobs[r].in);
    ck_assert_msg(jobs[r].why[0] == '\0', "world %d, %s of %llu, rank %d: %s", world, op,
                  (unsigned long long)count, r, jobs[r].why);
  }
}

static float **spans(int world, uint64_t count) {
  float **s = calloc((size_t)world, sizeof *s);
  ck_assert_ptr_nonnull(s);
  for (int r = 0; r < world; r++) {
    s[r] = malloc((size_t)count * sizeof(float));
    ck_assert_ptr_nonnull(s[r]);
  }
  return s;
}

static void free_spans(float **s, int world) {
  for (int r = 0; r < world; r++) free(s[r]);
  free(s);
}

/* The tolerance of element i against the rank-order sum: any order of
 * world - 1 float additions is within (world - 1) * FLT_EPSILON / 2 of the
 * exact sum times the sum of magnitudes; world * FLT_EPSILON covers it and
 * the scale's rounding. */
static float tolerance(int world, uint64_t i, float scale) {
  if (world == 1) return 0.0f; /* one rank: NCCL copies, the scale is the same multiply */
  float mag = 0.0f;
  for (int k = 0; k < world; k++) mag += fabsf(ar_value_of(k, i));
  return (float)world * FLT_EPSILON * fabsf(scale) * mag * 1.0001f;
}

static void check_world(int world) {
  void *nccl = nccl_open_world(world);
  /* 1 element; a multiple of the world (one NCCL call per phase); not one
   * (one call per chunk) unless world is 1; large enough for NCCL to chunk */
  const uint64_t counts[] = {1, 4096 * 3, 1001, (1u << 20) + 7};
  const float scale = world == 1 ? 0.5f : 1.0f / (float)world; /* the scale kernel runs */
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    const uint64_t count = counts[c];
    float **sum = spans(world, count), **got = spans(world, count);
    run_world(nccl, world, ops[0], count, scale, 0, sum);
    for (int op = 0; op < OP_COUNT; op++) {
      float **o = op == 0 ? sum : got;
      if (op > 0) run_world(nccl, world, ops[op], count, scale, 0, got);
      for (int r = 0; r < world; r++)
        for (uint64_t i = 0; i < count; i++) {
          float want;
          if (!ar_expected(ops[op], world, r, count, i, scale, &want)) continue;
          const float tol = op == 2 ? 0.0f : tolerance(world, i, scale);
          if (!(fabsf(o[r][i] - want) <= tol)) /* NaN fails too */
            ck_abort_msg("world %d, %s of %llu: rank %d element %llu is %.9g, want %.9g +- %.3g",
                         world, ops[op], (unsigned long long)count, r, (unsigned long long)i,
                         o[r][i], want, tol);
          /* the same bits everywhere: sum on every rank, reduce_scatter's own chunk */
          if (op < 2 && memcmp(&o[r][i], &sum[0][i], sizeof(float)) != 0)
            ck_abort_msg("world %d, %s of %llu: rank %d element %llu has other bits (%.9g) "
                         "than allreduce.sum on rank 0 (%.9g)",
                         world, ops[op], (unsigned long long)count, r, (unsigned long long)i,
                         o[r][i], sum[0][i]);
        }
    }
    free_spans(sum, world);
    free_spans(got, world);
  }
  nccl_transport->close(nccl);
}

START_TEST(nccl_collectives_match_the_rank_order_sum_at_every_world) {
  for (int world = 1; world <= gpus; world++) check_world(world);
}
END_TEST

START_TEST(nccl_sum_captured_in_a_graph_replays_the_eager_bits) {
  const int world = gpus;
  void *nccl = nccl_open_world(world);
  const uint64_t count = 100003;
  const float scale = 1.0f / (float)world;
  float **eager = spans(world, count), **replay = spans(world, count);
  run_world(nccl, world, "allreduce.sum", count, scale, 0, eager);
  run_world(nccl, world, "allreduce.sum", count, scale, 1, replay);
  for (int r = 0; r < world; r++)
    ck_assert_msg(memcmp(eager[r], replay[r], (size_t)count * sizeof(float)) == 0,
                  "world %d: rank %d's replayed sum differs from the eager one", world, r);
  free_spans(eager, world);
  free_spans(replay, world);
  nccl_transport->close(nccl);
}
END_TEST

START_TEST(nccl_refuses_another_backend_with_the_reason) {
  float x = 0.0f;
  bp_abi_comm_threads none = {0};
  const bp_abi_comm threads = {sizeof threads, "threads", 0, 2, &none};
  ar_node n;
  ar_node_init(&n, &x, 1, 0.5f, &threads);
  n.args.input_ptrs = NULL; /* supports() never reads data */
  n.args.output_ptrs = NULL;
  for (int op = 0; op < OP_COUNT; op++) {
    const bp_abi_kernel *k = kernel_of(ops[op]);
    char reason[256] = "";
    ck_assert_int_eq(k->supports(k->user, &n.args, reason, sizeof reason), 0);
    ck_assert_msg(strstr(reason, "communicator is 'threads', not 'nccl'") != NULL, "%s", reason);
    ck_assert(k->flags & BP_ABI_KERNEL_GRAPH_CAPTURABLE);
    ck_assert(k->flags & BP_ABI_KERNEL_COLLECTIVE);
    ck_assert_str_eq(k->device, "cuda");
  }
}
END_TEST

int main(void) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    printf("SKIP: no CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
    return SKIP_CODE;
  }
  gpus = count < MAX_GPUS ? count : MAX_GPUS;
  if (bp_registry_create(&registry) != BP_OK ||
      bp_registry_load(registry, BP_OPS_ALLREDUCE_NCCL_PATH) != BP_OK ||
      !ar_kernel(registry, "allreduce.sum", "nccl") ||
      bp_registry_load(registry, BP_DEVICE_CUDA_PATH) != BP_OK) {
    printf("SKIP: %s or %s is not usable here: %s\n", BP_OPS_ALLREDUCE_NCCL_PATH,
           BP_DEVICE_CUDA_PATH, bp_last_error());
    bp_registry_destroy(registry);
    return SKIP_CODE;
  }
  const bp_abi_device *cuda = bp_registry_find_device(registry, "cuda");
  for (int i = 0; cuda && i < cuda->num_transports; i++)
    if (strcmp(cuda->transports[i].backend, "nccl") == 0) nccl_transport = &cuda->transports[i];
  if (!nccl_transport) {
    printf("FAIL: the cuda device offers no 'nccl' transport\n");
    bp_registry_destroy(registry);
    return EXIT_FAILURE;
  }
  printf("testing the nccl collectives at worlds 1..%d (this machine has %d GPU(s))\n", gpus,
         count);
  Suite *suite = suite_create("allreduce_nccl");
  TCase *tc = tcase_create("allreduce_nccl");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, nccl_refuses_another_backend_with_the_reason);
  tcase_add_test(tc, nccl_collectives_match_the_rank_order_sum_at_every_world);
  tcase_add_test(tc, nccl_sum_captured_in_a_graph_replays_the_eager_bits);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  bp_registry_destroy(registry);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
