/* Which communicator a run gets (comm.h: bp_comm_choose), from made-up
 * layouts: ranks on CUDA GPUs use NCCL when every rank has its own GPU (in
 * one process, or one process per GPU under mpirun), the threads
 * communicator (device-memory collectives) when every rank of one process
 * shares one GPU; other layouts are refused with a reason that says why and
 * what to run instead; other devices keep threads (one process) or MPI
 * (processes). */
#include <check.h>
#include <string.h>

#include "blueprint/comm.h"
#include "blueprint/status.h"

/* local ranks on GPUs `devices` of a machine with `gpus`, in one process */
static bp_comm_layout one_process(int gpus, int local, const int *devices) {
  bp_comm_layout l = {.device = "cuda", .cuda = 1, .device_count = gpus, .local = local,
                      .world = local, .local_processes = 1};
  for (int k = 0; k < local; k++) l.devices[k] = devices[k];
  return l;
}

START_TEST(one_rank_has_no_communicator) {
  bp_comm_layout l = one_process(1, 1, (const int[]){0});
  bp_comm_kind kind = BP_COMM_KIND_NCCL;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK);
  ck_assert_int_eq(kind, BP_COMM_KIND_NONE);
}
END_TEST

START_TEST(ranks_on_distinct_gpus_use_nccl) {
  bp_comm_layout l = one_process(4, 3, (const int[]){0, 1, 3});
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK);
  ck_assert_int_eq(kind, BP_COMM_KIND_NCCL);
}
END_TEST

START_TEST(ranks_all_on_one_gpu_use_the_threads_communicator) {
  bp_comm_layout l = one_process(1, 3, (const int[]){0, 0, 0});
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK);
  ck_assert_int_eq(kind, BP_COMM_KIND_THREADS);
  l = one_process(4, 2, (const int[]){2, 2}); /* --devices 2,2 */
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK);
  ck_assert_int_eq(kind, BP_COMM_KIND_THREADS);
}
END_TEST

START_TEST(ranks_partly_sharing_gpus_are_refused_with_the_reason) {
  bp_comm_layout l = one_process(2, 3, (const int[]){0, 1, 0}); /* the third rank wraps around */
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_ERR_UNSUPPORTED);
  ck_assert_str_eq(bp_last_error(),
                   "ranks 0 and 2 both run on 'cuda' device 0 while other ranks run on other "
                   "GPUs: NCCL needs one GPU per rank, and the device-memory collectives need "
                   "every rank on one GPU: run at most 2 ranks (this machine's GPUs), or give "
                   "--devices with distinct GPUs or one GPU for all");
}
END_TEST

START_TEST(processes_use_nccl_up_to_one_per_gpu) {
  bp_comm_layout l = {.device = "cuda", .cuda = 1, .device_count = 2, .local = 1, .world = 4,
                      .local_processes = 2, .devices = {1}};
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK);
  ck_assert_int_eq(kind, BP_COMM_KIND_NCCL);
  l.local_processes = 3;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_ERR_UNSUPPORTED);
  ck_assert_str_eq(bp_last_error(),
                   "3 processes of this run share this machine's 2 'cuda' device(s): NCCL needs "
                   "one GPU per rank, and the device-memory collectives serve ranks of one "
                   "process only: start at most 2 processes per machine, or run --ranks without "
                   "mpirun");
}
END_TEST

START_TEST(other_devices_keep_threads_or_mpi) {
  bp_comm_layout l = {.device = "cpu", .device_count = 1, .local = 4, .world = 4,
                      .local_processes = 1};
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK); /* every rank on device 0: fine */
  ck_assert_int_eq(kind, BP_COMM_KIND_THREADS);
  l = (bp_comm_layout){.device = "cpu", .device_count = 1, .local = 1, .world = 3,
                       .local_processes = 3};
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_OK);
  ck_assert_int_eq(kind, BP_COMM_KIND_MPI);
}
END_TEST

START_TEST(bad_layouts_are_invalid) {
  bp_comm_kind kind;
  bp_comm_layout l = {.local = 0, .world = 1};
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_ERR_INVALID);
  l = (bp_comm_layout){.local = 3, .world = 2};
  ck_assert_int_eq(bp_comm_choose(&l, &kind), BP_ERR_INVALID);
  ck_assert_int_eq(bp_comm_choose(NULL, &kind), BP_ERR_INVALID);
}
END_TEST

/* Without NCCL on the library path, opening fails with the reason; where
 * NCCL loads (and no GPU exists) ncclCommInitAll fails with NCCL's. */
START_TEST(nccl_open_fails_with_a_reason_without_a_gpu) {
  bp_nccl *n = NULL;
  const bp_status st = bp_nccl_open_all(1, (const int[]){0}, &n);
  if (st == BP_OK) { /* a GPU and NCCL are here: a world of one works */
    bp_abi_comm c = bp_nccl_abi(n, 0, 0, 1);
    ck_assert_str_eq(c.backend, "nccl");
    ck_assert_ptr_nonnull(c.handle);
    bp_nccl_close(n);
    return;
  }
  ck_assert_ptr_null(n);
  ck_assert_msg(strstr(bp_last_error(), "NCCL") || strstr(bp_last_error(), "nccl"), "%s",
                bp_last_error());
  ck_assert_int_eq(bp_nccl_open_all(0, (const int[]){0}, &n), BP_ERR_INVALID);
}
END_TEST

int main(void) {
  Suite *s = suite_create("comm_choose");
  TCase *tc = tcase_create("comm_choose");
  tcase_add_test(tc, one_rank_has_no_communicator);
  tcase_add_test(tc, ranks_on_distinct_gpus_use_nccl);
  tcase_add_test(tc, ranks_all_on_one_gpu_use_the_threads_communicator);
  tcase_add_test(tc, ranks_partly_sharing_gpus_are_refused_with_the_reason);
  tcase_add_test(tc, processes_use_nccl_up_to_one_per_gpu);
  tcase_add_test(tc, other_devices_keep_threads_or_mpi);
  tcase_add_test(tc, bad_layouts_are_invalid);
  tcase_add_test(tc, nccl_open_fails_with_a_reason_without_a_gpu);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
