/* A relu.fwd that misbehaves one way per build (TM_CASE), for the tests of
 * kernels that crash, end the process or hang (test_run_guards): device
 * "cpu", FP32, priority BP_ABI_PRIORITY_USER, so `train --plugin` picks it.
 *   1 segv   writes through a NULL pointer
 *   2 abort  calls abort()
 *   3 exit0  calls exit(0) in the middle of the step
 *   4 hang   blocks SIGALRM and SIGTERM and sleeps forever */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bp_abi_ops.h"
#include "test_module.h"

#ifndef TM_CASE
#define TM_CASE 1
#endif

static int supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  if (a->num_inputs != 1 || a->num_outputs != 1) {
    snprintf(reason, size, "wants 1 input and 1 output");
    return 0;
  }
  return 1;
}

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
#if TM_CASE == 1
  volatile int *volatile nowhere = NULL;
  *nowhere = 1;
#elif TM_CASE == 2
  abort();
#elif TM_CASE == 3
  exit(0);
#else
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGALRM);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, NULL);
  for (;;) pause();
#endif
  return BP_ABI_OK;
}

static const bp_abi_kernel kernel = {.struct_size = sizeof(bp_abi_kernel),
                                     .op = "relu.fwd",
                                     .impl = "hostile",
                                     .device = "cpu",
                                     .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
                                     .priority = BP_ABI_PRIORITY_USER,
                                     .flags = BP_ABI_KERNEL_DETERMINISTIC,
                                     .supports = supports,
                                     .run = run};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

TM_MODULE("test-hostile", init)
