// chorus: the distributed side of training with LibTorch. One include for the whole public API
// (see docs/api.md for the map from torch.distributed, Fabric, Accelerate, Axolotl and Lightning).
#pragma once

#include "chorus/collections.h"
#include "chorus/core/dtype.h"
#include "chorus/core/error.h"
#include "chorus/ddp.h"
#include "chorus/fabric.h"
#include "chorus/helpers.h"
#include "chorus/ivalue_convert.h"
#include "chorus/lightning.h"
#include "chorus/operations.h"
#include "chorus/process_group.h"
