// chorus::DistributedSampler: torch's DistributedSampler order, and a position that survives a
// change of world size without losing or repeating a sample.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <set>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/sampler.h"

namespace {

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(DistributedSampler, GivesTorchsOrderPaddedOrDropped) {
  // torch.utils.data.DistributedSampler: randperm(n, generator seeded with seed + epoch), padded
  // with its start to a multiple of W (or cut), every W-th index from the rank.
  const int64_t n = 10;
  for (bool drop : {false, true}) {
    auto gen = at::detail::createCPUGenerator(7 + 3);
    const auto perm = values(at::randperm(n, gen, at::TensorOptions().dtype(at::kLong)));
    std::vector<int64_t> all;
    for (int r = 0; r < 4; ++r) {
      chorus::DistributedSampler s(n, 4, r, {.shuffle = true, .seed = 7, .drop_last = drop});
      s.set_epoch(3);
      const auto mine = values(s.indices());
      EXPECT_EQ(int64_t(mine.size()), drop ? 2 : 3);
      EXPECT_EQ(s.size(), int64_t(mine.size()));
      for (size_t k = 0; k < mine.size(); ++k) {
        const size_t at = size_t(r) + 4 * k;
        EXPECT_EQ(mine[k], perm[at % perm.size()]) << "rank " << r << " index " << k;
      }
      all.insert(all.end(), mine.begin(), mine.end());
    }
    EXPECT_EQ(all.size(), drop ? 8u : 12u);
  }
  chorus::DistributedSampler plain(5, 2, 1, {.shuffle = false});
  EXPECT_EQ(values(plain.indices()), (std::vector<int64_t>{1, 3, 0}));  // 0 1 2 3 4 0: rank 1's
}

TEST(DistributedSampler, AResizeMidEpochLosesAndRepeatsNothing) {
  const int64_t n = 1000, batch = 8;
  std::vector<chorus::DistributedSampler> six;
  for (int r = 0; r < 6; ++r) six.emplace_back(n, 6, r, chorus::DistributedSamplerOptions{.drop_last = true});
  std::multiset<int64_t> seen;
  for (int step = 0; step < 5; ++step)
    for (auto& s : six) {
      const auto mine = values(s.indices());
      seen.insert(mine.begin(), mine.begin() + batch);  // the next batch: indices() starts at the position
      s.advance(batch);
    }
  // Checkpoint rank 0's state, load it into 4 new ranks, train the rest of the epoch.
  const c10::IValue state = six[0].state_dict();
  for (int r = 0; r < 4; ++r) {
    chorus::DistributedSampler s(n, 1, 0, {.drop_last = true});
    s.load_state_dict(state);
    s.set_replicas(4, r);
    EXPECT_EQ(s.position(), 5 * batch * 6);
    const auto rest = values(s.indices());
    seen.insert(rest.begin(), rest.end());
  }
  std::set<int64_t> distinct(seen.begin(), seen.end());
  EXPECT_EQ(distinct.size(), seen.size()) << "a sample was seen twice";
  EXPECT_GE(seen.size(), size_t(n - 3));  // drop_last: at most W - 1 left out at the tail
}

TEST(DistributedSampler, RefusesAnotherDatasetAndBadPlaces) {
  chorus::DistributedSampler s(100, 2, 0, {.seed = 1});
  chorus::DistributedSampler other(99, 2, 0, {.seed = 1});
  try {
    other.load_state_dict(s.state_dict());
    ADD_FAILURE() << "loaded another dataset's position";
  } catch (const chorus::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dataset_size is 100, this sampler's 99"), std::string::npos) << e.what();
  }
  EXPECT_THROW(chorus::DistributedSampler(10, 2, 2), chorus::InvalidArgument);
  EXPECT_THROW(chorus::DistributedSampler(10, 0, 0), chorus::InvalidArgument);
  EXPECT_THROW(s.advance(-1), chorus::InvalidArgument);
}

}  // namespace
