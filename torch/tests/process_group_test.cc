// ProcessGroup tensor collectives: every dtype, 0-d / empty / non-contiguous tensors, non-zero
// roots, subgroups, async forms and errors, at W = 1..4. Expected values are computed here from
// every rank's input, independently of the code under test.
#include <gtest/gtest.h>

#include "torch_harness.h"

namespace chorus::test {
namespace {

const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kDouble, at::kHalf,        at::kBFloat16,
                                            at::kChar,  at::kByte,   at::kShort,       at::kInt,
                                            at::kLong,  at::kBool,   at::kComplexFloat};

// Rank r's input: small integers (exact in every dtype, products stay in range), or bools.
at::Tensor input(int r, at::ScalarType type, at::IntArrayRef shape) {
  const int64_t n = c10::multiply_integers(shape);
  auto i = at::arange(n, at::kLong);
  at::Tensor v = type == at::kBool ? (i + r).remainder(3).eq(0) : (i * 3 + r * 7).remainder(3) + 1;
  if (at::isComplexType(type)) return at::complex(v.to(at::kFloat), (v * 2).to(at::kFloat)).reshape(shape);
  return v.to(type).reshape(shape);
}

// A non-contiguous tensor holding the same values as input(r, type, shape).
at::Tensor strided(const at::Tensor& t) {
  if (t.dim() == 0) return t.clone();
  auto shape = t.sizes().vec();
  shape[0] *= 2;
  auto base = at::zeros(shape, t.options());
  auto view = base.slice(0, 0, shape[0], 2);
  view.copy_(t);
  return view;
}

std::vector<ReduceOp> ops_for(at::ScalarType type) {
  if (at::isComplexType(type)) return {ReduceOp::Sum, ReduceOp::Mean};
  if (at::isFloatingType(type)) return {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max};
  return {ReduceOp::Sum,        ReduceOp::Product,   ReduceOp::Min,       ReduceOp::Max,
          ReduceOp::BitwiseAnd, ReduceOp::BitwiseOr, ReduceOp::BitwiseXor};
}

// The reduction of every rank's input, in rank order, computed in a wide type.
at::Tensor expected_reduce(int w, at::ScalarType type, at::IntArrayRef shape, ReduceOp op) {
  if (type == at::kBool) {
    at::Tensor acc = input(0, type, shape);
    for (int r = 1; r < w; ++r) {
      auto x = input(r, type, shape);
      if (op == ReduceOp::Product || op == ReduceOp::Min || op == ReduceOp::BitwiseAnd)
        acc = acc.logical_and(x);
      else if (op == ReduceOp::BitwiseXor)
        acc = acc.logical_xor(x);
      else
        acc = acc.logical_or(x);
    }
    return acc;
  }
  const bool integral = !at::isFloatingType(type) && !at::isComplexType(type);
  const auto wide = at::isComplexType(type) ? at::kComplexDouble : integral ? at::kLong : at::kDouble;
  at::Tensor acc = input(0, type, shape).to(wide);
  for (int r = 1; r < w; ++r) {
    auto x = input(r, type, shape).to(wide);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean: acc = acc + x; break;
      case ReduceOp::Product: acc = acc * x; break;
      case ReduceOp::Min: acc = at::minimum(acc, x); break;
      case ReduceOp::Max: acc = at::maximum(acc, x); break;
      case ReduceOp::BitwiseAnd: acc = acc.bitwise_and(x); break;
      case ReduceOp::BitwiseOr: acc = acc.bitwise_or(x); break;
      case ReduceOp::BitwiseXor: acc = acc.bitwise_xor(x); break;
    }
  }
  if (op == ReduceOp::Mean) acc = acc / double(w);
  return acc.to(type);
}

const std::vector<std::vector<int64_t>> kShapes = {{}, {0, 3}, {5}, {3, 4}, {1000, 3}};

TEST(ProcessGroup, AllReduceEveryDtypeOpAndShape) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    for (auto type : kTypes)
      for (auto op : ops_for(type))
        for (const auto& shape : kShapes)
          for (bool contiguous : {true, false}) {
            at::Tensor t = input(me, type, shape);
            if (!contiguous) t = strided(t);
            RANK_CHECK(contiguous || t.dim() == 0 || !t.is_contiguous() || t.numel() <= 1);
            g->all_reduce_(t, op);
            at::Tensor want = expected_reduce(w, type, shape, op);
            const bool half_mean = op == ReduceOp::Mean && (type == at::kHalf || type == at::kBFloat16);
            if (half_mean)
              RANK_CHECK(at::allclose(t.to(at::kFloat), want.to(at::kFloat), 1e-2, 1e-2));
            else
              RANK_CHECK_EQUAL(t, want);
          }
  });
}

TEST(ProcessGroup, BroadcastAndReduceFromTheLastRank) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank(), last = w - 1;
    for (auto type : kTypes)
      for (const auto& shape : kShapes) {
        at::Tensor t = strided(input(me, type, shape));
        g->broadcast_(t, last);
        RANK_CHECK_EQUAL(t, input(last, type, shape));
        at::Tensor u = input(me, type, shape);
        g->reduce_(u, last, type == at::kBool ? ReduceOp::Max : ReduceOp::Sum);
        RANK_CHECK_EQUAL(u, me == last
                                ? expected_reduce(w, type, shape, type == at::kBool ? ReduceOp::Max : ReduceOp::Sum)
                                : input(me, type, shape));
      }
  });
}

TEST(ProcessGroup, GatherFamilyScatterReduceScatterAllToAll) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank(), last = w - 1;
    for (auto type : kTypes)
      for (const auto& shape : kShapes) {
        std::vector<at::Tensor> all;
        for (int r = 0; r < w; ++r) all.push_back(input(r, type, shape));
        at::Tensor stacked = at::stack(all);
        RANK_CHECK_EQUAL(g->all_gather(strided(input(me, type, shape))), stacked);
        auto gathered = g->gather(input(me, type, shape), last);
        RANK_CHECK(gathered.has_value() == (me == last));
        if (gathered) RANK_CHECK_EQUAL(*gathered, stacked);
        auto part = g->scatter(me == last ? std::optional<at::Tensor>(strided(stacked)) : std::nullopt, last);
        RANK_CHECK_EQUAL(part, input(me, type, shape));
        if (shape.empty()) continue;
        // (w * n, ...) inputs: block q of rank r holds input(r + q).
        std::vector<at::Tensor> blocks;
        for (int q = 0; q < w; ++q) blocks.push_back(input(me + q, type, shape));
        at::Tensor mine = at::cat(blocks);
        at::Tensor want_rs = expected_reduce(1, type, shape, ReduceOp::Sum).zero_();
        std::vector<at::Tensor> from;
        for (int p = 0; p < w; ++p) from.push_back(input(p + me, type, shape));
        if (type != at::kBool) {
          at::Tensor acc = from[0].to(at::isComplexType(type) ? at::kComplexDouble : at::kDouble);
          for (int p = 1; p < w; ++p) acc = acc + from[size_t(p)].to(acc.scalar_type());
          RANK_CHECK_EQUAL(g->reduce_scatter(mine, ReduceOp::Sum), acc.to(type));
        }
        RANK_CHECK_EQUAL(g->all_to_all(strided(mine)), at::cat(from));
      }
  });
}

// Note [Symmetric pool]: dropped memory serves the next take without allocating; collectives on
// pooled tensors run direct; a rank that finds no room (it still holds what the others dropped)
// makes every rank grow the pool with it, and nothing waits.
TEST(ProcessGroup, TakeSymmetricReusesDroppedMemoryAndRanksAgreeOnRoom) {
  for_worlds({1, 2, 3}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    at::Tensor a = g->take_symmetric(1000);
    RANK_CHECK(a.numel() == 1000 && a.scalar_type() == at::kFloat);
    RANK_CHECK(in_shared_memory(a.data_ptr()), "a pooled tensor outside symmetric memory");
    void* first = a.data_ptr();
    a.reset();
    at::Tensor b = g->take_symmetric(1000);
    RANK_CHECK(b.data_ptr() == first, "dropped memory was not taken again");
    b.fill_(float(me + 1));
    g->all_reduce_(b, ReduceOp::Sum);
    RANK_CHECK_EQUAL(b, at::full({1000}, float(w * (w + 1) / 2)));
    at::Tensor out = g->take_symmetric(int64_t(w) * 1000, at::kDouble);
    g->all_gather_into(out, at::full({1000}, double(me), at::kDouble));
    RANK_CHECK_EQUAL(out, at::arange(w, at::kDouble).repeat_interleave(1000));

    const int64_t whole = 2 << 20;  // floats: one whole arena (8 MiB)
    at::Tensor held = g->take_symmetric(whole);
    if (me != 0) held.reset();  // rank 0 alone has no room for the next one
    at::Tensor c = g->take_symmetric(whole);
    RANK_CHECK(in_shared_memory(c.data_ptr()), "the grown pool's tensor outside symmetric memory");
    c.fill_(1);
    g->all_reduce_(c, ReduceOp::Sum);
    RANK_CHECK_EQUAL(c, at::full({whole}, float(w)));
    RANK_CHECK(g->take_symmetric(0).numel() == 0);
  });
}

TEST(ProcessGroup, AllGatherVShapesDifferInEveryDim) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    auto shape_of = [](int r) { return std::vector<int64_t>{r + 1, 3 - r % 3, 2}; };
    auto parts = g->all_gather_v(strided(input(me, at::kBFloat16, shape_of(me))));
    RANK_CHECK(int(parts.size()) == w);
    for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(parts[size_t(r)], input(r, at::kBFloat16, shape_of(r)));
    auto work = g->all_gather_v_async(input(me, at::kLong, {me}));
    auto got = work->result();
    for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(got[size_t(r)], input(r, at::kLong, {r}));
  });
}

TEST(ProcessGroup, SendRecvRingAndAsync) {
  for_worlds({2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank();
    const int next = (me + 1) % w, prev = (me + w - 1) % w;
    auto send = g->send_async(input(me, at::kHalf, {7, 3}), next, 5);
    at::Tensor got = strided(at::zeros({7, 3}, at::kHalf));
    g->recv(got, prev, 5);
    send->wait();
    RANK_CHECK_EQUAL(got, input(prev, at::kHalf, {7, 3}));

    at::Tensor t = strided(input(me, at::kFloat, {64, 5}));
    auto work = g->all_reduce_async(t, ReduceOp::Max);
    auto gathered = g->all_gather_async(input(me, at::kInt, {3}));
    work->wait();
    RANK_CHECK(work->is_completed() && work->is_success());
    RANK_CHECK_EQUAL(t, expected_reduce(w, at::kFloat, {64, 5}, ReduceOp::Max));
    std::vector<at::Tensor> all;
    for (int r = 0; r < w; ++r) all.push_back(input(r, at::kInt, {3}));
    RANK_CHECK_EQUAL(gathered->result()[0], at::stack(all));
    g->barrier_async()->wait();
  });
}

TEST(ProcessGroup, OverlappingSubgroups) {
  for_worlds({3, 4}, [] {
    const int me = default_group()->rank();
    auto a = new_group({0, 1});
    auto b = new_group({1, 2});
    RANK_CHECK((a != nullptr) == (me <= 1) && (b != nullptr) == (me == 1 || me == 2));
    for (int round = 0; round < 3; ++round) {
      if (a) {
        at::Tensor t = at::full({4}, double(me + round), at::kDouble);
        a->all_reduce_(t);
        RANK_CHECK_EQUAL(t, at::full({4}, double(1 + 2 * round), at::kDouble));
      }
      if (b) {
        at::Tensor t = at::full({2}, int64_t(me), at::kLong);
        b->broadcast_(t, 1);  // group rank 1 is world rank 2
        RANK_CHECK_EQUAL(t, at::full({2}, int64_t(2), at::kLong));
        RANK_CHECK(b->global_rank(1) == 2);
      }
    }
    default_group()->barrier();
  });
}

TEST(ProcessGroupErrors, BadInputOnOneRankIsAnErrorOnEveryRank) {
  for_worlds({2, 3}, [] {
    auto g = default_group();
    const int me = g->rank();
    at::Tensor ints = at::ones({3}, at::kInt);
    auto msg = RANK_EXPECT_THROW(InvalidArgument, g->all_reduce_(ints, ReduceOp::Mean));
    RANK_CHECK(msg.find("convert to a floating type") != std::string::npos, msg);

    // One rank passes a tensor on another device: everyone raises, and the group goes on.
    at::Tensor t = me == 1 ? at::empty({3}, at::TensorOptions().device(at::kMeta)) : at::ones({3});
    msg = RANK_EXPECT_THROW(InvalidArgument, g->all_reduce_(t));
    RANK_CHECK(msg.find("meta") != std::string::npos, msg);
    at::Tensor c = at::ones({2}, at::kComplexFloat);
    RANK_EXPECT_THROW(InvalidArgument, g->all_reduce_(c, ReduceOp::Max));
    RANK_EXPECT_THROW(InvalidArgument, g->broadcast_(c, 7));
    at::Tensor odd = at::ones({g->size() + 1});
    msg = RANK_EXPECT_THROW(InvalidArgument, g->reduce_scatter(odd));
    RANK_CHECK(msg.find("multiple of the group size") != std::string::npos, msg);
    msg = RANK_EXPECT_THROW(InvalidArgument,
                            g->scatter(me == 0 ? std::optional<at::Tensor>(at::ones({1})) : std::nullopt, 0));
    RANK_CHECK(msg.find("one block per rank") != std::string::npos, msg);

    at::Tensor x = at::ones({4});
    g->all_reduce_(x);
    RANK_CHECK_EQUAL(x, at::full({4}, double(g->size()), at::kFloat));
  });
}

TEST(ProcessGroupErrors, DifferentShapesOrDtypesAreMismatches) {
  for_worlds({2, 3}, [] {
    auto g = default_group();
    const int me = g->rank();
    auto msg =
        RANK_EXPECT_THROW(CollectiveMismatch, g->all_gather_v(at::ones(std::vector<int64_t>(size_t(me + 1), 1))));
    RANK_CHECK(msg.find("rank 1: all_gather_v(Float[1, 1])") != std::string::npos, msg);
    at::Tensor t = at::ones({3}, me == 0 ? at::kFloat : at::kDouble);
    msg = RANK_EXPECT_THROW(CollectiveMismatch, g->all_reduce_(t));
    RANK_CHECK(msg.find("f64") != std::string::npos, msg);
  });
}

TEST(ProcessGroupErrors, NotInitialized) {
  auto msg = expect_throw<Error>([] { default_group(); }, "default_group");
  EXPECT_NE(msg.find("init_process_group"), std::string::npos) << msg;
}

}  // namespace
}  // namespace chorus::test
