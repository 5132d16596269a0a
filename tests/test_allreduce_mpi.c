/* The all-reduce kernels across processes under mpirun: "threads" over
 * arenas whose first bytes are shared (comm.h: bp_mpi_shared_allocator,
 * bp_mpi_shared_comm) and "mpi" over private memory give every rank the
 * bits of the reference sum in rank order (allreduce.sum; reduce_scatter
 * in the rank's own chunk) or every chunk's owner's bits (all_gather), for
 * 2, 3 and 4 processes and spans of 1 element to 4 MB, odd sizes and
 * offsets, spans that end at the shared part's end; nothing outside the
 * span changes, in the shared part or the private rest.
 *
 * Run alone (by CTest), the test starts itself under `mpirun -np N` for
 * each N and expects every run to pass; under mpirun it is the worker: it
 * checks and ends the run with MPI_Abort at the first wrong bit, so no
 * rank is left waiting in a collective. Skips (77) without mpirun or MPI. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allreduce_util.h"
#include "blueprint/comm.h"
#include "blueprint/registry.h"
#include "run_util.h"

#ifdef BP_OPS_ALLREDUCE_MPI_PATH
#include <mpi.h>

enum { GUARD_BITS = 0x7fc00bad }; /* a quiet NaN no sum produces */
#define SHARED_BYTES ((size_t)(1u << 22) + 5 * 4096) /* 4 MB and 5 pages */

static int world_rank;

/* Reports the first wrong bit and ends every process of the run. */
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d: ", world_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One op over elements [first, first + count) of `data` (`total` floats,
 * every other element holding the guard bits), twice (a collective leaves
 * nothing behind for the next call). */
static void check_span(const bp_abi_kernel *k, const bp_abi_comm *c, float *data,
                       uint64_t total, uint64_t first, uint64_t count) {
  const float scale = count % 2 ? 1.0f : 1.0f / (float)c->world;
  const uint32_t guard = GUARD_BITS;
  for (uint64_t i = 0; i < total; i++) memcpy(&data[i], &guard, sizeof guard);
  ar_node n;
  ar_node_init(&n, data + first, count, scale, c);
  char why[256] = "";
  if (!k->supports(k->user, &n.args, why, sizeof why))
    die("%s (%s) refuses a span of %llu: %s", k->op, k->impl, (unsigned long long)count, why);
  n.args.workspace_bytes = k->workspace_size ? k->workspace_size(k->user, &n.args) : 0;
  n.args.workspace = n.args.workspace_bytes ? malloc(n.args.workspace_bytes) : NULL;
  for (int repeat = 0; repeat < 2; repeat++) {
    for (uint64_t i = 0; i < count; i++) data[first + i] = ar_value_of(c->rank, i);
    if (k->run(k->user, &n.args) != BP_ABI_OK)
      die("%s (%s) failed on a span of %llu", k->op, k->impl, (unsigned long long)count);
  }
  free(n.args.workspace);
  for (uint64_t i = 0; i < count; i++) {
    float want;
    if (ar_expected(k->op, c->world, c->rank, count, i, scale, &want) &&
        memcmp(&data[first + i], &want, sizeof want) != 0)
      die("%s (%s), span of %llu at %llu: element %llu is %a, the rank-order reference %a",
           k->op, k->impl, (unsigned long long)count, (unsigned long long)first,
           (unsigned long long)i, (double)data[first + i], (double)want);
  }
  for (uint64_t i = 0; i < total; i++)
    if ((i < first || i >= first + count) && memcmp(&data[i], &guard, sizeof guard) != 0)
      die("%s (%s), span of %llu at %llu: element %llu outside it changed", k->op, k->impl,
           (unsigned long long)count, (unsigned long long)first, (unsigned long long)i);
}

static const char *const ops[] = {"allreduce.sum", "allreduce.reduce_scatter",
                                  "allreduce.all_gather"};

/* Spans of every size at the start, at an odd offset, and ending at the
 * shared part's end, in `data` of `total` floats (`shared` of them first). */
static void check_all(bp_registry *r, const char *impl, const bp_abi_comm *c, float *data,
                      uint64_t total, uint64_t shared) {
  static const uint64_t sizes[] = {1, 2, 3, 7, 255, 1025, 65537, (1u << 20) + 3};
  for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
    const bp_abi_kernel *k = ar_kernel(r, ops[o], impl);
    if (!k) die("no %s kernel '%s'", ops[o], impl);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      const uint64_t n = sizes[s];
      check_span(k, c, data, total, 0, n);
      check_span(k, c, data, total, 5, n);
      check_span(k, c, data, total, shared - n, n);
    }
  }
}

static int worker(void) {
  bp_abi_comm mpi;
  bp_registry *r = NULL;
  if (bp_mpi_comm(&mpi) != BP_OK || bp_registry_create(&r) != BP_OK ||
      bp_registry_load(r, BP_OPS_ALLREDUCE_PATH) != BP_OK ||
      bp_registry_load(r, BP_OPS_ALLREDUCE_MPI_PATH) != BP_OK) {
    fprintf(stderr, "worker: %s\n", bp_last_error());
    return 1;
  }
  world_rank = mpi.rank;
  size_t shared_bytes = SHARED_BYTES; /* then 16 private pages */
  const uint64_t shared = shared_bytes / sizeof(float), total = shared + 16 * 1024;
  const char *use_shm = getenv("BP_TEST_SHARED");
  if (!use_shm || strcmp(use_shm, "0") != 0) {
    bp_mpi_shared *owner = NULL;
    if (bp_mpi_shared_create(&shared_bytes, &owner) != BP_OK) die("%s", bp_last_error());
    const bp_arena_allocator a = bp_mpi_shared_allocator(owner);
    float *arena = a.alloc(a.user, total * sizeof(float), 256);
    bp_abi_comm threads;
    if (!arena || bp_mpi_shared_comm(owner, arena, &threads) != BP_OK)
      die("no shared arena of %zu bytes", shared_bytes);
    if (strcmp(threads.backend, "threads") != 0 || threads.rank != mpi.rank ||
        threads.world != mpi.world)
      die("the shared communicator (%s, rank %d of %d) is not this rank's", threads.backend,
          threads.rank, threads.world);
    check_all(r, "threads", &threads, arena, total, shared);
    a.free(a.user, arena, total * sizeof(float));
    bp_mpi_shared_destroy(owner);
  }
  float *own = malloc(total * sizeof(float));
  if (!own) return 1;
  check_all(r, "mpi", &mpi, own, total, shared);
  free(own);
  bp_registry_destroy(r);
  if (mpi.rank == 0) printf("%d processes: every rank has the reference bits\n", mpi.world);
  return 0;
}

START_TEST(processes_match_rank_order_sum) {
  char exe[4096], np[16];
  snprintf(exe, sizeof exe, "%s/tests/test_allreduce_mpi", getenv("BP_BINARY_DIR"));
  snprintf(np, sizeof np, "%d", 2 + _i);
  run_result m = run_argv((const char *const[]){"mpirun", "--timeout", "300", "--oversubscribe",
                                                "-np", np, exe, NULL});
  if (m.status != 0) /* the first lines say why; Check's messages are short */
    fprintf(stderr, "mpirun -np %s:\n%.4000s\n%.4000s\n", np, m.out, m.err);
  ck_assert_msg(m.status == 0, "mpirun -np %s: status %d (its output above)", np, m.status);
  ck_assert_msg(strstr(m.out, "every rank has the reference bits") != NULL, "%s", m.out);
  run_free(&m);
}
END_TEST
#endif

int main(void) {
#ifndef BP_OPS_ALLREDUCE_MPI_PATH
  printf("SKIP: blueprint was built without MPI (BP_WITH_MPI=OFF)\n");
  return 77;
#else
  if (bp_mpi_launched_world() > 1) return worker();
  if (!mpirun_ready()) return 77;
  /* 4 processes' shared parts, with room to spare for Open MPI's own segments */
  if (!shm_usable(64u << 20)) {
    printf("note: /dev/shm cannot hold the shared arenas here: the mpi kernels only\n");
    setenv("BP_TEST_SHARED", "0", 1);
  }
  /* Open MPI's own allocations outlive MPI_Finalize: no leak check in the
   * workers (the in-process all-reduce test has it) */
  const char *asan = getenv("ASAN_OPTIONS");
  char options[1024];
  snprintf(options, sizeof options, "%s%sdetect_leaks=0", asan ? asan : "",
           asan && *asan ? ":" : "");
  setenv("ASAN_OPTIONS", options, 1);
  Suite *s = suite_create("allreduce_mpi");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 900);
  tcase_add_loop_test(tc, processes_match_rank_order_sum, 0, 3); /* 2, 3, 4 processes */
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
#endif
}
