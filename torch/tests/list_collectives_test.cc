// ProcessGroup's list and coalesced forms (torch.distributed's, list_collectives.cc), receiving
// from any rank, and the async handle and `then` of TensorAsyncOptions, at W = 1..4, with the
// errors a user can reach. Expected values are computed here from every rank's input.
#include <gtest/gtest.h>

#include <numeric>

#include "torch_harness.h"

namespace chorus::test {
namespace {

// Rank r's tensor number i: distinct small integers, exact in every dtype used here.
at::Tensor value(int r, int i, at::ScalarType type, at::IntArrayRef shape) {
  const int64_t n = c10::multiply_integers(shape);
  return (at::arange(n, at::kLong) + 100 * r + 10 * i).remainder(120).to(type).reshape(shape);
}

// A non-contiguous tensor of `shape` (every other row of a larger one), zeroed.
at::Tensor strided_zeros(at::IntArrayRef shape, at::ScalarType type) {
  if (shape.empty()) return at::zeros({}, type);
  auto big = shape.vec();
  big[0] *= 2;
  return at::zeros(big, type).slice(0, 0, big[0], 2);
}

TEST(ListCollectives, AllGatherIntoTheCallersTensors) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    // Small and large (the large ones cross the shared-memory slot many times), contiguous or not.
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, {0}, {5, 3}, {70000, 4}})
      for (bool contiguous : {true, false}) {
        std::vector<at::Tensor> out;
        for (int r = 0; r < w; ++r)
          out.push_back(contiguous ? at::zeros(shape, at::kFloat) : strided_zeros(shape, at::kFloat));
        g->all_gather(out, value(me, 0, at::kFloat, shape));
        for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(out[size_t(r)], value(r, 0, at::kFloat, shape));
      }
    std::vector<at::Tensor> out;
    for (int r = 0; r < w; ++r) out.push_back(at::zeros({3}, at::kLong));
    g->all_gather_async(out, value(me, 1, at::kLong, {3}))->wait();
    for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(out[size_t(r)], value(r, 1, at::kLong, {3}));
  });
}

TEST(ListCollectives, AllReduceCoalescedMixesDtypesAndShapes) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> specs = {
        {at::kFloat, {3, 4}}, {at::kLong, {5}}, {at::kFloat, {}}, {at::kDouble, {2, 2}}, {at::kLong, {0}}};
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < specs.size(); ++i) tensors.push_back(value(me, int(i), specs[i].first, specs[i].second));
    tensors[0] = tensors[0].t();  // not contiguous
    g->all_reduce_coalesced_(tensors, ReduceOp::Sum);
    for (size_t i = 0; i < specs.size(); ++i) {
      at::Tensor want = value(0, int(i), at::kLong, specs[i].second);
      for (int r = 1; r < w; ++r) want = want + value(r, int(i), at::kLong, specs[i].second);
      want = want.to(specs[i].first);
      RANK_CHECK_EQUAL(tensors[i].contiguous(), i == 0 ? want.t().contiguous() : want);
    }
    std::vector<at::Tensor> one = {value(me, 0, at::kInt, {4})};
    g->all_reduce_coalesced_async(one, ReduceOp::Max)->wait();
    at::Tensor most = value(0, 0, at::kInt, {4});
    for (int r = 1; r < w; ++r) most = at::maximum(most, value(r, 0, at::kInt, {4}));
    RANK_CHECK_EQUAL(one[0], most);
  });
}

TEST(ListCollectives, CoalescedIntoTensors) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    std::vector<at::Tensor> ins = {value(me, 0, at::kFloat, {6}), value(me, 1, at::kBFloat16, {2, w})};
    std::vector<at::Tensor> outs = {at::zeros({6 * w}, at::kFloat), strided_zeros({2 * w, w}, at::kBFloat16)};
    g->all_gather_into_coalesced(outs, ins);
    for (int r = 0; r < w; ++r) {
      RANK_CHECK_EQUAL(outs[0].slice(0, 6 * r, 6 * (r + 1)), value(r, 0, at::kFloat, {6}));
      RANK_CHECK_EQUAL(outs[1].slice(0, 2 * r, 2 * (r + 1)), value(r, 1, at::kBFloat16, {2, w}));
    }
    // reduce_scatter: block me of the sum of every rank's input.
    std::vector<at::Tensor> rs_in = {value(me, 2, at::kDouble, {3 * w}), value(me, 3, at::kLong, {w, 2})};
    std::vector<at::Tensor> rs_out = {at::zeros({3}, at::kDouble), at::zeros({1, 2}, at::kLong)};
    g->reduce_scatter_into_coalesced_async(rs_out, rs_in, ReduceOp::Sum)->wait();
    at::Tensor a = value(0, 2, at::kDouble, {3 * w}), b = value(0, 3, at::kLong, {w, 2});
    for (int r = 1; r < w; ++r) a = a + value(r, 2, at::kDouble, {3 * w}), b = b + value(r, 3, at::kLong, {w, 2});
    RANK_CHECK_EQUAL(rs_out[0], a.slice(0, 3 * me, 3 * (me + 1)));
    RANK_CHECK_EQUAL(rs_out[1], b.slice(0, me, me + 1));
  });
}

TEST(ListCollectives, AllToAllWithSplitsAndLists) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    // Rank p sends p + q + 1 rows of 2 values (p * 100 + q) to rank q.
    std::vector<int64_t> send, recv;
    for (int q = 0; q < w; ++q) send.push_back(me + q + 1), recv.push_back(q + me + 1);
    std::vector<at::Tensor> blocks, want;
    for (int q = 0; q < w; ++q) blocks.push_back(at::full({send[size_t(q)], 2}, double(me * 100 + q), at::kDouble));
    for (int p = 0; p < w; ++p) want.push_back(at::full({recv[size_t(p)], 2}, double(p * 100 + me), at::kDouble));
    at::Tensor out = at::zeros({std::accumulate(recv.begin(), recv.end(), int64_t(0)), 2}, at::kDouble);
    g->all_to_all_into(out, at::cat(blocks), recv, send);
    RANK_CHECK_EQUAL(out, at::cat(want));
    std::vector<at::Tensor> outs;
    for (int p = 0; p < w; ++p) outs.push_back(at::zeros({recv[size_t(p)], 2}, at::kDouble));
    g->all_to_all_async(outs, blocks)->wait();
    RANK_CHECK_EQUAL(at::cat(outs), at::cat(want));
    // Even blocks without splits.
    at::Tensor even = at::arange(2 * w, at::kInt) + 10 * me, got = at::zeros({2 * w}, at::kInt);
    g->all_to_all_into(got, even);
    for (int p = 0; p < w; ++p)
      RANK_CHECK_EQUAL(got.slice(0, 2 * p, 2 * p + 2), at::arange(2 * me, 2 * me + 2, at::kInt) + 10 * p);
  });
}

TEST(ListCollectives, GatherScatterReduceScatterLists) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank(), last = w - 1;
    std::vector<at::Tensor> outs;
    if (me == last)
      for (int r = 0; r < w; ++r) outs.push_back(strided_zeros({4, 2}, at::kHalf));
    g->gather(outs, value(me, 0, at::kHalf, {4, 2}), last);
    for (int r = 0; r < int(outs.size()); ++r) RANK_CHECK_EQUAL(outs[size_t(r)], value(r, 0, at::kHalf, {4, 2}));
    std::vector<at::Tensor> ins;
    if (me == 0)
      for (int q = 0; q < w; ++q) ins.push_back(value(q, 1, at::kShort, {3}));
    at::Tensor part = at::zeros({3}, at::kShort);
    g->scatter_async(part, ins, 0)->wait();
    RANK_CHECK_EQUAL(part, value(me, 1, at::kShort, {3}));
    std::vector<at::Tensor> rs;
    for (int q = 0; q < w; ++q) rs.push_back(value(me + q, 2, at::kFloat, {5}));
    at::Tensor mine = at::zeros({5}, at::kFloat);
    g->reduce_scatter(mine, rs, ReduceOp::Sum);
    at::Tensor want = at::zeros({5}, at::kFloat);
    for (int p = 0; p < w; ++p) want = want + value(p + me, 2, at::kFloat, {5});
    RANK_CHECK_EQUAL(mine, want);
  });
}

TEST(ListCollectives, RecvFromAnyRankNamesTheSender) {
  for_worlds({2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    if (me != 0) {
      g->send(at::full({3}, double(me), at::kDouble), 0, 7);
    } else {
      std::vector<int> from;
      for (int k = 1; k < w; ++k) {
        at::Tensor t = at::zeros({3}, at::kDouble);
        const int src = g->recv_any(t, 7);
        RANK_CHECK(src >= 1 && src < w, "source ", src);
        RANK_CHECK_EQUAL(t, at::full({3}, double(src), at::kDouble));
        from.push_back(src);
      }
      std::sort(from.begin(), from.end());
      for (int k = 1; k < w; ++k) RANK_CHECK(from[size_t(k - 1)] == k, "every sender once");
    }
    g->barrier();
    // Async, into a non-contiguous tensor: the sender is known once the work finished.
    if (me == w - 1) g->send_async(at::arange(4, at::kFloat), 0, 0)->wait();
    if (me == 0) {
      at::Tensor t = strided_zeros({4}, at::kFloat);
      auto work = g->recv_any_async(t, 0);
      work->wait();
      RANK_CHECK(work->source() == w - 1, "source ", work->source());
      RANK_CHECK_EQUAL(t, at::arange(4, at::kFloat));
    }
    g->barrier();
  });
}

TEST(ListCollectives, HandleAndThen) {
  for_worlds({2, 3}, [] {
    auto g = default_group();
    struct Counted : TensorWork {
      int* finished;
    };
    int finished = 0;
    auto handle = std::make_shared<Counted>();
    handle->finished = &finished;
    handle->on_finish([&finished](std::exception_ptr) { ++finished; });
    at::Tensor t = at::ones({4});
    bool then_ran_before_finish = false;
    auto work = g->all_reduce_async(t, ReduceOp::Sum,
                                    {.handle = handle, .then = [&] { then_ran_before_finish = finished == 0; }});
    RANK_CHECK(work.get() == handle.get(), "the handle given is the one returned");
    work->wait();
    RANK_CHECK(then_ran_before_finish && finished == 1);
    RANK_CHECK_EQUAL(t, at::full({4}, double(g->size()), at::kFloat));
    // What `then` throws is the work's error, on this rank; the group goes on.
    at::Tensor u = at::ones({2});
    auto failed = g->all_reduce_async(u, ReduceOp::Sum, {.then = [] { throw std::runtime_error("then failed"); }});
    RANK_CHECK(expect_throw<std::runtime_error>([&] { failed->wait(); }, "then").find("then failed") !=
               std::string::npos);
    g->barrier();
  });
}

TEST(ListCollectivesErrors, ListsThatDifferBetweenRanksAreMismatches) {
  for_worlds({2, 3}, [] {
    auto g = default_group();
    const int me = g->rank();
    // Same total element count, split differently: a wrong answer without the list agreement.
    std::vector<at::Tensor> tensors = me == 0 ? std::vector<at::Tensor>{at::ones({3}), at::ones({5})}
                                              : std::vector<at::Tensor>{at::ones({5}), at::ones({3})};
    auto msg = RANK_EXPECT_THROW(CollectiveMismatch, g->all_reduce_coalesced_(tensors));
    RANK_CHECK(msg.find("rank 0: all_reduce_coalesced(Float[3], Float[5], sum)") != std::string::npos, msg);
    RANK_CHECK(msg.find("rank 1: all_reduce_coalesced(Float[5], Float[3], sum)") != std::string::npos, msg);
  });
  for_worlds({2}, [] {
    auto g = default_group();
    const int me = g->rank();
    std::vector<at::Tensor> ins, outs;  // one pair on rank 0, two on rank 1
    for (int i = 0; i <= me; ++i) ins.push_back(at::ones({2})), outs.push_back(at::zeros({4}));
    auto msg = RANK_EXPECT_THROW(CollectiveMismatch, g->all_gather_into_coalesced(outs, ins));
    RANK_CHECK(msg.find("all_gather") != std::string::npos, msg);
  });
}

TEST(ListCollectivesErrors, BadListsAreErrorsOnEveryRank) {
  for_worlds({2, 3}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    std::vector<at::Tensor> outs;
    for (int r = 0; r < w; ++r) outs.push_back(at::zeros({3}));
    if (me == 1) outs[0] = at::zeros({3}, at::kInt);  // one rank's output has the wrong dtype
    auto msg = RANK_EXPECT_THROW(InvalidArgument, g->all_gather(outs, at::ones({3})));
    RANK_CHECK(msg.find("all_gather") != std::string::npos && msg.find("rank 1") != std::string::npos, msg);
    at::Tensor out = at::zeros({4});
    msg = RANK_EXPECT_THROW(InvalidArgument, g->all_to_all_into(out, at::ones({4}), {1}, {}));
    RANK_CHECK(msg.find("split sizes") != std::string::npos, msg);
    std::vector<at::Tensor> sparse = {at::ones({2}).to_sparse()};
    msg = RANK_EXPECT_THROW(InvalidArgument, g->all_reduce_coalesced_(sparse));
    RANK_CHECK(msg.find("layout") != std::string::npos, msg);
    at::Tensor x = at::ones({2});
    g->all_reduce_(x);  // the group goes on
    RANK_CHECK_EQUAL(x, at::full({2}, double(w), at::kFloat));
    at::Tensor t = at::zeros({1});
    if (w == 2) {
      msg = expect_throw<InvalidArgument>([&] { g->recv_any(t, -1); }, "recv_any");
      RANK_CHECK(msg.find("tags must be >= 0") != std::string::npos, msg);
    }
  });
}

}  // namespace
}  // namespace chorus::test
