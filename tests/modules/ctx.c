/* A module that keeps its state in a context (ABI 1.6 init_ctx/fini_ctx):
 * each init_ctx allocates one holding the value of the host option
 * "tm_value" and registers relu.fwd/ctx/cpu with `user` pointing at it;
 * run() writes that value into its output, so a test sees which context a
 * registry's kernel reads. Options steer the failure cases:
 *   tm_fail=1  init_ctx registers its kernel, then fails (host->error):
 *              it frees its context itself and must get no fini_ctx
 *   tm_dup=1   init_ctx registers its kernel twice and returns OK: the
 *              host refuses the module and must call fini_ctx
 * Built with TM_ABI15 it is a 1.5 module: struct_size ends before
 * init_ctx (which is still set, so a host that reads past struct_size
 * would call it) and plain init/fini register relu.fwd/ctx15/cpu with the
 * value -15. Every call is recorded in a log that the exported
 * tm_ctx_record() returns (test_module.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "test_module.h"

#define TM_CTX_MAGIC 0x43545831u /* "CTX1" */

typedef struct tm_ctx {
  uint32_t magic;
  int32_t value;
} tm_ctx;

static tm_ctx_log tm_log;

BP_ABI_EXPORT tm_ctx_log *tm_ctx_record(void);
BP_ABI_EXPORT tm_ctx_log *tm_ctx_record(void) { return &tm_log; }

/* output 0, element 0 = the context's value; BP_ABI_ERR_INVALID when user
 * is not a live context of this module */
static int run(void *user, const bp_abi_kernel_args *args) {
  const tm_ctx *c = user;
  if (!c || c->magic != TM_CTX_MAGIC || !args || args->num_outputs < 1 || !args->output_ptrs)
    return BP_ABI_ERR_INVALID;
  *(float *)args->output_ptrs[0] = (float)c->value;
  return BP_ABI_OK;
}

#ifdef TM_ABI15
#define TM_IMPL "ctx15"
#else
#define TM_IMPL "ctx"
#endif

/* A static template; each registration is a copy pointing at its context
 * (bp_sdk_register_kernel_user: the host copies kernel descriptors). */
static const bp_abi_kernel template_kernel = {
    .struct_size = sizeof(bp_abi_kernel), .op = "relu.fwd", .impl = TM_IMPL, .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .run = run, .user = NULL};

static int register_kernel(const bp_abi_host *host, tm_ctx *c) {
  return bp_sdk_register_kernel_user(host, &template_kernel, c);
}

static const char *option(const bp_abi_host *host, const char *name) {
  return bp_sdk_host_option(host, name);
}

static int init_ctx(const bp_abi_host *host, void **ctx_out) {
  tm_log.init_ctx_calls++;
  tm_ctx *c = calloc(1, sizeof *c);
  if (!c) return BP_ABI_ERR_NOMEM;
  c->magic = TM_CTX_MAGIC;
  const char *v = option(host, "tm_value");
  c->value = v ? (int32_t)atoi(v) : 0;
  int rc = register_kernel(host, c);
  if (rc == BP_ABI_OK && option(host, "tm_fail")) {
    host->error(host->ctx, "test-ctx: tm_fail asks init_ctx to fail");
    rc = BP_ABI_ERR_DEVICE;
  }
  if (rc == BP_ABI_OK && option(host, "tm_dup")) (void)register_kernel(host, c);
  if (rc != BP_ABI_OK) {
    c->magic = 0;
    free(c); /* a failed init_ctx frees its own context */
    return rc;
  }
  tm_log.init_ctx_ok++;
  if (tm_log.live_count < TM_CTX_MAX) tm_log.live[tm_log.live_count++] = c;
  *ctx_out = c;
  return BP_ABI_OK;
}

static void fini_ctx(void *ctx) {
  tm_log.fini_ctx_calls++;
  int at = -1;
  for (int i = 0; i < tm_log.live_count; i++)
    if (tm_log.live[i] == ctx) at = i;
  if (at < 0) {
    tm_log.fini_ctx_unknown++; /* never made, or finished twice: never free it */
    return;
  }
  tm_log.live[at] = tm_log.live[--tm_log.live_count];
  if (tm_log.finished_count < TM_CTX_MAX) tm_log.finished[tm_log.finished_count++] = ctx;
  tm_ctx *c = ctx;
  c->magic = 0;
  free(c);
}

#ifdef TM_ABI15
static tm_ctx plain_ctx = {TM_CTX_MAGIC, -15};
static int init(const bp_abi_host *host) {
  tm_log.init_calls++;
  return register_kernel(host, &plain_ctx);
}
static void fini(void) { tm_log.fini_calls++; }
#endif

static const bp_abi_module tm_module = {
#ifdef TM_ABI15
    .struct_size = offsetof(bp_abi_module, init_ctx), /* a 1.5 module's size */
    .abi_minor_built = 5,
    .init = init,
    .fini = fini,
#else
    .struct_size = sizeof(bp_abi_module),
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 6,
#endif
    .abi_major = BP_ABI_MAJOR,
    .name = "test-" TM_IMPL,
    .version = "1.0",
    .build_id = TM_BUILD_ID,
    .init_ctx = init_ctx,
    .fini_ctx = fini_ctx,
};
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &tm_module; }
