/* Arenas of mpirun processes on one machine (comm.h: bp_mpi_shared_create,
 * bp_mpi_shared_allocator, bp_mpi_shared_comm). A rank's arena is one address range: its first
 * `shared` bytes (up to the end of the last span a collective touches; the
 * plan puts those regions first) map the rank's segment of one shared
 * memory file, which every process also maps whole to read its peers'
 * segments; the rest (features, inputs) is private memory, in huge pages
 * where the kernel gives them. Pointers
 * differ between processes, offsets into arenas of one plan do not: a rank
 * publishes the offset of its span in the slot page after its segment, and
 * its peers add it to their mapping of that segment. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "blueprint/comm.h"

#define MAX_ARENAS 16 /* shared arenas alive at once in one bp_mpi_shared */

typedef struct shared_arena shared_arena;

/* The owner's bookkeeping: the arenas it gave, found again by their base. */
struct bp_mpi_shared {
  const size_t *shared_bytes; /* borrowed: read at each alloc */
  shared_arena *arenas[MAX_ARENAS];
};

bp_status bp_mpi_shared_create(const size_t *shared_bytes, bp_mpi_shared **shared_out) {
  if (!shared_bytes || !shared_out)
    return bp_fail(BP_ERR_INVALID, "bp_mpi_shared_create: NULL argument");
  bp_mpi_shared *s = calloc(1, sizeof *s);
  if (!s) return bp_fail(BP_ERR_NOMEM, "out of memory creating the shared arenas' owner");
  s->shared_bytes = shared_bytes;
  *shared_out = s;
  return BP_OK;
}

void bp_mpi_shared_destroy(bp_mpi_shared *s) { free(s); }

#ifdef BP_HAVE_MPI
#include <mpi.h>

#define PAGE ((size_t)4096)
#define HUGE_PAGE ((size_t)2 << 20)
struct shared_arena {
  MPI_Comm comm;    /* the run's processes (MPI_COMM_WORLD's duplicate) */
  int rank, world;
  char *base;       /* this rank's arena */
  size_t bytes;     /* its mapped length */
  size_t segment;   /* one rank's part of the file: its shared bytes, then the slot page */
  size_t shared;    /* the arena's first bytes that live in the file */
  char *file;       /* every rank's segment, world * segment bytes */
  char **peers;     /* peers[r]: rank r's arena start as mapped here (the file, or base) */
  bp_abi_comm_threads abi;
};

static shared_arena **find(bp_mpi_shared *s, const void *base) {
  for (int i = 0; i < MAX_ARENAS; i++)
    if (s->arenas[i] && s->arenas[i]->base == base) return &s->arenas[i];
  return NULL;
}

static shared_arena **unused(bp_mpi_shared *s) {
  for (int i = 0; i < MAX_ARENAS; i++)
    if (!s->arenas[i]) return &s->arenas[i];
  return NULL;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static volatile uint64_t *slot(const shared_arena *a, int rank) {
  return (volatile uint64_t *)(void *)(a->file + (size_t)rank * a->segment + a->shared);
}

/* The fences order this rank's plain stores and loads on the shared pages
 * against the barrier (MPI orders only its own messages). A failed barrier
 * would leave peers reading half-written spans: the run ends instead, as
 * bp_mpi_abort ends it for any failed rank. */
static void shared_barrier(void *ctx) {
  const shared_arena *a = ctx;
  atomic_thread_fence(memory_order_seq_cst);
  if (MPI_Barrier(a->comm) != MPI_SUCCESS) {
    fprintf(stderr, "blueprint: rank %d: MPI_Barrier failed between shared arenas\n", a->rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  atomic_thread_fence(memory_order_seq_cst);
}

static void shared_publish(void *ctx, int32_t rank, void *pointer) {
  const shared_arena *a = ctx;
  *slot(a, rank) = (uint64_t)((char *)pointer - a->base);
}

static void *shared_peer(void *ctx, int32_t peer) {
  const shared_arena *a = ctx;
  return a->peers[peer] + *slot(a, peer);
}

/* Every rank's `ok`, and-ed: every rank takes the same branch. */
static int all_agree(MPI_Comm comm, int ok) {
  int all = 0;
  return MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && all;
}

/* Every rank of the run on this machine? (collective) */
static int one_machine(MPI_Comm comm, int rank, int world) {
  MPI_Comm node = MPI_COMM_NULL;
  int size = 0;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS)
    return 0;
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return size == world;
}

static void arena_unmap(shared_arena *a) {
  if (a->base) munmap(a->base, a->bytes);
  if (a->file) munmap(a->file, a->segment * (size_t)a->world);
  free(a->peers);
  free(a);
}

/* The arena's address range: the rank's segment of `fd` first, private
 * memory after it; aligned to a huge page so the private part can use them. */
static char *map_arena(shared_arena *a, int fd) {
  char *raw = mmap(NULL, a->bytes + HUGE_PAGE, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  char *base = (char *)round_up((uintptr_t)raw, HUGE_PAGE);
  if (base > raw) munmap(raw, (size_t)(base - raw));
  munmap(base + a->bytes, (size_t)(raw + HUGE_PAGE - base));
  if (mmap(base, a->shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
           (off_t)((size_t)a->rank * a->segment)) == MAP_FAILED ||
      (a->bytes > a->shared &&
       mmap(base + a->shared, a->bytes - a->shared, PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)) {
    munmap(base, a->bytes);
    return NULL;
  }
  if (a->bytes > a->shared) (void)madvise(base + a->shared, a->bytes - a->shared, MADV_HUGEPAGE);
  return base;
}

/* Rank 0 creates the file (its pages reserved now: a full /dev/shm says so
 * here, not with a fault on the first write) and names it to the others;
 * every rank maps it and its arena. Rank 0 removes the name once every rank
 * holds the file open. */
static int open_file(shared_arena *a) {
  static unsigned serial;
  char name[64] = {0};
  int fd = -1, ok = 1;
  if (a->rank == 0) {
    snprintf(name, sizeof name, "/blueprint-%ld-%u", (long)getpid(), serial++);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    ok = fd >= 0 && posix_fallocate(fd, 0, (off_t)(a->segment * (size_t)a->world)) == 0;
  }
  if (MPI_Bcast(name, sizeof name, MPI_CHAR, 0, a->comm) != MPI_SUCCESS) ok = 0;
  if (!all_agree(a->comm, ok)) {
    if (fd >= 0) close(fd);
    if (a->rank == 0 && name[0]) shm_unlink(name);
    return 0;
  }
  if (a->rank != 0) fd = shm_open(name, O_RDWR, 0600);
  ok = fd >= 0;
  if (ok) {
    a->file = mmap(NULL, a->segment * (size_t)a->world, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a->file == MAP_FAILED) a->file = NULL;
    ok = a->file && (a->base = map_arena(a, fd)) != NULL;
  }
  if (fd >= 0) close(fd); /* the mappings keep the file */
  ok = all_agree(a->comm, ok); /* every rank has opened it (or failed) */
  if (a->rank == 0) shm_unlink(name);
  return ok;
}

static void *shared_alloc(void *user, size_t bytes, size_t alignment) {
  bp_abi_comm mpi;
  if (bp_mpi_comm(&mpi) != BP_OK || mpi.world < 2) return NULL;
  const MPI_Comm comm = *(const MPI_Comm *)mpi.handle;
  bp_mpi_shared *owner = user;
  const size_t shared = round_up(*owner->shared_bytes, PAGE);
  shared_arena **free_slot = unused(owner);
  shared_arena *a = calloc(1, sizeof *a);
  int ok = a && free_slot && alignment <= PAGE && shared > 0 && shared <= round_up(bytes, PAGE);
  if (a) {
    *a = (shared_arena){.comm = comm, .rank = mpi.rank, .world = mpi.world};
    a->bytes = round_up(bytes, PAGE);
    a->shared = shared;
    a->segment = shared + PAGE;
    a->peers = calloc((size_t)mpi.world, sizeof *a->peers);
    ok = ok && a->peers;
  }
  /* collectives whatever ok says: every rank calls the same MPI functions */
  ok = all_agree(comm, one_machine(comm, mpi.rank, mpi.world) && ok);
  if (!ok || !open_file(a)) {
    if (a) arena_unmap(a);
    return NULL;
  }
  for (int r = 0; r < a->world; r++) a->peers[r] = a->file + (size_t)r * a->segment;
  a->peers[a->rank] = a->base; /* the same pages, through the arena */
  a->abi = (bp_abi_comm_threads){sizeof a->abi, a, shared_barrier, shared_publish, shared_peer};
  *free_slot = a;
  return a->base; /* tmpfs and anonymous pages start zeroed */
}

/* Local: the file's name is gone, each process unmaps its view. */
static void shared_free(void *user, void *ptr, size_t bytes) {
  (void)bytes;
  shared_arena **a = find(user, ptr);
  if (!a) return;
  arena_unmap(*a);
  *a = NULL;
}

bp_status bp_mpi_shared_comm(bp_mpi_shared *shared, const void *base, bp_abi_comm *out) {
  shared_arena **a = shared && base ? find(shared, base) : NULL;
  if (!a || !out) return bp_fail(BP_ERR_INVALID, "bp_mpi_shared_comm: not a shared arena");
  *out = (bp_abi_comm){sizeof *out, "threads", (*a)->rank, (*a)->world, &(*a)->abi};
  return BP_OK;
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

bp_status bp_mpi_shared_comm(bp_mpi_shared *shared, const void *base, bp_abi_comm *out) {
  (void)shared;
  (void)base;
  (void)out;
  return bp_fail(BP_ERR_UNSUPPORTED, "this blueprint was built without MPI");
}

#endif

bp_arena_allocator bp_mpi_shared_allocator(bp_mpi_shared *shared) {
  return (bp_arena_allocator){"mpi-shared", shared_alloc, shared_free, shared};
}
