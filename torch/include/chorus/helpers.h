// Deprecated: this header's declarations moved to chorus/axolotl.h (named after its section in
// docs/api.md). Include chorus/chorus.h, the one public include.
#pragma once

#include "chorus/axolotl.h"
