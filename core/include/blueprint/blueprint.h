/* blueprint: the whole public C API. */
#ifndef BLUEPRINT_BLUEPRINT_H
#define BLUEPRINT_BLUEPRINT_H

#include "blueprint/status.h"
#include "blueprint/dtype.h"
#include "blueprint/region.h"
#include "blueprint/dtensor.h"
#include "blueprint/plan.h"
#include "blueprint/arena.h"
#include "blueprint/model.h"
#include "blueprint/registry.h"
#include "blueprint/data.h"
#include "blueprint/graph.h"
#include "blueprint/exec.h"
#include "blueprint/threads.h"
#include "blueprint/train.h"
#include "blueprint/checkpoint.h"

#endif
