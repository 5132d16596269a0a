/* Arenas of mpirun processes on one machine, in one MPI shared window
 * (comm.h: bp_mpi_shared_allocator, bp_mpi_shared_comm). Each rank's
 * segment is its arena from the first page boundary on, then one page
 * whose first word is the offset the rank last published: pointers differ
 * between processes, offsets into arenas of the same plan do not. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "blueprint/comm.h"

#ifdef BP_HAVE_MPI
#include <mpi.h>

#define SHARED_PAGE ((size_t)4096)
#define SHARED_MAX_WINDOWS 16 /* arenas alive at once in one process */

typedef struct shared_window {
  MPI_Win win;
  MPI_Comm node; /* the ranks of this machine: every rank of the run */
  char *base;    /* this rank's arena */
  size_t bytes;  /* each arena, rounded up to the page; the slot page follows */
  int rank, world;
  char **peers; /* every rank's arena, as mapped in this process */
  int locked;   /* MPI_Win_lock_all holds: one passive epoch for the window's life */
  bp_abi_comm_threads abi;
} shared_window;

static shared_window *windows[SHARED_MAX_WINDOWS];

static shared_window **find(const void *base) {
  for (int i = 0; i < SHARED_MAX_WINDOWS; i++)
    if (windows[i] && windows[i]->base == base) return &windows[i];
  return NULL;
}

static shared_window **unused(void) {
  for (int i = 0; i < SHARED_MAX_WINDOWS; i++)
    if (!windows[i]) return &windows[i];
  return NULL;
}

static volatile uint64_t *slot(const shared_window *w, int rank) {
  return (volatile uint64_t *)(void *)(w->peers[rank] + w->bytes);
}

/* A failed barrier would leave peers reading half-written spans: end the
 * run instead (as bp_mpi_abort does for any failed rank). */
static void shared_barrier(void *ctx) {
  shared_window *w = ctx;
  MPI_Win_sync(w->win); /* this rank's stores, before the others pass */
  if (MPI_Barrier(w->node) != MPI_SUCCESS) {
    fprintf(stderr, "blueprint: rank %d: MPI_Barrier on the shared arenas failed\n", w->rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Win_sync(w->win); /* the others' stores, before this rank reads */
}

static void shared_publish(void *ctx, int32_t rank, void *pointer) {
  shared_window *w = ctx;
  *slot(w, rank) = (uint64_t)((char *)pointer - w->base);
}

static void *shared_peer(void *ctx, int32_t peer) {
  const shared_window *w = ctx;
  return w->peers[peer] + *slot(w, peer);
}

/* Whether /dev/shm, where Open MPI puts shared windows, has room for
 * `bytes`: a window larger than the tmpfs would map, then fault (SIGBUS)
 * on the first write past its space (a container's 64 MiB /dev/shm).
 * Without /dev/shm the MPI library picks its place and answers itself. */
static int shm_has_room(size_t bytes) {
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) != 0) return 1;
  return (double)fs.f_bavail * (double)fs.f_frsize >= (double)bytes;
}

/* Every rank's `ok`, and-ed: every rank takes the same branch. */
static int all_agree(MPI_Comm comm, int ok) {
  int all = 0;
  return MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && all;
}

static void window_free(shared_window *w) {
  if (w->locked) MPI_Win_unlock_all(w->win);
  if (w->win != MPI_WIN_NULL) MPI_Win_free(&w->win);
  if (w->node != MPI_COMM_NULL) MPI_Comm_free(&w->node);
  free(w->peers);
  free(w);
}

static void *shared_alloc(void *user, size_t bytes, size_t alignment) {
  (void)user;
  bp_abi_comm mpi;
  if (bp_mpi_comm(&mpi) != BP_OK || mpi.world < 2) return NULL;
  const MPI_Comm comm = *(const MPI_Comm *)mpi.handle;
  const char *env = getenv("BP_MPI_SHARED");
  shared_window **free_slot = unused();
  shared_window *w = calloc(1, sizeof *w);
  int ok = w && free_slot && alignment <= SHARED_PAGE && !(env && strcmp(env, "0") == 0);
  if (w) {
    w->win = MPI_WIN_NULL;
    w->node = MPI_COMM_NULL;
    w->rank = mpi.rank;
    w->world = mpi.world;
    w->bytes = (bytes + SHARED_PAGE - 1) / SHARED_PAGE * SHARED_PAGE;
  }
  /* a collective whatever ok says: every rank calls the same MPI functions */
  MPI_Comm node = MPI_COMM_NULL;
  int node_size = 0;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, mpi.rank, MPI_INFO_NULL, &node) !=
          MPI_SUCCESS ||
      MPI_Comm_size(node, &node_size) != MPI_SUCCESS)
    ok = 0;
  if (w) w->node = node;
  /* a segment: a page of slack (MPI may start it anywhere), the arena, the slot page */
  const size_t segment = SHARED_PAGE + (w ? w->bytes : 0) + SHARED_PAGE;
  ok = ok && shm_has_room(segment * (size_t)mpi.world);
  if (!all_agree(comm, ok && node_size == mpi.world)) {
    if (w) window_free(w);
    else if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    return NULL;
  }
  /* node ranks follow the world ranks (the key): node rank r is world rank r */
  char *own = NULL;
  ok = MPI_Win_allocate_shared((MPI_Aint)segment, 1, MPI_INFO_NULL, node, &own, &w->win) ==
           MPI_SUCCESS &&
       (w->peers = calloc((size_t)w->world, sizeof *w->peers)) != NULL;
  /* a window's errors are fatal unless it says otherwise */
  if (ok) ok = MPI_Win_set_errhandler(w->win, MPI_ERRORS_RETURN) == MPI_SUCCESS;
  for (int r = 0; ok && r < w->world; r++) {
    MPI_Aint size;
    int unit;
    char *raw = NULL;
    ok = MPI_Win_shared_query(w->win, r, &size, &unit, &raw) == MPI_SUCCESS &&
         (size_t)size == segment;
    /* mappings are whole pages: the page-aligned start is one place in every process */
    if (ok) w->peers[r] = (char *)(((uintptr_t)raw + SHARED_PAGE - 1) / SHARED_PAGE * SHARED_PAGE);
  }
  if (ok) w->base = w->peers[w->rank];
  if (ok) ok = w->locked = MPI_Win_lock_all(MPI_MODE_NOCHECK, w->win) == MPI_SUCCESS;
  if (!all_agree(comm, ok)) {
    window_free(w);
    return NULL;
  }
  memset(own, 0, segment); /* arenas start zeroed, as host memory does */
  w->abi = (bp_abi_comm_threads){sizeof w->abi, w, shared_barrier, shared_publish, shared_peer};
  *free_slot = w;
  return w->base;
}

static void shared_free(void *user, void *ptr, size_t bytes) {
  (void)user;
  (void)bytes;
  shared_window **w = find(ptr);
  if (!w) return; /* abandoned (bp_mpi_shared_abandon) */
  window_free(*w);
  *w = NULL;
}

bp_status bp_mpi_shared_comm(const void *base, bp_abi_comm *out) {
  shared_window **w = base ? find(base) : NULL;
  if (!w || !out) return bp_fail(BP_ERR_INVALID, "bp_mpi_shared_comm: not a shared arena");
  *out = (bp_abi_comm){sizeof *out, "threads", (*w)->rank, (*w)->world, &(*w)->abi};
  return BP_OK;
}

void bp_mpi_shared_abandon(const void *base) {
  shared_window **w = base ? find(base) : NULL;
  if (w) *w = NULL; /* its memory stays mapped until the process ends */
}

#else /* a build without MPI */

static void *shared_alloc(void *user, size_t bytes, size_t alignment) {
  (void)user;
  (void)bytes;
  (void)alignment;
  return NULL;
}

static void shared_free(void *user, void *ptr, size_t bytes) {
  (void)user;
  (void)ptr;
  (void)bytes;
}

bp_status bp_mpi_shared_comm(const void *base, bp_abi_comm *out) {
  (void)base;
  (void)out;
  return bp_fail(BP_ERR_UNSUPPORTED, "this blueprint was built without MPI");
}

void bp_mpi_shared_abandon(const void *base) { (void)base; }

#endif

const bp_arena_allocator *bp_mpi_shared_allocator(void) {
  static const bp_arena_allocator shared = {"mpi-shared", shared_alloc, shared_free, NULL};
  return &shared;
}
