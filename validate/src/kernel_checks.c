/* The registry's checker (kernel_checks.h): validate's checks for pinned
 * kernels, and a timing of priority picks from modules that do not ship
 * with blueprint against the default pick. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blueprint/kernel_checks.h"
#include "blueprint/threads.h"
#include "strutil-impl.h"
#include "validate-impl.h"

/* A remembered verdict: key hashes (op, impl, build id, descriptors,
 * attributes); why "" when the kernel passed. */
typedef struct pin_verdict {
  uint64_t key;
  char *why;
} pin_verdict;

/* The slowest node seen of one (op, picked impl) against its default pick. */
typedef struct slow_pick {
  char op[64], impl[64], default_impl[64], node[96];
  int priority, default_priority;
  double ratio, ms, default_ms;
} slow_pick;

typedef struct kernel_checks {
  pthread_mutex_t lock; /* guards everything below; one check at a time */
  int check_pins;
  pin_verdict *verdicts;
  int verdict_count, verdict_cap;
  uint64_t *timed; /* keys of the nodes timed already */
  int timed_count, timed_cap;
  slow_pick *slow;
  int slow_count, slow_cap;
  char *warnings; /* bp_kernel_checks_warnings' text */
} kernel_checks;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * UINT64_C(1099511628211);
  return h;
}

/* The key of kernel k (or of the pair k, other) on case c. */
static uint64_t case_key(const bp_registered_kernel *k, const bp_registered_kernel *other,
                         const vc_case *c) {
  uint64_t h = UINT64_C(14695981039346656037);
  const bp_registered_kernel *ks[2] = {k, other};
  for (int j = 0; j < 2 && ks[j]; j++) {
    h = fnv(h, ks[j]->kernel.op, strlen(ks[j]->kernel.op) + 1);
    h = fnv(h, ks[j]->kernel.impl, strlen(ks[j]->kernel.impl) + 1);
    h = fnv(h, ks[j]->kernel.device, strlen(ks[j]->kernel.device) + 1);
    const char *b = ks[j]->build_id ? ks[j]->build_id : "";
    h = fnv(h, b, strlen(b) + 1);
  }
  for (int i = 0; i < c->num_inputs; i++) h = fnv(h, &c->in[i].d, sizeof c->in[i].d);
  for (int o = 0; o < c->num_outputs; o++) h = fnv(h, &c->out[o].d, sizeof c->out[o].d);
  h = fnv(h, c->alias, sizeof c->alias);
  return fnv(h, c->attrs, c->attr_size);
}

/* ---- pinned kernels: validate's checks ------------------------------------------- */

/* A pinned kernel that crashes or ends the process during its check (in
 * this process: a forked child could hang in an OpenMP runtime the parent
 * has used) is named in one line on stderr, preformatted before the check
 * so that the handlers only write(2): then the signal's default action,
 * or exit status 70 for a kernel that calls exit(). */
#define CHECK_EXIT_STATUS 70
static char crash_line[512];
static size_t crash_len;
static volatile sig_atomic_t checking; /* 1 while a pinned kernel's check runs */
static struct sigaction before[5];
static const int crash_sigs[5] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static pthread_once_t exit_hook_once = PTHREAD_ONCE_INIT;
/* The check runs in this process with process-wide state (guard pages,
 * signal handlers, the line above): one at a time, whatever registry. */
static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;

static void write_line(const char *what) {
  static const char head[] = "blueprint: ";
  ssize_t w = write(STDERR_FILENO, head, sizeof head - 1);
  w = write(STDERR_FILENO, what, strlen(what));
  w = write(STDERR_FILENO, crash_line, crash_len);
  (void)w;
}

static void on_crash(int sig) {
  if (checking) {
    checking = 0;
    write_line(sig == SIGSEGV   ? "SIGSEGV in "
               : sig == SIGBUS  ? "SIGBUS in "
               : sig == SIGILL  ? "SIGILL in "
               : sig == SIGFPE  ? "SIGFPE in "
                                : "SIGABRT in ");
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void on_exit_during_check(void) {
  if (!checking) return;
  checking = 0;
  write_line("exit() called by ");
  _exit(CHECK_EXIT_STATUS);
}

static void add_exit_hook(void) { (void)atexit(on_exit_during_check); }

static void crash_report_begin(const bp_registered_kernel *k, const char *node) {
  pthread_once(&exit_hook_once, add_exit_hook);
  int n = snprintf(crash_line, sizeof crash_line,
                   "the pinned kernel %s/%s/%s (module %s) during its check on node '%s' "
                   "(--trust-pins skips the check)\n",
                   k->kernel.op, k->kernel.impl, k->kernel.device, k->path ? k->path : "?",
                   node && node[0] ? node : "?");
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof crash_line) {
    n = (int)sizeof crash_line - 1;
    crash_line[n - 1] = '\n';
  }
  crash_len = (size_t)n;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 5; i++) sigaction(crash_sigs[i], &sa, &before[i]);
  checking = 1;
}

static void crash_report_end(void) {
  checking = 0;
  for (int i = 0; i < 5; i++) sigaction(crash_sigs[i], &before[i], NULL);
}

static int remember(kernel_checks *kc, uint64_t key, const char *why) {
  if (kc->verdict_count == kc->verdict_cap) {
    const int cap = kc->verdict_cap ? 2 * kc->verdict_cap : 16;
    pin_verdict *grown = realloc(kc->verdicts, (size_t)cap * sizeof *grown);
    if (!grown) return -1;
    kc->verdicts = grown;
    kc->verdict_cap = cap;
  }
  char *copy = bp_strdup(why);
  if (!copy) return -1;
  kc->verdicts[kc->verdict_count++] = (pin_verdict){key, copy};
  return 0;
}

/* 1: k passes the checks on the node (or cannot be checked here), 0: it
 * fails them, why set. */
static int check_pinned(void *ctx, bp_registry *r, const char *op, const char *device,
                        const bp_abi_kernel_args *args, const bp_registered_kernel *k,
                        const char *node, char *why, size_t why_size) {
  kernel_checks *kc = ctx;
  if (!kc->check_pins || strcmp(device, "cpu") != 0) return 1;
  const bp_abi_kernel *ref = vc_reference(r, op);
  if (!ref) ref = &k->kernel; /* a module op without one: conventions and state only */
  vc_case *c = malloc(sizeof *c);
  if (!c || vc_case_from_args(op, args, c) != 0 || c->collective) {
    free(c);
    return 1;
  }
  vc_layer_complete(r, c, 0); /* a module op's accumulate flag */
  const uint64_t key = case_key(k, NULL, c);
  int verdict = 1;
  pthread_mutex_lock(&kc->lock);
  int found = 0;
  for (int i = 0; i < kc->verdict_count && !found; i++)
    if (kc->verdicts[i].key == key) {
      found = 1;
      verdict = kc->verdicts[i].why[0] == '\0';
      snprintf(why, why_size, "%s", kc->verdicts[i].why);
    }
  /* one thread: a read past a slot then faults on this thread, where the
   * guarded check catches it (as autotune checks a candidate) */
  bp_threads *one = NULL;
  if (!found && bp_threads_create(1, &one) == BP_OK) {
    const vc_check_options o = {.seed = 1, .guard = 1, .threads = bp_threads_abi(one)};
    vc_outcome out;
    pthread_mutex_lock(&check_lock);
    crash_report_begin(k, node); /* vc_check_guarded passes on faults not its own */
    vc_check_guarded(&k->kernel, ref, c, &o, &out);
    crash_report_end();
    pthread_mutex_unlock(&check_lock);
    verdict = out.verdict != BP_VALIDATE_FAIL;
    snprintf(why, why_size, "%s", verdict ? "" : out.detail);
    (void)remember(kc, key, why); /* not remembered: checked again next time */
  }
  bp_threads_destroy(one);
  pthread_mutex_unlock(&kc->lock);
  free(c);
  return verdict;
}

/* ---- priority picks: timed against the default pick ------------------------------- */

/* 1 when k's module ships with blueprint (found in the install directory
 * or beside the library) or k is the host's own. */
static int shipped(const bp_registry *r, const bp_registered_kernel *k) {
  if (!k->path || strcmp(k->path, "<builtin>") == 0) return 1;
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    if (rec->outcome == BP_LOAD_LOADED && strcmp(rec->path, k->path) == 0)
      return rec->source && (strcmp(rec->source, "install") == 0 ||
                             strcmp(rec->source, "library") == 0);
  }
  return 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Scratch buffers of a case, filled with its input rules' values. */
typedef struct scratch {
  vbuf in[VC_MAX], out[VC_MAX];
  void *in_ptrs[VC_MAX], *out_ptrs[VC_MAX];
} scratch;

static void scratch_free(scratch *s) {
  for (int i = 0; i < VC_MAX; i++) {
    vbuf_free(&s->in[i]);
    vbuf_free(&s->out[i]);
  }
}

static int fill(const vc_case *c, const vc_tensor *t, uint64_t *rng, void *p) {
  const int64_t n = vt_count(&t->d);
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  if (!v) return -1;
  vc_fill_values(c, t, rng, v);
  vt_fill_input_padding(&t->d, p);
  vt_write(&t->d, p, v);
  free(v);
  return 0;
}

static int scratch_make(const vc_case *c, scratch *s) {
  memset(s, 0, sizeof *s);
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < c->num_inputs; i++) {
    if (vbuf_alloc(&s->in[i], c->in[i].d.slot_bytes, 0) != 0 ||
        fill(c, &c->in[i], &rng, s->in[i].ptr) != 0)
      return -1;
    s->in_ptrs[i] = s->in[i].ptr;
  }
  for (int o = 0; o < c->num_outputs; o++) {
    if (c->alias[o] >= 0) {
      s->out_ptrs[o] = s->in_ptrs[c->alias[o]];
      continue;
    }
    if (vbuf_alloc(&s->out[o], c->out[o].d.slot_bytes, 0) != 0 ||
        fill(c, &c->out[o], &rng, s->out[o].ptr) != 0) /* data, never NaN poison */
      return -1;
    s->out_ptrs[o] = s->out[o].ptr;
  }
  return 0;
}

/* Best of BP_KERNEL_CHECKS_CALLS calls of k on the scratch buffers after
 * a warm-up, in ms; < 0 when it could not run. */
static double time_on(const bp_registered_kernel *k, const bp_abi_kernel_args *node_args,
                      scratch *s) {
  bp_abi_kernel_args a = *node_args;
  a.input_ptrs = (const void *const *)s->in_ptrs;
  a.output_ptrs = s->out_ptrs;
  a.stream = NULL;
  a.state = NULL;
  char reason[256] = "";
  a.reason = reason;
  a.reason_size = sizeof reason;
  uint64_t generation = 1;
  a.params_generation = &generation;
  bp_abi_kernel_args meta = a;
  meta.input_ptrs = NULL;
  meta.output_ptrs = NULL;
  meta.workspace = NULL;
  meta.workspace_bytes = 0;
  meta.params_generation = NULL;
  meta.reason = NULL;
  meta.reason_size = 0;
  const uint64_t need =
      k->kernel.workspace_size ? k->kernel.workspace_size(k->kernel.user, &meta) : 0;
  vbuf ws;
  memset(&ws, 0, sizeof ws);
  if (need > 0 && vbuf_alloc(&ws, need, 0) != 0) return -1;
  a.workspace = need ? ws.ptr : NULL;
  a.workspace_bytes = need;
  void *state = NULL;
  double best = -1;
  if (!k->kernel.prepare || k->kernel.prepare(k->kernel.user, &a, &state) == BP_ABI_OK) {
    a.state = state;
    int ok = k->kernel.run(k->kernel.user, &a) == BP_ABI_OK; /* warm-up */
    for (int i = 0; ok && i < BP_KERNEL_CHECKS_CALLS; i++) {
      const double t0 = now_ms();
      ok = k->kernel.run(k->kernel.user, &a) == BP_ABI_OK;
      const double ms = now_ms() - t0;
      if (ok && (best < 0 || ms < best)) best = ms;
    }
    if (!ok) best = -1;
    if (state && k->kernel.release) k->kernel.release(k->kernel.user, state);
  }
  vbuf_free(&ws);
  return best;
}

static void note_slow(kernel_checks *kc, const bp_registered_kernel *k,
                      const bp_registered_kernel *d, const char *node, double ms,
                      double default_ms) {
  const double ratio = ms / (default_ms > 1e-6 ? default_ms : 1e-6);
  if (ratio < BP_KERNEL_CHECKS_SLOW) return;
  slow_pick *e = NULL;
  for (int i = 0; i < kc->slow_count && !e; i++)
    if (strcmp(kc->slow[i].op, k->kernel.op) == 0 && strcmp(kc->slow[i].impl, k->kernel.impl) == 0)
      e = &kc->slow[i];
  if (e && e->ratio >= ratio) return;
  if (!e) {
    if (kc->slow_count == kc->slow_cap) {
      const int cap = kc->slow_cap ? 2 * kc->slow_cap : 8;
      slow_pick *grown = realloc(kc->slow, (size_t)cap * sizeof *grown);
      if (!grown) return;
      kc->slow = grown;
      kc->slow_cap = cap;
    }
    e = &kc->slow[kc->slow_count++];
  }
  snprintf(e->op, sizeof e->op, "%s", k->kernel.op);
  snprintf(e->impl, sizeof e->impl, "%s", k->kernel.impl);
  snprintf(e->default_impl, sizeof e->default_impl, "%s", d->kernel.impl);
  snprintf(e->node, sizeof e->node, "%s", node);
  e->priority = k->kernel.priority;
  e->default_priority = d->kernel.priority;
  e->ratio = ratio;
  e->ms = ms;
  e->default_ms = default_ms;
}

static void check_priority(void *ctx, bp_registry *r, const char *op, const char *device,
                           const bp_abi_kernel_args *args,
                           const bp_registered_kernel *const *pool, int m, const char *node) {
  kernel_checks *kc = ctx;
  if (strcmp(device, "cpu") != 0 || shipped(r, pool[0])) return;
  const bp_registered_kernel *d = NULL; /* the default pick: the best shipped one */
  for (int i = 1; i < m && !d; i++)
    if (shipped(r, pool[i])) d = pool[i];
  if (!d || (pool[0]->kernel.flags & BP_ABI_KERNEL_COLLECTIVE)) return;
  vc_case *c = malloc(sizeof *c);
  if (!c || vc_case_from_args(op, args, c) != 0 || c->collective) {
    free(c);
    return;
  }
  const uint64_t key = case_key(pool[0], d, c);
  pthread_mutex_lock(&kc->lock);
  int seen = 0;
  for (int i = 0; i < kc->timed_count && !seen; i++) seen = kc->timed[i] == key;
  if (!seen && kc->timed_count == kc->timed_cap) {
    const int cap = kc->timed_cap ? 2 * kc->timed_cap : 16;
    uint64_t *grown = realloc(kc->timed, (size_t)cap * sizeof *grown);
    if (grown) {
      kc->timed = grown;
      kc->timed_cap = cap;
    }
  }
  if (!seen && kc->timed_count < kc->timed_cap) {
    kc->timed[kc->timed_count++] = key;
    scratch s;
    if (scratch_make(c, &s) == 0) {
      /* the node's threads, as the run lends them */
      const double ms = time_on(pool[0], args, &s);
      const double default_ms = time_on(d, args, &s);
      if (ms >= 0 && default_ms >= 0) note_slow(kc, pool[0], d, node, ms, default_ms);
    }
    scratch_free(&s);
  }
  pthread_mutex_unlock(&kc->lock);
  free(c);
}

/* ---- install ------------------------------------------------------------------------ */

static void destroy(void *ctx) {
  kernel_checks *kc = ctx;
  if (!kc) return;
  for (int i = 0; i < kc->verdict_count; i++) free(kc->verdicts[i].why);
  free(kc->verdicts);
  free(kc->timed);
  free(kc->slow);
  free(kc->warnings);
  pthread_mutex_destroy(&kc->lock);
  free(kc);
}

bp_status bp_kernel_checks_install(bp_registry *registry, int check_pins) {
  if (!registry) return bp_fail(BP_ERR_INVALID, "bp_kernel_checks_install: NULL registry");
  kernel_checks *kc = calloc(1, sizeof *kc);
  if (!kc) return bp_fail(BP_ERR_NOMEM, "out of memory installing the kernel checks");
  pthread_mutex_init(&kc->lock, NULL);
  kc->check_pins = check_pins;
  const bp_select_checker checker = {.ctx = kc,
                                     .pinned = check_pinned,
                                     .by_priority = check_priority,
                                     .destroy = destroy};
  bp_status st = bp_registry_set_checker(registry, &checker);
  if (st != BP_OK) destroy(kc);
  return st;
}

const char *bp_kernel_checks_warnings(const bp_registry *registry) {
  const bp_select_checker *ch = bp_registry_checker(registry);
  if (!ch || ch->pinned != check_pinned) return "";
  kernel_checks *kc = ch->ctx;
  pthread_mutex_lock(&kc->lock);
  char *text = NULL;
  size_t size = (size_t)kc->slow_count * 512 + 1;
  if ((text = malloc(size)) != NULL) {
    text[0] = '\0';
    for (int i = 0; i < kc->slow_count; i++) {
      const slow_pick *e = &kc->slow[i];
      bp_strcatf(text, size,
                 "%s: %s (priority %d) was picked by priority, but took %.1fx the time of the "
                 "default pick %s (priority %d) on node '%s' (%.3f ms against %.3f ms, best "
                 "of %d calls on the node's shapes); --kernels %s=%s pins the default\n",
                 e->op, e->impl, e->priority, e->ratio, e->default_impl, e->default_priority,
                 e->node, e->ms, e->default_ms, BP_KERNEL_CHECKS_CALLS, e->op, e->default_impl);
    }
    free(kc->warnings);
    kc->warnings = text;
  }
  const char *out = kc->warnings ? kc->warnings : "";
  pthread_mutex_unlock(&kc->lock);
  return out;
}
