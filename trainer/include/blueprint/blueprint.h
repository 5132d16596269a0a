/* blueprint: the whole public C API, every library's headers (the core,
 * the YAML front end, data, validate and autotune, the trainer;
 * docs/architecture.md). */
#ifndef BLUEPRINT_BLUEPRINT_H
#define BLUEPRINT_BLUEPRINT_H

#include "blueprint/status.h"
#include "blueprint/dtype.h"
#include "blueprint/region.h"
#include "blueprint/dtensor.h"
#include "blueprint/plan.h"
#include "blueprint/arena.h"
#include "blueprint/model.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "blueprint/registry.h"
#include "blueprint/data.h"
#include "blueprint/graph.h"
#include "blueprint/exec.h"
#include "blueprint/session.h"
#include "blueprint/threads.h"
#include "blueprint/train.h"
#include "blueprint/checkpoint.h"
#include "blueprint/comm.h"
#include "blueprint/profile.h"
#include "blueprint/validate.h"
#include "blueprint/autotune.h"

#endif
