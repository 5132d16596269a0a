/* Loader and registry: every ABI rule (docs/architecture.md, "ABI and
 * discovery") that a module can break, one purpose-built module each (tests/modules/), and discovery. */
#include <check.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blueprint/registry.h"
#include "blueprint/op_table.h"
#include "bp_abi_ops.h"
#include "registry-impl.h"
#include "test_module.h"

/* BP_TEST_MODULES/<dir>/<name>.so; one static buffer per slot. */
static const char *module_path(int slot, const char *dir, const char *name) {
  static char paths[4][PATH_MAX];
  snprintf(paths[slot], sizeof paths[slot], "%s/%s/%s.so", BP_TEST_MODULES, dir, name);
  return paths[slot];
}
#define MOD(name) module_path(0, "registry", name)

/* realpath of a module, as records name it. */
static const char *resolved(int slot, const char *dir, const char *name) {
  static char paths[4][PATH_MAX];
  ck_assert_ptr_nonnull(realpath(module_path(slot, dir, name), paths[slot]));
  return paths[slot];
}

static bp_registry *fresh(void) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  return r;
}

/* A registry whose search path (the CLI's BP_PLUGIN_PATH) is `path`. */
static bp_registry *fresh_with_path(const char *path) {
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  ro.search_path = path;
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  return r;
}

static const bp_load_record *last(const bp_registry *r) {
  ck_assert_int_gt(bp_registry_record_count(r), 0);
  return bp_registry_record(r, bp_registry_record_count(r) - 1);
}

static const bp_registered_kernel *find_kernel(const bp_registry *r, const char *op,
                                               const char *impl, const char *device) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    if (!strcmp(k->kernel.op, op) && !strcmp(k->kernel.impl, impl) &&
        !strcmp(k->kernel.device, device))
      return k;
  }
  return NULL;
}

/* The record of the first attempt on `path` (resolved), or NULL. */
static const bp_load_record *record_of(const bp_registry *r, const char *path) {
  for (int i = 0; i < bp_registry_record_count(r); i++)
    if (strcmp(bp_registry_record(r, i)->path, path) == 0) return bp_registry_record(r, i);
  return NULL;
}

static void assert_refused(const bp_registry *r, bp_load_stage stage, const char *needle) {
  const bp_load_record *rec = last(r);
  ck_assert_int_eq(rec->outcome, BP_LOAD_REFUSED);
  ck_assert_str_eq(bp_load_stage_name(rec->stage), bp_load_stage_name(stage));
  if (needle && !strstr(rec->message, needle))
    ck_abort_msg("record message '%s' lacks '%s'", rec->message, needle);
  ck_assert_int_eq(rec->host_abi_major, BP_ABI_MAJOR);
  ck_assert_int_eq(rec->host_abi_minor, BP_ABI_MINOR);
}

START_TEST(builtin_ops_are_known_before_modules) {
  bp_registry *r = fresh();
  /* the op table's entries, in its order (tests/test_op_table.c holds
   * each entry against its contract) */
  int count = 0;
  const bp_op_info *table = bp_op_table(&count);
  ck_assert_int_eq(bp_registry_op_count(r), count);
  for (int i = 0; i < count; i++) {
    const bp_abi_op *op = bp_registry_op(r, i);
    ck_assert_str_eq(op->name, table[i].abi.name);
    ck_assert_int_eq(op->num_inputs, table[i].abi.num_inputs);
    ck_assert_int_eq(op->num_outputs, table[i].abi.num_outputs);
    if (strcmp(op->name, "allreduce.all_gather") == 0)
      ck_assert_uint_eq(op->attr_size, 0); /* copies only: no attributes */
    else
      ck_assert_uint_gt(op->attr_size, 0); /* the blocks of abi/bp_abi_ops.h */
    ck_assert_uint_eq(op->attr_version, BP_ABI_ATTR_VERSION);
  }
  /* a few by hand */
  ck_assert_int_eq(bp_registry_find_op(r, "conv2d.bwd_filter")->num_outputs, 2);
  ck_assert_int_eq(bp_registry_find_op(r, "batchnorm_relu.bwd")->num_inputs, 6);
  ck_assert_int_eq(bp_registry_find_op(r, "range.loss_scale")->num_outputs, 4);
  ck_assert_str_eq(bp_registry_op_path(r, 0), "<builtin>");
  ck_assert_int_eq(bp_registry_kernel_count(r), 0);
  ck_assert_int_eq(bp_registry_record_count(r), 0);
  ck_assert_ptr_null(bp_registry_find_op(r, "no.such.op"));
  ck_assert_ptr_null(bp_registry_kernel(r, 0));
  ck_assert_ptr_null(bp_registry_record(r, -1));
  bp_registry_destroy(r);
  bp_registry_destroy(NULL); /* a no-op */
}
END_TEST

START_TEST(good_module_loads_kernel_and_new_op) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("good")), BP_OK);
  const bp_load_record *rec = last(r);
  ck_assert_int_eq(rec->outcome, BP_LOAD_LOADED);
  ck_assert_int_eq(rec->stage, BP_LOAD_STAGE_DONE);
  ck_assert_str_eq(rec->path, resolved(0, "registry", "good"));
  ck_assert_str_eq(rec->message, "");
  ck_assert_str_eq(rec->name, "test-good");
  ck_assert_str_eq(rec->version, "1.0");
  ck_assert_str_eq(rec->build_id, "test");
  ck_assert_int_eq(rec->abi_major, BP_ABI_MAJOR);
  ck_assert_int_eq(rec->abi_minor_built, BP_ABI_MINOR);
  ck_assert_int_eq(rec->abi_minor_required, 0);

  const bp_abi_op *op = bp_registry_find_op(r, "test.double");
  ck_assert_ptr_nonnull(op);
  ck_assert_int_eq(op->num_inputs, 1);
  ck_assert_str_eq(bp_registry_op_path(r, bp_registry_op_count(r) - 1), rec->path);
  const bp_registered_kernel *relu = find_kernel(r, "relu.fwd", "good", "cpu");
  const bp_registered_kernel *dbl = find_kernel(r, "test.double", "plain", "cpu");
  ck_assert_ptr_nonnull(relu);
  ck_assert_ptr_nonnull(dbl);
  ck_assert_str_eq(relu->path, rec->path);
  ck_assert_str_eq(relu->build_id, "test");
  ck_assert_int_lt(relu->load_index, dbl->load_index);
  ck_assert_int_eq(relu->kernel.priority, 5);

  /* The new op's kernel is selected and runs. */
  float x[4] = {1, -2, 3, -4}, y[4] = {0};
  bp_abi_tensor t = {sizeof t, BP_ABI_DTYPE_FP32, {1, 1, 1, 4}, 4, {4, 4, 4, 1}, 256};
  const void *in[1] = {x};
  void *out[1] = {y};
  bp_abi_kernel_args a = {.struct_size = sizeof a, .num_inputs = 1, .num_outputs = 1,
                          .inputs = &t, .outputs = &t, .input_ptrs = in, .output_ptrs = out,
                          .world_size = 1};
  const bp_registered_kernel *k = NULL;
  bp_select_options o = {.pins = ""};
  ck_assert_int_eq(bp_registry_select(r, "test.double", "cpu", &a, &o, &k), BP_OK);
  ck_assert_ptr_eq(k, dbl);
  ck_assert_int_eq(k->kernel.run(k->kernel.user, &a), BP_ABI_OK);
  ck_assert(y[0] == 2 && y[1] == -4 && y[3] == -8);
  ck_assert_int_eq(((tm_stats *)k->kernel.user)->runs[1], 1);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(same_file_twice_is_a_skipped_no_op) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("good")), BP_OK);
  int kernels = bp_registry_kernel_count(r), ops = bp_registry_op_count(r);
  /* another spelling of the same path */
  char other[PATH_MAX];
  snprintf(other, sizeof other, "%s/registry/../registry/./good.so", BP_TEST_MODULES);
  ck_assert_int_eq(bp_registry_load(r, other), BP_OK);
  const bp_load_record *rec = last(r);
  ck_assert_int_eq(rec->outcome, BP_LOAD_SKIPPED);
  ck_assert_ptr_nonnull(strstr(rec->message, "same file as"));
  ck_assert_int_eq(bp_registry_kernel_count(r), kernels);
  ck_assert_int_eq(bp_registry_op_count(r), ops);

  /* a hard link has another path but the same inode */
  char dir[PATH_MAX], link_path[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/link-XXXXXX", BP_TEST_MODULES);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(link_path, sizeof link_path, "%s/alias.so", dir);
  if (link(MOD("good"), link_path) == 0) {
    ck_assert_int_eq(bp_registry_load(r, link_path), BP_OK);
    ck_assert_int_eq(last(r)->outcome, BP_LOAD_SKIPPED);
    ck_assert_int_eq(bp_registry_kernel_count(r), kernels);
    unlink(link_path);
  }
  rmdir(dir);

  /* a refused file tried again is skipped and keeps its refusal */
  ck_assert_int_eq(bp_registry_load(r, MOD("initfail")), BP_ERR_INVALID);
  ck_assert_int_eq(bp_registry_load(r, MOD("initfail")), BP_ERR_INVALID);
  ck_assert_int_eq(last(r)->outcome, BP_LOAD_SKIPPED);
  ck_assert_ptr_nonnull(strstr(last(r)->message, "refused"));
  bp_registry_destroy(r);
}
END_TEST

START_TEST(another_major_is_refused) {
  bp_registry *r = fresh();
  /* the major-2 entry symbol */
  ck_assert_int_eq(bp_registry_load(r, MOD("major2")), BP_ERR_UNSUPPORTED);
  assert_refused(r, BP_LOAD_STAGE_VERSION, "major 2");
  ck_assert_int_eq(last(r)->abi_major, 2);
  char host[32];
  snprintf(host, sizeof host, "ABI %d.%d", BP_ABI_MAJOR, BP_ABI_MINOR);
  ck_assert_ptr_nonnull(strstr(last(r)->message, host));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "major2.so"));
  /* the major-1 symbol with a major-2 descriptor */
  ck_assert_int_eq(bp_registry_load(r, MOD("major2v1")), BP_ERR_UNSUPPORTED);
  assert_refused(r, BP_LOAD_STAGE_VERSION, "ABI 2.0");
  ck_assert_ptr_nonnull(strstr(last(r)->message, host));
  ck_assert_str_eq(last(r)->name, "");
  ck_assert_int_eq(bp_registry_kernel_count(r), 0);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(older_minor_loads_and_lacking_fields_are_absent) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("older")), BP_OK);
  ck_assert_int_eq(last(r)->outcome, BP_LOAD_LOADED);
  ck_assert_int_eq(last(r)->abi_minor_built, 0);
  const bp_registered_kernel *k = find_kernel(r, "relu.fwd", "older", "cpu");
  ck_assert_ptr_nonnull(k);
  ck_assert_uint_eq(k->kernel.struct_size, offsetof(bp_abi_kernel, user));
  ck_assert_ptr_null(k->kernel.user); /* the module's poison stayed beyond struct_size */
  ck_assert_ptr_nonnull(k->kernel.supports);
  /* supports() says no if it is handed the poison */
  bp_abi_tensor t = {sizeof t, BP_ABI_DTYPE_FP32, {1, 1, 1, 4}, 4, {4, 4, 4, 1}, 256};
  bp_abi_kernel_args a = {.struct_size = sizeof a, .num_inputs = 1, .num_outputs = 1,
                          .inputs = &t, .outputs = &t, .world_size = 1};
  bp_select_options o = {.pins = "relu.fwd=older"};
  const bp_registered_kernel *picked = NULL;
  ck_assert_msg(bp_registry_select(r, "relu.fwd", "cpu", &a, &o, &picked) == BP_OK, "%s",
                bp_last_error());
  ck_assert_ptr_eq(picked, k);
  bp_registry_destroy(r); /* must not call the fini beyond struct_size (it aborts) */
}
END_TEST

START_TEST(newer_required_minor_is_refused_with_both_versions) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("newer")), BP_ERR_UNSUPPORTED);
  char needed[32], host[32];
  snprintf(needed, sizeof needed, "ABI %d.%d or newer", BP_ABI_MAJOR, BP_ABI_MINOR + 1);
  snprintf(host, sizeof host, "host has ABI %d.%d", BP_ABI_MAJOR, BP_ABI_MINOR);
  assert_refused(r, BP_LOAD_STAGE_VERSION, needed);
  ck_assert_ptr_nonnull(strstr(last(r)->message, host));
  ck_assert_int_eq(last(r)->abi_minor_required, BP_ABI_MINOR + 1);
  ck_assert_int_eq(last(r)->abi_minor_built, BP_ABI_MINOR + 1);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), host));
  ck_assert_int_eq(bp_registry_kernel_count(r), 0);

  /* the same newer module that accepts this host loads; the host reads its part */
  ck_assert_int_eq(bp_registry_load(r, MOD("newer_ok")), BP_OK);
  const bp_registered_kernel *k = find_kernel(r, "relu.fwd", "newer", "cpu");
  ck_assert_ptr_nonnull(k);
  ck_assert_uint_gt(k->kernel.struct_size, sizeof(bp_abi_kernel));
  ck_assert_int_eq(k->kernel.priority, 2);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(missing_entry_symbol_is_refused) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("noentry")), BP_ERR_INVALID);
  assert_refused(r, BP_LOAD_STAGE_SYMBOL, BP_ABI_ENTRY_SYMBOL);
  ck_assert_int_eq(last(r)->abi_major, -1);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(failing_init_leaves_nothing_registered) {
  bp_registry *r = fresh();
  int ops = bp_registry_op_count(r);
  ck_assert_int_eq(bp_registry_load(r, MOD("initfail")), BP_ERR_INVALID);
  assert_refused(r, BP_LOAD_STAGE_INIT, "the device it needs is not there");
  ck_assert_ptr_nonnull(strstr(last(r)->message, "status 3"));
  ck_assert_str_eq(last(r)->name, "test-initfail");
  ck_assert_ptr_null(bp_registry_find_op(r, "test.failed"));
  ck_assert_int_eq(bp_registry_op_count(r), ops);
  ck_assert_int_eq(bp_registry_kernel_count(r), 0);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(duplicate_kernel_is_refused_naming_both_files) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("good")), BP_OK);
  int kernels = bp_registry_kernel_count(r);
  ck_assert_int_eq(bp_registry_load(r, module_path(1, "registry", "good_twin")), BP_ERR_INVALID);
  assert_refused(r, BP_LOAD_STAGE_REGISTER, "relu.fwd/good/cpu");
  ck_assert_ptr_nonnull(strstr(last(r)->message, resolved(0, "registry", "good")));
  ck_assert_ptr_nonnull(strstr(last(r)->message, resolved(1, "registry", "good_twin")));
  /* its other, valid kernel went too (the module returned OK regardless) */
  ck_assert_ptr_null(find_kernel(r, "relu.bwd", "twin", "cpu"));
  ck_assert_int_eq(bp_registry_kernel_count(r), kernels);
  ck_assert_str_eq(find_kernel(r, "relu.fwd", "good", "cpu")->path,
                   resolved(0, "registry", "good"));
  bp_registry_destroy(r);
}
END_TEST

START_TEST(file_that_is_not_elf_is_refused_at_open) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("bad")), BP_ERR_IO);
  assert_refused(r, BP_LOAD_STAGE_OPEN, "not an ELF file"); /* the pre-check, before dlopen */
  ck_assert_int_eq(last(r)->abi_major, -1);
  ck_assert_str_eq(last(r)->name, "");
  /* a path that does not exist */
  ck_assert_int_eq(bp_registry_load(r, "/nonexistent/blueprint/x.so"), BP_ERR_IO);
  assert_refused(r, BP_LOAD_STAGE_OPEN, "No such file");
  bp_registry_destroy(r);
}
END_TEST

START_TEST(unresolved_symbol_fails_at_load_not_at_first_call) {
  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_load(r, MOD("unresolved")), BP_ERR_IO);
  assert_refused(r, BP_LOAD_STAGE_OPEN, "bp_test_missing_function");
  ck_assert_int_eq(bp_registry_kernel_count(r), 0);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(refused_registrations_refuse_the_module) {
  static const char *const why[] = {
      NULL,
      "unknown op 'no.such.op'",
      "duplicate op 'conv2d.fwd': already registered by <builtin>",
      "bad name",
      "run is NULL",
      "empty dtype mask",
      "stream_create is NULL",
  };
  int c = _i;
  char name[16];
  snprintf(name, sizeof name, "badreg%d", c);
  bp_registry *r = fresh();
  int ops = bp_registry_op_count(r);
  ck_assert_int_eq(bp_registry_load(r, MOD(name)), BP_ERR_INVALID);
  assert_refused(r, BP_LOAD_STAGE_REGISTER, why[c]);
  ck_assert_int_eq(bp_registry_kernel_count(r), 0); /* its valid relu.bwd kernel too */
  ck_assert_int_eq(bp_registry_op_count(r), ops);
  ck_assert_int_eq(bp_registry_device_count(r), 0);
  bp_registry_destroy(r);
}
END_TEST

/* Registry options: a bad log level or struct size is one clear error;
 * the level can change later (loading is single-threaded). */
START_TEST(registry_options_are_checked) {
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  ck_assert_int_eq(ro.log_level, BP_ABI_LOG_WARN);
  bp_registry *r = (bp_registry *)0x1;
  ro.log_level = BP_ABI_LOG_DEBUG + 1;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "log level 4 is outside 0..3"));
  ck_assert_ptr_eq(r, (bp_registry *)0x1); /* untouched on failure */
  ro.log_level = BP_ABI_LOG_INFO;
  ro.struct_size = 0;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_ERR_INVALID);
  ro.struct_size = sizeof ro;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  ck_assert_int_eq(bp_registry_set_log_level(r, -1), BP_ERR_INVALID);
  ck_assert_int_eq(bp_registry_set_log_level(r, BP_ABI_LOG_ERROR), BP_OK);
  bp_registry_destroy(r);
  /* module options (ABI 1.6): "name=value", the first of a name wins */
  static const char *const bad[] = {"cpu_isa"}, *const empty[] = {"=avx2"};
  static const char *const good[] = {"cpu_isa=avx2", "tf32=0", "cpu_isa=default"};
  ro.module_options = bad;
  ro.module_option_count = 1;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "module option 'cpu_isa' is not name=value"));
  ro.module_options = empty;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_ERR_INVALID);
  ro.module_options = good;
  ro.module_option_count = 3;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  const bp_abi_host *host = &r->host; /* what modules' init receives */
  ck_assert_str_eq(host->option(host->ctx, "cpu_isa"), "avx2");
  ck_assert_str_eq(host->option(host->ctx, "tf32"), "0");
  ck_assert_ptr_null(host->option(host->ctx, "tf"));
  ck_assert_ptr_null(host->option(host->ctx, "deterministic"));
  bp_registry_destroy(r);
}
END_TEST

START_TEST(discovering_a_directory_continues_past_refusals) {
  bp_registry *r = fresh();
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/registry", BP_TEST_MODULES);
  const char *paths[] = {dir};
  ck_assert_int_eq(bp_registry_discover(r, paths, 1), BP_OK);
  const struct {
    const char *name;
    bp_load_outcome outcome;
    bp_load_stage stage;
  } expect[] = {
      {"bad", BP_LOAD_REFUSED, BP_LOAD_STAGE_OPEN},
      {"badreg1", BP_LOAD_REFUSED, BP_LOAD_STAGE_REGISTER},
      {"good", BP_LOAD_LOADED, BP_LOAD_STAGE_DONE},
      {"good_twin", BP_LOAD_REFUSED, BP_LOAD_STAGE_REGISTER},
      {"initfail", BP_LOAD_REFUSED, BP_LOAD_STAGE_INIT},
      {"major2", BP_LOAD_REFUSED, BP_LOAD_STAGE_VERSION},
      {"newer", BP_LOAD_REFUSED, BP_LOAD_STAGE_VERSION},
      {"newer_ok", BP_LOAD_LOADED, BP_LOAD_STAGE_DONE},
      {"noentry", BP_LOAD_REFUSED, BP_LOAD_STAGE_SYMBOL},
      {"older", BP_LOAD_LOADED, BP_LOAD_STAGE_DONE},
      {"unresolved", BP_LOAD_REFUSED, BP_LOAD_STAGE_OPEN},
  };
  int previous = -1;
  for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
    const bp_load_record *rec = record_of(r, resolved(0, "registry", expect[i].name));
    ck_assert_msg(rec != NULL, "%s was not tried", expect[i].name);
    ck_assert_msg(rec->outcome == expect[i].outcome && rec->stage == expect[i].stage,
                  "%s: %s at %s (%s)", expect[i].name, bp_load_outcome_name(rec->outcome),
                  bp_load_stage_name(rec->stage), rec->message);
    /* name order */
    for (int j = 0; j < bp_registry_record_count(r); j++)
      if (bp_registry_record(r, j) == rec) {
        ck_assert_int_gt(j, previous);
        previous = j;
      }
  }
  ck_assert_ptr_nonnull(find_kernel(r, "relu.fwd", "good", "cpu"));
  ck_assert_ptr_nonnull(find_kernel(r, "relu.fwd", "older", "cpu"));
  ck_assert_ptr_null(find_kernel(r, "relu.bwd", "twin", "cpu"));
  const bp_search_dir *d = bp_registry_search_dir(r, 0);
  ck_assert_ptr_nonnull(d);
  ck_assert_str_eq(d->source, "explicit");
  ck_assert_int_eq(d->exists, 1);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(plugin_path_takes_absolute_directories_only) {
  char env[PATH_MAX + 64];
  snprintf(env, sizeof env, "relative/dir::%s/registry_cwd", BP_TEST_MODULES);
  bp_registry *r = fresh_with_path(env);
  ck_assert_int_eq(bp_registry_discover(r, NULL, 0), BP_OK);
  ck_assert_ptr_nonnull(find_kernel(r, "relu.fwd", "cwd", "cpu"));
  const bp_load_record *rel = record_of(r, "relative/dir");
  ck_assert_ptr_nonnull(rel);
  ck_assert_int_eq(rel->outcome, BP_LOAD_SKIPPED);
  ck_assert_ptr_nonnull(strstr(rel->message, "relative"));
  const bp_load_record *empty = record_of(r, "");
  ck_assert_ptr_nonnull(empty);
  ck_assert_ptr_nonnull(strstr(empty->message, "current directory"));
  int env_dirs = 0;
  for (int i = 0; i < bp_registry_search_dir_count(r); i++)
    env_dirs += strcmp(bp_registry_search_dir(r, i)->source, "BP_PLUGIN_PATH") == 0;
  ck_assert_int_eq(env_dirs, 1);
  bp_registry_destroy(r);
  /* the library never reads BP_PLUGIN_PATH itself: only the CLI does */
  setenv("BP_PLUGIN_PATH", env, 1);
  r = fresh();
  ck_assert_int_eq(bp_registry_discover(r, NULL, 0), BP_OK);
  ck_assert_ptr_null(find_kernel(r, "relu.fwd", "cwd", "cpu"));
  unsetenv("BP_PLUGIN_PATH");
  bp_registry_destroy(r);
}
END_TEST

/* No record and no kernel of the module in the current directory. */
static void assert_cwd_module_absent(const bp_registry *r) {
  ck_assert_ptr_null(find_kernel(r, "relu.fwd", "cwd", "cpu"));
  for (int i = 0; i < bp_registry_record_count(r); i++)
    ck_assert_msg(strstr(bp_registry_record(r, i)->path, "registry_cwd") == NULL,
                  "tried %s", bp_registry_record(r, i)->path);
}

START_TEST(current_directory_is_never_searched) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/registry_cwd", BP_TEST_MODULES);
  ck_assert_int_eq(chdir(dir), 0);
  ck_assert_int_eq(access("cwd.so", R_OK), 0);

  bp_registry *r = fresh();
  ck_assert_int_eq(bp_registry_discover(r, NULL, 0), BP_OK);
  assert_cwd_module_absent(r);
  bp_registry_destroy(r);

  static const char *const values[] = {".", "", "./", "cwd.so", ".:"};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    r = fresh_with_path(values[i]);
    ck_assert_int_eq(bp_registry_discover(r, NULL, 0), BP_OK);
    assert_cwd_module_absent(r);
    ck_assert_int_eq(bp_registry_record(r, 0)->outcome, BP_LOAD_SKIPPED);
    bp_registry_destroy(r);
  }
}
END_TEST

START_TEST(explicit_failure_is_returned_and_discovery_goes_on) {
  char env[PATH_MAX];
  snprintf(env, sizeof env, "%s/registry_cwd", BP_TEST_MODULES);
  bp_registry *r = fresh_with_path(env);
  const char *paths[] = {"/nonexistent/blueprint/modules", MOD("good")};
  ck_assert_int_eq(bp_registry_discover(r, paths, 2), BP_ERR_IO);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "/nonexistent/blueprint/modules"));
  ck_assert_ptr_nonnull(find_kernel(r, "relu.fwd", "good", "cpu"));
  ck_assert_ptr_nonnull(find_kernel(r, "relu.fwd", "cwd", "cpu"));
  /* the same directory again is not searched twice */
  const char *again[] = {env};
  ck_assert_int_eq(bp_registry_discover(r, again, 1), BP_OK);
  int tries = 0;
  for (int i = 0; i < bp_registry_record_count(r); i++)
    tries += strstr(bp_registry_record(r, i)->path, "registry_cwd/cwd.so") != NULL;
  ck_assert_int_eq(tries, 1);
  bp_registry_destroy(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("registry");
  TCase *tc = tcase_create("registry");
  tcase_add_test(tc, builtin_ops_are_known_before_modules);
  tcase_add_test(tc, good_module_loads_kernel_and_new_op);
  tcase_add_test(tc, same_file_twice_is_a_skipped_no_op);
  tcase_add_test(tc, another_major_is_refused);
  tcase_add_test(tc, older_minor_loads_and_lacking_fields_are_absent);
  tcase_add_test(tc, newer_required_minor_is_refused_with_both_versions);
  tcase_add_test(tc, missing_entry_symbol_is_refused);
  tcase_add_test(tc, failing_init_leaves_nothing_registered);
  tcase_add_test(tc, duplicate_kernel_is_refused_naming_both_files);
  tcase_add_test(tc, file_that_is_not_elf_is_refused_at_open);
  tcase_add_test(tc, unresolved_symbol_fails_at_load_not_at_first_call);
  tcase_add_loop_test(tc, refused_registrations_refuse_the_module, 1, 7);
  tcase_add_test(tc, registry_options_are_checked);
  tcase_add_test(tc, discovering_a_directory_continues_past_refusals);
  tcase_add_test(tc, plugin_path_takes_absolute_directories_only);
  tcase_add_test(tc, current_directory_is_never_searched);
  tcase_add_test(tc, explicit_failure_is_returned_and_discovery_goes_on);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
