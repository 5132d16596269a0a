/* Parsing the command lines of `blueprint train` and `blueprint eval`.
 * Every value is checked here, so a typo is one line naming the option and
 * the value, before any data is read. */
#include "blueprint/model_onnx.h"
#include "train_args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/comm.h"
#include "blueprint/data.h"
#include "env_options.h"

/* A finite decimal number >= min (no hex, no inf/nan). */
static int parse_number(const char *s, double min, double *out) {
  if (!*s || strpbrk(s, "xXnNiI") || *s == ' ') return -1;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (*end != '\0' || errno == ERANGE || !isfinite(v) || v < min) return -1;
  *out = v;
  return 0;
}

typedef enum { V_COUNT, V_COUNT0, V_SEED, V_NUMBER, V_UNIT, V_TEXT, V_FILE, V_NONE } value_kind;

typedef enum {
  O_DATA, O_BATCH, O_EVAL_BATCH, O_TEST_LIMIT, O_CHECKPOINT, O_DEVICE, O_KERNELS, O_PLUGIN,
  O_OPTIMIZER, O_EMA, O_AMP, O_QUIET, O_EPOCHS, O_RANKS, O_SEED, O_RESUME, O_METRICS,
  O_LOG_EVERY, O_LR, O_MOMENTUM, O_WEIGHT_DECAY, O_NESTEROV, O_SCHEDULE, O_WARMUP,
  O_STEP_GAMMA, O_STEP_EVERY, O_TRAIN_LIMIT, O_STOP_AFTER, O_CROP_PAD, O_FLIP, O_EMA_DECAY,
  O_AUTOTUNE, O_AUTOTUNE_CACHE, O_REPLICATE, O_VERBOSE, O_DEVICES, O_LOSS_SCALE,
  O_GROWTH_INTERVAL, O_PROFILE, O_NO_REUSE, O_DETERMINISTIC, O_NO_TF32, O_NO_GRAPH,
  O_STREAMS, O_KEEP_GOING_NONFINITE, O_TRUST_PINS
} option_id;

/* Every option: its name, what its value is, and whether eval takes it. */
static const struct option_spec {
  option_id id;
  const char *name;
  value_kind kind;
  int eval;
} specs[] = {
    {O_DATA, "--data", V_FILE, 1},
    {O_BATCH, "--batch", V_COUNT, 1},
    {O_EVAL_BATCH, "--eval-batch", V_COUNT, 1},
    {O_TEST_LIMIT, "--test-limit", V_COUNT0, 1},
    {O_CHECKPOINT, "--checkpoint", V_FILE, 1},
    {O_DEVICE, "--device", V_TEXT, 1},
    {O_DEVICES, "--devices", V_TEXT, 1},
    {O_KERNELS, "--kernels", V_TEXT, 1},
    {O_TRUST_PINS, "--trust-pins", V_NONE, 1},
    {O_PLUGIN, "--plugin", V_FILE, 1},
    {O_OPTIMIZER, "--optimizer", V_TEXT, 1},
    {O_EMA, "--ema", V_NONE, 1},
    {O_AMP, "--amp", V_NONE, 1},
    {O_LOSS_SCALE, "--loss-scale", V_NUMBER, 0},
    {O_GROWTH_INTERVAL, "--loss-scale-growth-interval", V_COUNT, 0},
    {O_QUIET, "--quiet", V_NONE, 1},
    {O_VERBOSE, "--verbose", V_NONE, 1},
    {O_PROFILE, "--profile", V_NONE, 1},
    {O_EPOCHS, "--epochs", V_COUNT, 0},
    {O_RANKS, "--ranks", V_COUNT, 1},
    {O_REPLICATE, "--replicate-update", V_NONE, 0},
    {O_NO_REUSE, "--no-reuse", V_NONE, 1},
    {O_NO_GRAPH, "--no-graph", V_NONE, 1},
    {O_STREAMS, "--streams", V_COUNT, 1},
    {O_DETERMINISTIC, "--deterministic", V_NONE, 1},
    {O_NO_TF32, "--no-tf32", V_NONE, 1},
    {O_SEED, "--seed", V_SEED, 0},
    {O_RESUME, "--resume", V_FILE, 0},
    {O_METRICS, "--metrics", V_FILE, 0},
    {O_LOG_EVERY, "--log-every", V_COUNT0, 0},
    {O_LR, "--lr", V_NUMBER, 0},
    {O_MOMENTUM, "--momentum", V_UNIT, 0},
    {O_WEIGHT_DECAY, "--weight-decay", V_NUMBER, 0},
    {O_NESTEROV, "--nesterov", V_NONE, 0},
    {O_SCHEDULE, "--schedule", V_TEXT, 0},
    {O_WARMUP, "--warmup-epochs", V_NUMBER, 0},
    {O_STEP_GAMMA, "--step-gamma", V_NUMBER, 0},
    {O_STEP_EVERY, "--step-every", V_COUNT, 0},
    {O_TRAIN_LIMIT, "--train-limit", V_COUNT0, 0},
    {O_STOP_AFTER, "--stop-after-steps", V_COUNT, 0},
    {O_CROP_PAD, "--crop-pad", V_COUNT0, 0},
    {O_FLIP, "--flip", V_NONE, 0},
    {O_EMA_DECAY, "--ema-decay", V_UNIT, 0},
    {O_AUTOTUNE, "--autotune", V_NONE, 0},
    {O_AUTOTUNE_CACHE, "--autotune-cache", V_FILE, 0},
    {O_KEEP_GOING_NONFINITE, "--keep-going-nonfinite", V_NONE, 0},
};

static const struct option_spec *find_spec(const char *arg, size_t len, int eval) {
  for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
    if (strlen(specs[k].name) == len && strncmp(arg, specs[k].name, len) == 0 &&
        (specs[k].eval || !eval))
      return &specs[k];
  return NULL;
}

/* The largest value an option takes (train.h states the ranges); 0: the
 * kind's own bound only. */
static double max_of(option_id id) {
  switch (id) {
  case O_EPOCHS:
  case O_STEP_EVERY:
  case O_WARMUP: return BP_TRAIN_MAX_EPOCHS;
  case O_LR:
  case O_WEIGHT_DECAY:
  case O_STEP_GAMMA: return BP_TRAIN_MAX_RATE;
  case O_CROP_PAD: return BP_TRAIN_MAX_CROP_PAD;
  case O_BATCH:
  case O_EVAL_BATCH:
  case O_TEST_LIMIT:
  case O_TRAIN_LIMIT:
  case O_LOG_EVERY:
  case O_STOP_AFTER: return (double)BP_TRAIN_MAX_COUNT;
  case O_GROWTH_INTERVAL: return BP_TRAIN_MAX_GROWTH_INTERVAL;
  default: return 0;
  }
}

/* Refuses a parsed value over its option's stated maximum. */
static int check_max(const char *cmd, const struct option_spec *s, const char *value, double v,
                     double lo) {
  const double hi = max_of(s->id);
  if (hi == 0 || v <= hi) return 0;
  bp_cli_report(cmd, "%s: '%.64s' is out of range [%.0f, %.0f]", s->name, value, lo, hi);
  return -1;
}

/* Checks `value` for its kind; the parsed number goes to *i or *d. */
static int check_value(const char *cmd, const struct option_spec *s, const char *value, int64_t *i,
                       double *d) {
  const double hi = max_of(s->id);
  switch (s->kind) {
  case V_COUNT:
    if (bp_cli_parse_int(value, 1, i) == 0) return check_max(cmd, s, value, (double)*i, 1);
    if (hi > 0)
      bp_cli_report(cmd, "%s: '%.64s' is not an integer in [1, %.0f]", s->name, value, hi);
    else
      bp_cli_report(cmd, "%s: '%.64s' is not a positive integer", s->name, value);
    return -1;
  case V_COUNT0:
    if (bp_cli_parse_int(value, 0, i) == 0) return check_max(cmd, s, value, (double)*i, 0);
    if (hi > 0)
      bp_cli_report(cmd, "%s: '%.64s' is not an integer in [0, %.0f]", s->name, value, hi);
    else
      bp_cli_report(cmd, "%s: '%.64s' is not an integer >= 0", s->name, value);
    return -1;
  case V_SEED: {
    if (*value >= '0' && *value <= '9') {
      errno = 0;
      char *end;
      unsigned long long v = strtoull(value, &end, 10);
      if (*end == '\0' && errno != ERANGE) {
        *i = (int64_t)v;
        return 0;
      }
    }
    bp_cli_report(cmd, "%s: '%s' is not an integer in [0, 2^64)", s->name, value);
    return -1;
  }
  case V_NUMBER:
    if (parse_number(value, 0.0, d) == 0) return check_max(cmd, s, value, *d, 0);
    if (hi > 0)
      bp_cli_report(cmd, "%s: '%.64s' is not a number in [0, %.0f]", s->name, value, hi);
    else
      bp_cli_report(cmd, "%s: '%.64s' is not a finite number >= 0", s->name, value);
    return -1;
  case V_UNIT:
    if (parse_number(value, 0.0, d) == 0 && *d < 1.0) return 0;
    bp_cli_report(cmd, "%s: '%s' is not a number in [0, 1)", s->name, value);
    return -1;
  case V_TEXT:
  case V_FILE:
    if (*value) return 0;
    bp_cli_report(cmd, "%s: the value is empty", s->name);
    return -1;
  case V_NONE: break;
  }
  return 0;
}

static int apply(bp_cli_train_args *a, const struct option_spec *s, const char *value, int64_t i,
                 double d, int *plugins) {
  bp_train_options *o = &a->options;
  const char *cmd = a->command;
  switch (s->id) {
  case O_DATA:
    if (bp_data_is_synthetic(value)) { /* a bad synthetic spec fails before any work */
      bp_data_synthetic_spec spec;
      if (bp_data_synthetic_parse(value, &spec) != BP_OK) {
        bp_cli_report(cmd, "--data: %s", bp_last_error());
        return -1;
      }
    }
    o->data_dir = value;
    break;
  case O_BATCH: o->batch = i; break;
  case O_EVAL_BATCH: o->eval_batch = i; break;
  case O_TEST_LIMIT: o->test_limit = i; break;
  case O_CHECKPOINT: o->checkpoint_path = value; break;
  case O_KERNELS: o->kernels = value; break;
  case O_EMA: o->ema = 1; break;
  case O_AMP: o->amp = 1; break;
  case O_QUIET: a->quiet = 1; break;
  case O_VERBOSE: a->verbose = 1; break;
  case O_PROFILE: a->profile = 1; break;
  case O_EPOCHS: o->epochs = i; break;
  case O_SEED:
    o->seed = (uint64_t)i;
    a->seed_given = 1;
    break;
  case O_RESUME: o->resume_path = value; break;
  case O_METRICS: o->metrics_path = value; break;
  case O_LOG_EVERY: o->log_every = i; break;
  case O_LR: o->lr = d; break;
  case O_MOMENTUM: o->momentum = d; break;
  case O_WEIGHT_DECAY: o->weight_decay = d; break;
  case O_NESTEROV: o->nesterov = 1; break;
  case O_REPLICATE: o->replicate_update = 1; break;
  case O_NO_REUSE: o->no_reuse = 1; break;
  case O_NO_GRAPH: o->no_graph = 1; break;
  /* GPU kernel switches the CUDA op modules read at init (env_options.h) */
  case O_DETERMINISTIC: bp_cli_env_set_deterministic(); break;
  case O_NO_TF32: bp_cli_env_set_no_tf32(); break;
  case O_WARMUP: o->warmup_epochs = d; break;
  case O_STEP_GAMMA: o->step_gamma = d; break;
  case O_STEP_EVERY: o->step_epochs = i; break;
  case O_TRAIN_LIMIT: o->train_limit = i; break;
  case O_STOP_AFTER: o->stop_after_steps = i; break;
  case O_CROP_PAD: o->augment.crop_pad = (int)i; break; /* at most 1024: check_value */
  case O_FLIP: o->augment.flip = 1; break;
  case O_EMA_DECAY: o->ema_decay = d; break;
  case O_AUTOTUNE: o->autotune = 1; break;
  case O_TRUST_PINS: o->trust_pins = 1; break;
  case O_KEEP_GOING_NONFINITE: o->keep_going_nonfinite = 1; break;
  case O_AUTOTUNE_CACHE: o->autotune = 1, o->autotune_cache = value; break;
  case O_GROWTH_INTERVAL: o->loss_scale_growth_interval = i; break;
  case O_LOSS_SCALE: /* 0 means "dynamic" in the options: not a scale one can ask for */
    if (d < BP_TRAIN_MIN_LOSS_SCALE || d > BP_TRAIN_MAX_LOSS_SCALE) {
      bp_cli_report(cmd, "--loss-scale: '%s' is not a number in [2^-24, 2^64]", value);
      return -1;
    }
    o->loss_scale = d;
    break;
  case O_STREAMS:
    if (i < 1 || i > 3) {
      bp_cli_report(cmd, "--streams %lld: must be in [1, 3] (compute streams of a device rank)",
                    (long long)i);
      return -1;
    }
    o->streams = (int)i;
    break;
  case O_RANKS:
    if (i < 1 || i > BP_COMM_MAX_WORLD) {
      bp_cli_report(cmd, "--ranks %lld: must be in [1, %d] (ranks run as threads)", (long long)i,
                    BP_COMM_MAX_WORLD);
      return -1;
    }
    o->ranks = (int)i;
    break;
  case O_DEVICE: /* the kinds are the plugins': the trainer names the loaded ones */
    o->device = value;
    break;
  case O_DEVICES:
    if (!value[0] || strspn(value, "0123456789,") != strlen(value)) {
      bp_cli_report(cmd, "--devices: '%s' is not a comma-separated list of device indices",
                    value);
      return -1;
    }
    o->devices = value;
    break;
  case O_OPTIMIZER: {
    bp_optimizer opt;
    if (bp_optimizer_from_name(value, &opt) != 0) {
      bp_cli_report(cmd, "--optimizer: unknown optimizer '%s' (sgd, adamw or lars)", value);
      return -1;
    }
    o->optimizer = (int)opt;
    break;
  }
  case O_SCHEDULE: {
    bp_lr_schedule sch;
    if (bp_lr_schedule_from_name(value, &sch) != 0) {
      bp_cli_report(cmd, "--schedule: unknown schedule '%s' (constant, step or cosine)", value);
      return -1;
    }
    o->schedule = (int)sch;
    break;
  }
  case O_PLUGIN:
    if (*plugins >= BP_CLI_MAX_PLUGINS) {
      bp_cli_report(cmd, "--plugin: more than %d plugin paths", BP_CLI_MAX_PLUGINS);
      return -1;
    }
    a->plugins[(*plugins)++] = value;
    o->plugin_paths = a->plugins;
    o->plugin_path_count = *plugins;
    break;
  }
  return 0;
}

int bp_cli_train_parse(int argc, char **argv, int eval, bp_cli_train_args *a) {
  memset(a, 0, sizeof *a);
  a->command = eval ? (argc > 0 && strcmp(argv[0], "export") == 0 ? "export" : "eval") : "train";
  bp_train_options_init(&a->options);
  bp_cli_env_train(&a->options); /* the options below win */
  int plugins = 0, only_positional = 0;
  for (int k = 1; k < argc; k++) {
    const char *arg = argv[k];
    if (only_positional || arg[0] != '-' || strcmp(arg, "-") == 0) {
      if (a->model_path) {
        bp_cli_report(a->command, "unexpected argument '%s' (the model is '%s')", arg,
                      a->model_path);
        return -1;
      }
      a->model_path = arg;
      continue;
    }
    if (!strcmp(arg, "--")) {
      only_positional = 1;
      continue;
    }
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      a->help = 1;
      return 0;
    }
    const char *eq = strchr(arg, '=');
    const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const struct option_spec *s = find_spec(arg, len, eval);
    if (!s) {
      bp_cli_report(a->command, "unknown option '%.*s' (try 'blueprint %s --help')", (int)len, arg,
                    a->command);
      return -1;
    }
    const char *value = NULL;
    if (s->kind == V_NONE) {
      if (eq) {
        bp_cli_report(a->command, "option '%s' takes no value", s->name);
        return -1;
      }
    } else if (eq) {
      value = eq + 1;
    } else if (k + 1 < argc) {
      value = argv[++k];
    } else {
      bp_cli_report(a->command, "option '%s' needs a value", s->name);
      return -1;
    }
    int64_t i = 0;
    double d = 0.0;
    if (value && check_value(a->command, s, value, &i, &d) != 0) return -1;
    if (apply(a, s, value, i, d, &plugins) != 0) return -1;
  }
  if (!a->model_path) {
    bp_cli_report(a->command,
                  "no model file given (usage: blueprint %s MODEL [options]; try "
                  "--help)",
                  a->command);
    return -1;
  }
  if (eval && !a->options.checkpoint_path && !bp_model_path_is_onnx(a->model_path)) {
    bp_cli_report(a->command, "--checkpoint FILE is required (the checkpoint to evaluate; an "
                  "ONNX model without one runs its own initializers)");
    return -1;
  }
  if (a->options.loss_scale > 0 && a->options.loss_scale_growth_interval > 0) {
    bp_cli_report(a->command,
                  "--loss-scale sets a static scale, which never grows: drop "
                  "--loss-scale-growth-interval (or --loss-scale, for a dynamic scale)");
    return -1;
  }
  if (!eval && a->options.stop_after_steps && !a->options.checkpoint_path) {
    bp_cli_report(a->command, "--stop-after-steps needs --checkpoint FILE (it saves and stops)");
    return -1;
  }
  return 0;
}
