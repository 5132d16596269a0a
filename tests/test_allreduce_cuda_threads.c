/* The device-memory "threads" collectives (ops/allreduce/device_threads.c,
 * impl "cuda_threads"): 1 to 4 ranks as threads of this process, all on GPU
 * 0, each with its own stream, over the core's threads communicator
 * (comm.h: bp_comm_create). Every op gives exactly the bits of the
 * rank-order reference (allreduce_util.c: the CPU threads kernel's), for
 * spans that are and are not a multiple of the world; a node's state
 * (its events) is reused over several calls, each after the rank's stream
 * has queued more work, as in a run of many steps. Without a GPU or the
 * module the test prints why and exits 77. CUDA does not survive fork(), so
 * the suite runs without Check's fork; rank threads record failures, the
 * main thread asserts. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "blueprint/comm.h"
#include "blueprint/registry.h"
#include "blueprint/status.h"
#include "allreduce_util.h"

#define SKIP_CODE 77
#define MAX_WORLD 4
#define CALLS 3 /* calls of one node per rank: its events are recorded again */

static bp_registry *registry;

static const char *const ops[] = {"allreduce.sum", "allreduce.reduce_scatter",
                                  "allreduce.all_gather"};

typedef struct rank_job {
  const bp_abi_kernel *k;
  bp_abi_comm comm;
  uint64_t count;
  float scale;
  float *out;    /* host: the span after the last call */
  char why[512]; /* empty, or what failed */
} rank_job;

#define CUDA_TRY(job, call)                                                                    \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      snprintf((job)->why, sizeof (job)->why, "%s: %s", #call, cudaGetErrorString(e_));        \
      goto done;                                                                               \
    }                                                                                          \
  } while (0)

/* Each call starts from ar_value_of(rank, i), written on the rank's stream
 * just before the call (so a peer that read early would see stale values). */
static void *rank_main(void *arg) {
  rank_job *j = arg;
  const size_t bytes = (size_t)j->count * sizeof(float);
  float *data = NULL, *in = malloc(bytes);
  void *state = NULL;
  cudaStream_t stream = NULL;
  char reason[256] = "";
  if (!in) {
    snprintf(j->why, sizeof j->why, "out of memory");
    return NULL;
  }
  for (uint64_t i = 0; i < j->count; i++) in[i] = ar_value_of(j->comm.rank, i);
  CUDA_TRY(j, cudaSetDevice(0));
  CUDA_TRY(j, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_TRY(j, cudaMalloc((void **)&data, bytes));
  ar_node n;
  ar_node_init(&n, data, j->count, j->scale, &j->comm);
  n.args.stream = stream;
  n.args.reason = reason;
  n.args.reason_size = sizeof reason;
  int rc = j->k->prepare(j->k->user, &n.args, &state);
  if (rc != BP_ABI_OK) {
    snprintf(j->why, sizeof j->why, "prepare: %d: %s", rc, reason);
    goto done;
  }
  n.args.state = state;
  for (int call = 0; call < CALLS; call++) {
    CUDA_TRY(j, cudaMemsetAsync(data, 0xFF, bytes, stream)); /* NaNs first */
    CUDA_TRY(j, cudaMemcpyAsync(data, in, bytes, cudaMemcpyHostToDevice, stream));
    rc = j->k->run(j->k->user, &n.args);
    if (rc != BP_ABI_OK) { /* every rank fails alike, so none waits in a barrier */
      snprintf(j->why, sizeof j->why, "%s run %d: %d: %s", j->k->op, call, rc, reason);
      goto done;
    }
  }
  CUDA_TRY(j, cudaStreamSynchronize(stream));
  CUDA_TRY(j, cudaMemcpy(j->out, data, bytes, cudaMemcpyDeviceToHost));
done:
  if (state) j->k->release(j->k->user, state);
  if (data) cudaFree(data);
  if (stream) cudaStreamDestroy(stream);
  free(in);
  return NULL;
}

static void check_world(int world, const char *op, uint64_t count) {
  const bp_abi_kernel *k = ar_kernel(registry, op, "cuda_threads");
  ck_assert_msg(k != NULL, "no %s kernel 'cuda_threads'", op);
  ck_assert(k->prepare && k->release);
  bp_comm *comm = NULL;
  ck_assert_int_eq(bp_comm_create(world, &comm), BP_OK);
  const float scale = world == 1 ? 0.5f : 1.0f / (float)world;
  rank_job jobs[MAX_WORLD];
  pthread_t threads[MAX_WORLD];
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){.k = k, .comm = bp_comm_abi(comm, r), .count = count, .scale = scale};
    jobs[r].out = malloc((size_t)count * sizeof(float));
    ck_assert_ptr_nonnull(jobs[r].out);
  }
  for (int r = 0; r < world; r++)
    ck_assert_int_eq(pthread_create(&threads[r], NULL, rank_main, &jobs[r]), 0);
  for (int r = 0; r < world; r++) pthread_join(threads[r], NULL);
  for (int r = 0; r < world; r++) {
    ck_assert_msg(jobs[r].why[0] == '\0', "world %d, %s of %llu, rank %d: %s", world, op,
                  (unsigned long long)count, r, jobs[r].why);
    for (uint64_t i = 0; i < count; i++) {
      float want;
      if (!ar_expected(op, world, r, count, i, scale, &want)) continue;
      if (memcmp(&jobs[r].out[i], &want, sizeof want) != 0)
        ck_abort_msg("world %d, %s of %llu: rank %d element %llu is %.9g, the rank-order "
                     "reference %.9g",
                     world, op, (unsigned long long)count, r, (unsigned long long)i,
                     jobs[r].out[i], want);
    }
  }
  for (int r = 0; r < world; r++) free(jobs[r].out);
  bp_comm_destroy(comm);
}

START_TEST(device_threads_give_the_rank_order_bits) {
  const uint64_t counts[] = {1, 4096 * 3, 1001, (1u << 20) + 7};
  for (int world = 1; world <= MAX_WORLD; world++)
    for (int op = 0; op < 3; op++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        check_world(world, ops[op], counts[c]);
}
END_TEST

START_TEST(device_threads_refuse_another_backend) {
  const bp_abi_comm nccl = {sizeof nccl, "nccl", 0, 2, (void *)&nccl};
  float x = 0.0f;
  ar_node n;
  ar_node_init(&n, &x, 1, 0.5f, &nccl);
  const bp_abi_kernel *k = ar_kernel(registry, "allreduce.sum", "cuda_threads");
  ck_assert_ptr_nonnull(k);
  char reason[256] = "";
  ck_assert_int_eq(k->supports(k->user, &n.args, reason, sizeof reason), 0);
  ck_assert_msg(strstr(reason, "communicator backend 'nccl', not 'threads'") != NULL, "%s",
                reason);
  ck_assert(!(k->flags & BP_ABI_KERNEL_GRAPH_CAPTURABLE)); /* peers' events cross captures */
  ck_assert_str_eq(k->device, "cuda");
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
  if (bp_registry_create(&registry) != BP_OK ||
      bp_registry_load(registry, BP_OPS_ALLREDUCE_CUDA_PATH) != BP_OK ||
      !ar_kernel(registry, "allreduce.sum", "cuda_threads")) {
    printf("SKIP: %s is not usable here: %s\n", BP_OPS_ALLREDUCE_CUDA_PATH, bp_last_error());
    bp_registry_destroy(registry);
    return SKIP_CODE;
  }
  Suite *suite = suite_create("allreduce_cuda_threads");
  TCase *tc = tcase_create("allreduce_cuda_threads");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, device_threads_refuse_another_backend);
  tcase_add_test(tc, device_threads_give_the_rank_order_bits);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  bp_registry_destroy(registry);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
