/* Kernel selection: pins and globs, supports() falling through, REFERENCE
 * as a last resort, deterministic ties, errors that name the node, and
 * autotune with its cache (tests/modules/sel.c, tie.c, tune.c). */
#include <check.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blueprint/autotune.h"
#include "blueprint/registry.h"
#include "test_module.h"

static const char *module_path(const char *dir, const char *name) {
  static char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s/%s.so", BP_TEST_MODULES, dir, name);
  return path;
}

/* A registry with modules a and b (NULL: none) of dir, and default pins
 * (registry options; the CLI's BP_KERNELS), NULL for none. */
static bp_registry *load_pinned(const char *dir, const char *a, const char *b, const char *pins) {
  bp_registry *r = NULL;
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  ro.pins = pins;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  ck_assert_int_eq(bp_registry_load(r, module_path(dir, a)), BP_OK);
  if (b) ck_assert_int_eq(bp_registry_load(r, module_path(dir, b)), BP_OK);
  ck_assert_int_eq(bp_autotune_install(r), BP_OK);
  return r;
}

static bp_registry *load(const char *dir, const char *a, const char *b) {
  return load_pinned(dir, a, b, NULL);
}

/* One node: every tensor the same dtype and NHWC shape. */
typedef struct node {
  bp_abi_tensor t[3];
  float data[3][64];
  const void *in[3];
  void *out[3];
  bp_abi_kernel_args args;
} node;

static void node_init(node *nd, int inputs, int outputs, int dtype, int64_t n, int64_t c,
                      int with_pointers) {
  memset(nd, 0, sizeof *nd);
  for (int i = 0; i < 3; i++) {
    nd->t[i] = (bp_abi_tensor){sizeof(bp_abi_tensor), dtype, {n, 1, 1, c}, c, {c, c, c, 1}, 256};
    nd->in[i] = nd->data[i];
    nd->out[i] = nd->data[i];
  }
  nd->args = (bp_abi_kernel_args){.struct_size = sizeof nd->args,
                                  .num_inputs = inputs,
                                  .num_outputs = outputs,
                                  .inputs = nd->t,
                                  .outputs = nd->t + inputs,
                                  .input_ptrs = with_pointers ? nd->in : NULL,
                                  .output_ptrs = with_pointers ? nd->out + inputs : NULL,
                                  .world_size = 1};
}

/* Selects relu.fwd on cpu for dtype / N / C; returns the impl or NULL. */
static const char *pick(bp_registry *r, const char *op, int dtype, int64_t n, int64_t c,
                        const bp_select_options *o, bp_status expect) {
  node nd;
  node_init(&nd, bp_registry_find_op(r, op)->num_inputs, bp_registry_find_op(r, op)->num_outputs,
            dtype, n, c, 0);
  const bp_registered_kernel *k = NULL;
  bp_status st = bp_registry_select(r, op, "cpu", &nd.args, o, &k);
  ck_assert_msg(st == expect, "select %s: status %d, expected %d: %s", op, st, expect,
                bp_last_error());
  return st == BP_OK ? k->kernel.impl : NULL;
}

#define FP32 BP_ABI_DTYPE_FP32
#define FP16 BP_ABI_DTYPE_FP16
static const bp_select_options no_pins = {.pins = ""};

START_TEST(reference_is_held_back_when_another_kernel_supports) {
  bp_registry *r = load("select", "sel", NULL);
  char report[2048];
  bp_select_options o = {.pins = NULL, .report = report, .report_size = sizeof report};
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 16, &o, BP_OK), "fast");
  ck_assert_ptr_nonnull(strstr(report, "ref (priority 0): reference, held back"));
  ck_assert_ptr_nonnull(strstr(report, "fast (priority 10): picked"));
  ck_assert_ptr_nonnull(strstr(report, "mid (priority 5): supports the node, not picked"));
  ck_assert_ptr_nonnull(strstr(report, "half (priority 20): does not support"));
  bp_registry_destroy(r);
}
END_TEST

START_TEST(supports_falls_through_and_keeps_the_reason) {
  bp_registry *r = load("select", "sel", NULL);
  char report[2048];
  bp_select_options o = {.pins = "", .report = report, .report_size = sizeof report};
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 3, &o, BP_OK), "mid");
  ck_assert_ptr_nonnull(strstr(report, "fast (priority 10): does not support the node: C=3 is "
                                       "not a multiple of 8"));
  /* nothing but the reference supports: it is picked */
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 100, 3, &o, BP_OK), "ref");
  ck_assert_ptr_nonnull(strstr(report, "batch N=100 is over 64"));
  /* dtype masks: only half and ref take fp16, and ref is held back */
  ck_assert_str_eq(pick(r, "relu.fwd", FP16, 8, 3, &o, BP_OK), "half");
  ck_assert_ptr_nonnull(strstr(report, "fast (priority 10): does not support the node: input 0 "
                                       "is fp16; the kernel takes fp32"));
  /* the only kernel of an op is a reference kernel */
  ck_assert_str_eq(pick(r, "add.fwd", FP32, 8, 3, &no_pins, BP_OK), "ref");
  bp_registry_destroy(r);
}
END_TEST

START_TEST(unsupported_node_names_op_shapes_and_every_reason) {
  bp_registry *r = load("select", "sel", NULL);
  ck_assert_ptr_null(pick(r, "relu.fwd", BP_ABI_DTYPE_INT8, 8, 3, &no_pins, BP_ERR_UNSUPPORTED));
  const char *e = bp_last_error();
  static const char *const parts[] = {
      "relu.fwd", "cpu", "int8[8,1,1,3]", "ref: input 0 is int8; the kernel takes fp32,fp16",
      "fast: input 0 is int8", "mid: input 0 is int8", "half: input 0 is int8"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    ck_assert_msg(strstr(e, parts[i]) != NULL, "'%s' lacks '%s'", e, parts[i]);
  /* no kernel for the op on that device at all */
  node nd;
  node_init(&nd, 1, 1, FP32, 8, 8, 0);
  const bp_registered_kernel *k = (const bp_registered_kernel *)0x1;
  ck_assert_int_eq(bp_registry_select(r, "relu.fwd", "cuda", &nd.args, &no_pins, &k),
                   BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "no kernel for relu.fwd on device 'cuda'"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "exist on: cpu"));
  ck_assert_ptr_eq(k, (const bp_registered_kernel *)0x1); /* untouched on failure */
  node_init(&nd, 2, 1, FP32, 8, 8, 0);
  ck_assert_int_eq(bp_registry_select(r, "relu.fwd", "cpu", &nd.args, &no_pins, &k),
                   BP_ERR_INVALID); /* 2 inputs given, relu takes 1 */
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "relu.fwd takes at most 1 inputs"));
  ck_assert_int_eq(bp_registry_select(r, "nope.fwd", "cpu", &nd.args, &no_pins, &k),
                   BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "unknown op 'nope.fwd'"));
  /* fewer tensors than the op's most (an optional bias left out) is fine */
  node_init(&nd, 1, 1, FP32, 8, 8, 0);
  ck_assert_int_eq(bp_registry_select(r, "relu.bwd", "cpu", &nd.args, &no_pins, &k),
                   BP_ERR_UNSUPPORTED); /* valid node, but sel.so has no relu.bwd kernel */
  bp_registry_destroy(r);
}
END_TEST

START_TEST(pins_from_the_registry_and_options_with_globs) {
  /* the registry's default pins: the library never reads BP_KERNELS */
  setenv("BP_KERNELS", "relu.*=ref", 1);
  bp_registry *r = load_pinned("select", "sel", NULL, " r?lu.f*=mid,");
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 16, NULL, BP_OK), "mid");
  /* a pinned REFERENCE kernel is taken: the user asked for it */
  bp_select_options o = {.pins = "relu.fwd@cpu=ref"};
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 16, &o, BP_OK), "ref");
  /* options replace the registry's pins; "" means no pins */
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 16, &no_pins, BP_OK), "fast");
  /* a pin for another device does not apply; the first match wins
   * (plugins/nodev.so has relu.fwd kernels on "npu") */
  ck_assert_int_eq(bp_registry_load(r, module_path("plugins", "nodev")), BP_OK);
  o.pins = "relu.fwd@npu=npu,*=mid,relu.fwd=fast";
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 16, &o, BP_OK), "mid");
  bp_registry_destroy(r);
  r = load("select", "sel", NULL); /* no default pins */
  ck_assert_str_eq(pick(r, "relu.fwd", FP32, 8, 16, NULL, BP_OK), "fast");
  bp_registry_destroy(r);
  unsetenv("BP_KERNELS");
}
END_TEST

START_TEST(pinned_kernel_that_cannot_run_the_node_is_an_error) {
  bp_registry *r = load("select", "sel", NULL);
  bp_select_options o = {.pins = "relu.fwd=fast"};
  ck_assert_ptr_null(pick(r, "relu.fwd", FP32, 8, 3, &o, BP_ERR_UNSUPPORTED));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "pinned by 'relu.fwd=fast'"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "C=3 is not a multiple of 8"));
  bp_registry *pinned = load_pinned("select", "sel", NULL, "relu.*=nope");
  ck_assert_ptr_null(pick(pinned, "relu.fwd", FP32, 8, 16, NULL, BP_ERR_UNSUPPORTED));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "BP_KERNELS"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "there are: ref, fast, mid, half"));
  bp_registry_destroy(pinned);
  static const char *const malformed[] = {"relu.fwd", "=fast", "relu.fwd=", "relu.fwd=a b",
                                          "ok=fast,broken"};
  for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
    o.pins = malformed[i];
    ck_assert_ptr_null(pick(r, "relu.fwd", FP32, 8, 16, &o, BP_ERR_INVALID));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "OP_GLOB=IMPL"));
  }
  bp_registry_destroy(r);
}
END_TEST

/* Every pin list is checked against every registered kernel, whichever
 * node asks: nothing a user pins is silently ignored (registry.h). */
START_TEST(pins_that_match_nothing_are_errors_and_dead_pins_warnings) {
  bp_registry *r = load("select", "sel", NULL);
  char w[1024];
  /* a glob that matches no op with a kernel, on any device */
  static const char *const nothing[] = {"conv2d.*=ref", "relu.fwd@cuda=ref", "rleu.fwd=fast"};
  for (size_t i = 0; i < sizeof nothing / sizeof nothing[0]; i++) {
    ck_assert_int_eq(bp_registry_check_pins(r, nothing[i], "test", w, sizeof w), BP_ERR_INVALID);
    ck_assert_msg(strstr(bp_last_error(), "matches no op that has a kernel") &&
                      strstr(bp_last_error(), nothing[i]) && strstr(bp_last_error(), "(test)"),
                  "%s: %s", nothing[i], bp_last_error());
    /* selecting any node, even one the pin is not about, fails the same way */
    bp_select_options o = {.pins = nothing[i]};
    ck_assert_ptr_null(pick(r, "add.fwd", FP32, 8, 16, &o, BP_ERR_INVALID));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "matches no op that has a kernel"));
  }
  /* an impl that no matched op has: named, with the impls there are */
  ck_assert_int_eq(bp_registry_check_pins(r, "relu.*=nope", "test", w, sizeof w),
                   BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "names no registered kernel 'nope'"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "there are: ref, fast, mid, half"));
  /* a pin that never applies: earlier pins with another impl cover it */
  ck_assert_int_eq(bp_registry_check_pins(r, "relu.*=mid, relu.fwd@cpu=fast", "test", w, sizeof w),
                   BP_OK);
  ck_assert_msg(strstr(w, "pin 'relu.fwd@cpu=fast' (test) never applies") &&
                    strstr(w, "pinned first by 'relu.*=mid'"),
                "warnings: %s", w);
  ck_assert_ptr_eq(strchr(w, '\n'), w + strlen(w) - 1); /* one line */
  /* fine: a broader pin that still applies somewhere, a repeat of the
   * same impl, and no pins at all */
  static const char *const fine[] = {"relu.fwd=fast,*=ref", "relu.*=mid,relu.fwd=mid", "",
                                     "add.fwd=ref,,"};
  for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
    ck_assert_msg(bp_registry_check_pins(r, fine[i], "test", w, sizeof w) == BP_OK, "%s: %s",
                  fine[i], bp_last_error());
    ck_assert_msg(w[0] == '\0', "%s warned: %s", fine[i], w);
  }
  /* malformed, and too many */
  ck_assert_int_eq(bp_registry_check_pins(r, "relu.fwd", "test", NULL, 0), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "OP_GLOB=IMPL"));
  char many[2048] = "";
  for (int i = 0; i < 33; i++) strcat(many, "relu.fwd=ref,");
  ck_assert_int_eq(bp_registry_check_pins(r, many, "test", NULL, 0), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "more than 32 pins"));
  bp_registry_destroy(r);
}
END_TEST

/* One place decides where pins come from: option > the registry's default
 * pins (the CLI's BP_KERNELS) > model. */
START_TEST(pin_precedence_is_option_then_environment_then_model) {
  bp_pin_source src = BP_PINS_MODEL;
  setenv("BP_KERNELS", "fc.*=x", 1); /* never read by the library */
  ck_assert_str_eq(bp_pins_resolve(NULL, NULL, &src), "");
  ck_assert_int_eq(src, BP_PINS_NONE);
  ck_assert_str_eq(bp_pins_resolve(NULL, "", &src), "");
  ck_assert_int_eq(src, BP_PINS_NONE);
  ck_assert_str_eq(bp_pins_resolve(NULL, "fc.*=m", &src), "fc.*=m");
  ck_assert_int_eq(src, BP_PINS_MODEL);
  ck_assert_str_eq(bp_pin_source_name(src), "model file");
  unsetenv("BP_KERNELS");
  bp_registry *r = NULL, *bare = NULL;
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  ro.pins = "fc.*=e";
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  ck_assert_int_eq(bp_registry_create(&bare), BP_OK);
  ck_assert_str_eq(bp_registry_resolve_pins(bare, NULL, "fc.*=m", &src), "fc.*=m");
  ck_assert_int_eq(src, BP_PINS_MODEL);
  ck_assert_str_eq(bp_registry_resolve_pins(r, NULL, "fc.*=m", &src), "fc.*=e");
  ck_assert_int_eq(src, BP_PINS_ENV);
  ck_assert_str_eq(bp_pin_source_name(src), "BP_KERNELS");
  ck_assert_str_eq(bp_registry_resolve_pins(r, "fc.*=o", "fc.*=m", &src), "fc.*=o");
  ck_assert_int_eq(src, BP_PINS_OPTION);
  /* an empty option means "no pins", hiding the registry's */
  ck_assert_str_eq(bp_registry_resolve_pins(r, "", "fc.*=m", &src), "");
  ck_assert_int_eq(src, BP_PINS_OPTION);
  bp_registry_destroy(r);
  bp_registry_destroy(bare);
}
END_TEST

START_TEST(equal_priorities_break_by_load_order) {
  bp_registry *xy = load("select", "tie_x", "tie_y");
  bp_registry *yx = load("select", "tie_y", "tie_x");
  node nd;
  node_init(&nd, 2, 1, FP32, 4, 4, 0);
  for (int round = 0; round < 3; round++) {
    const bp_registered_kernel *k = NULL;
    ck_assert_int_eq(bp_registry_select(xy, "relu.bwd", "cpu", &nd.args, &no_pins, &k), BP_OK);
    ck_assert_str_eq(k->kernel.impl, "x");
    ck_assert_int_eq(bp_registry_select(yx, "relu.bwd", "cpu", &nd.args, &no_pins, &k), BP_OK);
    ck_assert_str_eq(k->kernel.impl, "y");
  }
  ck_assert_str_eq(bp_registry_kernel(xy, 0)->kernel.impl, "x"); /* listed in load order */
  ck_assert_str_eq(bp_registry_default_kernel(yx, "relu.bwd", "cpu")->kernel.impl, "y");
  bp_registry_destroy(xy);
  bp_registry_destroy(yx);
}
END_TEST

START_TEST(default_kernel_follows_priority_and_reference_rules) {
  bp_registry *r = load("select", "sel", NULL);
  ck_assert_str_eq(bp_registry_default_kernel(r, "relu.fwd", "cpu")->kernel.impl, "half");
  ck_assert_str_eq(bp_registry_default_kernel(r, "add.fwd", "cpu")->kernel.impl, "ref");
  ck_assert_ptr_null(bp_registry_default_kernel(r, "relu.fwd", "cuda"));
  ck_assert_ptr_null(bp_registry_default_kernel(r, "conv2d.fwd", "cpu"));
  bp_registry_destroy(r);
}
END_TEST

/* ---- autotune ------------------------------------------------------------ */

static char tmp_dir[PATH_MAX], cache_path[PATH_MAX + 16];

static void make_tmp(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "%s/tune-XXXXXX", BP_TEST_MODULES);
  ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
  snprintf(cache_path, sizeof cache_path, "%s/cache.txt", tmp_dir);
}

static void remove_tmp(void) {
  unlink(cache_path);
  rmdir(tmp_dir);
}

static int files_in_tmp(void) {
  DIR *d = opendir(tmp_dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static char *read_cache(void) {
  static char text[4096];
  FILE *f = fopen(cache_path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

/* Selects add.fwd with autotune; returns the module's counters. */
static tm_stats *tune(bp_registry *r, const char *device, const char *cache, const char *expect,
                      char *report, size_t report_size) {
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 1);
  bp_select_options o = {.pins = "", .autotune = 1, .autotune_cache = cache, .report = report,
                         .report_size = report_size};
  const bp_registered_kernel *k = NULL;
  ck_assert_msg(bp_registry_select(r, "add.fwd", device, &nd.args, &o, &k) == BP_OK, "%s",
                bp_last_error());
  ck_assert_str_eq(k->kernel.impl, expect);
  return k->kernel.user;
}

/* Selection is a pure pass: with no tuner installed it times nothing,
 * runs no kernel and writes no file, and asking it to autotune is a state
 * error naming what to install. */
START_TEST(autotune_without_a_tuner_runs_nothing_and_names_the_hook) {
  make_tmp();
  bp_registry *r = load("tune_a", "tune", NULL);
  ck_assert_ptr_nonnull(bp_registry_tuner(r));
  ck_assert_int_eq(bp_registry_set_tuner(r, NULL), BP_OK);
  ck_assert_ptr_null(bp_registry_tuner(r));
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 1);
  bp_select_options o = {.pins = "", .autotune = 1, .autotune_cache = cache_path};
  const bp_registered_kernel *k = NULL;
  ck_assert_int_eq(bp_registry_select(r, "add.fwd", "cpu", &nd.args, &o, &k), BP_ERR_STATE);
  ck_assert_ptr_null(k);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "no tuner is installed"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "bp_autotune_install"));
  /* no kernel ran, no cache file was written */
  o.autotune = 0;
  ck_assert_int_eq(bp_registry_select(r, "add.fwd", "cpu", &nd.args, &o, &k), BP_OK);
  const tm_stats *s = k->kernel.user;
  ck_assert_int_eq(s->runs[0] + s->runs[1], 0);
  ck_assert_int_eq(files_in_tmp(), 0);
  /* installing twice keeps one autotuner */
  ck_assert_int_eq(bp_autotune_install(r), BP_OK);
  const bp_select_tuner *t = bp_registry_tuner(r);
  ck_assert_int_eq(bp_autotune_install(r), BP_OK);
  ck_assert_ptr_eq(bp_registry_tuner(r)->ctx, t->ctx);
  bp_registry_destroy(r);
  remove_tmp();
}
END_TEST

START_TEST(autotune_picks_the_faster_kernel_and_writes_the_cache) {
  make_tmp();
  bp_registry *r = load("tune_a", "tune", NULL);
  /* without autotune, priority picks the slow kernel */
  ck_assert_str_eq(pick(r, "add.fwd", FP32, 1, 4, &no_pins, BP_OK), "slow");
  char report[2048];
  tm_stats *s = tune(r, "cpu", cache_path, "quick", report, sizeof report);
  ck_assert_int_ge(s->runs[0], 2); /* warm-up and timed runs */
  ck_assert_int_ge(s->runs[1], 2);
  ck_assert_ptr_nonnull(strstr(report, "monotonic clock"));
  ck_assert_ptr_nonnull(strstr(report, "quick (priority 0): picked (autotuned)"));
  const char *text = read_cache();
  ck_assert_msg(strstr(text, "add.fwd@cpu;in=fp32[1,1,1,4],fp32[1,1,1,4];out=fp32[1,1,1,4];"
                             "attr=v0:cbf29ce484222325;world=1 quick tune-a ") != NULL,
                "cache:\n%s", text);
  /* the candidates' times alone, as the report gave them (cache v2) */
  const char *times = strstr(text, " tune-a ") + strlen(" tune-a ");
  ck_assert_msg(strstr(times, "quick=") && strstr(times, "slow=") && strchr(times, ','),
                "cache:\n%s", text);
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 1);
  char got[256];
  ck_assert_int_eq(bp_autotune_node_times(r, "add.fwd", "cpu", &nd.args, got, sizeof got), BP_OK);
  ck_assert_int_eq(strncmp(times, got, strlen(got)), 0);
  ck_assert_int_eq(times[strlen(got)], '\n');
  ck_assert_int_eq(files_in_tmp(), 1); /* no temporary file left behind */
  bp_registry_destroy(r);
  remove_tmp();
}
END_TEST

START_TEST(autotune_cache_is_reused_and_invalidated_by_a_new_build_id) {
  make_tmp();
  char report[2048];
  bp_registry *r = load("tune_a", "tune", NULL);
  (void)tune(r, "cpu", cache_path, "quick", report, sizeof report);
  bp_registry_destroy(r);

  /* next run: the cached winner, nothing timed */
  r = load("tune_a", "tune", NULL);
  const tm_stats *s = bp_registry_kernel(r, 0)->kernel.user;
  int quick = s->runs[0], slow = s->runs[1];
  ck_assert_ptr_eq(tune(r, "cpu", cache_path, "quick", report, sizeof report), s);
  ck_assert_int_eq(s->runs[0], quick);
  ck_assert_int_eq(s->runs[1], slow);
  ck_assert_ptr_nonnull(strstr(report, "autotune: quick from the cache"));
  bp_registry_destroy(r);

  /* a rebuilt module: its build id differs, so the node is timed again */
  r = load("tune_b", "tune", NULL);
  s = bp_registry_kernel(r, 0)->kernel.user;
  slow = s->runs[1];
  (void)tune(r, "cpu", cache_path, "quick", report, sizeof report);
  ck_assert_int_gt(s->runs[1], slow);
  ck_assert_ptr_nonnull(strstr(report, "was built as 'tune-a', the loaded module is 'tune-b'"));
  const char *text = read_cache();
  ck_assert_ptr_nonnull(strstr(text, " quick tune-b slow="));
  ck_assert_ptr_null(strstr(text, "tune-a"));
  bp_registry_destroy(r);
  remove_tmp();
}
END_TEST

/* Autotune times on the device the node runs on (bp_select_options
 * device_index), not on the one its rank number names. */
START_TEST(autotune_uses_the_nodes_device_index) {
  bp_registry *r = load("tune_a", "tune", NULL);
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 1);
  nd.args.rank = 0;
  char report[2048];
  bp_select_options o = {.pins = "", .autotune = 1, .report = report,
                         .report_size = sizeof report, .device_index = 1};
  const bp_registered_kernel *k = NULL;
  ck_assert_msg(bp_registry_select(r, "add.fwd", "tunedev", &nd.args, &o, &k) == BP_OK, "%s",
                bp_last_error());
  tm_stats *s = k->kernel.user;
  ck_assert_int_gt(s->event_records, 0);
  ck_assert_int_eq(s->last_device, 1);
  bp_registry_destroy(r);
}
END_TEST

/* Writes text as the cache file. */
static void put_cache(const char *text) {
  FILE *f = fopen(cache_path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* Selecting add.fwd with autotune over the cache file fails with `status`
 * and a message holding `needle`, the file left as it was. */
static void tune_refused(bp_registry *r, bp_status status, const char *needle) {
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 1);
  bp_select_options o = {.pins = "", .autotune = 1, .autotune_cache = cache_path};
  const bp_registered_kernel *k = NULL;
  ck_assert_int_eq(bp_registry_select(r, "add.fwd", "cpu", &nd.args, &o, &k), status);
  ck_assert_msg(strstr(bp_last_error(), needle) != NULL, "want '%s': %s", needle, bp_last_error());
}

/* The cache file is read through the checked open (a FIFO or a device is
 * refused at once, never read forever) and a line that does not parse is
 * refused at load, naming FILE:LINE; a good cache of 200,000 lines loads
 * and is searched by hash (a strcmp per line took minutes). */
START_TEST(autotune_cache_is_checked_at_open_and_malformed_lines_are_refused) {
  make_tmp();
  bp_registry *r = load("tune_a", "tune", NULL);
  put_cache("garbage-in-one-field\n");
  tune_refused(r, BP_ERR_PARSE, "cache.txt:1: malformed line");
  put_cache("\n# a comment\nx y z extra\n");
  tune_refused(r, BP_ERR_PARSE, "cache.txt:3: malformed line");
  ck_assert_str_eq(read_cache(), "\n# a comment\nx y z extra\n"); /* not rewritten */
  unlink(cache_path);
  ck_assert_int_eq(mkfifo(cache_path, 0600), 0);
  tune_refused(r, BP_ERR_IO, "not a regular file (a FIFO)");
  unlink(cache_path);
  ck_assert_int_eq(symlink("/dev/zero", cache_path), 0);
  tune_refused(r, BP_ERR_IO, "not a regular file (a character device)");
  unlink(cache_path);
  FILE *f = fopen(cache_path, "w");
  ck_assert_ptr_nonnull(f);
  for (int k = 0; k < 200000; k++) fprintf(f, "sig%d@cpu;in=x quick tune-a\n", k);
  fclose(f);
  const time_t t0 = time(NULL);
  char report[2048];
  (void)tune(r, "cpu", cache_path, "quick", report, sizeof report);
  ck_assert_msg(time(NULL) - t0 < 20, "200,000 lines took %lld s", (long long)(time(NULL) - t0));
  bp_registry_destroy(r);
  remove_tmp();
}
END_TEST

#define ADD_SIG                                                                          \
  "add.fwd@cpu;in=fp32[1,1,1,4],fp32[1,1,1,4];out=fp32[1,1,1,4];attr=v0:cbf29ce484222325;" \
  "world=1"

/* Cache lines of format v1 (no times) still load; v2 times come back in
 * the report and through bp_autotune_node_times, survive a rewrite, and a
 * times field that does not parse is refused naming FILE:LINE. */
START_TEST(autotune_cache_keeps_the_times_and_loads_v1_lines) {
  make_tmp();
  bp_registry *r = load("tune_a", "tune", NULL);
  const tm_stats *s = bp_registry_kernel(r, 0)->kernel.user;
  const int quick = s->runs[0], slow = s->runs[1];
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 1);
  char report[2048], got[256];
  put_cache("# blueprint autotune cache v1: signature impl build_id\n" ADD_SIG " quick tune-a\n");
  (void)tune(r, "cpu", cache_path, "quick", report, sizeof report);
  ck_assert_ptr_nonnull(strstr(report, "autotune: quick from the cache"));
  ck_assert_int_eq(bp_autotune_node_times(r, "add.fwd", "cpu", &nd.args, got, sizeof got), BP_OK);
  ck_assert_str_eq(got, "");
  bp_registry_destroy(r);

  r = load("tune_a", "tune", NULL);
  put_cache(ADD_SIG " quick tune-a quick=0.5,slow=2.25\nother@cpu;in=x slow tune-a slow=1\n");
  (void)tune(r, "cpu", cache_path, "quick", report, sizeof report);
  ck_assert_msg(strstr(report, "from the cache") && strstr(report, "quick=0.5,slow=2.25"), "%s",
                report);
  ck_assert_int_eq(bp_autotune_node_times(r, "add.fwd", "cpu", &nd.args, got, sizeof got), BP_OK);
  ck_assert_str_eq(got, "quick=0.5,slow=2.25");
  s = bp_registry_kernel(r, 0)->kernel.user;
  ck_assert_int_eq(s->runs[0], quick); /* nothing timed */
  ck_assert_int_eq(s->runs[1], slow);
  bp_registry_destroy(r);

  /* a rebuilt module times the node again and rewrites the file: the
   * other line keeps its times */
  r = load("tune_b", "tune", NULL);
  (void)tune(r, "cpu", cache_path, "quick", report, sizeof report);
  const char *text = read_cache();
  ck_assert_msg(strstr(text, "\nother@cpu;in=x slow tune-a slow=1\n") != NULL, "%s", text);
  ck_assert_msg(strstr(text, " quick tune-b slow=") != NULL, "%s", text);
  ck_assert_msg(strstr(text, "v2: signature impl build_id [impl=ms,...]") != NULL, "%s", text);
  bp_registry_destroy(r);

  r = load("tune_a", "tune", NULL);
  const char *bad[] = {"quick=abc", "quick=-1", "=1", "quick=1,", "quick=1,slow",
                       "quick=1;slow=2", "quick=nan", "quick=1 extra"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text2[512];
    snprintf(text2, sizeof text2, "# c\n" ADD_SIG " quick tune-a %s\n", bad[i]);
    put_cache(text2);
    tune_refused(r, BP_ERR_PARSE, "cache.txt:2: malformed line");
  }
  bp_registry_destroy(r);
  remove_tmp();
}
END_TEST

START_TEST(autotune_times_with_device_events_and_tolerates_a_missing_cache) {
  make_tmp();
  bp_registry *r = load("tune_a", "tune", NULL);
  char report[2048];
  tm_stats *s = tune(r, "tunedev", cache_path, "quick", report, sizeof report);
  ck_assert_int_gt(s->event_records, 0);
  ck_assert_int_ge(s->runs[2], 2);
  ck_assert_int_ge(s->runs[3], 2); /* slow got its workspace from the device */
  ck_assert_int_eq(s->runs[0] + s->runs[1], 0);
  ck_assert_ptr_nonnull(strstr(report, "device events"));
  ck_assert_ptr_nonnull(strstr(read_cache(), "add.fwd@tunedev;"));
  /* no cache file: tuned once, then remembered in memory */
  int slow = s->runs[1];
  (void)tune(r, "cpu", NULL, "quick", report, sizeof report);
  ck_assert_int_gt(s->runs[1], slow);
  slow = s->runs[1];
  (void)tune(r, "cpu", NULL, "quick", report, sizeof report);
  ck_assert_int_eq(s->runs[1], slow);
  /* without pointers there is nothing to time */
  node nd;
  node_init(&nd, 2, 1, FP32, 1, 4, 0);
  bp_select_options o = {.pins = "", .autotune = 1};
  const bp_registered_kernel *k = NULL;
  ck_assert_int_eq(bp_registry_select(r, "add.fwd", "cpu", &nd.args, &o, &k), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "real pointers"));
  /* an unwritable cache is an error naming the file */
  o = (bp_select_options){.pins = "", .autotune = 1,
                          .autotune_cache = "/nonexistent/dir/cache.txt"};
  node_init(&nd, 2, 1, FP32, 1, 8, 1);
  ck_assert_int_eq(bp_registry_select(r, "add.fwd", "cpu", &nd.args, &o, &k), BP_ERR_IO);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "/nonexistent/dir/cache.txt"));
  bp_registry_destroy(r);
  remove_tmp();
}
END_TEST

int main(void) {
  Suite *s = suite_create("select");
  TCase *tc = tcase_create("select");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, reference_is_held_back_when_another_kernel_supports);
  tcase_add_test(tc, supports_falls_through_and_keeps_the_reason);
  tcase_add_test(tc, unsupported_node_names_op_shapes_and_every_reason);
  tcase_add_test(tc, pins_from_the_registry_and_options_with_globs);
  tcase_add_test(tc, pinned_kernel_that_cannot_run_the_node_is_an_error);
  tcase_add_test(tc, pins_that_match_nothing_are_errors_and_dead_pins_warnings);
  tcase_add_test(tc, pin_precedence_is_option_then_environment_then_model);
  tcase_add_test(tc, equal_priorities_break_by_load_order);
  tcase_add_test(tc, default_kernel_follows_priority_and_reference_rules);
  tcase_add_test(tc, autotune_without_a_tuner_runs_nothing_and_names_the_hook);
  tcase_add_test(tc, autotune_picks_the_faster_kernel_and_writes_the_cache);
  tcase_add_test(tc, autotune_cache_keeps_the_times_and_loads_v1_lines);
  tcase_add_test(tc, autotune_cache_is_reused_and_invalidated_by_a_new_build_id);
  tcase_add_test(tc, autotune_uses_the_nodes_device_index);
  tcase_add_test(tc, autotune_times_with_device_events_and_tolerates_a_missing_cache);
  tcase_add_test(tc, autotune_cache_is_checked_at_open_and_malformed_lines_are_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
