/* Checks in this process with guard pages (autotune): a kernel that reads
 * past a slot touches the guard page after it; the SIGSEGV / SIGBUS
 * handler installed for the duration of the check jumps back to the
 * checker instead of ending the process. Any other fault, or a fault on
 * another thread, goes to the handler that was installed before. One
 * check at a time in the process (the caller serializes: autotune holds
 * its lock); the kernel gets one thread, so its reads happen on the
 * checking thread. The check's own memory is released after a fault;
 * what the interrupted kernel had allocated itself is lost. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "validate-impl.h"

static _Thread_local sigjmp_buf *jump_to;
static _Thread_local const char *fault_owner;
static struct sigaction previous_segv, previous_bus;

static void on_fault(int sig, siginfo_t *info, void *context) {
  (void)context;
  const char *owner = jump_to ? vbuf_guard_owner(info->si_addr) : NULL;
  if (owner) {
    fault_owner = owner;
    siglongjmp(*jump_to, 1);
  }
  /* not ours: the earlier handler takes it when the access repeats */
  sigaction(sig, sig == SIGSEGV ? &previous_segv : &previous_bus, NULL);
}

void vc_check_guarded(const bp_abi_kernel *k, const bp_abi_kernel *ref, const vc_case *c,
                      const vc_check_options *o, vc_outcome *out) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &previous_segv);
  sigaction(SIGBUS, &sa, &previous_bus);
  sigjmp_buf here;
  vc_check_options guarded = *o;
  guarded.guard = 1;
  if (sigsetjmp(here, 1) == 0) {
    jump_to = &here;
    vc_check(k, ref, c, &guarded, out);
  } else {
    out->verdict = BP_VALIDATE_FAIL;
    out->error = out->tolerance = NAN;
    snprintf(out->detail, sizeof out->detail,
             "read past slot_bytes of %s (it touched the guard page right after the slot)",
             fault_owner ? fault_owner : "a tensor");
    vbuf_guard_clear();
    vc_mem_release_all(); /* what the interrupted check had allocated */
  }
  jump_to = NULL;
  sigaction(SIGSEGV, &previous_segv, NULL);
  sigaction(SIGBUS, &previous_bus, NULL);
}
