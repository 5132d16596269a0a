/* Kernel validation: every loaded kernel run against the reference kernel
 * of its op (flag REFERENCE, same device) on the same seeded random inputs,
 * case by case, with the op conventions of abi/bp_abi_ops.h checked. What
 * `blueprint validate` prints and what autotune checks before it times
 * (docs/validate.md has the checks, the error measure and the tolerances).
 *
 * Cases come from a built-in table (odd sizes, batch 1, padded channels,
 * stride / pad / dilation / groups variants, every dtype the ops take), or
 * from the nodes of a model's plan (options.model_path). For every
 * (kernel, case) the kernel's supports() decides: no is a skip with its
 * reason; yes must be followed by a run that
 *   1. returns BP_ABI_OK (a supports() yes followed by a failing run fails);
 *   2. matches the reference: max|out - ref| / max(1, max|ref|) over the
 *      logical elements of every output, within the dtype's tolerance
 *      (FP16 outputs: one rounding, rtol 2^-11, plus the op's atol; the
 *      oracle of an FP16 case is the reference run in FP32);
 *   3. writes every logical output element (outputs are poisoned first);
 *   4. leaves output channel padding and the bytes after the last element
 *      untouched (rules 2 and 3), and ignores input channel padding (it
 *      holds NaN);
 *   5. adds into prior contents with accumulate = 1 (rule 4);
 *   6. works in place when flagged IN_PLACE (rule 5);
 *   7. gives the same bits twice when flagged DETERMINISTIC;
 *   8. reads nothing past slot_bytes: with options.isolate each tensor's
 *      slot ends at an inaccessible page and each case runs in a child
 *      process, so such a read is reported, not a crash;
 *  10. follows new inputs on the same buffers and state: the first run goes
 *      on with new data and the same params_generation, then every input
 *      new and the generation bumped, each matching a fresh run;
 *  11. gives the same result at other thread counts: 1 and more than the
 *      cores on every case, the rest of 1, 2, 3, 4 and twice the cores on
 *      one case in four.
 * With options.gradcheck, reference backwards and every cpu kernel of a
 * module layer's backward op (saved tensors included) are compared with
 * central differences of their own forward op.
 * Reference kernels are the oracle: their rows run every check but the
 * comparison (accumulate is checked as out(1) = prior + out(0)).
 * Collective kernels (allreduce.*) are skipped: they need every rank.
 *
 * Devices: cpu kernels run on host buffers (the checks above). Kernels of
 * a device kind whose device plugin is loaded (cuda) run through that
 * plugin on its device 0: every tensor in its memory (the host images,
 * poison and padding included, copied in; every slot copied back and
 * checked as above), the kernel on a compute stream (args->stream its
 * native handle) or in host tasks (BP_ABI_DEVICE_HOST_TASK_KERNELS), in
 * this process; the reference runs on the host. Check 8 does not apply
 * there (no guard pages on a device). options.device may name a device
 * plugin that runs another kind's kernels (kernel_kind: the test device
 * "guarded" runs the cpu ones): those kernels then run through it. */
#ifndef BLUEPRINT_VALIDATE_H
#define BLUEPRINT_VALIDATE_H

#include <stdint.h>

#include "blueprint/registry.h"
#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bp_validate_verdict {
  BP_VALIDATE_PASS = 0,
  BP_VALIDATE_FAIL,
  BP_VALIDATE_SKIP,
} bp_validate_verdict;

/* "pass", "FAIL", "skip". */
const char *bp_validate_verdict_name(bp_validate_verdict verdict);

typedef struct bp_validate_options {
  const char *op_glob;    /* fnmatch glob on op names; NULL: every op */
  const char *impl;       /* implementation name; NULL: every one */
  /* device kind: its kernels only, run through its device plugin when one
   * that is not host memory is loaded (bp_validate_device); NULL: every
   * kind, each through the plugin of its kind (cpu: host buffers) */
  const char *device;
  const char *model_path; /* NULL: the built-in table; else every node of this model's plan */
  uint64_t seed;          /* inputs are a function of (seed, case) */
  int gradcheck;          /* also check reference backwards and module layers' backward
                             kernels against finite differences of their forward */
  /* 1: guard pages after every slot and every (kernel, case) in a forked
   * child, so a crash or a read past slot_bytes is a failed case. 0: in
   * this process, plain buffers (a wild kernel crashes the caller). */
  int isolate;
  /* dtype name ("fp16", "fp32", "int8", "int32"): only cases with a tensor
   * of it (fp16: the AMP twins and the FP16 range cases); NULL: every case */
  const char *dtype;
  /* appended; 0 keeps the behaviour before them (the library reads no
   * environment: the CLI maps BP_THREADS, BP_FUSE and BP_TF32 here) */
  int threads; /* threads lent to kernels run in this process; 0: the cores */
  int no_fuse; /* 1: a model's plan unfused only (0: also the fused one) */
  int no_tf32; /* 1: cuDNN and cuBLAS FP32 outputs held to the FP32 tolerance, for
                  modules told not to use TF32 (0: VC_TF32 tolerance, 5e-3) */
  /* with model_path: the global training batch the plan is compiled for
   * (its "train" variants, and "train_last" for the epoch's last partial
   * batch when the model's train_size is not a multiple); 0: the model's */
  int64_t batch;
  double case_timeout_s; /* isolate: seconds one (kernel, case) child may run (all its runs)
                            before the parent kills it with SIGKILL, whatever the child
                            does with its signals; a failed row "timed out after S s";
                            0: BP_VALIDATE_CASE_TIMEOUT_S, with model_path
                            BP_VALIDATE_MODEL_CASE_TIMEOUT_S (model-sized nodes) */
} bp_validate_options;

#define BP_VALIDATE_CASE_TIMEOUT_S 10.0
#define BP_VALIDATE_MODEL_CASE_TIMEOUT_S 300.0

/* One row: a kernel on a case (or a gradient check, impl "gradcheck"). */
typedef struct bp_validate_result {
  const char *op, *impl, *device; /* borrowed from the registry */
  char case_name[96];
  int reference;                  /* 1: the kernel is the oracle (flag REFERENCE) */
  bp_validate_verdict verdict;
  double error;     /* the largest normalized error measured; NaN: none */
  double tolerance; /* what it is compared with; NaN: none */
  char detail[320]; /* why it failed or was skipped; "" when it passed */
  /* Where the case ran: "host" (host buffers, the cpu path) or the kind of
   * the device plugin it went through; static or borrowed from it. */
  const char *run_device;
  int device_index; /* the plugin's device, -1 on the host */
  int guard_pages;  /* 1: check 8 ran (slots end at guard pages) */
} bp_validate_result;

typedef struct bp_validate_report bp_validate_report; /* opaque */

/* How `--device kind` runs: the kernels of kind *kernel_kind_out (the
 * plugin's kernel_kind, else kind), through *device_out, or on host
 * buffers when *device_out is NULL (cpu, or a plugin whose memory is host
 * memory). BP_ERR_INVALID: an unknown kind (no device plugin, no kernel of
 * it); BP_ERR_DEVICE: no device to run on (the plugin reports 0 devices,
 * or no plugin is loaded for a kind that is not cpu). The message is one
 * line naming the kind and the plugin's reason. */
bp_status bp_validate_device(const bp_registry *registry, const char *kind,
                             const char **kernel_kind_out, const bp_abi_device **device_out);

/* Validates every kernel of `registry` that the options select. A failing
 * case is not an error: it is a row with verdict FAIL. Errors are bad
 * options, a model that does not compile, and out of memory.
 * *report_out is written only on success. One call at a time per process
 * (the guard-page bookkeeping is process-wide). */
bp_status bp_validate_run(bp_registry *registry, const bp_validate_options *options,
                          bp_validate_report **report_out);
void bp_validate_report_destroy(bp_validate_report *report); /* NULL is a no-op */

int bp_validate_result_count(const bp_validate_report *report);
const bp_validate_result *bp_validate_result_get(const bp_validate_report *report, int index);

typedef struct bp_validate_summary {
  int kernels;  /* distinct (op, impl, device) with at least one row */
  int cases;    /* rows */
  int passed, failed, skipped;
} bp_validate_summary;
bp_validate_summary bp_validate_summarize(const bp_validate_report *report);

#ifdef __cplusplus
}
#endif
#endif
