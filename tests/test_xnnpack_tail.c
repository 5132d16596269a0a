/* The 16-byte tail of every slot (bp_abi_ops.h rule 3), proven
 * load-bearing with XNNPACK: its kernels read vectors, and the last vector
 * of a tensor may reach up to XNN_EXTRA_BYTES (16) past its last element.
 *
 *  - with the plan's tail: every input slot, tail included, ends right
 *    where a PROT_NONE page begins, and every kernel of bp_ops_xnnpack.so
 *    runs clean on shapes whose data ends at the tail;
 *  - with the tail cut off (a test-only descriptor whose slot ends exactly
 *    at the last element, the guard right after it) the same runs fault.
 *
 * Each run happens in a forked child, so a fault is an outcome, not a
 * crash of the test. The module is loaded by its build path and called
 * through the ABI alone (prepare, run, release), one thread. */
#include <check.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"

#define TAIL 16
#define MAX_KERNELS 16

/* ---- the module through a minimal host ------------------------------------------ */

static bp_abi_kernel kernels[MAX_KERNELS];
static int kernel_count;

static void host_log(void *ctx, int level, const char *message) { (void)ctx, (void)level, (void)message; }
static void host_error(void *ctx, const char *message) {
  (void)ctx;
  fprintf(stderr, "module error: %s\n", message);
}
static int host_register_op(void *ctx, const bp_abi_op *op) { return (void)ctx, (void)op, 0; }
static int host_register_kernel(void *ctx, const bp_abi_kernel *k) {
  (void)ctx;
  if (kernel_count == MAX_KERNELS) return BP_ABI_ERR_NOMEM;
  kernels[kernel_count++] = *k;
  return BP_ABI_OK;
}

static void load_module(void) {
  void *so = dlopen(BP_OPS_XNNPACK_PATH, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(so != NULL, "%s", dlerror());
  bp_abi_module_entry_fn entry = (bp_abi_module_entry_fn)dlsym(so, BP_ABI_ENTRY_SYMBOL);
  ck_assert_ptr_nonnull(entry);
  const bp_abi_host host = {.struct_size = sizeof host,
                            .abi_major = BP_ABI_MAJOR,
                            .abi_minor = BP_ABI_MINOR,
                            .log = host_log,
                            .error = host_error,
                            .register_op = host_register_op,
                            .register_kernel = host_register_kernel};
  kernel_count = 0;
  /* as the host does (bp_abi_module): init_ctx when the module has it; the
   * context lives as long as this test process */
  const bp_abi_module *m = entry();
  void *ctx = NULL;
  ck_assert_int_eq(m->init_ctx ? m->init_ctx(&host, &ctx) : m->init(&host), BP_ABI_OK);
}

static const bp_abi_kernel *kernel(const char *op) {
  for (int i = 0; i < kernel_count; i++)
    if (strcmp(kernels[i].op, op) == 0) return &kernels[i];
  ck_abort_msg("no kernel for %s", op);
  return NULL;
}

/* ---- slots at a guard page -------------------------------------------------------- */

/* Dense NHWC descriptor (padded_c = C) whose slot is its data plus `tail`. */
static bp_abi_tensor desc(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c, size_t tail) {
  bp_abi_tensor t = {.struct_size = sizeof t, .dtype = dtype, .shape = {n, h, w, c}, .padded_c = c};
  t.stride[3] = 1, t.stride[2] = c, t.stride[1] = w * c, t.stride[0] = h * w * c;
  const size_t esize = dtype == BP_ABI_DTYPE_INT8 ? 1 : dtype == BP_ABI_DTYPE_FP16 ? 2 : 4;
  t.slot_bytes = (uint64_t)(n * h * w * c) * esize + tail;
  return t;
}

/* A slot of t.slot_bytes whose end is the first byte of a PROT_NONE page,
 * filled with small values. */
static void *slot_at_guard(const bp_abi_tensor *t) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t pages = (t->slot_bytes + page - 1) / page + 1;
  char *base = mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(base, MAP_FAILED);
  char *guard = base + (pages - 1) * page;
  ck_assert_int_eq(mprotect(guard, page, PROT_NONE), 0);
  char *p = guard - t->slot_bytes;
  if (t->dtype == BP_ABI_DTYPE_FP32)
    for (uint64_t i = 0; i < t->slot_bytes / 4; i++) ((float *)(void *)p)[i] = (float)(i % 7) - 3;
  else
    memset(p, 0, t->slot_bytes);
  return p;
}

/* ---- one kernel on one case --------------------------------------------------------- */

typedef struct tail_case {
  const char *op;
  int nin, nout;
  bp_abi_tensor in[3], out[2];
  const void *attrs;
  uint32_t attr_size;
} tail_case;

/* Runs the case in this process: prepare, run, release; exits 0 when all
 * returned OK. Called in the child. */
static void run_case(const tail_case *c) {
  const bp_abi_kernel *k = kernel(c->op);
  const void *ins[3];
  void *outs[2];
  for (int i = 0; i < c->nin; i++) ins[i] = slot_at_guard(&c->in[i]);
  for (int o = 0; o < c->nout; o++) outs[o] = slot_at_guard(&c->out[o]);
  uint64_t generation = 1;
  char reason[256] = "";
  bp_abi_kernel_args a = {.struct_size = sizeof a,
                          .num_inputs = c->nin,
                          .num_outputs = c->nout,
                          .inputs = c->in,
                          .outputs = c->out,
                          .attrs = c->attrs,
                          .attr_size = c->attr_size,
                          .attr_version = BP_ABI_ATTR_VERSION,
                          .world_size = 1,
                          .params_generation = &generation,
                          .reason = reason,
                          .reason_size = sizeof reason};
  if (k->supports && !k->supports(k->user, &a, reason, sizeof reason)) {
    fprintf(stderr, "%s: refused: %s\n", c->op, reason);
    _exit(3);
  }
  a.input_ptrs = ins, a.output_ptrs = outs;
  const uint64_t ws = k->workspace_size ? k->workspace_size(k->user, &a) : 0;
  a.workspace = ws ? malloc(ws) : NULL, a.workspace_bytes = ws;
  void *state = NULL;
  if (k->prepare && k->prepare(k->user, &a, &state) != BP_ABI_OK) _exit(4);
  a.state = state;
  const int rc = k->run(k->user, &a);
  if (rc != BP_ABI_OK) {
    fprintf(stderr, "%s: run failed: %s\n", c->op, reason);
    _exit(5);
  }
  if (state && k->release) k->release(k->user, state);
  _exit(0);
}

#define FAULT_EXIT 42 /* the child's own SIGSEGV / SIGBUS handler */

static void on_fault(int sig) {
  (void)sig;
  _exit(FAULT_EXIT);
}

/* 0: ran clean; else the signal that ended the child (negative) or its
 * exit status. The child handles SIGSEGV and SIGBUS itself (exit
 * FAULT_EXIT), ahead of a sanitizer's handler. */
static int outcome_of(const tail_case *c) {
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    alarm(60);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    run_case(c);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return WEXITSTATUS(status);
}

/* The cases: every kernel of the module on FP32 shapes whose bytes are not
 * a multiple of 16 (so a vector load of the last elements crosses the
 * data's end), inputs with `tail` bytes after their data. */
static const bp_conv2d_attrs conv_a = {.kernel_h = 3, .kernel_w = 3, .stride_h = 1,
                                       .stride_w = 1, .pad_h = 1, .pad_w = 1, .dilation_h = 1,
                                       .dilation_w = 1, .groups = 1, .has_bias = 1};
static const bp_conv2d_attrs conv1x1_a = {.kernel_h = 1, .kernel_w = 1, .stride_h = 1,
                                          .stride_w = 1, .dilation_h = 1, .dilation_w = 1,
                                          .groups = 1, .has_bias = 0};
static const bp_fc_attrs fc_a = {.has_bias = 1};
static const bp_pool_attrs pool_a = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
static const bp_elementwise_attrs ew_a = {0};

#define F32 BP_ABI_DTYPE_FP32
static int make_cases(tail_case *c, size_t tail) {
  int n = 0;
  c[n++] = (tail_case){"conv2d.fwd", 3, 1,
                       {desc(F32, 1, 5, 5, 3, tail), desc(F32, 4, 3, 3, 3, tail),
                        desc(F32, 1, 1, 1, 4, tail)},
                       {desc(F32, 1, 5, 5, 4, TAIL)}, &conv_a, sizeof conv_a};
  c[n++] = (tail_case){"conv2d.fwd", 2, 1, {desc(F32, 1, 3, 3, 5, tail), desc(F32, 3, 1, 1, 5, tail)},
                       {desc(F32, 1, 3, 3, 3, TAIL)}, &conv1x1_a, sizeof conv1x1_a};
  c[n++] = (tail_case){"fc.fwd", 3, 1,
                       {desc(F32, 1, 1, 1, 7, tail), desc(F32, 5, 1, 1, 7, tail),
                        desc(F32, 1, 1, 1, 5, tail)},
                       {desc(F32, 1, 1, 1, 5, TAIL)}, &fc_a, sizeof fc_a};
  c[n++] = (tail_case){"maxpool.fwd", 1, 2, {desc(F32, 1, 4, 4, 3, tail)},
                       {desc(F32, 1, 2, 2, 3, TAIL), desc(BP_ABI_DTYPE_INT8, 1, 2, 2, 3, TAIL)},
                       &pool_a, sizeof pool_a};
  c[n++] = (tail_case){"avgpool.fwd", 1, 1, {desc(F32, 1, 4, 4, 3, tail)},
                       {desc(F32, 1, 2, 2, 3, TAIL)}, &pool_a, sizeof pool_a};
  c[n++] = (tail_case){"global_avgpool.fwd", 1, 1, {desc(F32, 1, 3, 3, 5, tail)},
                       {desc(F32, 1, 1, 1, 5, TAIL)}, &ew_a, sizeof ew_a};
  c[n++] = (tail_case){"relu.fwd", 1, 1, {desc(F32, 1, 1, 1, 13, tail)},
                       {desc(F32, 1, 1, 1, 13, TAIL)}, &ew_a, sizeof ew_a};
  c[n++] = (tail_case){"add.fwd", 2, 1, {desc(F32, 1, 1, 1, 13, tail), desc(F32, 1, 1, 1, 13, tail)},
                       {desc(F32, 1, 1, 1, 13, TAIL)}, &ew_a, sizeof ew_a};
  return n;
}

START_TEST(every_xnnpack_kernel_runs_clean_with_slots_ending_at_a_guard_page) {
  load_module();
  tail_case cases[16];
  const int n = make_cases(cases, TAIL);
  for (int i = 0; i < n; i++) {
    const int o = outcome_of(&cases[i]);
    printf("with the tail:    %-20s %s\n", cases[i].op, o == 0 ? "clean" : "FAILED");
    ck_assert_msg(o == 0, "%s (case %d) with 16-byte tails: outcome %d", cases[i].op, i, o);
  }
}
END_TEST

/* Cut the tail and XNNPACK's vector loads run into the guard page: the
 * tail is what makes them safe. Which kernels over-read depends on the
 * microkernels XNNPACK picks for the CPU, so this prints every kernel's
 * outcome and asserts the ones whose x86 microkernels in this XNNPACK are
 * SSE only and finish a row of channels with a whole 4-float load: argmax
 * pooling (maxpool.fwd), average pooling and global average pooling on 3
 * and 5 channels. (On AVX2, clamp and add end with masked loads and the
 * GEMMs broadcast single input floats: those stay inside the data.) */
START_TEST(without_the_tail_xnnpack_reads_past_the_slot_and_faults) {
  load_module();
  tail_case cases[16];
  const int n = make_cases(cases, 0);
  int faults = 0;
  for (int i = 0; i < n; i++) {
    const int o = outcome_of(&cases[i]);
    const int fault = o == FAULT_EXIT || o == -SIGSEGV || o == -SIGBUS;
    faults += fault;
    printf("without the tail: %-20s %s\n", cases[i].op,
           fault ? "read past the data: fault" : o == 0 ? "clean" : "other failure");
    ck_assert_msg(fault || o == 0, "%s (case %d): outcome %d", cases[i].op, i, o);
    if (strstr(cases[i].op, "pool"))
      ck_assert_msg(fault, "%s read no further than its data without a tail", cases[i].op);
  }
  ck_assert_int_ge(faults, 3);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("xnnpack_tail");
  TCase *c = tcase_create("core");
  tcase_set_timeout(c, 120);
  tcase_add_test(c, every_xnnpack_kernel_runs_clean_with_slots_ending_at_a_guard_page);
  tcase_add_test(c, without_the_tail_xnnpack_reads_past_the_slot_and_faults);
  suite_add_tcase(s, c);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
