/* Autotune: time every kernel that supports a node on the node's real
 * buffers and keep the fastest, in a cache file reused by later runs.
 *
 * Cache file: text, one entry a line, "signature impl build_id [times]",
 * fields separated by one space; '#' starts a comment line. times (since
 * cache v2; v1 lines without it still load) lists what each candidate took
 * when timed alone, "impl=ms,impl=ms" (docs/tuning.md). The file is read
 * through the checked open (infile.h: a regular file, at most 256 MiB), and
 * a line that does not parse is refused at load with "FILE:LINE" (before,
 * garbage was kept silently in every rewrite). Lookups hash the signature. Fields hold no
 * whitespace: names are checked at registration, the signature is built
 * from names and numbers, and a build id is written with bytes <= ' ',
 * '%' and DEL as %XX ("-" stands for an empty one). An entry counts only
 * while its impl supports the node and the loaded module's build id
 * equals the recorded one; otherwise the node is timed again and the line
 * replaced. The file is rewritten whole (merged with what other processes
 * wrote meanwhile) through a temporary file and rename(), so readers never
 * see half a file.
 *
 * Before any timing, every candidate runs validate's checks on the node's
 * own shapes and attributes, against the reference kernel of the op, in
 * scratch buffers of its own (never the arena; no guard pages, no child
 * process: docs/validate.md). A candidate that fails is excluded, named in
 * the report and in a warning on stderr, and never timed or picked (a
 * cached winner included); when every candidate fails, the reference
 * kernel runs. Verdicts are remembered per (signature, impl, build id)
 * for the registry's lifetime. Nodes on other devices than "cpu", and ops
 * without a reference kernel, are not checked. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blueprint/autotune.h"
#include "blueprint/dtype.h"
#include "blueprint/infile.h"
#include "blueprint/outfile.h"
#include "blueprint/threads.h"
#include "registry-impl.h"
#include "validate-impl.h"
#include "strutil-impl.h"

#define TUNE_REPS 5          /* timed runs per kernel after one warm-up; the minimum counts */
#define TUNE_FIELD_MAX 4096  /* longest field of a cache line */
#define TUNE_FILE_MAX (UINT64_C(256) << 20) /* a cache file larger is refused */
#define TUNE_HEADER "# blueprint autotune cache v2: signature impl build_id [impl=ms,...]\n"

typedef struct tune_entry {
  char *sig, *impl, *build;
  char *times; /* "impl=ms,..." or NULL (a v1 line) */
} tune_entry;

/* A check verdict: sig and impl as in the cache, build the encoded id,
 * why empty when the candidate passed. */
typedef struct tune_check {
  char *sig, *impl, *build, *why;
} tune_check;

typedef struct bp_autotune_cache {
  char *path; /* the file the entries mirror; "" for an in-memory cache */
  tune_entry *entries;
  int count, cap;
  int *slots;     /* open addressing over entries by signature: index + 1, 0 empty */
  int slot_count; /* a power of two > 2 * cap (0: none yet) */
  tune_check *checks; /* never written to the file */
  int check_count, check_cap;
} bp_autotune_cache;

/* The tuner installed in a registry (bp_autotune_install): the cache of
 * the file last asked for, shared by every rank of the registry. */
typedef struct autotuner {
  pthread_mutex_t lock; /* guards cache */
  bp_autotune_cache *cache;
} autotuner;

static void cache_clear(bp_autotune_cache *c) {
  for (int i = 0; i < c->count; i++) {
    free(c->entries[i].sig);
    free(c->entries[i].impl);
    free(c->entries[i].build);
    free(c->entries[i].times);
  }
  free(c->entries);
  free(c->slots);
  c->entries = NULL;
  c->slots = NULL;
  c->count = c->cap = c->slot_count = 0;
}

static void cache_free(bp_autotune_cache *c) {
  if (!c) return;
  cache_clear(c);
  for (int i = 0; i < c->check_count; i++) {
    free(c->checks[i].sig);
    free(c->checks[i].impl);
    free(c->checks[i].build);
    free(c->checks[i].why);
  }
  free(c->checks);
  free(c->path);
  free(c);
}

/* FNV-1a of a signature. */
static uint64_t sig_hash(const char *sig) {
  uint64_t h = UINT64_C(14695981039346656037);
  for (const unsigned char *p = (const unsigned char *)sig; *p; p++)
    h = (h ^ *p) * UINT64_C(1099511628211);
  return h;
}

/* The slot of sig: its entry's, or the empty one where it would go. */
static int *slot_of(const bp_autotune_cache *c, const char *sig) {
  const size_t mask = (size_t)c->slot_count - 1;
  for (size_t k = (size_t)sig_hash(sig) & mask;; k = (k + 1) & mask) {
    int *slot = &c->slots[k];
    if (*slot == 0 || strcmp(c->entries[*slot - 1].sig, sig) == 0) return slot;
  }
}

static int cache_find(const bp_autotune_cache *c, const char *sig) {
  if (!c->slot_count) return -1;
  const int slot = *slot_of(c, sig);
  return slot - 1;
}

/* Room for one more entry: entries and slots grown together (slots at
 * most half full). 0, or -1 when out of memory (nothing changed). */
static int cache_grow(bp_autotune_cache *c) {
  if (c->count < c->cap) return 0;
  if (c->cap > INT32_MAX / 4) return -1;
  const int cap = c->cap ? 2 * c->cap : 16;
  int *slots = calloc((size_t)cap * 4, sizeof *slots);
  tune_entry *e = slots ? realloc(c->entries, (size_t)cap * sizeof *e) : NULL;
  if (!e) {
    free(slots);
    return -1;
  }
  c->entries = e;
  c->cap = cap;
  free(c->slots);
  c->slots = slots;
  c->slot_count = cap * 4;
  for (int k = 0; k < c->count; k++) *slot_of(c, c->entries[k].sig) = k + 1;
  return 0;
}

/* Sets sig's entry (replacing an older one); times may be NULL; 0 on success. */
static int cache_set(bp_autotune_cache *c, const char *sig, const char *impl, const char *build,
                     const char *times) {
  char *s = bp_strdup(sig), *i = bp_strdup(impl), *b = bp_strdup(build);
  char *tm = times ? bp_strdup(times) : NULL;
  int at = cache_find(c, sig);
  if (!s || !i || !b || (times && !tm) || (at < 0 && cache_grow(c) != 0)) {
    free(s);
    free(i);
    free(b);
    free(tm);
    return -1;
  }
  if (at < 0) {
    at = c->count++;
    *slot_of(c, sig) = at + 1;
  } else {
    free(c->entries[at].sig);
    free(c->entries[at].impl);
    free(c->entries[at].build);
    free(c->entries[at].times);
  }
  c->entries[at] = (tune_entry){s, i, b, tm};
  return 0;
}

/* 1 when `times` reads "impl=ms,impl=ms,..." (valid names, finite ms >= 0). */
static int times_valid(const char *times) {
  for (const char *p = times;;) {
    const char *eq = strchr(p, '='), *comma = strchr(p, ',');
    if (!eq || (comma && comma < eq) || eq == p || eq - p > 63) return 0;
    char name[64];
    memcpy(name, p, (size_t)(eq - p));
    name[eq - p] = '\0';
    if (!bp_registry_name_valid(name)) return 0;
    char *end;
    errno = 0;
    const double ms = strtod(eq + 1, &end);
    if (end == eq + 1 || errno || !(ms >= 0) || ms > 1e12 || (*end && *end != ',')) return 0;
    if (!*end) return 1;
    p = end + 1;
  }
}

/* Reads `path` into c (emptied first). A missing file is an empty cache;
 * anything else goes through the checked open (infile.h: a regular file
 * of at most TUNE_FILE_MAX bytes), and a line that is not a comment, blank
 * or "signature impl build_id" is refused, naming the file and the line. */
static bp_status cache_read(bp_autotune_cache *c, const char *path) {
  cache_clear(c);
  if (!path[0]) return BP_OK;
  char *text = NULL;
  size_t size = 0;
  bp_status st = bp_input_read_all(path, "autotune cache", TUNE_FILE_MAX, &text, &size);
  if (st != BP_OK) return errno == ENOENT ? (bp_clear_error(), BP_OK) : st;
  char *sig = malloc(4 * TUNE_FIELD_MAX);
  if (!sig) {
    free(text);
    return bp_fail(BP_ERR_NOMEM, "out of memory reading the autotune cache %s", path);
  }
  char *impl = sig + TUNE_FIELD_MAX, *build = impl + TUNE_FIELD_MAX, *times = build + TUNE_FIELD_MAX;
  long line_no = 0;
  for (char *line = text; st == BP_OK && line < text + size;) {
    char *end = memchr(line, '\n', (size_t)(text + size - line));
    char *next = end ? end + 1 : text + size;
    if (end) *end = '\0';
    line_no++;
    const size_t len = strlen(line);
    if (len != (size_t)((end ? end : text + size) - line)) {
      st = bp_fail(BP_ERR_PARSE, "autotune cache %s:%ld: a NUL byte; not a cache line", path,
                   line_no);
    } else if (line[0] != '#' && line[strspn(line, " \t\r")] != '\0') {
      char extra[2];
      const int fields = len >= TUNE_FIELD_MAX ? 0
                         : sscanf(line, "%4095s %4095s %4095s %4095s %1s", sig, impl, build,
                                  times, extra);
      if (fields != 3 && (fields != 4 || !times_valid(times)))
        st = bp_fail(BP_ERR_PARSE,
                     "autotune cache %s:%ld: malformed line (want 'signature impl build_id "
                     "[impl=ms,...]'); fix or remove the file",
                     path, line_no);
      else if (cache_set(c, sig, impl, build, fields == 4 ? times : NULL) != 0)
        st = bp_fail(BP_ERR_NOMEM, "out of memory reading the autotune cache %s", path);
    }
    line = next;
  }
  free(sig);
  free(text);
  if (st != BP_OK) cache_clear(c);
  return st;
}

/* Writes c to its file through path.tmp.<pid> and rename(). */
static bp_status cache_write(const bp_autotune_cache *c) {
  bp_status checked = bp_output_prepare(c->path, "autotune cache"); /* outfile.h */
  if (checked != BP_OK) return checked;
  char *target = bp_output_target(c->path); /* a symlink's target is replaced, not the link */
  size_t n = target ? strlen(target) + 32 : 0;
  char *tmp = target ? malloc(n) : NULL;
  if (!tmp) {
    free(target);
    return bp_fail(BP_ERR_NOMEM, "out of memory writing %s", c->path);
  }
  snprintf(tmp, n, "%s.tmp.%ld", target, (long)getpid());
  FILE *f = fopen(tmp, "w");
  int ok = f != NULL && fputs(TUNE_HEADER, f) >= 0;
  for (int i = 0; ok && i < c->count; i++)
    ok = fprintf(f, "%s %s %s%s%s\n", c->entries[i].sig, c->entries[i].impl, c->entries[i].build,
                 c->entries[i].times ? " " : "", c->entries[i].times ? c->entries[i].times : "") > 0;
  if (ok) ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  int err = errno;
  if (f && fclose(f) != 0 && ok) {
    ok = 0;
    err = errno;
  }
  if (ok && rename(tmp, target) != 0) {
    ok = 0;
    err = errno;
  }
  if (!ok) unlink(tmp);
  free(tmp);
  free(target);
  if (!ok) return bp_fail(BP_ERR_IO, "autotune cache %s: cannot write: %s", c->path, strerror(err));
  return BP_OK;
}

/* The build id as a cache field (see the top of this file). */
static void encode_field(const char *in, char *out, size_t size) {
  out[0] = '\0';
  if (!in[0]) {
    snprintf(out, size, "-");
    return;
  }
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    if (*p <= ' ' || *p == '%' || *p == 0x7f || (*p == '-' && p == (const unsigned char *)in))
      bp_strcatf(out, size, "%%%02X", *p);
    else
      bp_strcatf(out, size, "%c", *p);
  }
}

/* op@device;in=...;out=...;attr=v<version>:<fnv1a-64 of the bytes>;world=<n> */
static void signature(const char *op, const char *device, const bp_abi_kernel_args *a, char *buf,
                      size_t size) {
  snprintf(buf, size, "%s@%s", op, device);
  for (int side = 0; side < 2; side++) {
    const bp_abi_tensor *t = side ? a->outputs : a->inputs;
    int n = side ? a->num_outputs : a->num_inputs;
    bp_strcatf(buf, size, ";%s=", side ? "out" : "in");
    for (int i = 0; i < n; i++) {
      bp_strcatf(buf, size, "%s%s[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "]", i ? "," : "",
                 bp_dtype_name((bp_dtype)t[i].dtype), t[i].shape[0], t[i].shape[1],
                 t[i].shape[2], t[i].shape[3]);
      if (t[i].padded_c != t[i].shape[3]) bp_strcatf(buf, size, "p%" PRId64, t[i].padded_c);
    }
  }
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
  const unsigned char *bytes = a->attrs;
  for (uint32_t i = 0; bytes && i < a->attr_size; i++) h = (h ^ bytes[i]) * 0x100000001b3ull;
  bp_strcatf(buf, size, ";attr=v%" PRIu32 ":%016" PRIx64 ";world=%d", a->attr_version, h,
             (int)a->world_size);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Device events for timing, when a plugin of the node's device kind is
 * registered and its kernels do not run on the calling thread; all NULL
 * otherwise (timed with CLOCK_MONOTONIC). */
typedef struct tune_timer {
  const bp_abi_device *dev;
  int index;
  bp_abi_stream *stream;
  bp_abi_event *start, *end;
} tune_timer;

static void timer_close(tune_timer *t) {
  if (t->start) t->dev->event_destroy(t->start);
  if (t->end) t->dev->event_destroy(t->end);
  if (t->stream) t->dev->stream_destroy(t->stream);
  t->start = t->end = NULL;
  t->stream = NULL;
}

static void timer_open(tune_timer *t, const bp_registry *r, const char *device,
                       int device_index) {
  memset(t, 0, sizeof *t);
  t->dev = bp_registry_find_device(r, device);
  if (!t->dev) return;
  int count = 0;
  if (t->dev->device_count(&count) == BP_ABI_OK && device_index >= 0 && device_index < count)
    t->index = device_index;
  if (!t->dev->event_elapsed_ms || !t->dev->stream_native) return;
  /* a host-accessible device's kernels run on the calling thread and may
   * ignore the stream (bp_abi_device.h): its events would time two adjacent
   * markers, not the kernel (the cpu plugin's read ~0 ms), so the clock times them */
  if (t->dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE) return;
  if (t->dev->stream_create(t->index, BP_ABI_STREAM_COMPUTE, &t->stream) != BP_ABI_OK ||
      t->dev->event_create(t->index, &t->start) != BP_ABI_OK ||
      t->dev->event_create(t->index, &t->end) != BP_ABI_OK)
    timer_close(t); /* fall back to the clock */
}

/* One timed run; <0 when the kernel or the timer failed (reason set). */
static double timed_run(const tune_timer *t, const bp_registered_kernel *k,
                        const bp_abi_kernel_args *run, char *reason, size_t size) {
  const bp_abi_kernel *kk = &k->kernel;
  if (t->stream) {
    float ms = 0;
    int rc = t->dev->event_record(t->start, t->stream);
    int krc = rc == BP_ABI_OK ? kk->run(kk->user, run) : BP_ABI_OK;
    if (rc == BP_ABI_OK) rc = t->dev->event_record(t->end, t->stream);
    if (rc == BP_ABI_OK) rc = t->dev->event_synchronize(t->end);
    if (rc == BP_ABI_OK && krc == BP_ABI_OK) rc = t->dev->event_elapsed_ms(t->start, t->end, &ms);
    if (krc != BP_ABI_OK) {
      snprintf(reason, size, "run() failed with status %d", krc);
      return -1;
    }
    if (rc != BP_ABI_OK) {
      snprintf(reason, size, "device '%s' timer failed with status %d", t->dev->kind, rc);
      return -1;
    }
    return ms;
  }
  double t0 = now_ms();
  int krc = kk->run(kk->user, run);
  double t1 = now_ms();
  if (krc != BP_ABI_OK) {
    snprintf(reason, size, "run() failed with status %d", krc);
    return -1;
  }
  return t1 - t0;
}

/* Best of TUNE_REPS runs after a warm-up, in ms; <0 with a reason when the
 * kernel cannot be timed. */
static double time_kernel(const tune_timer *t, const char *device,
                          const bp_registered_kernel *k, const bp_abi_kernel_args *args,
                          char *reason, size_t size) {
  bp_abi_kernel_args run = *args, meta = *args;
  meta.input_ptrs = NULL;
  meta.output_ptrs = NULL;
  meta.workspace = NULL;
  meta.workspace_bytes = 0;
  meta.params_generation = NULL; /* (1.4) run() and prepare() only */
  meta.reason = NULL;
  meta.reason_size = 0;
  uint64_t need = k->kernel.workspace_size ? k->kernel.workspace_size(k->kernel.user, &meta) : 0;
  void *ws = NULL;
  if (need > 0 && (!args->workspace || args->workspace_bytes < need)) {
    int rc = -1;
    if (t->dev)
      rc = t->dev->arena_alloc(t->index, need, 256, &ws);
    else if (strcmp(device, "cpu") == 0 && need <= SIZE_MAX)
      rc = posix_memalign(&ws, 256, (size_t)need);
    if (rc != 0 || !ws) {
      snprintf(reason, size, "could not allocate %" PRIu64 " bytes of workspace on '%s'%s", need,
               device, t->dev ? "" : " (no device plugin of that kind is loaded)");
      return -1;
    }
    run.workspace = ws;
    run.workspace_bytes = need;
  }
  run.stream = t->stream ? t->dev->stream_native(t->stream) : NULL; /* NULL: synchronous */
  /* (1.4) a kernel with per-node state is timed with a state of its own,
   * released once timed (the binding makes the node's later) */
  void *state = NULL;
  double best = -1;
  if (k->kernel.prepare && k->kernel.prepare(k->kernel.user, &run, &state) != BP_ABI_OK)
    snprintf(reason, size, "prepare() failed: %s",
             run.reason && run.reason[0] ? run.reason : "no reason given");
  else {
    run.state = state;
    best = timed_run(t, k, &run, reason, size); /* warm-up */
  }
  for (int i = 0; i < TUNE_REPS && best >= 0; i++) {
    double ms = timed_run(t, k, &run, reason, size);
    if (ms < 0) best = ms;
    else if (i == 0 || ms < best) best = ms;
  }
  if (state && k->kernel.release) k->kernel.release(k->kernel.user, state);
  if (ws) {
    if (t->dev) t->dev->arena_free(t->index, ws, need);
    else free(ws);
  }
  return best;
}

/* ---- checks before timing ----------------------------------------------------- */

enum { CHECK_PASSED = 0, CHECK_EXCLUDED = 1, CHECK_NONE = 2 };

/* Runs validate's checks of candidate k on the node; why says what failed. */
static int run_checks(const bp_registry *r, const char *op, const char *device,
                      const bp_abi_kernel_args *args, const bp_registered_kernel *k, char *why,
                      size_t size) {
  const bp_abi_kernel *ref = vc_reference(r, op);
  if (strcmp(device, "cpu") != 0 || !ref || ref == &k->kernel) return CHECK_NONE;
  vc_case *c = malloc(sizeof *c);
  if (!c || vc_case_from_args(op, args, c) != 0 || c->collective) {
    free(c);
    return CHECK_NONE;
  }
  /* one thread: a read past a slot then faults on this thread, where the
   * guarded check catches it */
  bp_threads *own = NULL;
  int verdict = CHECK_NONE;
  if (bp_threads_create(1, &own) == BP_OK) {
    const vc_check_options o = {.seed = 1, .guard = 1, .threads = bp_threads_abi(own)};
    vc_outcome out;
    vc_check_guarded(&k->kernel, ref, c, &o, &out);
    if (out.verdict == BP_VALIDATE_FAIL) {
      snprintf(why, size, "%s", out.detail);
      verdict = CHECK_EXCLUDED;
    } else if (out.verdict == BP_VALIDATE_PASS) {
      verdict = CHECK_PASSED;
    }
  }
  bp_threads_destroy(own);
  free(c);
  return verdict;
}

/* The remembered verdict of k on sig, or the checks run now (remembered;
 * *fresh set). */
static int check_candidate(autotuner *t, bp_registry *r, const char *sig, const char *op,
                           const char *device, const bp_abi_kernel_args *args,
                           const bp_registered_kernel *k, char *why, size_t size,
                           int *fresh) {
  bp_autotune_cache *c = t->cache;
  char build[TUNE_FIELD_MAX];
  encode_field(k->build_id, build, sizeof build);
  for (int i = 0; i < c->check_count; i++) {
    const tune_check *e = &c->checks[i];
    if (strcmp(e->sig, sig) == 0 && strcmp(e->impl, k->kernel.impl) == 0 &&
        strcmp(e->build, build) == 0) {
      snprintf(why, size, "%s", e->why);
      return e->why[0] ? CHECK_EXCLUDED : CHECK_PASSED;
    }
  }
  why[0] = '\0';
  *fresh = 1;
  const int verdict = run_checks(r, op, device, args, k, why, size);
  if (verdict == CHECK_NONE) return verdict;
  if (c->check_count == c->check_cap) {
    const int cap = c->check_cap ? 2 * c->check_cap : 16;
    tune_check *grown = realloc(c->checks, (size_t)cap * sizeof *grown);
    if (!grown) return verdict; /* not remembered: checked again next time */
    c->checks = grown;
    c->check_cap = cap;
  }
  tune_check e = {bp_strdup(sig), bp_strdup(k->kernel.impl), bp_strdup(build),
                  bp_strdup(verdict == CHECK_EXCLUDED ? why : "")};
  if (e.sig && e.impl && e.build && e.why) {
    c->checks[c->check_count++] = e;
  } else {
    free(e.sig);
    free(e.impl);
    free(e.build);
    free(e.why);
  }
  return verdict;
}

/* The cache for `path`, loaded from the file when it is not the one held. */
static bp_status cache_for(autotuner *t, const char *path) {
  if (t->cache && strcmp(t->cache->path, path) == 0) return BP_OK;
  cache_free(t->cache);
  t->cache = calloc(1, sizeof *t->cache);
  if (t->cache) t->cache->path = bp_strdup(path);
  if (!t->cache || !t->cache->path) {
    cache_free(t->cache);
    t->cache = NULL;
    return bp_fail(BP_ERR_NOMEM, "out of memory reading the autotune cache");
  }
  bp_status st = cache_read(t->cache, path);
  if (st != BP_OK) { /* refused: read again (and refused again) by the next node */
    cache_free(t->cache);
    t->cache = NULL;
  }
  return st;
}

/* Looks the node up, or times it and stores the winner; lock held. */
static bp_status pick_locked(autotuner *t, bp_registry *r, const char *op, const char *device,
                             int device_index, const bp_abi_kernel_args *args,
                             const bp_registered_kernel *const *cands, int n, const char *path,
                             const char *node, int *winner_out, char *report,
                             size_t report_size) {
  char *sig = malloc(TUNE_FIELD_MAX);
  char *build = malloc(TUNE_FIELD_MAX);
  char *times = malloc(TUNE_FIELD_MAX); /* "impl=ms,..." of the candidates timed */
  int *passed = calloc((size_t)(n > 0 ? n : 1), sizeof *passed);
  char reason[BP_REASON_MAX];
  bp_status st = BP_OK;
  if (!sig || !build || !times || !passed) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory autotuning %s", op);
    goto out;
  }
  signature(op, device, args, sig, TUNE_FIELD_MAX);
  if ((st = cache_for(t, path)) != BP_OK) goto out;
  /* validate's checks before any timing: a candidate that disagrees with
   * the reference is never timed nor picked */
  int alive = 0, last = -1;
  for (int i = 0; i < n; i++) {
    int fresh = 0;
    const int v =
        check_candidate(t, r, sig, op, device, args, cands[i], reason, sizeof reason, &fresh);
    passed[i] = v != CHECK_EXCLUDED;
    if (passed[i]) {
      alive++;
      last = i;
      continue;
    }
    char line[BP_REASON_MAX + 256];
    snprintf(line, sizeof line, "autotune: excluded %s/%s for node '%s': %s\n", op,
             cands[i]->kernel.impl, node && node[0] ? node : "?", reason);
    bp_strcatf(report, report_size, "%s", line);
    if (fresh) fprintf(stderr, "blueprint: warning: %s", line); /* once per node signature */
  }
  if (alive == 0) {
    bp_strcatf(report, report_size,
               "autotune: every candidate was excluded; the reference kernel runs\n");
    *winner_out = -1;
    goto out;
  }
  if (alive == 1 && n > 1) {
    bp_strcatf(report, report_size, "autotune: %s is the only candidate that passed the checks\n",
               cands[last]->kernel.impl);
    *winner_out = last;
    goto out;
  }
  if (n == 1) {
    bp_strcatf(report, report_size, "autotune: %s passed the checks\n", cands[0]->kernel.impl);
    *winner_out = 0;
    goto out;
  }
  int at = cache_find(t->cache, sig);
  if (at >= 0) {
    const tune_entry *e = &t->cache->entries[at];
    for (int i = 0; i < n; i++) {
      if (strcmp(cands[i]->kernel.impl, e->impl) != 0 || !passed[i]) continue;
      encode_field(cands[i]->build_id, build, TUNE_FIELD_MAX);
      if (strcmp(build, e->build) == 0) {
        bp_strcatf(report, report_size, "autotune: %s from the cache%s%s%s%s\n", e->impl,
                   path[0] ? " " : "", path, e->times ? ", timed alone: " : "",
                   e->times ? e->times : "");
        *winner_out = i;
        goto out;
      }
      bp_strcatf(report, report_size,
                 "autotune: cached winner %s was built as '%s', the loaded module is '%s': "
                 "timing again\n",
                 e->impl, e->build, build);
    }
  }

  tune_timer timer;
  timer_open(&timer, r, device, device_index);
  int winner = -1;
  double best = 0;
  times[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (!passed[i]) continue;
    double ms = time_kernel(&timer, device, cands[i], args, reason, sizeof reason);
    if (ms < 0) {
      bp_strcatf(report, report_size, "autotune: %s excluded: %s\n", cands[i]->kernel.impl,
                 reason);
      continue;
    }
    bp_strcatf(report, report_size, "autotune: %s %.4f ms (%s)\n", cands[i]->kernel.impl, ms,
               timer.stream ? "device events" : "monotonic clock");
    bp_strcatf(times, TUNE_FIELD_MAX, "%s%s=%.4f", times[0] ? "," : "", cands[i]->kernel.impl, ms);
    if (winner < 0 || ms < best) { /* ties keep the preferred kernel */
      winner = i;
      best = ms;
    }
  }
  timer_close(&timer);
  if (winner < 0) {
    st = bp_fail(BP_ERR_UNSUPPORTED, "autotune of %s on %s: every kernel failed to run (%s)", op,
                 device, reason);
    goto out;
  }
  *winner_out = winner;
  encode_field(cands[winner]->build_id, build, TUNE_FIELD_MAX);
  if (path[0] && (st = cache_read(t->cache, path)) != BP_OK) { /* merge what others wrote */
    cache_free(t->cache);
    t->cache = NULL;
    goto out;
  }
  if (cache_set(t->cache, sig, cands[winner]->kernel.impl, build, times) != 0) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory updating the autotune cache");
    goto out;
  }
  if (path[0]) st = cache_write(t->cache);
out:
  free(sig);
  free(build);
  free(times);
  free(passed);
  return st;
}

static bp_status autotune_pick(void *ctx, bp_registry *r, const char *op, const char *device,
                               int device_index, const bp_abi_kernel_args *args,
                               const bp_registered_kernel *const *cands, int n,
                               const char *cache_path, const char *node, int *winner_out,
                               char *report, size_t report_size) {
  autotuner *t = ctx;
  pthread_mutex_lock(&t->lock);
  bp_status st = pick_locked(t, r, op, device, device_index, args, cands, n,
                             cache_path ? cache_path : "", node, winner_out, report, report_size);
  pthread_mutex_unlock(&t->lock);
  return st;
}

static void autotune_destroy(void *ctx) {
  autotuner *t = ctx;
  cache_free(t->cache);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

bp_status bp_autotune_install(bp_registry *r) {
  if (!r) return bp_fail(BP_ERR_INVALID, "bp_autotune_install: NULL registry");
  const bp_select_tuner *have = bp_registry_tuner(r);
  if (have && have->pick == autotune_pick) return BP_OK;
  autotuner *t = calloc(1, sizeof *t);
  if (!t) return bp_fail(BP_ERR_NOMEM, "out of memory installing the autotuner");
  if (pthread_mutex_init(&t->lock, NULL) != 0) {
    free(t);
    return bp_fail(BP_ERR_NOMEM, "cannot initialize the autotuner's lock");
  }
  const bp_select_tuner tuner = {.ctx = t, .pick = autotune_pick, .destroy = autotune_destroy};
  return bp_registry_set_tuner(r, &tuner);
}


int bp_autotune_keep_tuned(double tuned_ms, double default_ms, double margin) {
  /* NaN or a non-positive time never wins: the default stays */
  return tuned_ms > 0 && default_ms > 0 && tuned_ms < default_ms * (1.0 - margin);
}

int bp_autotune_excluded(bp_registry *r, const char *op, const char *device,
                         const bp_abi_kernel_args *args, const char *impl) {
  const bp_select_tuner *have = r ? bp_registry_tuner(r) : NULL;
  if (!have || have->pick != autotune_pick || !op || !device || !args || !impl) return 0;
  autotuner *t = have->ctx;
  char *sig = malloc(TUNE_FIELD_MAX);
  if (!sig) return 0;
  signature(op, device, args, sig, TUNE_FIELD_MAX);
  int excluded = 0;
  pthread_mutex_lock(&t->lock);
  for (int i = 0; t->cache && i < t->cache->check_count && !excluded; i++) {
    const tune_check *e = &t->cache->checks[i];
    excluded = strcmp(e->sig, sig) == 0 && strcmp(e->impl, impl) == 0 && e->why[0];
  }
  pthread_mutex_unlock(&t->lock);
  free(sig);
  return excluded;
}

bp_status bp_autotune_node_times(bp_registry *r, const char *op, const char *device,
                                 const bp_abi_kernel_args *args, char *out, size_t size) {
  if (!r || !op || !device || !args || !out || size == 0)
    return bp_fail(BP_ERR_INVALID, "bp_autotune_node_times: NULL argument");
  out[0] = '\0';
  const bp_select_tuner *have = bp_registry_tuner(r);
  if (!have || have->pick != autotune_pick) return BP_OK;
  autotuner *t = have->ctx;
  char *sig = malloc(TUNE_FIELD_MAX);
  if (!sig) return bp_fail(BP_ERR_NOMEM, "out of memory reading autotune times");
  signature(op, device, args, sig, TUNE_FIELD_MAX);
  pthread_mutex_lock(&t->lock);
  const int at = t->cache ? cache_find(t->cache, sig) : -1;
  if (at >= 0 && t->cache->entries[at].times)
    snprintf(out, size, "%s", t->cache->entries[at].times);
  pthread_mutex_unlock(&t->lock);
  free(sig);
  return BP_OK;
}
