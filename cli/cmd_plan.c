/* `blueprint plan MODEL ...`: loads a model, compiles its memory plan with
 * the command line's settings over the model file's, and prints it as a
 * table, as JSON, and/or as an SVG picture.
 *
 * Exit status: 0 success; 1 the model, the plan or an output file failed;
 * 2 the command line itself is wrong. Every failure is one line on stderr,
 * "blueprint plan: <what is wrong>". */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/model.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "blueprint/registry.h"
#include "cli_util.h"
#include "commands.h"
#include "env_options.h"
#include "path_guard.h"
#include "plan_print.h"

#define EXIT_INPUT 1 /* the model, the plan or an output failed */
#define EXIT_USAGE 2 /* the command line is wrong */

static const char usage_text[] =
    "usage: blueprint plan MODEL [options]\n"
    "\n"
    "Lays out every tensor of MODEL (a YAML model file) in one arena and prints\n"
    "the plan: its variants, regions, tensors and the arena bytes per rank.\n"
    "Options override the model file's train: settings.\n"
    "\n"
    "  --batch B            training batch (variant \"train\")\n"
    "  --eval-batch B       evaluation batch (variant \"eval\")\n"
    "  --train-size N       images per epoch; N %% B != 0 adds \"train_last\"\n"
    "  --amp, --no-amp      FP16 working copies, gradients and features\n"
    "  --ema, --no-ema      EMA copies of the weights\n"
    "  --optimizer NAME     sgd, adamw or lars\n"
    "  --variants SPEC      more variants: NAME:BATCH[:HxW],... (resolution\n"
    "                       defaults to the model's), e.g. hires:64:32x32,small:16\n"
    "  --no-reuse           give every feature and gradient slot its own bytes\n"
    "                       (no liveness packing; docs/plan.md)\n"
    "  --json               print the plan as JSON (docs/plan-json.md) instead\n"
    "  --svg FILE           also draw the arena as an SVG picture into FILE\n"
    "  --plugin PATH        load this op module (file or directory) too: a model may\n"
    "                       use the layer types op modules register (BP_PLUGIN_PATH\n"
    "                       and the install directory are searched as for train)\n"
    "  -h, --help           print this help\n"
    "\n"
    "Exit status: 0 ok, 1 bad model or plan or unwritable file, 2 bad command line.\n";

/* What the command line asked for; 0 / -1 mean "as the model file says". */
typedef struct plan_args {
  const char *model_path;
  int64_t batch, eval_batch, train_size; /* 0: from the model */
  int amp, ema;                          /* -1: from the model */
  int optimizer;                         /* -1: from the model, else bp_optimizer */
  bp_variant_spec *extra;                /* owned */
  int extra_count;
  int json;
  int no_reuse;
  const char *svg_path;
  const char *plugins[16]; /* --plugin paths */
  int plugin_count;
  int help;
} plan_args;

/* Same, for a value given to `option`; reports the problem itself. */
static int option_positive(const char *option, const char *value, int64_t *out) {
  if (bp_cli_parse_int(value, 1, out) == 0) return 0;
  bp_cli_report("plan", "%s: '%s' is not a positive integer", option, value);
  return -1;
}

static int name_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-' || c == '.';
}

/* Parses one "NAME:BATCH[:HxW]" item of --variants into `out` (height and
 * width 0 when absent: the model's resolution is filled in later). */
static int parse_variant_item(const char *item, bp_variant_spec *out) {
  char buf[256];
  if (strlen(item) >= sizeof buf) {
    bp_cli_report("plan", "--variants: '%.40s...' is too long", item);
    return -1;
  }
  strcpy(buf, item);
  memset(out, 0, sizeof *out);
  char *name = buf, *batch = strchr(buf, ':'), *res = NULL;
  if (!batch) {
    bp_cli_report("plan", "--variants: '%s' is not NAME:BATCH[:HxW]", item);
    return -1;
  }
  *batch++ = '\0';
  if ((res = strchr(batch, ':')) != NULL) *res++ = '\0';
  size_t nlen = strlen(name);
  if (nlen == 0 || nlen >= BP_NAME_MAX) {
    bp_cli_report("plan", "--variants: '%s': the name must have 1 to %d characters", item, BP_NAME_MAX - 1);
    return -1;
  }
  for (const char *p = name; *p; p++) {
    if (!name_char_ok(*p)) {
      bp_cli_report("plan", "--variants: '%s': the name '%s' may only hold letters, digits, '_', '-' and '.'",
             item, name);
      return -1;
    }
  }
  /* the compiler's own variants (model.h); the graph scales by their names */
  static const char *const builtin[] = {"train",      "train_small", "train_last",
                                        "train_last_small", "eval", "eval_last"};
  for (size_t k = 0; k < sizeof builtin / sizeof builtin[0]; k++) {
    if (strcmp(name, builtin[k]) == 0) {
      bp_cli_report("plan", "--variants: '%s': the name '%s' is reserved for the built-in variants",
                    item, name);
      return -1;
    }
  }
  memcpy(out->name, name, nlen + 1);
  if (bp_cli_parse_int(batch, 1, &out->batch) != 0) {
    bp_cli_report("plan", "--variants: '%s': the batch '%s' is not a positive integer", item, batch);
    return -1;
  }
  if (res) {
    char *x = strpbrk(res, "xX");
    if (x) *x = '\0';
    if (!x || bp_cli_parse_int(res, 1, &out->height) != 0 ||
        bp_cli_parse_int(x + 1, 1, &out->width) != 0) {
      if (x) *x = 'x';
      bp_cli_report("plan", "--variants: '%s': the resolution '%s' is not HxW (two positive integers)", item, res);
      return -1;
    }
  }
  return 0;
}

/* Appends the comma-separated items of one --variants value. */
static int parse_variants(const char *spec, plan_args *a) {
  const char *p = spec;
  if (*p == '\0') {
    bp_cli_report("plan", "--variants: the value is empty; expected NAME:BATCH[:HxW],...");
    return -1;
  }
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char *item = strndup(p, len);
    if (!item) {
      bp_cli_report("plan", "out of memory reading --variants");
      return -1;
    }
    if (len == 0) {
      bp_cli_report("plan", "--variants: '%s' has an empty item", spec);
      free(item);
      return -1;
    }
    bp_variant_spec *grown = realloc(a->extra, (size_t)(a->extra_count + 1) * sizeof *grown);
    if (!grown) {
      bp_cli_report("plan", "out of memory reading --variants");
      free(item);
      return -1;
    }
    a->extra = grown;
    int rc = parse_variant_item(item, &a->extra[a->extra_count]);
    if (rc == 0) {
      for (int i = 0; i < a->extra_count; i++) {
        if (strcmp(a->extra[i].name, a->extra[a->extra_count].name) == 0) {
          bp_cli_report("plan", "--variants: the variant '%s' is named twice", a->extra[i].name);
          rc = -1;
          break;
        }
      }
    }
    free(item);
    if (rc != 0) return -1;
    a->extra_count++;
    if (!comma) return 0;
    p = comma + 1;
  }
}

/* Options that take a value; `--opt VALUE` and `--opt=VALUE` both work. */
static const char *const valued[] = {"--batch", "--eval-batch", "--train-size",
                                     "--optimizer", "--variants", "--svg", "--plugin"};

/* Parses argv (argv[0] is "plan"). Returns 0, or -1 after reporting. */
static int parse_args(int argc, char **argv, plan_args *a) {
  int only_positional = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (only_positional || arg[0] != '-' || strcmp(arg, "-") == 0) {
      if (a->model_path) {
        bp_cli_report("plan", "unexpected argument '%s' (the model is '%s'; one model per plan)", arg,
               a->model_path);
        return -1;
      }
      a->model_path = arg;
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      only_positional = 1;
      continue;
    }
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      a->help = 1;
      return 0;
    }
    if (strcmp(arg, "--json") == 0) { a->json = 1; continue; }
    if (strcmp(arg, "--no-reuse") == 0) { a->no_reuse = 1; continue; }
    if (strcmp(arg, "--amp") == 0) { a->amp = 1; continue; }
    if (strcmp(arg, "--no-amp") == 0) { a->amp = 0; continue; }
    if (strcmp(arg, "--ema") == 0) { a->ema = 1; continue; }
    if (strcmp(arg, "--no-ema") == 0) { a->ema = 0; continue; }

    /* an option with a value: split "--opt=VALUE" or take the next word */
    char option[32];
    const char *value = NULL;
    const char *eq = strchr(arg, '=');
    size_t olen = eq ? (size_t)(eq - arg) : strlen(arg);
    const char *known = NULL;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
      if (strlen(valued[k]) == olen && strncmp(arg, valued[k], olen) == 0) known = valued[k];
    if (!known) {
      bp_cli_report("plan", "unknown option '%s' (try 'blueprint plan --help')", arg);
      return -1;
    }
    snprintf(option, sizeof option, "%s", known);
    if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    } else {
      bp_cli_report("plan", "option '%s' needs a value", option);
      return -1;
    }
    if (strcmp(option, "--batch") == 0) {
      if (option_positive(option, value, &a->batch)) return -1;
    } else if (strcmp(option, "--eval-batch") == 0) {
      if (option_positive(option, value, &a->eval_batch)) return -1;
    } else if (strcmp(option, "--train-size") == 0) {
      if (option_positive(option, value, &a->train_size)) return -1;
    } else if (strcmp(option, "--optimizer") == 0) {
      bp_optimizer opt;
      if (bp_optimizer_from_name(value, &opt) != 0) {
        bp_cli_report("plan", "--optimizer: unknown optimizer '%s' (sgd, adamw or lars)", value);
        return -1;
      }
      a->optimizer = (int)opt;
    } else if (strcmp(option, "--plugin") == 0) {
      if (a->plugin_count == (int)(sizeof a->plugins / sizeof a->plugins[0])) {
        bp_cli_report("plan", "--plugin: more than %d plugin paths",
                      (int)(sizeof a->plugins / sizeof a->plugins[0]));
        return -1;
      }
      a->plugins[a->plugin_count++] = value;
    } else if (strcmp(option, "--variants") == 0) {
      if (parse_variants(value, a)) return -1;
    } else { /* --svg */
      if (*value == '\0') {
        bp_cli_report("plan", "--svg: the file name is empty");
        return -1;
      }
      a->svg_path = value;
    }
  }
  if (!a->model_path) {
    bp_cli_report("plan", "no model file given (usage: blueprint plan MODEL [options]; try --help)");
    return -1;
  }
  return 0;
}

/* The model's name for titles: its own, else the file name. */
static const char *model_title(const bp_model *m, const char *path) {
  if (m->name[0]) return m->name;
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Loads, compiles and prints. Returns the exit status. */
static int run(const plan_args *a) {
  bp_model *model = NULL;
  bp_plan *plan = NULL;
  bp_registry *registry = NULL; /* the layer types of op modules */
  int rc = EXIT_INPUT;
  /* the picture never replaces the model or a module (path_guard.h) */
  bp_path_use uses[2 + sizeof a->plugins / sizeof a->plugins[0]];
  int n = 0;
  uses[n++] = (bp_path_use){a->model_path, "the model file", BP_PATH_INPUT, NULL};
  for (int k = 0; k < a->plugin_count; k++)
    uses[n++] = (bp_path_use){a->plugins[k], "the module file", BP_PATH_INPUT, NULL};
  uses[n++] = (bp_path_use){a->svg_path, "--svg", BP_PATH_OUTPUT, NULL};
  const int clash = bp_cli_check_paths("plan", uses, n);
  if (clash) return clash == 2 ? EXIT_USAGE : EXIT_INPUT;
  if (bp_registry_create_with(&bp_cli_env_get()->registry, &registry) != BP_OK ||
      bp_registry_discover(registry, a->plugins, a->plugin_count) != BP_OK ||
      bp_model_load_file(a->model_path, registry, &model) != BP_OK) {
    bp_cli_report("plan", "%s", bp_last_error());
    bp_registry_destroy(registry);
    return EXIT_INPUT;
  }
  bp_compile_options opt = bp_compile_options_from_model(model);
  opt.fuse_bn_relu = !bp_cli_env_get()->no_fuse;
  if (a->batch) opt.batch = a->batch;
  if (a->eval_batch) opt.eval_batch = a->eval_batch;
  if (a->train_size) opt.train_size = a->train_size;
  if (a->amp >= 0) opt.plan.amp = a->amp;
  if (a->ema >= 0) opt.plan.ema = a->ema;
  if (a->optimizer >= 0) opt.plan.optimizer = (bp_optimizer)a->optimizer;
  /* extra variants without a resolution take the model's */
  for (int i = 0; i < a->extra_count; i++) {
    if (a->extra[i].height == 0) {
      a->extra[i].height = model->height;
      a->extra[i].width = model->width;
    }
  }
  opt.extra = a->extra;
  opt.extra_count = a->extra_count;
  opt.no_reuse = a->no_reuse;
  if (bp_model_compile(model, &opt, &plan) != BP_OK) {
    bp_cli_report("plan", "%s", bp_last_error());
    goto done;
  }
  bp_plan_print_info info = {model_title(model, a->model_path), a->model_path};
  if (a->svg_path && bp_plan_write_svg(a->svg_path, plan, &info) != BP_OK) {
    bp_cli_report("plan", "%s", bp_last_error());
    goto done;
  }
  if (a->json) {
    bp_plan_print_json(stdout, plan);
  } else {
    bp_plan_print_table(stdout, plan, &info);
    if (a->svg_path) printf("picture of the arena: %s\n", a->svg_path);
  }
  /* a full disk or a closed pipe must not pass for success */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    bp_cli_report("plan", "cannot write the plan to standard output: %s", strerror(errno));
    goto done;
  }
  rc = 0;
done:
  bp_plan_destroy(plan);
  bp_model_destroy(model);
  bp_registry_destroy(registry); /* last: the model borrows its layer types */
  return rc;
}

int bp_cmd_plan(int argc, char **argv) {
  plan_args a = {.amp = -1, .ema = -1, .optimizer = -1};
  int rc;
  if (parse_args(argc, argv, &a) != 0) {
    rc = EXIT_USAGE;
  } else if (a.help) {
    fputs(usage_text, stdout);
    rc = fflush(stdout) == 0 ? 0 : EXIT_INPUT;
  } else {
    rc = run(&a);
  }
  free(a.extra);
  return rc;
}
