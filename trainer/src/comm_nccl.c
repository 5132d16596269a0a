/* NCCL communicators for ranks on GPUs (comm.h: bp_nccl_*). libnccl.so.2 is
 * loaded on first use, and the few functions used here are declared
 * locally with NCCL's C ABI (ncclResult_t is an enum, ncclComm_t a pointer,
 * ncclUniqueId 128 bytes by value), so the core builds and runs without
 * NCCL or CUDA headers; the kernels (ops/allreduce/nccl.c) use the real
 * header and the same library. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/comm.h"

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

struct bp_nccl {
  int count;
  void *comms[BP_COMM_MAX_WORLD];
};

static nccl_api api; /* loaded once, kept for the process (the kernels' module uses it too) */
static pthread_mutex_t api_mutex = PTHREAD_MUTEX_INITIALIZER; /* trainers may be made in parallel */

static void sym(void *lib, const char *name, void *fn_out, size_t size) {
  void *p = dlsym(lib, name);
  memcpy(fn_out, &p, size);
}

static bp_status load_locked(void) {
  if (api.lib) return BP_OK;
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "ranks on GPUs need NCCL, and libnccl.so.2 could not be loaded: %s (put "
                   "NCCL 2.9 or newer on LD_LIBRARY_PATH)",
                   dlerror());
  nccl_api a = {.lib = lib};
  /* POSIX: dlsym's object pointer is the function (as in loader.c) */
  sym(lib, "ncclGetUniqueId", &a.get_unique_id, sizeof a.get_unique_id);
  sym(lib, "ncclCommInitRank", &a.init_rank, sizeof a.init_rank);
  sym(lib, "ncclCommInitAll", &a.init_all, sizeof a.init_all);
  sym(lib, "ncclCommDestroy", &a.destroy, sizeof a.destroy);
  sym(lib, "ncclGetErrorString", &a.error_string, sizeof a.error_string);
  sym(lib, "ncclGetLastError", &a.last_error, sizeof a.last_error);
  if (!a.get_unique_id || !a.init_rank || !a.init_all || !a.destroy || !a.error_string ||
      !a.last_error) {
    dlclose(lib);
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "the loaded libnccl lacks ncclCommInitAll/ncclCommInitRank/ncclGetLastError "
                   "(NCCL 2.9 or newer is needed)");
  }
  api = a;
  return BP_OK;
}

static bp_status load(void) {
  pthread_mutex_lock(&api_mutex);
  const bp_status st = load_locked();
  pthread_mutex_unlock(&api_mutex);
  return st;
}

static bp_status nccl_failed(const char *what, int result, void *comm) {
  const char *last = api.last_error(comm);
  return bp_fail(BP_ERR_DEVICE, "%s: %s%s%s", what, api.error_string(result),
                 last && *last ? ": " : "", last ? last : "");
}

bp_status bp_nccl_open_all(int count, const int *devices, bp_nccl **out) {
  if (!devices || !out || count < 1 || count > BP_COMM_MAX_WORLD)
    return bp_fail(BP_ERR_INVALID, "bp_nccl_open_all: %d ranks", count);
  bp_status st = load();
  if (st != BP_OK) return st;
  bp_nccl *n = calloc(1, sizeof *n);
  if (!n) return bp_fail(BP_ERR_NOMEM, "out of memory for %d NCCL communicators", count);
  const int res = api.init_all(n->comms, count, devices);
  if (res != 0) {
    free(n); /* ncclCommInitAll leaves nothing behind when it fails */
    return nccl_failed("ncclCommInitAll", res, NULL);
  }
  n->count = count;
  *out = n;
  return BP_OK;
}

bp_status bp_nccl_open_mpi(bp_nccl **out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_nccl_open_mpi: NULL argument");
  bp_abi_comm mpi;
  bp_status st = bp_mpi_comm(&mpi);
  if (st != BP_OK) return st;
  /* every process learns whether NCCL loaded, so none waits in the broadcast alone */
  double missing = load() != BP_OK;
  char why[1024];
  if (missing) snprintf(why, sizeof why, "%s", bp_last_error());
  if ((st = bp_mpi_sum_f64(&missing, 1)) != BP_OK) return st;
  if (missing > 0)
    return api.lib ? bp_fail(BP_ERR_UNSUPPORTED, "NCCL could not be loaded on %.0f process(es)",
                             missing)
                   : bp_fail(BP_ERR_UNSUPPORTED, "%s", why);
  nccl_unique_id id;
  memset(&id, 0, sizeof id);
  int res = mpi.rank == 0 ? api.get_unique_id(&id) : 0;
  double failed = res != 0;
  if ((st = bp_mpi_sum_f64(&failed, 1)) != BP_OK) return st;
  if (failed > 0)
    return res ? nccl_failed("ncclGetUniqueId", res, NULL)
               : bp_fail(BP_ERR_DEVICE, "rank 0 could not make the NCCL unique id");
  if ((st = bp_mpi_bcast(&id, (int)sizeof id, 0)) != BP_OK) return st;
  bp_nccl *n = calloc(1, sizeof *n);
  if (!n) return bp_fail(BP_ERR_NOMEM, "out of memory for an NCCL communicator");
  res = api.init_rank(&n->comms[0], mpi.world, id, mpi.rank);
  if (res != 0) {
    free(n);
    return nccl_failed("ncclCommInitRank", res, NULL);
  }
  n->count = 1;
  *out = n;
  return BP_OK;
}

bp_abi_comm bp_nccl_abi(const bp_nccl *n, int k, int rank, int world) {
  return (bp_abi_comm){sizeof(bp_abi_comm), "nccl", rank, world, n->comms[k]};
}

void bp_nccl_close(bp_nccl *n) {
  if (!n) return;
  for (int k = 0; k < n->count; k++)
    if (n->comms[k]) (void)api.destroy(n->comms[k]);
  free(n);
}
