/* Which communicator a run gets (comm.h: bp_comm_choose), from made-up
 * layouts and made-up transports: the choice reads only the transports'
 * capability flags (bp_abi_device.h, ABI 1.6), never a device's name.
 * Transports named like the cuda device's: "nccl" (spans processes and
 * devices, one device per rank) and "threads" (ranks sharing one device).
 * The first transport that serves the layout wins; without one, a device
 * the host reaches keeps the host's threads (one process) or MPI
 * (processes); any other layout is refused with one line that says why
 * and what to run instead. Where the cuda plugin is built, its "nccl"
 * transport fails to open with NCCL's or CUDA's reason on a machine
 * without a GPU. */
#include <check.h>
#include <string.h>

#include "bp_abi_device.h"
#include "blueprint/comm.h"
#include "blueprint/registry.h"
#include "blueprint/status.h"

#define NCCL_LIKE (BP_ABI_COMM_SPANS_PROCESSES | BP_ABI_COMM_SPANS_DEVICES)

/* A GPU-like device (not reachable from the host) offering both transports. */
static void gpu_transports(bp_comm_layout *l) {
  l->transports = 2;
  l->transport_names[0] = "nccl";
  l->transport_flags[0] = NCCL_LIKE;
  l->transport_names[1] = "threads";
  l->transport_flags[1] = BP_ABI_COMM_SHARES_DEVICE;
}

/* local ranks on devices `devices` of a machine with `gpus`, in one process */
static bp_comm_layout one_process(int gpus, int local, const int *devices) {
  bp_comm_layout l = {.device = "gpu", .device_count = gpus, .local = local, .world = local,
                      .local_processes = 1};
  for (int k = 0; k < local; k++) l.devices[k] = devices[k];
  gpu_transports(&l);
  return l;
}

static void expect(const bp_comm_layout *l, bp_comm_kind kind, int transport) {
  bp_comm_kind got = BP_COMM_KIND_NONE;
  int index = -2;
  ck_assert_msg(bp_comm_choose(l, &got, &index) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(got, kind);
  ck_assert_int_eq(index, transport);
}

START_TEST(one_rank_has_no_communicator) {
  bp_comm_layout l = one_process(1, 1, (const int[]){0});
  expect(&l, BP_COMM_KIND_NONE, -1);
}
END_TEST

START_TEST(ranks_on_distinct_devices_take_the_transport_that_spans_devices) {
  bp_comm_layout l = one_process(4, 3, (const int[]){0, 1, 3});
  expect(&l, BP_COMM_KIND_DEVICE, 0);
}
END_TEST

START_TEST(ranks_all_on_one_device_take_the_transport_that_shares_it) {
  bp_comm_layout l = one_process(1, 3, (const int[]){0, 0, 0});
  expect(&l, BP_COMM_KIND_DEVICE, 1);
  l = one_process(4, 2, (const int[]){2, 2}); /* --devices 2,2 */
  expect(&l, BP_COMM_KIND_DEVICE, 1);
}
END_TEST

START_TEST(the_first_transport_that_serves_wins) {
  bp_comm_layout l = one_process(2, 2, (const int[]){0, 1});
  l.transport_flags[1] = BP_ABI_COMM_SPANS_DEVICES | BP_ABI_COMM_SHARES_DEVICE;
  expect(&l, BP_COMM_KIND_DEVICE, 0);
  l.transport_flags[0] = BP_ABI_COMM_SHARES_DEVICE; /* now only the second serves */
  expect(&l, BP_COMM_KIND_DEVICE, 1);
  l.host_reach = 1; /* a transport wins over the host's own communicator */
  expect(&l, BP_COMM_KIND_DEVICE, 1);
}
END_TEST

START_TEST(ranks_partly_sharing_devices_are_refused_with_the_reason) {
  bp_comm_layout l = one_process(2, 3, (const int[]){0, 1, 0}); /* the third rank wraps around */
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  int index = -2;
  ck_assert_int_eq(bp_comm_choose(&l, &kind, &index), BP_ERR_UNSUPPORTED);
  ck_assert_str_eq(bp_last_error(),
                   "ranks 0 and 2 both run on 'gpu' device 0 while other ranks run on other "
                   "devices: 'nccl' needs one device per rank, 'threads' needs every rank on one "
                   "device: run at most 2 ranks (this machine's devices), or give --devices with "
                   "distinct devices or one device for all");
  ck_assert_ptr_null(strchr(bp_last_error(), '\n'));
}
END_TEST

START_TEST(processes_take_the_transport_that_spans_processes_up_to_one_per_device) {
  bp_comm_layout l = {.device = "gpu", .device_count = 2, .local = 1, .world = 4,
                      .local_processes = 2, .devices = {1}};
  gpu_transports(&l);
  expect(&l, BP_COMM_KIND_DEVICE, 0);
  l.local_processes = 3;
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  int index = -2;
  ck_assert_int_eq(bp_comm_choose(&l, &kind, &index), BP_ERR_UNSUPPORTED);
  ck_assert_str_eq(bp_last_error(),
                   "3 processes of this run share this machine's 2 'gpu' device(s): 'nccl' needs "
                   "one device per rank, 'threads' serves ranks of one process only: start at "
                   "most 2 processes per machine, or run --ranks without mpirun");
}
END_TEST

START_TEST(devices_the_host_reaches_keep_threads_or_mpi) {
  bp_comm_layout l = {.device = "cpu", .host_reach = 1, .device_count = 1, .local = 4,
                      .world = 4, .local_processes = 1};
  expect(&l, BP_COMM_KIND_THREADS, -1); /* every rank on device 0: fine */
  l = (bp_comm_layout){.device = "cpu", .host_reach = 1, .device_count = 1, .local = 1,
                       .world = 3, .local_processes = 3};
  expect(&l, BP_COMM_KIND_MPI, -1);
  /* a transport that does not serve the layout leaves the host's */
  l.transports = 1;
  l.transport_names[0] = "threads";
  l.transport_flags[0] = BP_ABI_COMM_SPANS_DEVICES | BP_ABI_COMM_SHARES_DEVICE;
  expect(&l, BP_COMM_KIND_MPI, -1);
}
END_TEST

START_TEST(a_device_without_transports_the_host_cannot_reach_is_refused) {
  bp_comm_layout l = {.device = "opaque", .device_count = 2, .local = 2, .world = 2,
                      .local_processes = 1, .devices = {0, 1}};
  bp_comm_kind kind = BP_COMM_KIND_NONE;
  int index = -2;
  ck_assert_int_eq(bp_comm_choose(&l, &kind, &index), BP_ERR_UNSUPPORTED);
  ck_assert_str_eq(bp_last_error(),
                   "2 ranks run on distinct 'opaque' devices: device 'opaque' offers no "
                   "collective transport and the host cannot reach its memory: run at most 2 "
                   "ranks (this machine's devices), or give --devices with distinct devices or "
                   "one device for all");
}
END_TEST

START_TEST(bad_layouts_are_invalid) {
  bp_comm_kind kind;
  int index;
  bp_comm_layout l = {.local = 0, .world = 1};
  ck_assert_int_eq(bp_comm_choose(&l, &kind, &index), BP_ERR_INVALID);
  l = (bp_comm_layout){.local = 3, .world = 2};
  ck_assert_int_eq(bp_comm_choose(&l, &kind, &index), BP_ERR_INVALID);
  l = (bp_comm_layout){.local = 1, .world = 1, .transports = BP_COMM_MAX_TRANSPORTS + 1};
  ck_assert_int_eq(bp_comm_choose(&l, &kind, &index), BP_ERR_INVALID);
  ck_assert_int_eq(bp_comm_choose(NULL, &kind, &index), BP_ERR_INVALID);
  ck_assert_int_eq(bp_comm_choose(&l, &kind, NULL), BP_ERR_INVALID);
}
END_TEST

#ifdef BP_DEVICE_CUDA_PATH
/* The cuda plugin's "nccl" transport: where a GPU and NCCL are here a world
 * of one opens; without them open fails with a reason (NCCL's loader or
 * CUDA's), nothing left behind. */
START_TEST(the_cuda_nccl_transport_opens_or_fails_with_a_reason) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_load(r, BP_DEVICE_CUDA_PATH) == BP_OK, "%s", bp_last_error());
  const bp_abi_device *d = bp_registry_find_device(r, "cuda");
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(d->num_transports, 2);
  const bp_abi_comm_transport *t = &d->transports[0];
  ck_assert_str_eq(t->backend, "nccl");
  ck_assert_uint_eq(t->flags, NCCL_LIKE);
  ck_assert_str_eq(d->transports[1].backend, "threads");
  char reason[512] = "";
  const int32_t devices[] = {0};
  const bp_abi_comm_open_args a = {sizeof a, 1, devices, 0, 1, NULL, reason, sizeof reason};
  void *group = NULL;
  if (t->open(t->user, &a, &group) == BP_ABI_OK) {
    bp_abi_comm c;
    ck_assert_int_eq(t->comm(group, 0, &c), BP_ABI_OK);
    ck_assert_str_eq(c.backend, "nccl");
    ck_assert_ptr_nonnull(c.handle);
    t->close(group);
  } else {
    ck_assert_ptr_null(group);
    ck_assert_msg(reason[0] != '\0', "open failed without a reason");
  }
  const bp_abi_comm_open_args bad = {sizeof bad, 0, devices, 0, 1, NULL, reason, sizeof reason};
  ck_assert_int_eq(t->open(t->user, &bad, &group), BP_ABI_ERR_INVALID);
  bp_registry_destroy(r);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("comm_choose");
  TCase *tc = tcase_create("comm_choose");
  tcase_add_test(tc, one_rank_has_no_communicator);
  tcase_add_test(tc, ranks_on_distinct_devices_take_the_transport_that_spans_devices);
  tcase_add_test(tc, ranks_all_on_one_device_take_the_transport_that_shares_it);
  tcase_add_test(tc, the_first_transport_that_serves_wins);
  tcase_add_test(tc, ranks_partly_sharing_devices_are_refused_with_the_reason);
  tcase_add_test(tc, processes_take_the_transport_that_spans_processes_up_to_one_per_device);
  tcase_add_test(tc, devices_the_host_reaches_keep_threads_or_mpi);
  tcase_add_test(tc, a_device_without_transports_the_host_cannot_reach_is_refused);
  tcase_add_test(tc, bad_layouts_are_invalid);
#ifdef BP_DEVICE_CUDA_PATH
  tcase_add_test(tc, the_cuda_nccl_transport_opens_or_fails_with_a_reason);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
