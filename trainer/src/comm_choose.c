/* Which communicator a run's kernels see (comm.h: bp_comm_choose): by the
 * flags of the device's collective transports, never by a device's name. */
#include <stdio.h>
#include <string.h>

#include "blueprint/comm.h"

/* The capabilities a layout needs (BP_ABI_COMM_*). */
static uint32_t needs(const bp_comm_layout *l) {
  if (l->world > l->local) { /* processes: other machines are other devices */
    uint32_t n = BP_ABI_COMM_SPANS_PROCESSES | BP_ABI_COMM_SPANS_DEVICES;
    if (l->local_processes > l->device_count) n |= BP_ABI_COMM_SHARES_DEVICE;
    return n;
  }
  uint32_t n = 0;
  for (int k = 1; k < l->local; k++)
    if (l->devices[k] != l->devices[0]) n |= BP_ABI_COMM_SPANS_DEVICES;
  for (int k = 0; k < l->local; k++)
    for (int j = 0; j < k; j++)
      if (l->devices[j] == l->devices[k]) n |= BP_ABI_COMM_SHARES_DEVICE;
  return n;
}

/* What a transport lacks, in words (the first missing capability). */
static const char *lacks(uint32_t missing) {
  if (missing & BP_ABI_COMM_SPANS_PROCESSES) return "serves ranks of one process only";
  if (missing & BP_ABI_COMM_SHARES_DEVICE) return "needs one device per rank";
  return "needs every rank on one device";
}

/* The layout in words, and what to run instead. */
static void describe(const bp_comm_layout *l, const char *dev, char *what, size_t what_size,
                     char *hint, size_t hint_size) {
  if (l->world > l->local) {
    if (l->local_processes > l->device_count)
      snprintf(what, what_size, "%d processes of this run share this machine's %d '%s' device(s)",
               l->local_processes, l->device_count, dev);
    else
      snprintf(what, what_size, "the run's %d ranks are processes on '%s' devices", l->world, dev);
    snprintf(hint, hint_size, "start at most %d processes per machine, or run --ranks without mpirun",
             l->device_count);
    return;
  }
  int a = -1, b = -1;
  for (int k = 0; k < l->local && a < 0; k++)
    for (int j = 0; j < k; j++)
      if (l->devices[j] == l->devices[k]) {
        a = j, b = k;
        break;
      }
  const uint32_t n = needs(l);
  if ((n & BP_ABI_COMM_SHARES_DEVICE) && (n & BP_ABI_COMM_SPANS_DEVICES))
    snprintf(what, what_size,
             "ranks %d and %d both run on '%s' device %d while other ranks run on other devices",
             a, b, dev, l->devices[b]);
  else if (n & BP_ABI_COMM_SHARES_DEVICE)
    snprintf(what, what_size, "%d ranks share '%s' device %d", l->local, dev, l->devices[0]);
  else
    snprintf(what, what_size, "%d ranks run on distinct '%s' devices", l->local, dev);
  snprintf(hint, hint_size,
           "run at most %d ranks (this machine's devices), or give --devices with distinct "
           "devices or one device for all",
           l->device_count);
}

bp_status bp_comm_choose(const bp_comm_layout *l, bp_comm_kind *out, int *transport_out) {
  if (!l || !out || !transport_out)
    return bp_fail(BP_ERR_INVALID, "bp_comm_choose: NULL argument");
  if (l->local < 1 || l->local > BP_COMM_MAX_WORLD || l->world < l->local)
    return bp_fail(BP_ERR_INVALID, "bp_comm_choose: %d local ranks of %d", l->local, l->world);
  if (l->transports < 0 || l->transports > BP_COMM_MAX_TRANSPORTS)
    return bp_fail(BP_ERR_INVALID, "bp_comm_choose: %d transports", l->transports);
  const int processes = l->world > l->local;
  *out = BP_COMM_KIND_NONE;
  *transport_out = -1;
  if (l->world == 1) return BP_OK;
  const uint32_t n = needs(l);
  for (int i = 0; i < l->transports; i++)
    if ((l->transport_flags[i] & n) == n) {
      *out = BP_COMM_KIND_DEVICE;
      *transport_out = i;
      return BP_OK;
    }
  if (l->host_reach) {
    *out = processes ? BP_COMM_KIND_MPI : BP_COMM_KIND_THREADS;
    return BP_OK;
  }
  const char *dev = l->device ? l->device : "the run's device";
  char what[256], hint[256], why[768] = "";
  describe(l, dev, what, sizeof what, hint, sizeof hint);
  size_t used = 0;
  for (int i = 0; i < l->transports && used < sizeof why; i++)
    used += (size_t)snprintf(why + used, sizeof why - used, "%s'%s' %s", i ? ", " : "",
                             l->transport_names[i] ? l->transport_names[i] : "?",
                             lacks(n & ~l->transport_flags[i]));
  if (l->transports == 0)
    snprintf(why, sizeof why,
             "device '%s' offers no collective transport and the host cannot reach its memory",
             dev);
  return bp_fail(BP_ERR_UNSUPPORTED, "%s: %s: %s", what, why, hint);
}
