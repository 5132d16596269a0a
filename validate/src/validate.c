/* The validation driver (validate.h): picks the kernels and their cases,
 * runs each (kernel, case) in a child process when asked (so a crash or a
 * read past slot_bytes becomes a failed row), or through a device plugin
 * (validate_device.c), and collects the rows.
 *
 * Runs through a device stay in this process: a CUDA context does not
 * survive fork, and a device has no guard pages to catch. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "blueprint/dtype.h"
#include "blueprint/threads.h"
#include "validate-impl.h"

#define EXIT_GUARD 3        /* the child hit a guard page */
#define MAX_THREADS 4       /* threads lent to the kernels */

/* The thread counts every case also runs at (checks 10 and 11): 1, 2, 3,
 * 4 and twice the cores this process may use (deduplicated), so a race
 * between threads or a chunking error shows on one core too, and at more
 * threads than cores on any machine. */
static const int sweep_fixed[] = {1, 2, 3, 4};
#define SWEEP_FIXED ((int)(sizeof sweep_fixed / sizeof sweep_fixed[0]))
#define SWEEP_MAX (SWEEP_FIXED + 1)

typedef struct thread_set {
  bp_threads *pool[SWEEP_MAX];
  const bp_abi_threads *abi[SWEEP_MAX];
  int count;
} thread_set;

static void thread_set_destroy(thread_set *s) {
  for (int i = 0; i < SWEEP_MAX; i++) bp_threads_destroy(s->pool[i]);
  memset(s, 0, sizeof *s);
}

/* One pool per count of the sweep (each made once). */
static bp_status thread_set_create(thread_set *s) {
  if (s->count) return BP_OK;
  int counts[SWEEP_MAX], n = 0;
  for (int i = 0; i < SWEEP_FIXED; i++) counts[n++] = sweep_fixed[i];
  const int twice = 2 * bp_threads_share(1);
  int seen = 0;
  for (int i = 0; i < n; i++) seen |= counts[i] == twice;
  if (!seen) counts[n++] = twice;
  for (int i = 0; i < n; i++) {
    const bp_status st = bp_threads_create(counts[i], &s->pool[i]);
    if (st != BP_OK) return st;
    s->abi[i] = bp_threads_abi(s->pool[i]);
  }
  s->count = n;
  return BP_OK;
}

struct bp_validate_report {
  bp_validate_result *rows;
  int count, cap;
};

const char *bp_validate_verdict_name(bp_validate_verdict v) {
  switch (v) {
    case BP_VALIDATE_PASS: return "pass";
    case BP_VALIDATE_FAIL: return "FAIL";
    default: return "skip";
  }
}

static bp_validate_result *add_row(bp_validate_report *rep, const char *op, const char *impl,
                                   const char *device, const char *case_name, int reference) {
  if (rep->count == rep->cap) {
    const int cap = rep->cap ? 2 * rep->cap : 64;
    bp_validate_result *grown = realloc(rep->rows, (size_t)cap * sizeof *grown);
    if (!grown) return NULL;
    rep->rows = grown;
    rep->cap = cap;
  }
  bp_validate_result *r = &rep->rows[rep->count++];
  memset(r, 0, sizeof *r);
  r->op = op;
  r->impl = impl;
  r->device = device;
  snprintf(r->case_name, sizeof r->case_name, "%s", case_name);
  r->reference = reference;
  r->error = r->tolerance = NAN;
  r->run_device = "host";
  r->device_index = -1;
  return r;
}

static void set_outcome(bp_validate_result *r, const vc_outcome *o) {
  r->verdict = o->verdict;
  r->error = o->error;
  r->tolerance = o->tolerance;
  snprintf(r->detail, sizeof r->detail, "%s", o->detail);
}

/* ---- one job, here or in a child -------------------------------------------------- */

typedef struct job {
  const bp_registry *registry;
  const bp_abi_kernel *k, *ref; /* a kernel check */
  const vc_case *c;
  int grad_row;                 /* >= 0: a gradient check row instead */
  const char *grad_op;
  char grad_case[96];
  vc_check_options opt;
  int thread_count; /* an isolated child's pool (bp_validate_options.threads) */
  const vc_module_grad *mgrad; /* a module op's gradient check row instead */
} job;

static void job_run(job *j, vc_outcome *out) {
  if (j->mgrad)
    vc_module_grad_check(j->registry, j->mgrad, &j->opt, out);
  else if (j->grad_row >= 0)
    vc_grad_row(j->registry, j->grad_row, &j->opt, &j->grad_op, j->grad_case,
                sizeof j->grad_case, out);
  else
    vc_check(j->k, j->ref, j->c, &j->opt, out);
}

/* Where a child reports; shared with the parent. */
static vc_outcome *child_out;

static void on_fault(int sig, siginfo_t *info, void *context) {
  (void)context;
  const char *owner = vbuf_guard_owner(info->si_addr);
  child_out->verdict = BP_VALIDATE_FAIL;
  if (owner)
    snprintf(child_out->detail, sizeof child_out->detail,
             "read past slot_bytes of %s (it touched the guard page right after the slot)", owner);
  else
    snprintf(child_out->detail, sizeof child_out->detail, "crashed with %s at address %p",
             sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", info->si_addr);
  _exit(EXIT_GUARD);
}

typedef struct grad_result { /* what a child hands back */
  vc_outcome out;
  int done; /* 1: the job returned (a kernel that ends the process never gets here) */
} grad_result;

/* Waits for the child up to `limit_s` seconds (polling with a growing
 * sleep, at most 1 ms: a case takes milliseconds); then kills
 * it with SIGKILL, which no child can catch or block. Returns the wait
 * status; *timed_out 1 when it was killed for time. */
static int wait_child(pid_t pid, double limit_s, int *timed_out) {
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  long nap_ns = 20000;
  *timed_out = 0;
  for (;;) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return status;
    if (got < 0 && errno != EINTR) return 0;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double spent =
        (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
    if (spent >= limit_s) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      *timed_out = 1;
      return status;
    }
    nanosleep(&(struct timespec){0, nap_ns}, NULL);
    if (nap_ns < 1000000) nap_ns *= 2;
  }
}

static void run_isolated(job *j, double limit_s, vc_outcome *out) {
  grad_result *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    out->verdict = BP_VALIDATE_FAIL;
    snprintf(out->detail, sizeof out->detail, "cannot map memory for a child: %s", strerror(errno));
    return;
  }
  memset(shared, 0, sizeof *shared);
  shared->out.verdict = BP_VALIDATE_FAIL;
  shared->out.error = shared->out.tolerance = NAN;
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    child_out = &shared->out;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    bp_threads *threads = NULL;
    int count = j->thread_count > 0 ? j->thread_count : bp_threads_share(1);
    if (count > MAX_THREADS) count = MAX_THREADS;
    if (bp_threads_create(count, &threads) != BP_OK) _exit(4);
    j->opt.threads = bp_threads_abi(threads);
    thread_set sweep;
    memset(&sweep, 0, sizeof sweep);
    if (j->grad_row < 0 && !j->mgrad) {
      if (thread_set_create(&sweep) != BP_OK) _exit(4);
      j->opt.sweep = sweep.abi;
      j->opt.sweep_count = sweep.count;
    }
    vc_outcome o;
    job_run(j, &o);
    shared->out = o;
    shared->done = 1;
    thread_set_destroy(&sweep);
    bp_threads_destroy(threads);
    _exit(0);
  }
  if (pid < 0) {
    out->verdict = BP_VALIDATE_FAIL;
    snprintf(out->detail, sizeof out->detail, "cannot fork a child: %s", strerror(errno));
    munmap(shared, sizeof *shared);
    return;
  }
  int timed_out = 0;
  const int status = wait_child(pid, limit_s, &timed_out);
  *out = shared->out;
  if (timed_out) {
    out->verdict = BP_VALIDATE_FAIL;
    snprintf(out->detail, sizeof out->detail,
             "timed out after %g s (the child was killed; a kernel that hangs, or a case "
             "slower than --case-timeout)",
             limit_s);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    out->verdict = BP_VALIDATE_FAIL;
    snprintf(out->detail, sizeof out->detail, "crashed with signal %d (%s)", sig, strsignal(sig));
  } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
             WEXITSTATUS(status) != EXIT_GUARD) {
    out->verdict = BP_VALIDATE_FAIL;
    snprintf(out->detail, sizeof out->detail, "the child exited with status %d",
             WEXITSTATUS(status));
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !shared->done) {
    out->verdict = BP_VALIDATE_FAIL;
    snprintf(out->detail, sizeof out->detail,
             "the kernel ended the process (exit status 0) before the case finished");
  }
  if (out->verdict == BP_VALIDATE_FAIL && !out->detail[0])
    snprintf(out->detail, sizeof out->detail, "failed without a reason (exit status %d)",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  munmap(shared, sizeof *shared);
}

/* ---- selection ------------------------------------------------------------------------ */

const bp_abi_kernel *vc_reference(const bp_registry *r, const char *op) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    if ((k->kernel.flags & BP_ABI_KERNEL_REFERENCE) && strcmp(k->kernel.op, op) == 0 &&
        strcmp(k->kernel.device, "cpu") == 0)
      return &k->kernel;
  }
  return NULL;
}

/* kind: the kernel kind --device selects, or NULL. */
/* The seconds a (kernel, case) child may run (bp_validate_options). */
static double case_limit(const bp_validate_options *o) {
  if (o->case_timeout_s > 0) return o->case_timeout_s;
  return o->model_path ? BP_VALIDATE_MODEL_CASE_TIMEOUT_S : BP_VALIDATE_CASE_TIMEOUT_S;
}

static int selected(const bp_validate_options *o, const char *kind, const char *op,
                    const char *impl, const char *device) {
  if (o->op_glob && fnmatch(o->op_glob, op, 0) != 0) return 0;
  if (o->impl && strcmp(o->impl, impl) != 0) return 0;
  if (kind && strcmp(kind, device) != 0) return 0;
  return 1;
}

static int kernels_of(const bp_registry *r, const char *kind) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++)
    if (strcmp(bp_registry_kernel(r, i)->kernel.device, kind) == 0) return 1;
  return 0;
}

bp_status bp_validate_device(const bp_registry *r, const char *kind, const char **kernel_kind_out,
                             const bp_abi_device **device_out) {
  *kernel_kind_out = kind;
  *device_out = NULL;
  const bp_abi_device *dev = bp_registry_find_device(r, kind);
  if (!dev) {
    if (!kernels_of(r, kind))
      return bp_fail(BP_ERR_INVALID,
                     "device '%s': unknown device kind (no device plugin provides it and no "
                     "loaded kernel is of that kind; `blueprint plugins` lists what loaded)",
                     kind);
    if (strcmp(kind, "cpu") == 0) return BP_OK; /* host memory needs no plugin */
    return bp_fail(BP_ERR_DEVICE,
                   "device '%s': no device (no device plugin of that kind is loaded, and its "
                   "kernels run only through one; `blueprint plugins` lists what loaded)",
                   kind);
  }
  *kernel_kind_out = dev->kernel_kind ? dev->kernel_kind : kind;
  if (dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE) return BP_OK; /* the host path */
  int count = 0;
  if (dev->device_count(&count) != BP_ABI_OK)
    return bp_fail(BP_ERR_DEVICE, "device '%s': device_count failed: %s", kind,
                   dev->last_error && dev->last_error() ? dev->last_error() : "no reason given");
  if (count < 1) {
    const char *why = dev->last_error ? dev->last_error() : NULL;
    return bp_fail(BP_ERR_DEVICE, "device '%s': no device (the plugin reports 0 devices: %s)",
                   kind, why && why[0] ? why : "no reason given");
  }
  *device_out = dev;
  return BP_OK;
}

/* Where the kernels of one kind run when no --device names it: host
 * buffers, a device, or nowhere (why). */
#define ROUTES_MAX 16
typedef struct route {
  const char *kind;
  vc_device *dev;
  char why[320]; /* "" unless its kernels cannot run */
} route;

typedef struct routes {
  route r[ROUTES_MAX];
  int count;
} routes;

static void routes_close(routes *rt) {
  for (int i = 0; i < rt->count; i++) vc_device_close(rt->r[i].dev);
  rt->count = 0;
}

/* The route of kernel kind `kind`; NULL when out of room. */
static const route *route_of(routes *rt, const bp_registry *reg, const char *kind) {
  for (int i = 0; i < rt->count; i++)
    if (strcmp(rt->r[i].kind, kind) == 0) return &rt->r[i];
  if (rt->count == ROUTES_MAX) return NULL;
  route *x = &rt->r[rt->count++];
  memset(x, 0, sizeof *x);
  x->kind = kind;
  if (strcmp(kind, "cpu") == 0) return x;
  const char *kernel_kind;
  const bp_abi_device *dev;
  if (bp_validate_device(reg, kind, &kernel_kind, &dev) != BP_OK)
    snprintf(x->why, sizeof x->why, "%s", bp_last_error());
  else if (strcmp(kernel_kind, kind) != 0)
    snprintf(x->why, sizeof x->why,
             "device '%s': its plugin runs kernels of kind '%s', and no device plugin runs "
             "this kind's",
             kind, kernel_kind);
  else if (dev && vc_device_open(dev, 0, &x->dev) != BP_OK)
    snprintf(x->why, sizeof x->why, "%s", bp_last_error());
  return x;
}

/* 1 when a tensor of c has the dtype named `name`. */
static int has_dtype(const vc_case *c, const char *name) {
  for (int i = 0; i < c->num_inputs; i++)
    if (strcmp(bp_dtype_name((bp_dtype)c->in[i].d.dtype), name) == 0) return 1;
  for (int o = 0; o < c->num_outputs; o++)
    if (strcmp(bp_dtype_name((bp_dtype)c->out[o].d.dtype), name) == 0) return 1;
  return 0;
}

/* dev: the device its runs go through (NULL: host buffers); skip_why:
 * why it cannot run at all, or NULL. */
static bp_status validate_kernel(bp_validate_report *rep, const bp_registry *r,
                                 const bp_validate_options *o, const bp_abi_kernel *k,
                                 const vc_case *cases, int case_count, int from_model,
                                 const bp_abi_threads *threads, const thread_set *sweep,
                                 vc_device *dev,
                                 const char *skip_why) {
  const int is_ref = (k->flags & BP_ABI_KERNEL_REFERENCE) != 0;
  bp_validate_result *row;
  vc_case inferred[8];
  const vc_case **mine = malloc((size_t)(case_count + 8) * sizeof *mine);
  if (!mine) goto nomem;
  int n = 0;
  for (int i = 0; i < case_count; i++)
    if (strcmp(cases[i].op, k->op) == 0) mine[n++] = &cases[i];
  if (n == 0 && from_model) goto done; /* the model does not use the op */
  if (n == 0) {
    const bp_abi_op *op = bp_registry_find_op(r, k->op);
    const int m = op ? vc_infer_cases(r, op, inferred, 8) : 0;
    for (int i = 0; i < m; i++) mine[n++] = &inferred[i];
  }
  if (skip_why) {
    if (!(row = add_row(rep, k->op, k->impl, k->device, "-", is_ref))) goto nomem;
    row->verdict = BP_VALIDATE_SKIP;
    snprintf(row->detail, sizeof row->detail, "%s", skip_why);
    goto done;
  }
  if (n == 0) {
    if (!(row = add_row(rep, k->op, k->impl, k->device, "-", is_ref))) goto nomem;
    row->verdict = BP_VALIDATE_SKIP;
    snprintf(row->detail, sizeof row->detail,
             "no cases: the op is not in the built-in table and has no infer_shape (try --model)");
    goto done;
  }
  const bp_abi_kernel *ref = vc_reference(r, k->op);
  const int no_ref = ref == NULL;
  if (!ref) ref = k; /* conventions only */
  /* a kernel that claims FP16 also gets the AMP twin of every case */
  const int fp16 = (k->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16)) && !from_model;
  for (int i = 0; i < n * (fp16 ? 2 : 1); i++) {
    vc_case amp;
    const vc_case *c = mine[i % n];
    if (i >= n) {
      if (!vc_case_amp(c, &amp)) continue;
      c = &amp;
    }
    if (o->dtype && !has_dtype(c, o->dtype)) continue;
    if (!(row = add_row(rep, k->op, k->impl, k->device, c->name, is_ref))) goto nomem;
    job j = {.registry = r, .k = k, .ref = ref, .c = c, .grad_row = -1,
             .opt = {.seed = o->seed, .guard = o->isolate && !dev, .threads = threads,
                     .device = dev, .no_tf32 = o->no_tf32, .sweep = sweep ? sweep->abi : NULL,
                     .sweep_count = sweep ? sweep->count : 0},
             .thread_count = o->threads};
    vc_outcome out;
    if (o->isolate && !dev) run_isolated(&j, case_limit(o), &out);
    else job_run(&j, &out);
    set_outcome(row, &out);
    if (dev) {
      row->run_device = vc_device_kind(dev);
      row->device_index = vc_device_index(dev);
    }
    row->guard_pages = o->isolate && !dev && row->verdict != BP_VALIDATE_SKIP;
    if (row->verdict == BP_VALIDATE_PASS && row->tolerance == VC_TF32_TOLERANCE)
      snprintf(row->detail, sizeof row->detail,
               "TF32: FP32 outputs held to %g (without TF32: %g)", VC_TF32_TOLERANCE,
               vc_tolerance(BP_ABI_DTYPE_FP32));
    if (no_ref && row->verdict == BP_VALIDATE_PASS)
      snprintf(row->detail, sizeof row->detail, "no reference kernel: conventions checked only");
  }
done:
  free(mine);
  return BP_OK;
nomem:
  free(mine);
  return bp_fail(BP_ERR_NOMEM, "out of memory collecting validation results");
}

/* Gradient checks run on host buffers: the reference kernels of the
 * built-in ops, the kernels of module layers' backward ops. */
static bp_status gradcheck(bp_validate_report *rep, const bp_registry *r,
                           const bp_validate_options *o, const bp_abi_threads *threads) {
  vc_module_grad *mrows = NULL;
  int mcount = 0;
  bp_status st = vc_module_grad_rows(r, &mrows, &mcount);
  if (st != BP_OK) return st;
  for (int i = 0; i < mcount; i++) {
    const vc_module_grad *x = &mrows[i];
    if (o->op_glob && fnmatch(o->op_glob, x->op, 0) != 0) continue;
    if (o->impl && strcmp(o->impl, x->impl) != 0) continue;
    job j = {.registry = r, .grad_row = -1, .mgrad = x,
             .opt = {.seed = o->seed, .guard = o->isolate, .threads = threads,
                     .no_tf32 = o->no_tf32},
             .thread_count = o->threads};
    vc_outcome out;
    if (o->isolate) run_isolated(&j, case_limit(o), &out);
    else job_run(&j, &out);
    char name[96];
    snprintf(name, sizeof name, "gradcheck%s%.80s", x->bwd ? " " : "", x->bwd ? x->c.name : "");
    bp_validate_result *row = add_row(rep, x->op, x->impl, x->device, name, 0);
    if (!row) {
      free(mrows);
      return bp_fail(BP_ERR_NOMEM, "out of memory collecting validation results");
    }
    set_outcome(row, &out);
    row->guard_pages = o->isolate && row->verdict != BP_VALIDATE_SKIP;
  }
  free(mrows); /* rows keep op, impl and device: registry strings */
  if (o->impl && strcmp(o->impl, "reference") != 0) return BP_OK;
  for (int i = 0; i < vc_grad_row_count(); i++) {
    const char *op = NULL;
    char name[96];
    vc_grad_row_name(i, &op, name, sizeof name);
    if (o->op_glob && fnmatch(o->op_glob, op, 0) != 0) continue;
    job j = {.registry = r, .grad_row = i, .grad_op = op,
             .opt = {.seed = o->seed, .guard = o->isolate, .threads = threads,
                     .no_tf32 = o->no_tf32},
             .thread_count = o->threads};
    vc_outcome out;
    if (o->isolate) run_isolated(&j, case_limit(o), &out);
    else job_run(&j, &out);
    bp_validate_result *row = add_row(rep, op, "reference", "cpu", name, 1);
    if (!row) return bp_fail(BP_ERR_NOMEM, "out of memory collecting validation results");
    set_outcome(row, &out);
    row->guard_pages = o->isolate && row->verdict != BP_VALIDATE_SKIP;
  }
  return BP_OK;
}

/* Threads for kernels run in this process, made once. */
static bp_status own_threads(bp_threads **threads, int count) {
  if (*threads) return BP_OK;
  const int n = count > 0 ? count : bp_threads_share(1);
  return bp_threads_create(n > MAX_THREADS ? MAX_THREADS : n, threads);
}

bp_status bp_validate_run(bp_registry *registry, const bp_validate_options *options,
                          bp_validate_report **report_out) {
  if (!registry || !options || !report_out)
    return bp_fail(BP_ERR_INVALID, "bp_validate_run: NULL argument");
  if (options->batch < 0 || (options->batch > 0 && !options->model_path))
    return bp_fail(BP_ERR_INVALID, "validate: a batch (%lld) needs a model",
                   (long long)options->batch);
  if (options->threads < 0 || options->threads > 1024)
    return bp_fail(BP_ERR_INVALID, "validate: threads %d is outside 0..1024", options->threads);
  bp_dtype dtype;
  if (options->dtype && (bp_dtype_from_name(options->dtype, &dtype) != 0 ||
                         dtype == BP_DTYPE_ANY))
    return bp_fail(BP_ERR_INVALID, "unknown dtype '%s' (fp32, fp16, int8, int32, bf16)",
                   options->dtype);
  bp_validate_report *rep = calloc(1, sizeof *rep);
  if (!rep) return bp_fail(BP_ERR_NOMEM, "out of memory validating kernels");
  vc_case *model_cases = NULL;
  const vc_case *cases;
  int count = 0;
  bp_status st = BP_OK;
  bp_threads *threads = NULL;
  thread_set sweep;
  memset(&sweep, 0, sizeof sweep);
  /* --device: the kernels of its kernel kind, through its plugin or not */
  const char *kind = NULL;
  const bp_abi_device *fixed = NULL;
  vc_device *fixed_dev = NULL;
  routes rt = {.count = 0};
  if (options->device) st = bp_validate_device(registry, options->device, &kind, &fixed);
  if (st == BP_OK && fixed) st = vc_device_open(fixed, 0, &fixed_dev);
  if (st == BP_OK && options->model_path) {
    st = vc_model_cases(registry, options->model_path, !options->no_fuse, options->batch,
                        &model_cases, &count);
    cases = model_cases;
  } else {
    cases = vc_builtin_cases(&count);
  }
  for (int i = 0; st == BP_OK && i < bp_registry_kernel_count(registry); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(registry, i)->kernel;
    if (!selected(options, kind, k->op, k->impl, k->device)) continue;
    vc_device *dev = fixed_dev;
    const char *skip_why = NULL;
    if (!options->device) {
      const route *x = route_of(&rt, registry, k->device);
      dev = x ? x->dev : NULL;
      skip_why = !x ? "too many device kinds to validate at once (use --device)"
                 : x->why[0] ? x->why
                             : NULL;
    }
    /* in this process the kernels get threads of their own (children make
     * theirs): without isolation, and for every run on a device */
    if ((!options->isolate || dev) && ((st = own_threads(&threads, options->threads)) != BP_OK ||
                                        (st = thread_set_create(&sweep)) != BP_OK))
      break;
    st = validate_kernel(rep, registry, options, k, cases, count, options->model_path != NULL,
                         threads ? bp_threads_abi(threads) : NULL, threads ? &sweep : NULL, dev,
                         skip_why);
  }
  /* gradient checks run the FP32 forward cases of the cpu reference, on
   * host buffers */
  if (st == BP_OK && options->gradcheck && !fixed_dev && (!kind || strcmp(kind, "cpu") == 0) &&
      (!options->dtype || strcmp(options->dtype, "fp32") == 0)) {
    if (!options->isolate) st = own_threads(&threads, options->threads);
    if (st == BP_OK)
      st = gradcheck(rep, registry, options, threads ? bp_threads_abi(threads) : NULL);
  }
  routes_close(&rt);
  vc_device_close(fixed_dev);
  thread_set_destroy(&sweep);
  bp_threads_destroy(threads);
  free(model_cases);
  if (st != BP_OK) {
    bp_validate_report_destroy(rep);
    return st;
  }
  *report_out = rep;
  return BP_OK;
}

void bp_validate_report_destroy(bp_validate_report *rep) {
  if (!rep) return;
  free(rep->rows);
  free(rep);
}

int bp_validate_result_count(const bp_validate_report *rep) { return rep ? rep->count : 0; }

const bp_validate_result *bp_validate_result_get(const bp_validate_report *rep, int i) {
  return rep && i >= 0 && i < rep->count ? &rep->rows[i] : NULL;
}

bp_validate_summary bp_validate_summarize(const bp_validate_report *rep) {
  bp_validate_summary s = {0};
  if (!rep) return s;
  for (int i = 0; i < rep->count; i++) {
    const bp_validate_result *r = &rep->rows[i];
    s.cases++;
    if (r->verdict == BP_VALIDATE_PASS) s.passed++;
    else if (r->verdict == BP_VALIDATE_FAIL) s.failed++;
    else s.skipped++;
    int seen = 0;
    for (int j = 0; j < i && !seen; j++)
      seen = strcmp(rep->rows[j].op, r->op) == 0 && strcmp(rep->rows[j].impl, r->impl) == 0 &&
             strcmp(rep->rows[j].device, r->device) == 0;
    if (!seen) s.kernels++;
  }
  return s;
}
