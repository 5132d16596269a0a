/* The cuda device's collective transports (comm_nccl.c), which
 * device_cuda.c puts in its bp_abi_device. Plugin-private. */
#ifndef BP_PLUGINS_CUDA_COMM_H
#define BP_PLUGINS_CUDA_COMM_H

#include "bp_abi_device.h"

#define CU_TRANSPORTS 2

extern const bp_abi_comm_transport cu_transports[CU_TRANSPORTS];

#endif
