// Note [Receive buffers]
// A tensor received into fresh memory pays a page fault per 4 KiB page on first touch, which
// costs more than moving the bytes (100 MB: ~18 ms of faults against ~12 ms of copying here).
// Large received tensors therefore come from a cache of blocks that earlier received tensors
// gave back when freed: same-sized objects received again and again (the usual case: state
// dicts, batches, metrics) land in warm pages. The cache holds at most CHORUS_RECV_CACHE_MB.
#pragma once

#include <ATen/ATen.h>

namespace chorus::detail {

// An uninitialized CPU tensor for receiving into.
at::Tensor receive_buffer(at::IntArrayRef sizes, at::ScalarType type);

}  // namespace chorus::detail
