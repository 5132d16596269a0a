/* `blueprint plugins [--json] [--plugin PATH]...`: discovers op modules and
 * device plugins and prints what loaded, what was refused and why, the
 * kernels, and which kernel each op gets on each device by default.
 *
 * Exit status: 0 listed; 1 an explicit --plugin path could not be loaded
 * (the listing is printed anyway); 2 the command line is wrong. */
#include <stdio.h>
#include <string.h>

#include "blueprint/json_out.h"
#include "blueprint/dtype.h"
#include "blueprint/registry.h"
#include "cli_util.h"
#include "commands.h"
#include "env_options.h"

#define EXIT_LOAD 1
#define EXIT_USAGE 2
#define MAX_PLUGINS 256

static const char usage_text[] =
    "usage: blueprint plugins [--json] [--plugin PATH]...\n"
    "\n"
    "Finds op modules and device plugins and lists every load attempt (loaded,\n"
    "skipped or refused, with the stage and the reason), the kernels, the device\n"
    "kinds that have kernels but no device plugin, and the kernel each op gets\n"
    "on each device when nothing is pinned or tuned.\n"
    "Search order: --plugin paths (files or directories), BP_PLUGIN_PATH\n"
    "(absolute directories, colon-separated), the install directory, and\n"
    "blueprint/modules/ beside libblueprint.so; never the current directory.\n"
    "\n"
    "  --plugin PATH   load this module file, or every *.so in this directory\n"
    "  --json          print JSON (docs/plugins-json.md) instead of tables\n"
    "  -h, --help      print this help\n"
    "\n"
    "Exit status: 0 ok, 1 a --plugin path was refused, 2 bad command line.\n";

static void dtype_list(uint32_t mask, char *buf, size_t size, int json) {
  buf[0] = '\0';
  size_t used = 0;
  for (unsigned b = 0; b < 32; b++) {
    if (!(mask & BP_ABI_DTYPE_BIT(b))) continue;
    const char *name = bp_dtype_name((bp_dtype)b);
    int n = json ? snprintf(buf + used, size - used, "%s\"%s\"", used ? ", " : "", name)
                 : snprintf(buf + used, size - used, "%s%s", used ? "," : "", name);
    if (n < 0 || (size_t)n >= size - used) break;
    used += (size_t)n;
  }
}

static const struct {
  uint32_t bit;
  const char *name;
} flag_names[] = {
    {BP_ABI_KERNEL_REFERENCE, "reference"},
    {BP_ABI_KERNEL_DETERMINISTIC, "deterministic"},
    {BP_ABI_KERNEL_GRAPH_CAPTURABLE, "graph_capturable"},
    {BP_ABI_KERNEL_IN_PLACE, "in_place"},
};

static void flag_list(uint32_t flags, char *buf, size_t size, int json) {
  buf[0] = '\0';
  size_t used = 0;
  for (size_t i = 0; i < sizeof flag_names / sizeof flag_names[0]; i++) {
    if (!(flags & flag_names[i].bit)) continue;
    int n = json ? snprintf(buf + used, size - used, "%s\"%s\"", used ? ", " : "",
                            flag_names[i].name)
                 : snprintf(buf + used, size - used, "%s%s", used ? "," : "", flag_names[i].name);
    if (n < 0 || (size_t)n >= size - used) break;
    used += (size_t)n;
  }
  if (!json && !used) snprintf(buf, size, "-");
}

/* Module name of the kernel's file: the loaded record with that path. */
static const char *module_name(const bp_registry *r, const char *path) {
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    if (rec->outcome == BP_LOAD_LOADED && strcmp(rec->path, path) == 0) return rec->name;
  }
  return path;
}

/* A transport's reach (BP_ABI_COMM_* flags) in words. */
static void transport_reach(uint32_t flags, char *text, size_t size) {
  snprintf(text, size, "%s%s%s",
           flags & BP_ABI_COMM_SPANS_PROCESSES ? "ranks in several processes; " : "",
           flags & BP_ABI_COMM_SPANS_DEVICES ? "ranks on several devices; " : "",
           flags & BP_ABI_COMM_SHARES_DEVICE ? "several ranks on one device; " : "");
  const size_t n = strlen(text);
  if (n >= 2) text[n - 2] = '\0'; /* the last "; " */
}

/* Kernels whose device kind no loaded device plugin provides: calls fn for
 * each such kind (in first-registration order) with its kernel count. Such
 * kernels can only run where a plugin of that kind loads (the cpu device
 * falls back to host memory without one). */
static void for_unserved_devices(const bp_registry *r, void (*fn)(void *, const char *, int),
                                 void *user) {
  const int nk = bp_registry_kernel_count(r);
  for (int i = 0; i < nk; i++) {
    const char *kind = bp_registry_kernel(r, i)->kernel.device;
    if (bp_registry_find_device(r, kind)) continue;
    int first = 1, count = 0;
    for (int j = 0; j < nk; j++) {
      if (strcmp(bp_registry_kernel(r, j)->kernel.device, kind) != 0) continue;
      if (j < i) first = 0;
      count++;
    }
    if (first) fn(user, kind, count);
  }
}

static void unserved_text(void *user, const char *kind, int count) {
  fprintf(user, "  %-10s %d kernel%s, no device plugin of this kind loaded\n", kind, count,
          count == 1 ? "" : "s");
}

static void count_unserved(void *user, const char *kind, int count) {
  (void)kind;
  (void)count;
  ++*(int *)user;
}

typedef struct json_list {
  FILE *out;
  int listed;
} json_list;

static void unserved_json(void *user, const char *kind, int count) {
  json_list *l = user;
  fprintf(l->out, "%s\n    {\"kind\": ", l->listed++ ? "," : "");
  bp_json_string(l->out, kind);
  fprintf(l->out, ", \"kernels\": %d}", count);
}

/* Distinct devices of kernels, in first-registration order: calls fn for
 * each (op, device) that has a kernel. */
static int first_of_pair(const bp_registry *r, int index) {
  const bp_registered_kernel *k = bp_registry_kernel(r, index);
  for (int j = 0; j < index; j++) {
    const bp_registered_kernel *o = bp_registry_kernel(r, j);
    if (strcmp(o->kernel.op, k->kernel.op) == 0 && strcmp(o->kernel.device, k->kernel.device) == 0)
      return 0;
  }
  return 1;
}

/* Saved tensors of a layer type (0 for a descriptor that ends before them). */
static int layer_saved_count(const bp_registered_layer *l) {
  return l->saved ? (int)l->layer.num_saved : 0;
}

/* "int8[N,H,W,C] fp32[C]" for the layer's saved tensors (C: the output's
 * channels), "-" when it has none. */
static void layer_saved(const bp_registered_layer *l, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < layer_saved_count(l) && used < size; k++) {
    const bp_abi_layer_saved *t = &l->saved[k];
    char channels[24] = "C";
    if (t->channels) snprintf(channels, sizeof channels, "%d", (int)t->channels);
    used += (size_t)snprintf(buf + used, size - used, "%s%s[%s%s]", k ? " " : "",
                             bp_dtype_name((bp_dtype)t->dtype),
                             t->per_channel ? "" : "N,H,W,", channels);
  }
  if (!buf[0]) snprintf(buf, size, "-");
}

static const char *attr_type_name(int32_t type) {
  return type == BP_ABI_LAYER_ATTR_INT     ? "int"
         : type == BP_ABI_LAYER_ATTR_FLOAT ? "float"
         : type == BP_ABI_LAYER_ATTR_BOOL  ? "bool"
                                           : "?";
}

/* "slope (float, default 0.01, [0, 1]), ..." or "-". */
static void layer_keys(const bp_registered_layer *l, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < l->layer.num_attrs && used < size; k++) {
    const bp_abi_layer_attr *a = &l->attrs[k];
    int n = a->required ? snprintf(buf + used, size - used, "%s%s (%s, required", k ? ", " : "",
                                   a->key, attr_type_name(a->type))
                        : snprintf(buf + used, size - used, "%s%s (%s, default %g", k ? ", " : "",
                                   a->key, attr_type_name(a->type), a->default_value);
    if (n < 0) break;
    used += (size_t)n;
    if (used < size)
      n = a->type == BP_ABI_LAYER_ATTR_BOOL
              ? snprintf(buf + used, size - used, ")")
              : snprintf(buf + used, size - used, ", [%g, %g])", a->min, a->max);
    if (n < 0) break;
    used += (size_t)n;
  }
  if (!buf[0]) snprintf(buf, size, "-");
}

static void print_text(const bp_registry *r, FILE *out) {
  fprintf(out, "host ABI %d.%d\n\nsearch path:\n", BP_ABI_MAJOR, BP_ABI_MINOR);
  for (int i = 0; i < bp_registry_search_dir_count(r); i++) {
    const bp_search_dir *d = bp_registry_search_dir(r, i);
    fprintf(out, "  %-15s %s%s\n", d->source, d->path, d->exists ? "" : " (absent)");
  }

  int counts[3] = {0, 0, 0};
  for (int i = 0; i < bp_registry_record_count(r); i++)
    counts[bp_registry_record(r, i)->outcome]++;
  fprintf(out, "\nmodules: %d loaded, %d refused, %d skipped\n", counts[BP_LOAD_LOADED],
          counts[BP_LOAD_REFUSED], counts[BP_LOAD_SKIPPED]);
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    fprintf(out, "  %-8s %s", bp_load_outcome_name(rec->outcome),
            rec->path[0] ? rec->path : "\"\"");
    if (rec->outcome == BP_LOAD_REFUSED)
      fprintf(out, "  [stage %s]", bp_load_stage_name(rec->stage));
    fputc('\n', out);
    if (rec->name[0] || rec->abi_major >= 0) {
      fprintf(out, "           name %s, version %s", rec->name[0] ? rec->name : "?",
              rec->version[0] ? rec->version : "?");
      if (rec->abi_minor_built >= 0)
        fprintf(out, ", ABI built %d.%d, requires %d.%d", rec->abi_major, rec->abi_minor_built,
                rec->abi_major, rec->abi_minor_required);
      else if (rec->abi_major >= 0)
        fprintf(out, ", ABI major %d", rec->abi_major);
      fprintf(out, " (host %d.%d)\n", rec->host_abi_major, rec->host_abi_minor);
    }
    if (rec->message[0]) fprintf(out, "           %s\n", rec->message);
  }

  int nops = bp_registry_op_count(r), builtin = 0;
  for (int i = 0; i < nops; i++)
    if (strcmp(bp_registry_op_path(r, i), "<builtin>") == 0) builtin++;
  fprintf(out, "\nops: %d built in, %d from modules\n", builtin, nops - builtin);
  for (int i = 0; i < nops; i++) {
    const char *path = bp_registry_op_path(r, i);
    if (strcmp(path, "<builtin>") == 0) continue;
    const bp_abi_op *op = bp_registry_op(r, i);
    fprintf(out, "  %-24s %d in, %d out   %s\n", op->name, op->num_inputs, op->num_outputs,
            module_name(r, path));
  }

  fprintf(out, "\nlayer types: %d from modules\n", bp_registry_layer_count(r));
  for (int i = 0; i < bp_registry_layer_count(r); i++) {
    const bp_registered_layer *l = bp_registry_layer(r, i);
    char keys[512], saved[256];
    layer_keys(l, keys, sizeof keys);
    layer_saved(l, saved, sizeof saved);
    fprintf(out, "  %-16s %d in   %s / %s   keys: %s   saved: %s   %s\n", l->layer.type,
            (int)l->layer.num_inputs, l->layer.forward_op,
            l->layer.backward_op ? l->layer.backward_op : "(no backward)", keys, saved,
            module_name(r, l->path));
  }

  fprintf(out, "\ndevices: %d\n", bp_registry_device_count(r));
  for (int i = 0; i < bp_registry_device_count(r); i++) {
    const bp_abi_device *d = bp_registry_device(r, i);
    fprintf(out, "  %-10s %s\n", d->kind, module_name(r, bp_registry_device_path(r, i)));
    bp_abi_comm_transport t;
    for (int k = 0; bp_registry_device_transport(d, k, &t); k++) {
      char reach[128];
      transport_reach(t.flags, reach, sizeof reach);
      fprintf(out, "             collective transport %s: %s\n", t.backend, reach);
    }
  }

  int unserved = 0;
  for_unserved_devices(r, count_unserved, &unserved);
  if (unserved) {
    fprintf(out, "\ndevice kinds with kernels but no device plugin: %d\n", unserved);
    for_unserved_devices(r, unserved_text, out);
  }

  int nk = bp_registry_kernel_count(r);
  fprintf(out, "\nkernels: %d\n", nk);
  if (nk)
    fprintf(out, "  %-24s %-12s %-8s %-18s %8s  %-34s %s\n", "OP", "IMPL", "DEVICE", "DTYPES",
            "PRIORITY", "FLAGS", "MODULE");
  for (int i = 0; i < nk; i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    char dtypes[128], flags[128];
    dtype_list(k->kernel.dtypes, dtypes, sizeof dtypes, 0);
    flag_list(k->kernel.flags, flags, sizeof flags, 0);
    fprintf(out, "  %-24s %-12s %-8s %-18s %8d  %-34s %s\n", k->kernel.op, k->kernel.impl,
            k->kernel.device, dtypes, k->kernel.priority, flags, module_name(r, k->path));
  }

  if (nk) {
    fprintf(out, "\ndefault picks (nothing pinned or tuned, every kernel supporting):\n");
    fprintf(out, "  %-24s %-8s %s\n", "OP", "DEVICE", "KERNEL");
  }
  for (int i = 0; i < nk; i++) {
    if (!first_of_pair(r, i)) continue;
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    const bp_registered_kernel *pick =
        bp_registry_default_kernel(r, k->kernel.op, k->kernel.device);
    fprintf(out, "  %-24s %-8s %s%s\n", k->kernel.op, k->kernel.device, pick->kernel.impl,
            (pick->kernel.flags & BP_ABI_KERNEL_REFERENCE) ? " (reference: the only kernel)" : "");
  }
}

static void print_json(const bp_registry *r, FILE *out) {
  fprintf(out, "{\n  \"format_version\": 1,\n  \"host_abi\": {\"major\": %d, \"minor\": %d},\n",
          BP_ABI_MAJOR, BP_ABI_MINOR);
  fprintf(out, "  \"search_path\": [");
  for (int i = 0; i < bp_registry_search_dir_count(r); i++) {
    const bp_search_dir *d = bp_registry_search_dir(r, i);
    fprintf(out, "%s\n    {\"source\": ", i ? "," : "");
    bp_json_string(out, d->source);
    fprintf(out, ", \"path\": ");
    bp_json_string(out, d->path);
    fprintf(out, ", \"exists\": %s}", d->exists ? "true" : "false");
  }
  fprintf(out, "%s],\n  \"modules\": [", bp_registry_search_dir_count(r) ? "\n  " : "");
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    fprintf(out, "%s\n    {\"path\": ", i ? "," : "");
    bp_json_string(out, rec->path);
    fprintf(out, ", \"status\": \"%s\", \"stage\": \"%s\", \"name\": ",
            bp_load_outcome_name(rec->outcome), bp_load_stage_name(rec->stage));
    bp_json_string(out, rec->name);
    fprintf(out, ", \"version\": ");
    bp_json_string(out, rec->version);
    fprintf(out, ", \"build_id\": ");
    bp_json_string(out, rec->build_id);
    fprintf(out,
            ", \"abi_major\": %d, \"abi_minor_built\": %d, \"abi_minor_required\": %d"
            ", \"host_abi_major\": %d, \"host_abi_minor\": %d, \"reason\": ",
            rec->abi_major, rec->abi_minor_built, rec->abi_minor_required, rec->host_abi_major,
            rec->host_abi_minor);
    bp_json_string(out, rec->message);
    fprintf(out, ", \"source\": ");
    bp_json_string(out, rec->source);
    fputc('}', out);
  }
  fprintf(out, "%s],\n  \"ops\": [", bp_registry_record_count(r) ? "\n  " : "");
  for (int i = 0; i < bp_registry_op_count(r); i++) {
    const bp_abi_op *op = bp_registry_op(r, i);
    fprintf(out, "%s\n    {\"name\": ", i ? "," : "");
    bp_json_string(out, op->name);
    fprintf(out, ", \"inputs\": %d, \"outputs\": %d, \"attr_size\": %u, \"attr_version\": %u"
                 ", \"module\": ",
            op->num_inputs, op->num_outputs, op->attr_size, op->attr_version);
    bp_json_string(out, bp_registry_op_path(r, i));
    fputc('}', out);
  }
  fprintf(out, "%s],\n  \"layers\": [", bp_registry_op_count(r) ? "\n  " : "");
  for (int i = 0; i < bp_registry_layer_count(r); i++) {
    const bp_registered_layer *l = bp_registry_layer(r, i);
    fprintf(out, "%s\n    {\"type\": ", i ? "," : "");
    bp_json_string(out, l->layer.type);
    fprintf(out, ", \"inputs\": %d, \"forward_op\": ", (int)l->layer.num_inputs);
    bp_json_string(out, l->layer.forward_op);
    fprintf(out, ", \"backward_op\": ");
    if (l->layer.backward_op)
      bp_json_string(out, l->layer.backward_op);
    else
      fprintf(out, "null");
    fprintf(out, ", \"attr_size\": %u, \"keys\": [", (unsigned)l->layer.attr_size);
    for (int k = 0; k < l->layer.num_attrs; k++) {
      const bp_abi_layer_attr *a = &l->attrs[k];
      fprintf(out, "%s{\"key\": ", k ? ", " : "");
      bp_json_string(out, a->key);
      fprintf(out, ", \"type\": \"%s\", \"default\": %.15g, \"min\": %.15g, \"max\": %.15g"
                   ", \"required\": %s}",
              attr_type_name(a->type), a->default_value, a->min, a->max,
              a->required ? "true" : "false");
    }
    fprintf(out, "], \"saved\": [");
    for (int k = 0; k < layer_saved_count(l); k++) {
      const bp_abi_layer_saved *t = &l->saved[k];
      fprintf(out, "%s{\"dtype\": \"%s\", \"per_channel\": %s, \"channels\": %d}", k ? ", " : "",
              bp_dtype_name((bp_dtype)t->dtype), t->per_channel ? "true" : "false",
              (int)t->channels);
    }
    fprintf(out, "], \"module\": ");
    bp_json_string(out, l->path);
    fputc('}', out);
  }
  fprintf(out, "%s],\n  \"devices\": [", bp_registry_layer_count(r) ? "\n  " : "");
  for (int i = 0; i < bp_registry_device_count(r); i++) {
    const bp_abi_device *d = bp_registry_device(r, i);
    fprintf(out, "%s\n    {\"kind\": ", i ? "," : "");
    bp_json_string(out, d->kind);
    fprintf(out, ", \"module\": ");
    bp_json_string(out, bp_registry_device_path(r, i));
    fprintf(out, ", \"transports\": [");
    bp_abi_comm_transport t;
    for (int k = 0; bp_registry_device_transport(d, k, &t); k++) {
      fprintf(out, "%s{\"backend\": ", k ? ", " : "");
      bp_json_string(out, t.backend);
      fprintf(out, ", \"spans_processes\": %s, \"spans_devices\": %s, \"shares_device\": %s}",
              t.flags & BP_ABI_COMM_SPANS_PROCESSES ? "true" : "false",
              t.flags & BP_ABI_COMM_SPANS_DEVICES ? "true" : "false",
              t.flags & BP_ABI_COMM_SHARES_DEVICE ? "true" : "false");
    }
    fprintf(out, "]}");
  }
  fprintf(out, "%s],\n  \"devices_without_plugin\": [",
          bp_registry_device_count(r) ? "\n  " : "");
  json_list unserved = {out, 0};
  for_unserved_devices(r, unserved_json, &unserved);
  fprintf(out, "%s],\n  \"kernels\": [", unserved.listed ? "\n  " : "");
  int nk = bp_registry_kernel_count(r);
  for (int i = 0; i < nk; i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    char dtypes[256], flags[256];
    dtype_list(k->kernel.dtypes, dtypes, sizeof dtypes, 1);
    flag_list(k->kernel.flags, flags, sizeof flags, 1);
    fprintf(out, "%s\n    {\"op\": ", i ? "," : "");
    bp_json_string(out, k->kernel.op);
    fprintf(out, ", \"impl\": ");
    bp_json_string(out, k->kernel.impl);
    fprintf(out, ", \"device\": ");
    bp_json_string(out, k->kernel.device);
    fprintf(out, ", \"dtypes\": [%s], \"priority\": %d, \"flags\": [%s], \"module\": ", dtypes,
            k->kernel.priority, flags);
    bp_json_string(out, k->path);
    fprintf(out, ", \"build_id\": ");
    bp_json_string(out, k->build_id);
    fprintf(out, ", \"load_index\": %d}", k->load_index);
  }
  fprintf(out, "%s],\n  \"defaults\": [", nk ? "\n  " : "");
  int first = 1;
  for (int i = 0; i < nk; i++) {
    if (!first_of_pair(r, i)) continue;
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    const bp_registered_kernel *pick =
        bp_registry_default_kernel(r, k->kernel.op, k->kernel.device);
    fprintf(out, "%s\n    {\"op\": ", first ? "" : ",");
    bp_json_string(out, k->kernel.op);
    fprintf(out, ", \"device\": ");
    bp_json_string(out, k->kernel.device);
    fprintf(out, ", \"impl\": ");
    bp_json_string(out, pick->kernel.impl);
    fprintf(out, ", \"module\": ");
    bp_json_string(out, pick->path);
    fprintf(out, ", \"reference\": %s}",
            (pick->kernel.flags & BP_ABI_KERNEL_REFERENCE) ? "true" : "false");
    first = 0;
  }
  fprintf(out, "%s]\n}\n", first ? "" : "\n  ");
}

int bp_cmd_plugins(int argc, char **argv) {
  const char *paths[MAX_PLUGINS];
  int npaths = 0, json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(argv[i], "--plugin") == 0 || strncmp(argv[i], "--plugin=", 9) == 0) {
      const char *value = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
      if (!value || !value[0]) {
        bp_cli_report("plugins", "--plugin needs a path");
        return EXIT_USAGE;
      }
      if (npaths == MAX_PLUGINS) {
        bp_cli_report("plugins", "more than %d --plugin paths", MAX_PLUGINS);
        return EXIT_USAGE;
      }
      paths[npaths++] = value;
    } else {
      bp_cli_report("plugins", "unknown argument '%s' (try --help)", argv[i]);
      return EXIT_USAGE;
    }
  }

  bp_registry *r = NULL;
  if (bp_registry_create_with(&bp_cli_env_get()->registry, &r) != BP_OK) {
    bp_cli_report("plugins", "%s", bp_last_error());
    return EXIT_LOAD;
  }
  bp_status st = bp_registry_discover(r, paths, npaths);
  char why[1024];
  snprintf(why, sizeof why, "%s", bp_last_error());
  if (json)
    print_json(r, stdout);
  else
    print_text(r, stdout);
  fflush(stdout);
  bp_registry_destroy(r);
  if (st != BP_OK) {
    for (char *p = why; *p; p++)
      if ((unsigned char)*p < 0x20) *p = '?'; /* one line */
    bp_cli_report("plugins", "%s", why);
    return EXIT_LOAD;
  }
  return 0;
}
