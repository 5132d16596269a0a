/* The in-process communicator (comm.h): ranks as threads of this process,
 * with a barrier and one published pointer per rank, lent to kernels as
 * bp_abi_comm_threads. The group is the device plugins' own "threads"
 * transport (plugins/shared/threads_group.c), so one barrier serves both. */
#include <stdlib.h>

#include "blueprint/comm.h"
#include "threads_group.h"

struct bp_comm {
  int world;
  threads_group *group;
  const bp_abi_comm_threads *threads; /* the group's barrier, publish and peer */
};

bp_status bp_comm_create(int world, bp_comm **out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_comm_create: NULL argument");
  if (world < 1 || world > BP_COMM_MAX_WORLD)
    return bp_fail(BP_ERR_INVALID, "communicator: world %d must be in [1, %d]", world,
                   BP_COMM_MAX_WORLD);
  bp_comm *c = calloc(1, sizeof *c);
  if (!c) return bp_fail(BP_ERR_NOMEM, "out of memory creating a communicator");
  char reason[128] = "";
  bp_abi_comm rank0;
  if (threads_group_open(world, &c->group, reason, sizeof reason) != BP_ABI_OK ||
      threads_group_comm(c->group, 0, &rank0) != BP_ABI_OK) {
    bp_comm_destroy(c);
    return bp_fail(BP_ERR_NOMEM, "communicator: %s", reason[0] ? reason : "out of memory");
  }
  c->world = world;
  c->threads = rank0.handle;
  *out = c;
  return BP_OK;
}

void bp_comm_destroy(bp_comm *c) {
  if (!c) return;
  threads_group_close(c->group);
  free(c);
}

int bp_comm_world(const bp_comm *c) { return c ? c->world : 0; }

void bp_comm_barrier(bp_comm *c) { c->threads->barrier(c->threads->ctx); }

bp_abi_comm bp_comm_abi(bp_comm *c, int rank) {
  bp_abi_comm comm = {0};
  threads_group_comm(c->group, rank, &comm);
  return comm;
}
