// Precompiled for every torch-layer translation unit: LibTorch's headers dominate build time.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
