/* `blueprint validate`: every loaded kernel (filtered) against the
 * reference kernel of its op, case by case (validate.h, docs/validate.md).
 *
 * Exit status: 0 every case passed or was skipped; 1 a case failed, or a
 * --plugin path could not be loaded, or the model does not compile, or
 * --device names a kind with no device to run on; 2 the command line is
 * wrong, or its filters match no loaded kernel, or --device names an
 * unknown kind (one line on stderr). */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/json_out.h"
#include "blueprint/dtype.h"
#include "blueprint/registry.h"
#include "blueprint/validate.h"
#include "cli_util.h"
#include "commands.h"
#include "env_options.h"

#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define MAX_PLUGINS 256

static const char usage_text[] =
    "usage: blueprint validate [--plugin PATH]... [--op GLOB] [--impl NAME] [--device KIND]\n"
    "                          [--dtype NAME] [--model FILE [--batch B]] [--seed S] [--gradcheck]\n"
    "                          [--json] [--case-timeout S]\n"
    "\n"
    "Runs every loaded kernel against the reference kernel of its op (the oracle)\n"
    "on the same seeded random inputs, case by case, and checks: the normalized\n"
    "error within the dtype's tolerance, every output element written, channel\n"
    "padding and the tail untouched, input padding ignored, accumulate=1 adding,\n"
    "IN_PLACE and DETERMINISTIC as flagged, supports() never followed by a failing\n"
    "run, and no read past slot_bytes (each case runs in a child process with a\n"
    "guard page after every slot). Reference kernels are checked against the\n"
    "conventions only. Kernels of a device with a loaded device plugin (cuda) run\n"
    "through it: buffers in device memory, copies, its stream; no guard pages\n"
    "there. Modules are found as `blueprint plugins` finds them.\n"
    "\n"
    "  --plugin PATH   load this module file, or every *.so in this directory\n"
    "  --op GLOB       only ops matching GLOB (e.g. 'conv2d.*')\n"
    "  --impl NAME     only kernels of this implementation\n"
    "  --device KIND   only kernels of this device kind, through its device plugin;\n"
    "                  a plugin that runs another kind's kernels (the test device\n"
    "                  'guarded' runs the cpu ones) runs those through itself\n"
    "  --dtype NAME    only cases with a tensor of this dtype: fp16 (the AMP twins\n"
    "                  and FP16 range cases), fp32, int8, int32\n"
    "  --model FILE    the nodes of this model's plan as cases, instead of the\n"
    "                  built-in table\n"
    "  --batch B       with --model: compile its plan for global batch B (the\n"
    "                  \"train\" variants, and \"train_last\" for the epoch's last\n"
    "                  partial batch when the model's train_size is not a multiple)\n"
    "  --seed S        seed of the random inputs (default 1)\n"
    "  --case-timeout S  seconds one (kernel, case) child may run before it is\n"
    "                  killed and the row fails as timed out (default 10; with\n"
    "                  --model 300)\n"
    "  --gradcheck     also check each reference backward, and each kernel of a\n"
    "                  module layer's backward op, against finite differences of\n"
    "                  its own forward\n"
    "  --json          print JSON (docs/validate-json.md) instead of a table\n"
    "  -h, --help      print this help\n"
    "\n"
    "Exit status: 0 all passed or skipped, 1 a case failed (or a --plugin path or\n"
    "the model could not be loaded, or the --device kind has no device here),\n"
    "2 bad command line, unknown --device kind, or no kernel matches.\n";

typedef struct validate_args {
  const char *plugins[MAX_PLUGINS];
  int plugin_count;
  bp_validate_options opt;
  int json, help;
} validate_args;

static int parse_args(int argc, char **argv, validate_args *a) {
  a->opt.seed = 1;
  a->opt.isolate = 1;
  bp_cli_env_validate(&a->opt);
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      a->help = 1;
      continue;
    }
    if (strcmp(arg, "--json") == 0) {
      a->json = 1;
      continue;
    }
    if (strcmp(arg, "--gradcheck") == 0) {
      a->opt.gradcheck = 1;
      continue;
    }
    const int takes = strcmp(arg, "--plugin") == 0 || strcmp(arg, "--op") == 0 ||
                      strcmp(arg, "--impl") == 0 || strcmp(arg, "--device") == 0 ||
                      strcmp(arg, "--model") == 0 || strcmp(arg, "--seed") == 0 ||
                      strcmp(arg, "--dtype") == 0 || strcmp(arg, "--batch") == 0 ||
                      strcmp(arg, "--case-timeout") == 0;
    if (!takes) {
      bp_cli_report("validate", "unknown argument '%s' (try --help)", arg);
      return -1;
    }
    if (i + 1 >= argc || argv[i + 1][0] == '\0') {
      bp_cli_report("validate", "%s needs a value", arg);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(arg, "--plugin") == 0) {
      if (a->plugin_count == MAX_PLUGINS) {
        bp_cli_report("validate", "more than %d --plugin paths", MAX_PLUGINS);
        return -1;
      }
      a->plugins[a->plugin_count++] = v;
    } else if (strcmp(arg, "--op") == 0) {
      a->opt.op_glob = v;
    } else if (strcmp(arg, "--impl") == 0) {
      a->opt.impl = v;
    } else if (strcmp(arg, "--device") == 0) {
      a->opt.device = v;
    } else if (strcmp(arg, "--dtype") == 0) {
      bp_dtype d;
      if (bp_dtype_from_name(v, &d) != 0 || d == BP_DTYPE_ANY) {
        bp_cli_report("validate", "--dtype '%s' is not fp32, fp16, int8, int32 or bf16", v);
        return -1;
      }
      a->opt.dtype = v;
    } else if (strcmp(arg, "--model") == 0) {
      a->opt.model_path = v;
    } else if (strcmp(arg, "--batch") == 0) {
      int64_t b;
      if (bp_cli_parse_int(v, 1, &b) != 0) {
        bp_cli_report("validate", "--batch '%s' is not a positive integer", v);
        return -1;
      }
      a->opt.batch = b;
    } else if (strcmp(arg, "--case-timeout") == 0) {
      char *end;
      errno = 0;
      const double t = strtod(v, &end);
      if (*end || errno || !(t > 0 && t <= 86400) || strpbrk(v, "xXnNiI")) {
        bp_cli_report("validate", "--case-timeout '%s' is not a number of seconds in (0, 86400]",
                      v);
        return -1;
      }
      a->opt.case_timeout_s = t;
    } else {
      int64_t s;
      if (bp_cli_parse_int(v, 0, &s) != 0) {
        bp_cli_report("validate", "--seed '%s' is not a non-negative integer", v);
        return -1;
      }
      a->opt.seed = (uint64_t)s;
    }
  }
  if (a->opt.batch > 0 && !a->opt.model_path) {
    bp_cli_report("validate",
                  "--batch needs --model (the built-in cases have batches of their own)");
    return -1;
  }
  return 0;
}

static void number(FILE *out, double v, int json) {
  if (isnan(v)) fprintf(out, json ? "null" : "%-9s", "-");
  else if (isinf(v)) fprintf(out, json ? "null" : "%-9s", "inf");
  else fprintf(out, json ? "%.6g" : "%-9.2e", v);
}

/* One line per device the rows ran through (not the host). */
static void print_devices(FILE *out, const bp_validate_report *rep) {
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *r = bp_validate_result_get(rep, i);
    int seen = strcmp(r->run_device, "host") == 0;
    for (int j = 0; j < i && !seen; j++) {
      const bp_validate_result *p = bp_validate_result_get(rep, j);
      seen = strcmp(p->run_device, r->run_device) == 0 && p->device_index == r->device_index;
    }
    if (!seen)
      fprintf(out,
              "validate: kernels of kind '%s' ran on device '%s' %d through its plugin (device "
              "memory, copies, its stream); reads past slot_bytes are not checked there "
              "(compute-sanitizer does that on a GPU)\n",
              r->device, r->run_device, r->device_index);
  }
}

static void print_table(FILE *out, const bp_validate_report *rep) {
  print_devices(out, rep);
  fprintf(out, "%-20s %-10s %-6s %-58s %-9s %-9s %s\n", "op", "impl", "device", "case", "error",
          "tolerance", "verdict");
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *r = bp_validate_result_get(rep, i);
    fprintf(out, "%-20s %-10s %-6s %-58s ", r->op, r->impl, r->device, r->case_name);
    number(out, r->error, 0);
    fputc(' ', out);
    number(out, r->tolerance, 0);
    fprintf(out, " %s%s%s\n", bp_validate_verdict_name(r->verdict), r->detail[0] ? ": " : "",
            r->detail);
  }
}

static void print_json(FILE *out, const bp_validate_report *rep, const validate_args *a) {
  const bp_validate_summary s = bp_validate_summarize(rep);
  fprintf(out, "{\n  \"seed\": %llu,\n  \"model\": ", (unsigned long long)a->opt.seed);
  if (a->opt.model_path) bp_json_string(out, a->opt.model_path);
  else fputs("null", out);
  fputs(",\n  \"dtype\": ", out);
  if (a->opt.dtype) bp_json_string(out, a->opt.dtype);
  else fputs("null", out);
  fputs(",\n  \"device\": ", out);
  if (a->opt.device) bp_json_string(out, a->opt.device);
  else fputs("null", out);
  fprintf(out, ",\n  \"gradcheck\": %s,\n  \"results\": [", a->opt.gradcheck ? "true" : "false");
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *r = bp_validate_result_get(rep, i);
    fprintf(out, "%s\n    {\"op\": ", i ? "," : "");
    bp_json_string(out, r->op);
    fputs(", \"impl\": ", out);
    bp_json_string(out, r->impl);
    fputs(", \"device\": ", out);
    bp_json_string(out, r->device);
    fputs(", \"case\": ", out);
    bp_json_string(out, r->case_name);
    fprintf(out, ", \"reference\": %s, \"verdict\": \"%s\", \"error\": ",
            r->reference ? "true" : "false",
            r->verdict == BP_VALIDATE_PASS   ? "pass"
            : r->verdict == BP_VALIDATE_FAIL ? "fail"
                                             : "skip");
    number(out, r->error, 1);
    fputs(", \"tolerance\": ", out);
    number(out, r->tolerance, 1);
    fputs(", \"detail\": ", out);
    bp_json_string(out, r->detail);
    fputs(", \"run_device\": ", out);
    bp_json_string(out, r->run_device);
    if (r->device_index >= 0) fprintf(out, ", \"device_index\": %d", r->device_index);
    else fputs(", \"device_index\": null", out);
    fprintf(out, ", \"guard_pages\": %s}", r->guard_pages ? "true" : "false");
  }
  fprintf(out,
          "%s],\n  \"summary\": {\"kernels\": %d, \"cases\": %d, \"passed\": %d, \"failed\": %d, "
          "\"skipped\": %d}\n}\n",
          bp_validate_result_count(rep) ? "\n  " : "", s.kernels, s.cases, s.passed, s.failed,
          s.skipped);
}

static int run(const validate_args *a) {
  bp_registry *r = NULL;
  bp_validate_report *rep = NULL;
  int rc = EXIT_FAILED;
  if (bp_registry_create_with(&bp_cli_env_get()->registry, &r) != BP_OK) {
    bp_cli_report("validate", "%s", bp_last_error());
    return EXIT_FAILED;
  }
  if (bp_registry_discover(r, a->plugins, a->plugin_count) != BP_OK) {
    bp_cli_report("validate", "%s", bp_last_error());
    goto done;
  }
  /* --device: the kernel kind it runs, and a device to run on */
  const char *kind = NULL;
  if (a->opt.device) {
    const bp_abi_device *dev = NULL;
    const bp_status st = bp_validate_device(r, a->opt.device, &kind, &dev);
    if (st != BP_OK) {
      bp_cli_report("validate", "%s", bp_last_error());
      rc = st == BP_ERR_INVALID ? EXIT_USAGE : EXIT_FAILED;
      goto done;
    }
  }
  int matched = 0;
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if ((!a->opt.op_glob || fnmatch(a->opt.op_glob, k->op, 0) == 0) &&
        (!a->opt.impl || strcmp(a->opt.impl, k->impl) == 0) &&
        (!kind || strcmp(kind, k->device) == 0))
      matched = 1;
  }
  if (!matched) {
    bp_cli_report("validate", "no loaded kernel matches%s%s%s%s%s%s (see 'blueprint plugins')",
                  a->opt.op_glob ? " --op " : "", a->opt.op_glob ? a->opt.op_glob : "",
                  a->opt.impl ? " --impl " : "", a->opt.impl ? a->opt.impl : "",
                  a->opt.device ? " --device " : "", a->opt.device ? a->opt.device : "");
    rc = EXIT_USAGE;
    goto done;
  }
  if (bp_validate_run(r, &a->opt, &rep) != BP_OK) {
    bp_cli_report("validate", "%s", bp_last_error());
    goto done;
  }
  const bp_validate_summary s = bp_validate_summarize(rep);
  if (a->json) {
    print_json(stdout, rep, a);
  } else {
    print_table(stdout, rep);
    printf("validate: %d kernels, %d cases: %d passed, %d failed, %d skipped\n", s.kernels,
           s.cases, s.passed, s.failed, s.skipped);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    bp_cli_report("validate", "cannot write to standard output: %s", strerror(errno));
    goto done;
  }
  rc = s.failed ? EXIT_FAILED : 0;
done:
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
  return rc;
}

int bp_cmd_validate(int argc, char **argv) {
  validate_args a;
  memset(&a, 0, sizeof a);
  if (parse_args(argc, argv, &a) != 0) return EXIT_USAGE;
  if (a.help) {
    fputs(usage_text, stdout);
    return fflush(stdout) == 0 ? 0 : EXIT_FAILED;
  }
  return run(&a);
}
