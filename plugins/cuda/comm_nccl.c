/* The cuda device's collective transports (bp_abi_device.h, ABI 1.6):
 *  - "nccl": one rank per GPU, in one process (ncclCommInitAll over the
 *    local ranks' GPUs) or one per process under mpirun (process 0 makes
 *    the unique id, the host's bootstrap broadcasts it, each process joins
 *    with ncclCommInitRank); flags SPANS_PROCESSES | SPANS_DEVICES.
 *  - "threads": ranks of one process sharing one GPU, served by the
 *    device-memory collectives (ops/allreduce/device_threads.c); a
 *    plugin-made threads communicator (plugins/shared/threads_group.c);
 *    flag SHARES_DEVICE.
 * libnccl.so.2 is loaded on first use, and the few functions used here are
 * declared locally with NCCL's C ABI (ncclResult_t is an enum, ncclComm_t a
 * pointer, ncclUniqueId 128 bytes by value), so the plugin builds and loads
 * without NCCL; the kernels (ops/allreduce/nccl.c) use the real header and
 * the same library. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bp_abi.h"
#include "bp_abi_device.h"
#include "comm_cuda.h"
#include "threads_group.h"

#define NCCL_MAX_LOCAL 64

typedef struct nccl_unique_id {
  char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_unique_id;

typedef struct nccl_api {
  void *lib;
  int (*get_unique_id)(nccl_unique_id *id);
  int (*init_rank)(void **comm, int nranks, nccl_unique_id id, int rank);
  int (*init_all)(void **comms, int ndev, const int *devlist);
  int (*destroy)(void *comm);
  const char *(*error_string)(int result);
  const char *(*last_error)(void *comm);
} nccl_api;

typedef struct nccl_group {
  int count;
  int32_t first_rank, world;
  void *comms[NCCL_MAX_LOCAL];
} nccl_group;

/* Process-wide on purpose: a dlopen'ed library's function table, loaded
 * once (under api_mutex: trainers may be made in parallel), never unloaded
 * and read-only after; libnccl is one library per process (the kernels'
 * module loads it too). No registry option changes it. */
static nccl_api api;
static pthread_mutex_t api_mutex = PTHREAD_MUTEX_INITIALIZER;

static int say(const bp_abi_comm_open_args *a, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int say(const bp_abi_comm_open_args *a, int code, const char *fmt, ...) {
  if (a->reason && a->reason_size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->reason, a->reason_size, fmt, ap);
    va_end(ap);
  }
  return code;
}

static void sym(void *lib, const char *name, void *fn_out, size_t size) {
  void *p = dlsym(lib, name);
  memcpy(fn_out, &p, size);
}

static int load_locked(const bp_abi_comm_open_args *a) {
  if (api.lib) return BP_ABI_OK;
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return say(a, BP_ABI_ERR_UNSUPPORTED,
               "ranks on GPUs need NCCL, and libnccl.so.2 could not be loaded: %s (put "
               "NCCL 2.9 or newer on LD_LIBRARY_PATH)",
               dlerror());
  nccl_api n = {.lib = lib};
  /* POSIX: dlsym's object pointer is the function */
  sym(lib, "ncclGetUniqueId", &n.get_unique_id, sizeof n.get_unique_id);
  sym(lib, "ncclCommInitRank", &n.init_rank, sizeof n.init_rank);
  sym(lib, "ncclCommInitAll", &n.init_all, sizeof n.init_all);
  sym(lib, "ncclCommDestroy", &n.destroy, sizeof n.destroy);
  sym(lib, "ncclGetErrorString", &n.error_string, sizeof n.error_string);
  sym(lib, "ncclGetLastError", &n.last_error, sizeof n.last_error);
  if (!n.get_unique_id || !n.init_rank || !n.init_all || !n.destroy || !n.error_string ||
      !n.last_error) {
    dlclose(lib);
    return say(a, BP_ABI_ERR_UNSUPPORTED,
               "the loaded libnccl lacks ncclCommInitAll/ncclCommInitRank/ncclGetLastError "
               "(NCCL 2.9 or newer is needed)");
  }
  api = n;
  return BP_ABI_OK;
}

static int load(const bp_abi_comm_open_args *a) {
  pthread_mutex_lock(&api_mutex);
  const int rc = load_locked(a);
  pthread_mutex_unlock(&api_mutex);
  return rc;
}

static int nccl_failed(const bp_abi_comm_open_args *a, const char *what, int result) {
  const char *last = api.last_error(NULL);
  return say(a, BP_ABI_ERR_DEVICE, "%s: %s%s%s", what, api.error_string(result),
             last && *last ? ": " : "", last ? last : "");
}

/* One process: ncclCommInitAll over the local ranks' distinct GPUs. */
static int open_all(const bp_abi_comm_open_args *a, nccl_group *g) {
  int rc = load(a);
  if (rc != BP_ABI_OK) return rc;
  int devices[NCCL_MAX_LOCAL];
  for (int k = 0; k < a->local; k++) devices[k] = a->devices[k];
  const int res = api.init_all(g->comms, a->local, devices);
  /* ncclCommInitAll leaves nothing behind when it fails */
  if (res != 0) return nccl_failed(a, "ncclCommInitAll", res);
  g->count = a->local;
  return BP_ABI_OK;
}

/* Under mpirun, one rank per process; every process takes the same branch
 * (bootstrap count), so none waits in the broadcast alone. */
static int open_processes(const bp_abi_comm_open_args *a, nccl_group *g) {
  const bp_abi_comm_bootstrap *b = a->bootstrap;
  if (a->local != 1)
    return say(a, BP_ABI_ERR_UNSUPPORTED,
               "NCCL across processes takes one rank per process, not %d", (int)a->local);
  if (b->struct_size < sizeof *b || !b->broadcast || !b->count)
    return say(a, BP_ABI_ERR_INVALID, "the host's bootstrap lacks broadcast/count");
  /* the rank's GPU is the current device for ncclCommInitRank */
  if (cudaSetDevice(a->devices[0]) != cudaSuccess) (void)cudaGetLastError();
  int32_t missing = 0, failed = 0;
  int rc = load(a);
  if (b->count(b->ctx, rc != BP_ABI_OK, &missing) != BP_ABI_OK)
    return say(a, BP_ABI_ERR_DEVICE, "the bootstrap's count failed");
  if (missing > 0)
    return rc != BP_ABI_OK ? rc
                           : say(a, BP_ABI_ERR_UNSUPPORTED,
                                 "NCCL could not be loaded on %d process(es)", (int)missing);
  nccl_unique_id id;
  memset(&id, 0, sizeof id);
  int res = b->process == 0 ? api.get_unique_id(&id) : 0;
  if (b->count(b->ctx, res != 0, &failed) != BP_ABI_OK)
    return say(a, BP_ABI_ERR_DEVICE, "the bootstrap's count failed");
  if (failed > 0)
    return res ? nccl_failed(a, "ncclGetUniqueId", res)
               : say(a, BP_ABI_ERR_DEVICE, "rank 0 could not make the NCCL unique id");
  if (b->broadcast(b->ctx, &id, sizeof id) != BP_ABI_OK)
    return say(a, BP_ABI_ERR_DEVICE, "the bootstrap's broadcast of the NCCL unique id failed");
  res = api.init_rank(&g->comms[0], a->world, id, a->first_rank);
  if (res != 0) return nccl_failed(a, "ncclCommInitRank", res);
  g->count = 1;
  return BP_ABI_OK;
}

static int nccl_open(void *user, const bp_abi_comm_open_args *a, void **group_out) {
  (void)user;
  if (!a || !group_out || a->local < 1 || a->local > NCCL_MAX_LOCAL || !a->devices ||
      a->world < a->local || a->first_rank < 0 || a->first_rank + a->local > a->world)
    return a ? say(a, BP_ABI_ERR_INVALID, "nccl: %d local ranks of %d", (int)a->local,
                   (int)a->world)
             : BP_ABI_ERR_INVALID;
  nccl_group *g = calloc(1, sizeof *g);
  if (!g) return say(a, BP_ABI_ERR_NOMEM, "out of memory for %d NCCL communicators", (int)a->local);
  g->first_rank = a->first_rank;
  g->world = a->world;
  const int rc = a->bootstrap ? open_processes(a, g) : open_all(a, g);
  if (rc != BP_ABI_OK) {
    free(g);
    return rc;
  }
  *group_out = g;
  return BP_ABI_OK;
}

static int nccl_comm(void *group, int32_t k, bp_abi_comm *out) {
  nccl_group *g = group;
  if (!g || !out || k < 0 || k >= g->count) return BP_ABI_ERR_INVALID;
  *out = (bp_abi_comm){sizeof *out, "nccl", g->first_rank + k, g->world, g->comms[k]};
  return BP_ABI_OK;
}

static void nccl_close(void *group) {
  nccl_group *g = group;
  if (!g) return;
  for (int k = 0; k < g->count; k++)
    if (g->comms[k]) (void)api.destroy(g->comms[k]);
  free(g);
}

/* Ranks sharing one GPU in one process: the host never passes a bootstrap
 * (no SPANS_PROCESSES). */
static int threads_open(void *user, const bp_abi_comm_open_args *a, void **group_out) {
  (void)user;
  if (!a || !group_out) return BP_ABI_ERR_INVALID;
  if (a->bootstrap || a->first_rank != 0 || a->local != a->world)
    return say(a, BP_ABI_ERR_UNSUPPORTED, "the cuda 'threads' transport serves ranks of one process");
  threads_group *g = NULL;
  const int rc = threads_group_open(a->world, &g, a->reason, a->reason_size);
  if (rc == BP_ABI_OK) *group_out = g;
  return rc;
}

static int threads_comm(void *group, int32_t k, bp_abi_comm *out) {
  return threads_group_comm(group, k, out);
}

static void threads_close(void *group) { threads_group_close(group); }

const bp_abi_comm_transport cu_transports[CU_TRANSPORTS] = {
    {
        .struct_size = sizeof(bp_abi_comm_transport),
        .backend = "nccl",
        .flags = BP_ABI_COMM_SPANS_PROCESSES | BP_ABI_COMM_SPANS_DEVICES,
        .open = nccl_open,
        .comm = nccl_comm,
        .close = nccl_close,
    },
    {
        .struct_size = sizeof(bp_abi_comm_transport),
        .backend = "threads",
        .flags = BP_ABI_COMM_SHARES_DEVICE,
        .open = threads_open,
        .comm = threads_comm,
        .close = threads_close,
    },
};
