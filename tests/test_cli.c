/* `blueprint plan`: the printers on plans built by hand (linked in), then the
 * built executable end to end: every shipped model, --json against the
 * library's own numbers, --svg, overrides, and every kind of bad input
 * (exactly one line on stderr, the right exit status, never a crash). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "json_mini.h"
#include "plan_print.h"
#include "run_util.h"


/* ---- running the executable ------------------------------------------- */

static const char *env_dir(const char *name) {
  const char *v = getenv(name);
  ck_assert_msg(v && *v, "%s is not set (run through ctest)", name);
  return v;
}



static char *model_path(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "models/%s.yaml", name);
  return path_in(env_dir("BP_SOURCE_DIR"), rel);
}

/* Lines in a string (a last line without '\n' counts too). */
static int line_count(const char *s) {
  int n = 0;
  for (const char *p = s; *p; p++) n += *p == '\n';
  if (*s && s[strlen(s) - 1] != '\n') n++;
  return n;
}

/* The contract for every failure: status, one line "blueprint plan: ...",
 * naming `needle`, and nothing on stdout. */
static void expect_cli_error(const run_result *r, int status, const char *needle,
                                  const char *what) {
  ck_assert_msg(r->status == status, "%s: exit %d, expected %d (stderr: %s)", what, r->status,
                status, r->err);
  ck_assert_msg(line_count(r->err) == 1 && r->err[r->err_len - 1] == '\n',
                "%s: stderr is not exactly one line: [%s]", what, r->err);
  ck_assert_msg(strncmp(r->err, "blueprint plan: ", 16) == 0, "%s: stderr [%s]", what, r->err);
  ck_assert_msg(strstr(r->err, needle) != NULL, "%s: stderr [%s] does not name '%s'", what,
                r->err, needle);
  ck_assert_msg(r->out_len == 0, "%s: stdout is not empty: [%.200s]", what, r->out);
}

static char *tmp_dir(void) {
  const char *base = getenv("TMPDIR");
  char *t = path_in(base && *base ? base : "/tmp", "bp_test_cli_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(t));
  return t;
}

static char *write_temp(const char *dir, const char *name, const char *text) {
  char *p = path_in(dir, name);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  ck_assert_int_eq(fclose(f), 0);
  return p;
}


/* Also checks `text` with Python's json or xml parser where python3 exists
 * (an independent second opinion); skipped silently elsewhere. */
static void python_accepts(const char *text, size_t len, const char *code) {
  if (system("command -v python3 >/dev/null 2>&1") != 0) return;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "python3 -c '%s'", code);
  signal(SIGPIPE, SIG_IGN); /* a refusal shows in pclose, not as a kill */
  FILE *p = popen(cmd, "w");
  ck_assert_ptr_nonnull(p);
  fwrite(text, 1, len, p);
  ck_assert_msg(pclose(p) == 0, "python3 refused the output (%s)", code);
}

#define PY_JSON "import json,sys; json.load(sys.stdin)"
#define PY_XML "import sys,xml.dom.minidom as m; m.parse(sys.stdin.buffer)"

/* ---- plans built by hand --------------------------------------------- */

/* Two variants differing in batch and resolution; a parameter family, BN
 * statistics, features, inputs, a mask, a result, a scalar and a temporary
 * whose name needs escaping in JSON. */
static bp_plan *hand_plan(const char *odd_name) {
  bp_plan_options o = {.amp = 0, .ema = 1, .optimizer = BP_OPT_SGD};
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  const struct {
    const char *name;
    int64_t n, hw;
  } vs[] = {{"train", 8, 6}, {"hires", 4, 10}};
  for (int v = 0; v < 2; v++) {
    int64_t n = vs[v].n, hw = vs[v].hw;
    bp_param_ids ids;
    int32_t id, two[2];
    ck_assert_int_eq(bp_plan_begin_variant(p, vs[v].name, n, hw, hw), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_input(p, "x", (bp_shape){n, hw, hw, 3}, BP_DTYPE_FP32, two), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_CONV_FIRST, "conv.w", (bp_shape){16, 3, 3, 3},
                                         (bp_init){BP_INIT_KAIMING_NORMAL, 0, 0, 1}, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_BN_WEIGHT, "bn.w", (bp_shape){1, 1, 1, 16},
                                         (bp_init){BP_INIT_ONES, 0, 0, 0}, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_bn_stats(p, "bn", 16, two), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_feature(p, "conv.out", (bp_shape){n, hw, hw, 16}, BP_DTYPE_FP32, &id), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_mask(p, "relu.mask", (bp_shape){n, hw, hw, 16}, &id), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_result(p, "loss", (bp_shape){1, 1, 1, 1}, &id), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_scalar(p, "lr", BP_DTYPE_FP32, (bp_init){0}, &id), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_temp(p, odd_name, (bp_shape){1, 1, 1, 7}, BP_DTYPE_FP16, &id), BP_OK);
    ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  }
  ck_assert_int_eq(bp_plan_finalize(p), BP_OK);
  return p;
}

/* Renders with one of the printers into memory: *text_out is malloc'ed
 * (the caller's own pointer goes to open_memstream, so no local escapes). */
static void render(void (*print)(FILE *, const bp_plan *, const bp_plan_print_info *),
                   const bp_plan *p, const bp_plan_print_info *info, char **text_out,
                   size_t *len) {
  *text_out = NULL;
  FILE *f = open_memstream(text_out, len);
  ck_assert_ptr_nonnull(f);
  print(f, p, info);
  ck_assert_int_eq(fclose(f), 0);
}

static void print_json_adapter(FILE *f, const bp_plan *p, const bp_plan_print_info *info) {
  (void)info;
  bp_plan_print_json(f, p);
}

START_TEST(formats_sizes_counts_and_empty_regions) {
  char b[BP_FMT_MAX];
  ck_assert_str_eq(bp_fmt_bytes(0, b), "0 B");
  ck_assert_str_eq(bp_fmt_bytes(1023, b), "1023 B");
  ck_assert_str_eq(bp_fmt_bytes(1024, b), "1.00 KiB");
  ck_assert_str_eq(bp_fmt_bytes(1605888, b), "1.53 MiB");
  ck_assert_str_eq(bp_fmt_bytes(15 * 1048576ull + 300000, b), "15.3 MiB");
  ck_assert_str_eq(bp_fmt_bytes(1048575, b), "1.00 MiB"); /* not "1024 KiB" */
  ck_assert_str_eq(bp_fmt_bytes(UINT64_MAX, b), "16.0 EiB");
  ck_assert_str_eq(bp_fmt_count(0, b), "0");
  ck_assert_str_eq(bp_fmt_count(999, b), "999");
  ck_assert_str_eq(bp_fmt_count(1605888, b), "1,605,888");
  ck_assert_str_eq(bp_fmt_count(UINT64_MAX, b), "18,446,744,073,709,551,615");
  bp_plan *p = hand_plan("tmp");
  char zero[1024];
  int n = bp_fmt_zero_regions(p, zero, sizeof zero);
  /* sgd, ema on, amp off: A, G16, F16, V, N are off; FC and deep conv are empty */
  ck_assert_msg(strstr(zero, "disabled (amp off): A_* G16_* F16") != NULL, "%s", zero);
  ck_assert_msg(strstr(zero, "disabled (optimizer sgd): V_* N") != NULL, "%s", zero);
  ck_assert_msg(strstr(zero, "empty: W_BN_BIAS W_FC_BIAS") != NULL, "%s", zero);
  ck_assert_msg(strstr(zero, "E_*") == NULL, "ema is on: %s", zero);
  int counted = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) counted += bp_plan_region_span(p, (bp_region)r).bytes == 0;
  ck_assert_int_eq(n, counted);
  char tiny[8];
  bp_fmt_zero_regions(p, tiny, sizeof tiny); /* truncates, stays terminated */
  ck_assert_uint_eq(strlen(tiny), 7);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(json_of_a_hand_built_plan_is_valid_and_exact) {
  const char odd[] = "t\"q\\b\n\x01\xff\xc3\xa9"; /* quote, backslash, controls, bad byte, é */
  bp_plan *p = hand_plan(odd);
  size_t len;
  char *text;
  render(print_json_adapter, p, NULL, &text, &len);
  char err[128];
  jm_value *doc = jm_parse(text, len, err, sizeof err);
  ck_assert_msg(doc != NULL, "invalid JSON: %s\n%s", err, text);
  python_accepts(text, len, PY_JSON);
  const jm_value *vars = jm_get(doc, "variants");
  ck_assert_ptr_nonnull(vars);
  ck_assert_uint_eq(vars->count, 2);
  static const char *const vkeys[] = {"name", "batch", "height", "width", "total_bytes", "regions", "tensors"};
  static const char *const tkeys[] = {"id", "name", "region", "dtype", "shape", "padded_c", "offset", "slot_bytes"};
  for (int v = 0; v < 2; v++) {
    const jm_value *var = jm_at(vars, (size_t)v);
    ck_assert_uint_eq(var->count, 7);
    for (size_t k = 0; k < 7; k++) ck_assert_str_eq(var->keys[k], vkeys[k]); /* documented order */
    ck_assert_str_eq(jm_get(var, "name")->text, bp_plan_variant(p, v)->name);
    uint64_t x;
    ck_assert_int_eq(jm_u64(jm_get(var, "total_bytes"), &x), 0);
    ck_assert_uint_eq(x, bp_plan_total_bytes(p));
    ck_assert_int_eq(jm_u64(jm_get(var, "height"), &x), 0);
    ck_assert_uint_eq(x, (uint64_t)bp_plan_variant(p, v)->height);
    const jm_value *regions = jm_get(var, "regions");
    ck_assert_uint_eq(regions->count, BP_REGION_COUNT); /* zero-size ones too */
    for (int r = 0; r < BP_REGION_COUNT; r++) {
      const jm_value *reg = jm_at(regions, (size_t)r);
      bp_span s = bp_plan_region_span(p, (bp_region)r);
      ck_assert_str_eq(jm_get(reg, "name")->text, bp_region_get((bp_region)r)->name);
      ck_assert_int_eq(jm_u64(jm_get(reg, "base"), &x), 0);
      ck_assert_uint_eq(x, s.offset);
      ck_assert_int_eq(jm_u64(jm_get(reg, "bytes"), &x), 0);
      ck_assert_uint_eq(x, s.bytes);
    }
    const jm_value *tensors = jm_get(var, "tensors");
    ck_assert_uint_eq(tensors->count, (size_t)bp_plan_tensor_count(p));
    for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
      const jm_value *t = jm_at(tensors, (size_t)id);
      const bp_dtensor *d = bp_plan_tensor(p, v, id);
      ck_assert_uint_eq(t->count, 8);
      for (size_t k = 0; k < 8; k++) ck_assert_str_eq(t->keys[k], tkeys[k]);
      ck_assert_str_eq(jm_get(t, "region")->text, bp_region_get(d->region)->name);
      ck_assert_str_eq(jm_get(t, "dtype")->text, bp_dtype_name(d->dtype));
      const jm_value *shape = jm_get(t, "shape");
      ck_assert_uint_eq(shape->count, 4);
      const int64_t dims[4] = {d->shape.n, d->shape.h, d->shape.w, d->shape.c};
      for (size_t k = 0; k < 4; k++) {
        ck_assert_int_eq(jm_u64(jm_at(shape, k), &x), 0);
        ck_assert_uint_eq(x, (uint64_t)dims[k]);
      }
      ck_assert_int_eq(jm_u64(jm_get(t, "offset"), &x), 0);
      ck_assert_uint_eq(x, d->offset);
      ck_assert_int_eq(jm_u64(jm_get(t, "slot_bytes"), &x), 0);
      ck_assert_uint_eq(x, d->slot_bytes);
      ck_assert_int_eq(jm_u64(jm_get(t, "padded_c"), &x), 0);
      ck_assert_uint_eq(x, (uint64_t)d->padded_c);
    }
    /* the odd name survives: escapes decoded, the bad byte replaced */
    const jm_value *last = jm_at(tensors, tensors->count - 1);
    ck_assert_str_eq(jm_get(last, "name")->text, "t\"q\\b\n\x01\xef\xbf\xbd\xc3\xa9");
  }
  jm_free(doc);
  free(text);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(table_of_a_hand_built_plan) {
  bp_plan *p = hand_plan("tmp");
  bp_plan_print_info info = {"hand", "hand.yaml"};
  size_t len;
  char *text;
  render(bp_plan_print_table, p, &info, &text, &len);
  char want[128];
  snprintf(want, sizeof want, "total arena bytes per rank: %" PRIu64 " (", bp_plan_total_bytes(p));
  ck_assert_msg(strstr(text, want) != NULL, "%s", text);
  ck_assert_msg(strstr(text, "plan of model hand (hand.yaml)") != NULL, "%s", text);
  ck_assert(strstr(text, "E_CONV_FIRST") != NULL); /* ema on */
  ck_assert(strstr(text, "  A_CONV_FIRST ") == NULL); /* amp off: not a row */
  ck_assert(strstr(text, "disabled (amp off)") != NULL);
  /* the shapes of the other variant, only where they differ */
  ck_assert_msg(strstr(text, "[4,10,10,16]") != NULL, "%s", text);
  ck_assert(strstr(text, "[8,6,6,16]") != NULL);
  const char *diff = strstr(text, "shapes in the other variants");
  ck_assert_ptr_nonnull(diff);
  ck_assert(strstr(diff, "conv.w ") == NULL); /* parameters do not differ */
  /* every line ends without blanks */
  for (const char *q = text; (q = strchr(q, '\n')) != NULL; q++) ck_assert(q == text || q[-1] != ' ');
  free(text);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(svg_of_a_hand_built_plan) {
  bp_plan *p = hand_plan("tmp");
  bp_plan_print_info info = {"<odd & \"model\">", NULL};
  size_t len;
  char *text;
  render(bp_plan_print_svg, p, &info, &text, &len);
  ck_assert(strncmp(text, "<svg", 4) == 0);
  ck_assert(strstr(text, "&lt;odd &amp; &quot;model&quot;&gt;") != NULL);
  ck_assert(strstr(text, "<odd") == NULL);
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    char tag[64];
    snprintf(tag, sizeof tag, ">%s<", bp_region_get((bp_region)r)->name);
    int nonempty = bp_plan_region_span(p, (bp_region)r).bytes > 0;
    ck_assert_msg((strstr(text, tag) != NULL) == nonempty, "region %s", tag);
  }
  ck_assert(strstr(text, "</svg>\n") != NULL);
  python_accepts(text, len, PY_XML);
  free(text);

  char *dir = tmp_dir();
  char *good = path_in(dir, "plan.svg"), *tmp = path_in(dir, "plan.svg.tmp");
  ck_assert_int_eq(bp_plan_write_svg(good, p, &info), BP_OK);
  struct stat st;
  ck_assert_int_eq(stat(good, &st), 0);
  ck_assert_int_ne(stat(tmp, &st), 0); /* renamed, not left behind */
  char *bad = path_in(dir, "missing/plan.svg");
  ck_assert_int_eq(bp_plan_write_svg(bad, p, &info), BP_ERR_IO);
  ck_assert_msg(strstr(bp_last_error(), bad) != NULL, "%s", bp_last_error());
  /* a directory in the way: the rename fails and the temporary goes */
  char *sub = path_in(dir, "sub");
  ck_assert_int_eq(mkdir(sub, 0700), 0);
  ck_assert_int_eq(bp_plan_write_svg(sub, p, &info), BP_ERR_IO);
  char *subtmp = path_in(dir, "sub.tmp");
  ck_assert_int_ne(stat(subtmp, &st), 0);
  remove(good);
  rmdir(sub);
  rmdir(dir);
  free(subtmp), free(sub), free(bad), free(tmp), free(good), free(dir);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(printers_survive_an_empty_plan) {
  bp_plan_options o = {0};
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  ck_assert_int_eq(bp_plan_begin_variant(p, "only", 1, 1, 1), BP_OK);
  ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  ck_assert_int_eq(bp_plan_finalize(p), BP_OK);
  size_t len;
  char *text;
  render(print_json_adapter, p, NULL, &text, &len);
  jm_value *doc = jm_parse(text, len, NULL, 0);
  ck_assert_msg(doc != NULL, "%s", text);
  ck_assert_uint_eq(jm_get(jm_at(jm_get(doc, "variants"), 0), "tensors")->count, 0);
  jm_free(doc);
  free(text);
  render(bp_plan_print_table, p, NULL, &text, &len);
  ck_assert(strstr(text, "total arena bytes per rank: 0 (0.00 MiB)\n") != NULL);
  free(text);
  render(bp_plan_print_svg, p, NULL, &text, &len);
  ck_assert(strncmp(text, "<svg", 4) == 0);
  ck_assert(strstr(text, "nan") == NULL && strstr(text, "inf") == NULL);
  python_accepts(text, len, PY_XML);
  free(text);
  bp_plan_destroy(p);
}
END_TEST

/* ---- the executable ----------------------------------------------------- */

/* Names of the shipped models (the .yaml files in models/), NULL-terminated; at least
 * the three the issue asks for. */
static char **shipped_model_names(void) {
  char **names = shipped_models();
  int n = 0;
  for (; names[n]; n++) {
    const char *base = strrchr(names[n], '/') + 1;
    char *name = strndup(base, strlen(base) - 5);
    free(names[n]);
    names[n] = name;
  }
  const char *required[] = {"mlp", "cnn", "resnet8"};
  for (int k = 0; k < 3; k++) {
    int found = 0;
    for (int i = 0; i < n; i++) found |= strcmp(names[i], required[k]) == 0;
    ck_assert_msg(found, "models/%s.yaml is missing", required[k]);
  }
  return names;
}

static void free_names(char **names) {
  for (int i = 0; names[i]; i++) free(names[i]);
  free(names);
}

/* The library's own plan of a model with the model's settings, optionally
 * overridden (0 / -1 keep the model's). */
static bp_plan *library_plan(const char *path, int64_t batch, int amp, int ema, int optimizer,
                             bp_model **model_out) {
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  bp_compile_options o = bp_compile_options_from_model(m);
  if (batch) o.batch = batch;
  if (amp >= 0) o.plan.amp = amp;
  if (ema >= 0) o.plan.ema = ema;
  if (optimizer >= 0) o.plan.optimizer = (bp_optimizer)optimizer;
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &o, &p) == BP_OK, "%s", bp_last_error());
  if (model_out) *model_out = m;
  else bp_model_destroy(m);
  return p;
}

static jm_value *parse_json_output(const run_result *r) {
  char err[128];
  jm_value *doc = jm_parse(r->out, r->out_len, err, sizeof err);
  ck_assert_msg(doc != NULL, "invalid JSON: %s", err);
  python_accepts(r->out, r->out_len, PY_JSON);
  return doc;
}

static uint64_t region_bytes(const jm_value *variant, const char *name) {
  const jm_value *regions = jm_get(variant, "regions");
  for (size_t i = 0; i < regions->count; i++)
    if (strcmp(jm_get(jm_at(regions, i), "name")->text, name) == 0) {
      uint64_t x;
      ck_assert_int_eq(jm_u64(jm_get(jm_at(regions, i), "bytes"), &x), 0);
      return x;
    }
  ck_abort_msg("no region %s", name);
  return 0;
}

START_TEST(every_shipped_model_plans) {
  char **names = shipped_model_names();
  for (int i = 0; names[i]; i++) {
    char *path = model_path(names[i]);
    run_result r = RUN("plan", path);
    ck_assert_msg(r.status == 0, "%s: exit %d: %s", names[i], r.status, r.err);
    ck_assert_msg(r.err_len == 0, "%s: stderr: %s", names[i], r.err);
    bp_plan *p = library_plan(path, 0, -1, -1, -1, NULL);
    char want[128];
    snprintf(want, sizeof want, "\ntotal arena bytes per rank: %" PRIu64 " (%.2f MiB)\n",
             bp_plan_total_bytes(p), (double)bp_plan_total_bytes(p) / 1048576.0);
    ck_assert_msg(strstr(r.out, want) != NULL, "%s: no '%s' in\n%s", names[i], want + 1, r.out);
    /* the total, then what liveness reuse saved */
    const char *after = strstr(r.out, want) + strlen(want);
    ck_assert_msg(strncmp(after, "liveness reuse: on, ", 20) == 0, "%s: %s", names[i], after);
    ck_assert_msg(strstr(after, "\nwithout reuse (--no-reuse): ") != NULL, "%s: %s", names[i], after);
    bp_plan_destroy(p);
    run_free(&r);
    free(path);
  }
  free_names(names);
}
END_TEST

START_TEST(json_matches_the_library_for_every_model) {
  char **names = shipped_model_names();
  for (int i = 0; names[i]; i++) {
    char *path = model_path(names[i]);
    run_result r = RUN("plan", path, "--json");
    ck_assert_msg(r.status == 0 && r.err_len == 0, "%s: exit %d: %s", names[i], r.status, r.err);
    jm_value *doc = parse_json_output(&r);
    bp_model *m = NULL;
    bp_plan *p = library_plan(path, 0, -1, -1, -1, &m);
    /* train, train_last when the epoch does not divide, eval */
    const char *expect[3];
    int ne = 0;
    expect[ne++] = "train";
    if (m->train.train_size % m->train.batch != 0) expect[ne++] = "train_last";
    expect[ne++] = "eval";
    const jm_value *vars = jm_get(doc, "variants");
    ck_assert_ptr_nonnull(vars);
    ck_assert_msg(vars->count == (size_t)ne, "%s: %zu variants", names[i], vars->count);
    for (int v = 0; v < ne; v++) {
      const jm_value *var = jm_at(vars, (size_t)v);
      ck_assert_str_eq(jm_get(var, "name")->text, expect[v]);
      uint64_t total, batch;
      ck_assert_int_eq(jm_u64(jm_get(var, "total_bytes"), &total), 0);
      ck_assert_uint_eq(total, bp_plan_total_bytes(p));
      ck_assert_int_eq(jm_u64(jm_get(var, "batch"), &batch), 0);
      ck_assert_uint_eq(batch, (uint64_t)bp_plan_variant(p, v)->batch);
      ck_assert_uint_eq(jm_get(var, "regions")->count, BP_REGION_COUNT);
      const jm_value *tensors = jm_get(var, "tensors");
      ck_assert_uint_eq(tensors->count, (size_t)bp_plan_tensor_count(p));
      for (size_t t = 0; t < tensors->count; t++) {
        const jm_value *tv = jm_at(tensors, t);
        static const char *const keys[] = {"id", "name", "region", "dtype", "shape", "padded_c", "offset", "slot_bytes"};
        for (size_t k = 0; k < 8; k++) ck_assert_ptr_nonnull(jm_get(tv, keys[k]));
        uint64_t off;
        ck_assert_int_eq(jm_u64(jm_get(tv, "offset"), &off), 0);
        ck_assert_uint_eq(off, bp_plan_tensor(p, v, (int32_t)t)->offset);
      }
    }
    if (ne == 3) { /* the last partial batch */
      uint64_t b;
      ck_assert_int_eq(jm_u64(jm_get(jm_at(vars, 1), "batch"), &b), 0);
      ck_assert_uint_eq(b, (uint64_t)(m->train.train_size % m->train.batch));
    }
    jm_free(doc);
    bp_plan_destroy(p);
    bp_model_destroy(m);
    run_free(&r);
    free(path);
  }
  free_names(names);
}
END_TEST

START_TEST(command_line_overrides_the_model_file) {
  char *path = model_path("cnn");
  /* 60000 % 100 == 0: no train_last */
  run_result r = RUN("plan", path, "--json", "--batch", "100", "--train-size", "60000",
                     "--eval-batch=500");
  ck_assert_msg(r.status == 0, "%s", r.err);
  jm_value *doc = parse_json_output(&r);
  const jm_value *vars = jm_get(doc, "variants");
  ck_assert_uint_eq(vars->count, 2);
  ck_assert_str_eq(jm_get(jm_at(vars, 0), "name")->text, "train");
  ck_assert_str_eq(jm_get(jm_at(vars, 0), "batch")->text, "100");
  ck_assert_str_eq(jm_get(jm_at(vars, 1), "name")->text, "eval");
  ck_assert_str_eq(jm_get(jm_at(vars, 1), "batch")->text, "500");
  jm_free(doc);
  run_free(&r);

  /* 1000 % 128 = 104 */
  r = RUN("plan", path, "--json", "--batch", "128", "--train-size", "1000");
  ck_assert_msg(r.status == 0, "%s", r.err);
  doc = parse_json_output(&r);
  vars = jm_get(doc, "variants");
  ck_assert_uint_eq(vars->count, 3);
  ck_assert_str_eq(jm_get(jm_at(vars, 1), "name")->text, "train_last");
  ck_assert_str_eq(jm_get(jm_at(vars, 1), "batch")->text, "104");
  jm_free(doc);
  run_free(&r);

  /* the switches turn their regions on, and the totals follow the library */
  r = RUN("plan", path, "--json", "--amp", "--ema", "--optimizer", "adamw");
  ck_assert_msg(r.status == 0, "%s", r.err);
  doc = parse_json_output(&r);
  const jm_value *v0 = jm_at(jm_get(doc, "variants"), 0);
  ck_assert_uint_gt(region_bytes(v0, "A_CONV_DEEP"), 0);
  ck_assert_uint_gt(region_bytes(v0, "G16_CONV_DEEP"), 0);
  ck_assert_uint_gt(region_bytes(v0, "E_CONV_DEEP"), 0);
  ck_assert_uint_gt(region_bytes(v0, "V_CONV_DEEP"), 0);
  ck_assert_uint_eq(region_bytes(v0, "N"), 0);
  bp_plan *p = library_plan(path, 0, 1, 1, BP_OPT_ADAMW, NULL);
  uint64_t total;
  ck_assert_int_eq(jm_u64(jm_get(v0, "total_bytes"), &total), 0);
  ck_assert_uint_eq(total, bp_plan_total_bytes(p));
  bp_plan_destroy(p);
  jm_free(doc);
  run_free(&r);

  r = RUN("plan", path, "--json", "--optimizer=lars", "--no-amp", "--no-ema");
  ck_assert_msg(r.status == 0, "%s", r.err);
  doc = parse_json_output(&r);
  v0 = jm_at(jm_get(doc, "variants"), 0);
  ck_assert_uint_gt(region_bytes(v0, "N"), 0);
  ck_assert_uint_eq(region_bytes(v0, "V_CONV_DEEP"), 0);
  ck_assert_uint_eq(region_bytes(v0, "A_CONV_DEEP"), 0);
  jm_free(doc);
  run_free(&r);
  free(path);
}
END_TEST

START_TEST(extra_variants_by_batch_and_resolution) {
  char *path = model_path("resnet8"); /* global pooling: any resolution works */
  run_result r = RUN("plan", path, "--json", "--variants", "hires:64:32x32,small:16");
  ck_assert_msg(r.status == 0, "%s", r.err);
  jm_value *doc = parse_json_output(&r);
  const jm_value *vars = jm_get(doc, "variants");
  const jm_value *hires = NULL, *small = NULL;
  for (size_t i = 0; i < vars->count; i++) {
    const char *name = jm_get(jm_at(vars, i), "name")->text;
    if (strcmp(name, "hires") == 0) hires = jm_at(vars, i);
    if (strcmp(name, "small") == 0) small = jm_at(vars, i);
  }
  ck_assert_ptr_nonnull(hires);
  ck_assert_ptr_nonnull(small);
  ck_assert_str_eq(jm_get(hires, "batch")->text, "64");
  ck_assert_str_eq(jm_get(hires, "height")->text, "32");
  ck_assert_str_eq(jm_get(hires, "width")->text, "32");
  bp_model *m = NULL;
  ck_assert_int_eq(bp_model_load(path, &m), BP_OK);
  uint64_t h;
  ck_assert_int_eq(jm_u64(jm_get(small, "height"), &h), 0);
  ck_assert_uint_eq(h, (uint64_t)m->height); /* no resolution: the model's */
  ck_assert_str_eq(jm_get(small, "batch")->text, "16");
  bp_model_destroy(m);
  jm_free(doc);
  run_free(&r);

  /* the table lists the shapes that differ, per variant */
  r = RUN("plan", path, "--variants=hires:64:32x32");
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert(strstr(r.out, "hires") != NULL);
  ck_assert(strstr(r.out, "[64,32,32,") != NULL);
  run_free(&r);
  free(path);

  /* a resolution the FC layer cannot take is a model error, not a crash */
  path = model_path("cnn");
  r = RUN("plan", path, "--variants", "hires:8:32x32");
  expect_cli_error(&r, 1, "hires", "cnn at 32x32");
  run_free(&r);
  free(path);
}
END_TEST

START_TEST(svg_file_is_written) {
  char **names = shipped_model_names();
  char *dir = tmp_dir();
  for (int i = 0; names[i]; i++) {
    char *path = model_path(names[i]), file[64];
    snprintf(file, sizeof file, "%s.svg", names[i]);
    char *svg = path_in(dir, file);
    run_result r = RUN("plan", path, "--svg", svg);
    ck_assert_msg(r.status == 0 && r.err_len == 0, "%s: %s", names[i], r.err);
    ck_assert(strstr(r.out, "total arena bytes per rank: ") != NULL);
    size_t len;
    char *text = (char *)read_file(svg, &len); /* NUL-terminated */
    ck_assert_msg(text != NULL, "%s was not written", svg);
    ck_assert(strncmp(text, "<svg", 4) == 0);
    python_accepts(text, len, PY_XML);
    bp_plan *p = library_plan(path, 0, -1, -1, -1, NULL);
    for (int reg = 0; reg < BP_REGION_COUNT; reg++) {
      if (bp_plan_region_span(p, (bp_region)reg).bytes == 0) continue;
      ck_assert_msg(strstr(text, bp_region_get((bp_region)reg)->name) != NULL, "%s: no %s",
                    names[i], bp_region_get((bp_region)reg)->name);
    }
    ck_assert(strstr(text, names[i]) != NULL); /* the title names the model */
    char *tmp = malloc(strlen(svg) + 5);
    ck_assert_ptr_nonnull(tmp);
    sprintf(tmp, "%s.tmp", svg);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    remove(svg);
    free(tmp);
    bp_plan_destroy(p);
    free(text);
    run_free(&r);
    free(svg);
    free(path);
  }
  /* with --json the document stays alone on stdout */
  char *path = model_path("mlp"), *svg = path_in(dir, "j.svg");
  run_result r = RUN("plan", path, "--json", "--svg", svg);
  ck_assert_int_eq(r.status, 0);
  jm_free(parse_json_output(&r));
  ck_assert_int_eq(access(svg, F_OK), 0);
  remove(svg);
  run_free(&r);
  /* an unwritable place: one line, exit 1, nothing on stdout */
  char *bad = path_in(dir, "no/such/dir/plan.svg");
  r = RUN("plan", path, "--svg", bad);
  expect_cli_error(&r, 1, bad, "unwritable svg");
  run_free(&r);
  free(bad), free(svg), free(path);
  rmdir(dir);
  free(dir);
  free_names(names);
}
END_TEST

START_TEST(help_goes_to_stdout) {
  run_result r = RUN("plan", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_uint_eq(r.err_len, 0);
  ck_assert(strncmp(r.out, "usage: blueprint plan MODEL", 27) == 0);
  ck_assert(strstr(r.out, "--variants") != NULL);
  run_free(&r);
  r = RUN("plan", "models/whatever.yaml", "-h");
  ck_assert_int_eq(r.status, 0);
  run_free(&r);
}
END_TEST

START_TEST(version_names_the_release_and_the_module_abi) {
  run_result r = RUN("--version");
  ck_assert_int_eq(r.status, 0);
  ck_assert_uint_eq(r.err_len, 0);
  ck_assert_msg(strncmp(r.out, "blueprint 0.", 12) == 0, "%s", r.out);
  ck_assert_ptr_nonnull(strstr(r.out, " (module ABI 1."));
  run_free(&r);
  r = RUN("--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "'blueprint --version'"));
  run_free(&r);
}
END_TEST

START_TEST(bad_command_lines) {
  char *m = model_path("cnn");
  const struct {
    const char *args[6];
    int status;
    const char *needle;
  } cases[] = {
      {{"plan"}, 2, "no model"},
      {{"plan", "--json"}, 2, "no model"},
      {{"plan", m, "--frobnicate"}, 2, "--frobnicate"},
      {{"plan", m, "-x"}, 2, "'-x'"},
      {{"plan", m, "--batch"}, 2, "--batch"},
      {{"plan", m, "--batch", "--json"}, 2, "--batch"},
      {{"plan", m, "--batch", "abc"}, 2, "'abc'"},
      {{"plan", m, "--batch", "-5"}, 2, "'-5'"},
      {{"plan", m, "--batch", "0"}, 2, "'0'"},
      {{"plan", m, "--batch", "12x"}, 2, "'12x'"},
      {{"plan", m, "--batch", " 12"}, 2, "' 12'"},
      {{"plan", m, "--batch", "+12"}, 2, "'+12'"},
      {{"plan", m, "--batch", "99999999999999999999"}, 2, "'99999999999999999999'"},
      {{"plan", m, "--batch="}, 2, "''"},
      {{"plan", m, "--eval-batch", "1.5"}, 2, "'1.5'"},
      {{"plan", m, "--train-size", "0"}, 2, "'0'"},
      {{"plan", m, "--optimizer", "adam"}, 2, "'adam'"},
      {{"plan", m, "--optimizer"}, 2, "--optimizer"},
      {{"plan", m, "--svg"}, 2, "--svg"},
      {{"plan", m, "--svg="}, 2, "--svg"},
      {{"plan", m, "--json=yes"}, 2, "--json=yes"},
      {{"plan", m, "--variants", ""}, 2, "--variants"},
      {{"plan", m, "--variants", "hires"}, 2, "'hires'"},
      {{"plan", m, "--variants", "hires:0"}, 2, "'0'"},
      {{"plan", m, "--variants", "hires:64:32"}, 2, "'32'"},
      {{"plan", m, "--variants", "hires:64:32x"}, 2, "'32x'"},
      {{"plan", m, "--variants", "hires:64:0x32"}, 2, "'0x32'"},
      {{"plan", m, "--variants", ":64"}, 2, "':64'"},
      {{"plan", m, "--variants", "a:1,,b:2"}, 2, "'a:1,,b:2'"},
      {{"plan", m, "--variants", "a:1,"}, 2, "'a:1,'"},
      {{"plan", m, "--variants", "a:1,a:2"}, 2, "'a'"},
      {{"plan", m, "--variants", "eval:64"}, 2, "'eval'"},
      {{"plan", m, "--variants", "train_small:64"}, 2, "'train_small'"},
      {{"plan", m, "--variants", "train_last_small:8"}, 2, "'train_last_small'"},
      {{"plan", m, "--variants", "eval_last:8"}, 2, "'eval_last'"},
      {{"plan", m, "--variants", "h i:3"}, 2, "'h i'"},
      {{"plan", m, "--variants", "hires:64:32x32:9"}, 2, "'32x32:9'"},
      {{"plan", m, m}, 2, m},
      {{"plan", "/nonexistent/model.yaml"}, 1, "/nonexistent/model.yaml"},
      {{"plan", m, "--batch", "9223372036854775807"}, 1, "overflow"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *argv[8] = {0};
    for (int k = 0; k < 6 && cases[i].args[k]; k++) argv[k] = cases[i].args[k];
    run_result r = run_exe("blueprint", argv);
    char what[128];
    snprintf(what, sizeof what, "case %zu (%s %s %s)", i, argv[1] ? argv[1] : "",
             argv[2] ? argv[2] : "", argv[3] ? argv[3] : "");
    expect_cli_error(&r, cases[i].status, cases[i].needle, what);
    run_free(&r);
  }
  free(m);
}
END_TEST

/* "<file>:<line>:<column>" at the start of the message (after the prefix). */
static void expect_position(const run_result *r, const char *file, const char *what) {
  char pattern[1024];
  snprintf(pattern, sizeof pattern, "^blueprint plan: %s:[0-9]+:[0-9]+: ", file);
  regex_t re;
  ck_assert_int_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
  ck_assert_msg(regexec(&re, r->err, 0, NULL, 0) == 0, "%s: no file:line:column in [%s]", what,
                r->err);
  regfree(&re);
}

START_TEST(bad_model_files_name_file_line_column) {
  const struct {
    const char *file, *text, *needle;
  } cases[] = {
      {"syntax.yaml",
       "name: bad\ninput: {height: 8, width: 8, channels: 1, classes: 10\nlayers: []\n", ""},
      {"unknown_layer.yaml",
       "name: bad\ninput: {height: 8, width: 8, channels: 1, classes: 10}\nlayers:\n"
       "  - {type: conv, filters: 4, kernel: 3, pad: 1}\n  - {type: teleport}\n"
       "  - {type: fc, units: 10}\n  - {type: softmax_ce}\n",
       "teleport"},
      {"big_kernel.yaml",
       "name: bad\ninput: {height: 4, width: 4, channels: 1, classes: 10}\nlayers:\n"
       "  - {type: conv, name: huge, filters: 4, kernel: 7, pad: 1}\n"
       "  - {type: fc, units: 10}\n  - {type: softmax_ce}\n",
       "huge"},
      {"unknown_field.yaml",
       "name: bad\ninput: {height: 8, width: 8, channels: 1, classes: 10}\nlayers:\n"
       "  - {type: fc, units: 10, colour: blue}\n  - {type: softmax_ce}\n",
       "colour"},
  };
  char *dir = tmp_dir();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *path = write_temp(dir, cases[i].file, cases[i].text);
    run_result r = RUN("plan", path);
    expect_cli_error(&r, 1, cases[i].needle, cases[i].file);
    expect_position(&r, path, cases[i].file);
    /* --json and --svg fail the same way, and leave no picture behind */
    char *svg = path_in(dir, "never.svg");
    run_result j = RUN("plan", path, "--json", "--svg", svg);
    expect_cli_error(&j, 1, cases[i].needle, cases[i].file);
    ck_assert_int_ne(access(svg, F_OK), 0);
    run_free(&j);
    free(svg);
    run_free(&r);
    remove(path);
    free(path);
  }
  rmdir(dir);
  free(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cli");
  TCase *printers = tcase_create("printers");
  tcase_add_test(printers, formats_sizes_counts_and_empty_regions);
  tcase_add_test(printers, json_of_a_hand_built_plan_is_valid_and_exact);
  tcase_add_test(printers, table_of_a_hand_built_plan);
  tcase_add_test(printers, svg_of_a_hand_built_plan);
  tcase_add_test(printers, printers_survive_an_empty_plan);
  suite_add_tcase(s, printers);
  TCase *cli = tcase_create("blueprint plan");
  tcase_set_timeout(cli, 300); /* dozens of runs, slow under sanitizers */
  tcase_add_test(cli, every_shipped_model_plans);
  tcase_add_test(cli, json_matches_the_library_for_every_model);
  tcase_add_test(cli, command_line_overrides_the_model_file);
  tcase_add_test(cli, extra_variants_by_batch_and_resolution);
  tcase_add_test(cli, svg_file_is_written);
  tcase_add_test(cli, help_goes_to_stdout);
  tcase_add_test(cli, version_names_the_release_and_the_module_abi);
  tcase_add_test(cli, bad_command_lines);
  tcase_add_test(cli, bad_model_files_name_file_line_column);
  suite_add_tcase(s, cli);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
