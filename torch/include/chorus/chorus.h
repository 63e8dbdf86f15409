// chorus: the distributed side of training with LibTorch. One include for the whole public API
// (see docs/api.md for the map from torch.distributed, Fabric, Accelerate, Axolotl and Lightning).
// Headers are named after docs/api.md's sections: process_group.h, fabric.h, accelerate.h,
// axolotl.h, lightning.h, ddp.h, comm_hooks.h and sharded.h.
#pragma once

#include "chorus/accelerate.h"
#include "chorus/axolotl.h"
#include "chorus/checkpoint.h"
#include "chorus/comm_hooks.h"
#include "chorus/core/dtype.h"
#include "chorus/core/elastic.h"
#include "chorus/core/error.h"
#include "chorus/ddp.h"
#include "chorus/elastic.h"
#include "chorus/fabric.h"
#include "chorus/ivalue_convert.h"
#include "chorus/lightning.h"
#include "chorus/process_group.h"
#include "chorus/sampler.h"
#include "chorus/sharded.h"
