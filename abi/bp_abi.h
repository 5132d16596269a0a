/* blueprint op-module ABI: the only header an op module includes (device
 * plugins add bp_abi_device.h). Plain C, no dependency on the core.
 *
 * Rules (abi/README.md has the full text and the changelog):
 *  - Every struct begins with uint32_t struct_size, set by the writer to
 *    sizeof its own definition. A reader reads a struct only up to the
 *    smaller of its own size and struct_size; fields beyond are absent.
 *  - Version major.minor. A minor release only appends fields, enum values
 *    and extension types; a major release may break anything, and a module
 *    of another major is refused.
 *  - A module states the minor it was built with and the minimum host minor
 *    it needs; a host older than that minimum refuses it.
 *  - Every function pointer marked (optional) may be NULL, and readers check.
 *  - Optional groups of functions travel in an extension chain
 *    (bp_abi_ext_header), identified by type, skipped when unknown.
 *  - Strings and tables a module hands to the host must stay valid until
 *    the module is unloaded (use static storage). */
#ifndef BP_ABI_H
#define BP_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ABI_MAJOR 1
#define BP_ABI_MINOR 6

/* The one symbol a module exports; its type is bp_abi_module_entry_fn. The
 * major is part of the name so a module of another major fails at dlsym
 * with a clear message, not at a mismatched call. */
#define BP_ABI_ENTRY_SYMBOL "bp_abi_module_entry_v1"
#define BP_ABI_ENTRY bp_abi_module_entry_v1

#if defined(__GNUC__)
#define BP_ABI_EXPORT __attribute__((visibility("default")))
#else
#define BP_ABI_EXPORT
#endif

/* Status of ABI calls: 0 is success. Values are only appended. */
enum {
  BP_ABI_OK = 0,
  BP_ABI_ERR_INVALID = 1,     /* bad argument */
  BP_ABI_ERR_UNSUPPORTED = 2, /* the kernel/device cannot do this */
  BP_ABI_ERR_DEVICE = 3,      /* the device or its runtime failed */
  BP_ABI_ERR_NOMEM = 4,       /* allocation failed */
  BP_ABI_ERR_DUPLICATE = 5,   /* a registration collides */
};

/* Element types; numerically equal to the core's bp_dtype. */
enum {
  BP_ABI_DTYPE_FP32 = 0,
  BP_ABI_DTYPE_FP16 = 1,
  BP_ABI_DTYPE_INT8 = 2,
  BP_ABI_DTYPE_INT32 = 3,
  BP_ABI_DTYPE_BF16 = 4,
};
#define BP_ABI_DTYPE_BIT(dtype) (1u << (dtype))

/* Head of every optional extension group. */
typedef struct bp_abi_ext_header {
  uint32_t struct_size;                  /* of the whole extension struct */
  uint32_t type;                         /* BP_ABI_EXT_* */
  const struct bp_abi_ext_header *next;  /* next extension or NULL */
} bp_abi_ext_header;

enum {
  BP_ABI_EXT_GRAPH_CAPTURE = 1, /* bp_abi_device_graph_ext (bp_abi_device.h) */
};

/* One tensor as a kernel sees it: the DTensor descriptor without names. */
typedef struct bp_abi_tensor {
  uint32_t struct_size;
  int32_t dtype;        /* BP_ABI_DTYPE_* */
  int64_t shape[4];     /* NHWC extents */
  int64_t padded_c;     /* channels as laid out on the device (>= shape[3]) */
  int64_t stride[4];    /* NHWC element strides on the device (padded_c) */
  uint64_t slot_bytes;  /* bytes readable from the pointer, 16-byte tail included */
} bp_abi_tensor;

/* The ranks a collective kernel (allreduce.*) works across (1.1). One
 * per rank, made by the host or (1.6) by a collective transport of the
 * device plugin (bp_abi_device.h); `handle` is what `backend` names:
 *  "threads"  ranks share memory: a bp_abi_comm_threads (below). The
 *             ranks are threads of one process, or (1.3) processes of
 *             one machine under mpirun whose arenas' collective spans
 *             lie in shared memory; the host or a device's transport
 *             makes it;
 *  "mpi"      one rank per process: an MPI_Comm * of the MPI library the
 *             host is linked with (MPI is initialized by the host);
 *  "nccl"     one rank per GPU: an ncclComm_t the cuda device plugin's
 *             transport made (NCCL is loaded by the plugin and the kernel
 *             module alike); the kernel enqueues on args->stream.
 * Other backends are whatever a device's transport names. A kernel checks
 * `backend` in supports() and refuses any other. */
typedef struct bp_abi_comm {
  uint32_t struct_size;
  const char *backend; /* "threads", "mpi", "nccl", or a transport's */
  int32_t rank, world; /* this rank, number of ranks */
  void *handle;        /* see above */
} bp_abi_comm;

/* Shared memory between ranks (backend "threads"): a barrier and one
 * published pointer per rank, enough for any collective. Every rank of
 * the communicator calls the same functions in the same order. Ranks that
 * are processes (1.3) reach only the spans the host shares: publish a
 * pointer the host bound to a collective node (its input or output),
 * never a workspace. */
typedef struct bp_abi_comm_threads {
  uint32_t struct_size;
  void *ctx; /* pass to every function below */
  /* Returns once every rank has called it. Writes a rank made before its
   * call are visible to every rank after theirs. */
  void (*barrier)(void *ctx);
  /* Publishes this rank's pointer; peers read it after the next barrier.
   * It stays readable until this rank publishes again. */
  void (*publish)(void *ctx, int32_t rank, void *pointer);
  /* The pointer rank `peer` published before the last barrier. */
  void *(*peer)(void *ctx, int32_t peer);
} bp_abi_comm_threads;

/* (1.4) Threads the host lends a rank's kernels. Each rank has its own
 * service, sized to the rank's share of the machine (the cores divided by
 * the ranks of this process), so a kernel never decides a thread count by
 * itself (no environment variables, no library defaults). Kernels of one
 * rank run one at a time, so a kernel may use all `count` threads.
 * A kernel may use the count alone (to size a library's own pool, e.g.
 * OpenBLAS's or a pthreadpool) or run work on the host's threads through
 * parallel_for. */
typedef struct bp_abi_threads {
  uint32_t struct_size;
  int32_t count; /* threads this rank may use (>= 1) */
  void *ctx;     /* pass to parallel_for */
  /* Calls fn(arg, i) for every i in [0, n), spread over `count` threads
   * (the calling thread included), and returns once all calls are done.
   * The order of the calls is unspecified; fn must not call parallel_for. */
  void (*parallel_for)(void *ctx, void (*fn)(void *arg, int64_t i), void *arg, int64_t n);
} bp_abi_threads;

/* What run(), supports() and workspace_size() receive. Tensor pointers are
 * device pointers of the rank (arena base + offset); range ops get one
 * tensor per span, shaped [1,1,1,elements]. */
typedef struct bp_abi_kernel_args {
  uint32_t struct_size;
  int32_t num_inputs, num_outputs;
  const bp_abi_tensor *inputs;   /* [num_inputs] */
  const bp_abi_tensor *outputs;  /* [num_outputs] */
  const void *const *input_ptrs; /* [num_inputs]; NULL in supports/workspace_size */
  void *const *output_ptrs;      /* [num_outputs]; NULL in supports/workspace_size */
  const void *attrs;             /* the op's attribute block, or NULL */
  uint32_t attr_size;            /* bytes of attrs */
  uint32_t attr_version;         /* the op's attribute block version */
  void *workspace;               /* workspace_size() bytes, or NULL */
  uint64_t workspace_bytes;
  void *stream;                  /* device stream; NULL: run synchronously */
  int32_t rank, world_size;      /* this rank, number of ranks */
  /* (1.1) the communicator of collective kernels; NULL when the run has
   * none (one rank). Read only when struct_size covers it. */
  const bp_abi_comm *comm;
  /* (1.4) Fields below are read only when struct_size covers them. */
  /* The state prepare() made for this (variant, node, rank), or NULL (no
   * prepare, or in supports/workspace_size/prepare itself). */
  void *state;
  /* The rank's parameter generation: the host adds 1 to *params_generation
   * every time the parameters (W, their FP16 copies in A, E, the BN
   * statistics in B) may have changed by anything other than the kernel's
   * own outputs: after every optimizer update, checkpoint load, EMA swap
   * and initialization. It covers parameters only: a kernel that caches
   * something derived from its parameters (packed weights) keeps the
   * generation it packed at in its state and repacks when it differs; it
   * never caches anything derived from its data inputs, which change on
   * the same pointers within a generation. Never NULL in run(); NULL
   * elsewhere. */
  const uint64_t *params_generation;
  /* Where run() and prepare() write why they failed (NUL-terminated,
   * truncated to reason_size); the host prints it with the rank, variant,
   * node, op and implementation. NULL in supports/workspace_size. */
  char *reason;
  size_t reason_size;
  /* The threads lent to this rank (never NULL in run() and prepare()). */
  const bp_abi_threads *threads;
} bp_abi_kernel_args;

/* Priority scale (1.4): higher wins among kernels whose supports() holds
 * (after pins and autotune). Leave gaps so a module can place itself
 * between two tiers.
 *    0  reference: plain C, every case, the oracle (flag REFERENCE)
 *    5  portable C: hand-vectorized kernels of this project (ops/cpu)
 *   10  library: a general library (OpenBLAS 10, oneDNN 12, XNNPACK 15)
 *   20  vendor: a device vendor's library on its device (cuDNN, cuBLAS)
 *   30  user: kernels a user drops in to override everything above */
enum {
  BP_ABI_PRIORITY_REFERENCE = 0,
  BP_ABI_PRIORITY_PORTABLE = 5,
  BP_ABI_PRIORITY_LIBRARY = 10,
  BP_ABI_PRIORITY_VENDOR = 20,
  BP_ABI_PRIORITY_USER = 30,
};

/* Kernel flags. */
enum {
  BP_ABI_KERNEL_REFERENCE = 1u << 0,        /* plain reference: chosen only as a last resort */
  BP_ABI_KERNEL_DETERMINISTIC = 1u << 1,    /* same inputs, same bits */
  BP_ABI_KERNEL_GRAPH_CAPTURABLE = 1u << 2, /* may be captured in a CUDA graph */
  BP_ABI_KERNEL_IN_PLACE = 1u << 3,         /* output may alias input 0 */
  /* (1.1) a collective: every rank must run it together, so the host never
   * runs it alone (autotune does not time it) */
  BP_ABI_KERNEL_COLLECTIVE = 1u << 4,
};

typedef struct bp_abi_kernel {
  uint32_t struct_size;
  const char *op;        /* op name, e.g. "conv2d.fwd" */
  const char *impl;      /* implementation name, e.g. "xnnpack" */
  const char *device;    /* device kind, e.g. "cpu", "cuda" */
  uint32_t dtypes;       /* BP_ABI_DTYPE_BIT mask of supported dtypes */
  int32_t priority;      /* higher wins among supporting kernels */
  uint32_t flags;        /* BP_ABI_KERNEL_* */
  /* (optional; NULL: supports everything in `dtypes`) 1 if it can run these
   * args; else 0 and a reason in reason[reason_size]. */
  int (*supports)(void *user, const bp_abi_kernel_args *args, char *reason, size_t reason_size);
  /* (optional; NULL: 0) bytes of workspace needed for these args. */
  uint64_t (*workspace_size)(void *user, const bp_abi_kernel_args *args);
  /* Runs the kernel; BP_ABI_OK or an error. Never aborts on its inputs. */
  int (*run)(void *user, const bp_abi_kernel_args *args);
  void *user;            /* passed back to the functions above */
  /* (1.4, optional; NULL: no state) Called once at bind for every
   * (variant, node, rank) the kernel serves, with the node's args
   * (pointers, workspace, threads, params_generation and reason set;
   * state NULL). Creates what the kernel keeps for that node (XNNPACK
   * operators, cuDNN descriptors and algorithms, cuBLASLt plans) in
   * *state_out, which every later run() of that node receives as
   * args->state. BP_ABI_OK, or an error with args->reason written: the
   * bind fails and names the node. It may not assume the inputs hold data
   * yet (parameters are written after bind); pack on the first run() and
   * whenever *params_generation changes. */
  int (*prepare)(void *user, const bp_abi_kernel_args *args, void **state_out);
  /* (1.4, optional) Frees a state prepare() made. Called once per state,
   * on the thread that destroys the binding; NULL states are not passed. */
  void (*release)(void *user, void *state);
} bp_abi_kernel;

/* A new op kind. Built-in ops are registered by the host the same way. */
typedef struct bp_abi_op {
  uint32_t struct_size;
  const char *name;       /* "conv2d.fwd" */
  int32_t num_inputs, num_outputs;
  uint32_t attr_size;     /* bytes of the attribute block (0: none) */
  uint32_t attr_version;  /* its version; bumped when the block grows */
  /* (optional) output descriptors from inputs and attrs; 0 on success, else
   * a reason in reason[reason_size]. */
  int (*infer_shape)(const void *attrs, const bp_abi_tensor *inputs, bp_abi_tensor *outputs,
                     char *reason, size_t reason_size);
} bp_abi_op;

struct bp_abi_device; /* bp_abi_device.h */

/* (1.4) Layer types from modules.
 * A model file names a layer by `type:`; besides the built-in types, a
 * module may register one. The host then compiles it like a built-in
 * parameter-free layer: an output feature and its gradient slot of the
 * output shape in the feature dtype (FP16 under AMP, else FP32), the saved
 * tensors it declares (bp_abi_layer_saved), one forward node and (unless
 * backward_op is NULL) one backward node, both running ops registered
 * before the layer (by this module or an earlier one), with kernels for
 * them. With S saved tensors (0..BP_ABI_LAYER_SAVED_MAX):
 *   forward_op   in: x0 [, x1]                     out: y, saved0 .. saved(S-1)
 *   backward_op  in: x0 [, x1], y, dy, saved0 ..   out: dx0 [, dx1]   (accumulate)
 * The forward writes the saved tensors in every step (evaluation too) and
 * the backward of the same step reads them; nothing else touches them.
 * The kernels' dtypes masks cover the saved tensors' dtypes too.
 * A per-node scratch buffer is no layer field: a kernel asks for one
 * through its workspace_size (bp_abi_kernel).
 * The output shape is the forward op's infer_shape (bp_abi_op; rule 7 of
 * bp_abi_ops.h; the host reads outputs[0] only, the saved tensors' shapes
 * come from their declarations), or x0's shape when the op has none. The
 * YAML keys of the
 * layer fill the attribute block (the same block goes to both ops) through
 * `attrs`: each key is type-checked and range-checked, takes its default
 * when absent, and a key the schema does not list is an error. Bytes no
 * key covers are 0. The host writes the backward node's accumulate flag
 * (0 overwrite, 1 add: the gradient slot has several writers) at
 * accumulate_offset, and 0 there in the forward node.
 * Registration is refused (naming the module) when the type is a built-in
 * one or another module's, an op is missing or has other tensor counts
 * than above, the ops' attr_size differs from the layer's, a key is
 * invalid (a reserved key, a duplicate, outside the block, a default
 * outside its range) or a saved tensor is (another dtype, a flag not 0/1,
 * channels outside 0..BP_ABI_LAYER_SAVED_CHANNELS_MAX or set per channel). */
#define BP_ABI_LAYER_ATTR_SIZE_MAX 64 /* bytes of a layer's attribute block */
#define BP_ABI_LAYER_ATTRS_MAX 32     /* keys of one layer type */
#define BP_ABI_LAYER_SAVED_MAX 4      /* saved tensors of one layer type */
#define BP_ABI_LAYER_SAVED_CHANNELS_MAX 65536

enum {
  BP_ABI_LAYER_ATTR_INT = 0,   /* int32_t at offset; a plain YAML integer */
  BP_ABI_LAYER_ATTR_FLOAT = 1, /* float at offset; a plain YAML decimal number */
  BP_ABI_LAYER_ATTR_BOOL = 2,  /* int32_t 0/1 at offset; YAML true/false */
};

/* One YAML key of a layer type. An array of them is strided by the first
 * element's struct_size (bp_abi_ops.h rule 6). */
typedef struct bp_abi_layer_attr {
  uint32_t struct_size;
  const char *key;      /* YAML key, e.g. "slope": 1..47 characters of [A-Za-z0-9_-],
                           not type, name, input or inputs */
  int32_t type;         /* BP_ABI_LAYER_ATTR_* */
  uint32_t offset;      /* byte offset of its value in the attribute block (multiple of 4) */
  double default_value; /* the value when the key is absent (inside [min, max]) */
  double min, max;      /* accepted range, inclusive (ignored for BOOL) */
  int32_t required;     /* 1: the key must be present (default_value unused) */
} bp_abi_layer_attr;

/* One saved tensor of a layer type: what its forward records for its
 * backward (as maxpool's argmax mask or batchnorm's batch statistics).
 * The plan names it "<layer>.saved<k>" and places it by dtype: FP32 with
 * the FP32 features (region F32), INT8 with the masks (S_MASK), FP16 with
 * the FP16 features under AMP (F16) and with the temporaries (T)
 * otherwise, INT32 with the temporaries (T). Its shape is [N, H, W,
 * channels] with the output's N, H, W (channels 0: the output's C), or
 * [1, 1, 1, C] with the output's C when per_channel. An array of them is
 * strided by the first element's struct_size (bp_abi_ops.h rule 6). */
typedef struct bp_abi_layer_saved {
  uint32_t struct_size;
  int32_t dtype;       /* BP_ABI_DTYPE_FP32, _FP16, _INT8 or _INT32 (explicit, never
                          "the feature dtype") */
  int32_t per_channel; /* 1: [1,1,1,C_out]; 0: per sample [N,H_out,W_out,channels] */
  int32_t channels;    /* per sample: 1..BP_ABI_LAYER_SAVED_CHANNELS_MAX, or 0 for the
                          output's C; per channel: 0 */
} bp_abi_layer_saved;

/* A layer type (host->register_layer). Strings and the attrs array stay
 * valid while the module is loaded (static storage). */
typedef struct bp_abi_layer {
  uint32_t struct_size;
  const char *type;        /* YAML type name, e.g. "leaky_relu"; 1..47 characters of
                              [A-Za-z0-9_-]; not a built-in type nor another module's */
  const char *forward_op;  /* a registered op: num_inputs inputs, 1 output */
  const char *backward_op; /* (optional) a registered op: num_inputs + 2 inputs, num_inputs
                              outputs; NULL: no gradient flows back through the layer */
  int32_t num_inputs;      /* 1 (`input: a`) or 2 (`inputs: [a, b]`) */
  uint32_t attr_size;      /* bytes of the attribute block (0..BP_ABI_LAYER_ATTR_SIZE_MAX);
                              equal to both ops' attr_size */
  uint32_t accumulate_offset; /* byte offset of the int32_t accumulate flag in the block
                                 (multiple of 4); UINT32_MAX: none (only without backward_op) */
  const bp_abi_layer_attr *attrs; /* [num_attrs] the YAML keys */
  int32_t num_attrs;       /* 0..BP_ABI_LAYER_ATTRS_MAX */
  /* Memory needs besides y and dy: the saved tensors, in the order the
   * ops take them (absent from a shorter struct_size: none). */
  const bp_abi_layer_saved *saved; /* [num_saved] */
  int32_t num_saved;       /* 0..BP_ABI_LAYER_SAVED_MAX; the forward op then has 1 + num_saved
                              outputs and the backward op num_inputs + 2 + num_saved inputs */
} bp_abi_layer;

/* Log levels for bp_abi_host.log. */
enum { BP_ABI_LOG_ERROR = 0, BP_ABI_LOG_WARN = 1, BP_ABI_LOG_INFO = 2, BP_ABI_LOG_DEBUG = 3 };

/* Services the host lends a module during init. */
typedef struct bp_abi_host {
  uint32_t struct_size;
  uint16_t abi_major, abi_minor; /* the host's version */
  void *ctx;                     /* pass to every function below */
  void (*log)(void *ctx, int level, const char *message);
  /* Records why init fails (the loader reports it). */
  void (*error)(void *ctx, const char *message);
  /* Registrations are staged: they take effect only if init returns
   * BP_ABI_OK and every registration of the module succeeded. */
  int (*register_op)(void *ctx, const bp_abi_op *op);
  int (*register_kernel)(void *ctx, const bp_abi_kernel *kernel);
  int (*register_device)(void *ctx, const struct bp_abi_device *device);
  /* (1.4) Registers a layer type models may use (bp_abi_layer below); read
   * only when struct_size covers it. Staged like the others. */
  int (*register_layer)(void *ctx, const struct bp_abi_layer *layer);
  /* (1.6) A run option the host's user set for modules, by name (e.g.
   * "tf32", "deterministic", "cpu_isa", "dnnl_library"), or NULL when
   * unset. Modules read their switches here, never from the environment.
   * The string lives until init returns; read only when struct_size
   * covers it (bp_sdk_host_option does). */
  const char *(*option)(void *ctx, const char *name);
} bp_abi_host;

/* What a module's entry returns. */
typedef struct bp_abi_module {
  uint32_t struct_size;
  uint16_t abi_major;          /* BP_ABI_MAJOR the module was built with */
  uint16_t abi_minor_built;    /* BP_ABI_MINOR the module was built with */
  uint16_t abi_minor_required; /* the oldest host minor it works with */
  uint16_t reserved;
  const char *name;            /* short module name, e.g. "ops-reference" */
  const char *version;         /* the module's own version string */
  const char *build_id;        /* changes with every build (autotune cache key) */
  /* Registers everything through host; BP_ABI_OK or an error (with
   * host->error called). May be NULL only when init_ctx is set. */
  int (*init)(const bp_abi_host *host);
  /* (optional) called before the module is unloaded. */
  void (*fini)(void);
  /* (1.6, optional; read only when struct_size covers them) A module that
   * keeps its state in a context instead of globals. When init_ctx is set
   * the host calls it instead of init, once per registry that loads the
   * module (two registries loading one file share the library's globals,
   * never a context). It allocates the context, registers through host as
   * init does, with its kernels' `user` (and a device's ctx) pointing into
   * the context, and stores the context in *ctx_out. The host copies the
   * descriptors it is given (bp_abi_kernel, bp_abi_op, bp_abi_device), so
   * they may live on init_ctx's stack; strings they point to stay static.
   * On success the host passes that context to fini_ctx exactly once,
   * when the module is unloaded (its registry destroyed) or when the host
   * discards the module after a successful init_ctx (a registration of it
   * was refused). On failure (an error returned) the host ignores
   * *ctx_out and never calls fini_ctx: the module frees what it made
   * before returning. fini is never called for a module whose init_ctx
   * ran; a module that also sets init loads on a host before 1.6, which
   * calls init. */
  int (*init_ctx)(const bp_abi_host *host, void **ctx_out);
  /* (1.6, optional) Frees a context init_ctx made; called after every
   * kernel of the module is released and before the library is closed. */
  void (*fini_ctx)(void *ctx);
} bp_abi_module;

typedef const bp_abi_module *(*bp_abi_module_entry_fn)(void);

#ifdef __cplusplus
}
#endif
#endif
