// Objects between ranks (broadcast_object_list, gather_object, all_gather_object, Fabric's
// broadcast of IValues) and the Axolotl helpers with exact types and leader failures.
#include <gtest/gtest.h>

#include "torch_harness.h"

namespace chorus::test {
namespace {

// A nested object whose content and size depend on the rank: typed lists, a dict with int keys,
// a named tuple, tensors, strings, None, and a string of rank-dependent length.
c10::IValue object_of(int r) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("rank", int64_t(r));
  d.insert("scale", 0.5 * r);
  d.insert("name", std::string(size_t(10 + 1000 * r), char('a' + r)));
  d.insert("ids", c10::List<int64_t>({r, r + 1, r + 2}));
  d.insert("weights", at::arange(6 * (r + 1), at::kFloat).reshape({r + 1, 6}) + r);
  c10::impl::GenericDict by_id(c10::IntType::get(), c10::TensorType::get());
  by_id.insert(int64_t(r), at::full({2}, int64_t(r), at::kLong));
  d.insert("by_id", by_id);
  auto point = c10::TupleType::createNamed(c10::QualifiedName("Point"), std::vector<std::string>{"x", "y"},
                                           std::vector<c10::TypePtr>{c10::TensorType::get(), c10::StringType::get()});
  d.insert("point", c10::ivalue::Tuple::createNamed({at::ones({2}, at::kHalf) * r, std::string("p")}, point));
  d.insert("nothing", c10::IValue());
  d.insert("flag", r % 2 == 0);
  return d;
}

void check_object(const c10::IValue& got, int r) {
  c10::IValue want = object_of(r);
  RANK_CHECK(got.isGenericDict(), got.type()->annotation_str());
  auto g = got.toGenericDict(), w = want.toGenericDict();
  RANK_CHECK(*got.type() == *want.type(), got.type()->annotation_str());
  RANK_CHECK(g.size() == w.size());
  RANK_CHECK(g.at("rank").toInt() == r && g.at("scale").toDouble() == 0.5 * r);
  RANK_CHECK(g.at("name").toStringRef() == w.at("name").toStringRef());
  RANK_CHECK(g.at("ids").type()->annotation_str() == "List[int]" &&
             g.at("ids").toIntVector() == w.at("ids").toIntVector());
  RANK_CHECK_EQUAL(g.at("weights").toTensor(), w.at("weights").toTensor());
  RANK_CHECK(g.at("by_id").type()->annotation_str() == "Dict[int, Tensor]", g.at("by_id").type()->annotation_str());
  RANK_CHECK_EQUAL(g.at("by_id").toGenericDict().at(int64_t(r)).toTensor(), at::full({2}, int64_t(r), at::kLong));
  auto point = g.at("point");
  auto type = point.type()->cast<c10::TupleType>();
  RANK_CHECK(type && type->name() && type->name()->name() == "Point" && type->schema()->arguments()[1].name() == "y");
  RANK_CHECK_EQUAL(point.toTupleRef().elements()[0].toTensor(), at::ones({2}, at::kHalf) * r);
  RANK_CHECK(g.at("nothing").isNone() && g.at("flag").toBool() == (r % 2 == 0));
}

TEST(Objects, BroadcastGatherAndAllGatherOfUnequalObjects) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank(), last = w - 1;
    std::vector<c10::IValue> list = {object_of(me), int64_t(me)};
    if (me == last) list.push_back(std::string("extra"));
    broadcast_object_list(list, last);
    RANK_CHECK(list.size() == 3);
    check_object(list[0], last);
    RANK_CHECK(list[1].toInt() == last && list[2].toStringRef() == "extra");

    auto gathered = gather_object(object_of(me));
    RANK_CHECK(gathered.has_value() == (me == 0));
    if (gathered)
      for (int r = 0; r < w; ++r) check_object((*gathered)[size_t(r)], r);
    auto all = all_gather_object(object_of(me));
    RANK_CHECK(int(all.size()) == w);
    for (int r = 0; r < w; ++r) check_object(all[size_t(r)], r);

    Fabric fabric;
    check_object(fabric.broadcast(object_of(me), last), last);
    RANK_CHECK_EQUAL(fabric.broadcast(at::ones({me + 1, 2}) * me, last), at::ones({last + 1, 2}) * last);
  });
}

TEST(Objects, LargeObjectsWithTensorsInside) {
  for_worlds({2, 3}, [] {
    const int me = default_group()->rank();
    // 12 MB of tensors and a 10 MB string, from rank 1.
    c10::impl::GenericList list(c10::AnyType::get());
    list.push_back(at::arange(3 * 1000 * 1000, at::kFloat) * (me + 1));
    list.push_back(std::string(10 * 1000 * 1000, char('x' + me)));
    list.push_back(at::arange(1000, at::kInt).reshape({10, 100}).t());  // non-contiguous
    auto got = broadcast_object<c10::IValue>(c10::IValue(list), 1).toList();
    RANK_CHECK_EQUAL(got.get(0).toTensor(), at::arange(3 * 1000 * 1000, at::kFloat) * 2);
    RANK_CHECK(got.get(1).toStringRef() == std::string(10 * 1000 * 1000, 'y'));
    RANK_CHECK_EQUAL(got.get(2).toTensor(), at::arange(1000, at::kInt).reshape({10, 100}).t().contiguous());
    // Received blocks are reused once freed (Note [Receive buffers]), never while alive.
    auto first = broadcast_object(at::full({1 << 19}, 1.0 + me, at::kDouble), 0);
    auto second = broadcast_object(at::full({1 << 19}, 2.0 + me, at::kDouble), 0);
    RANK_CHECK(first.data_ptr() != second.data_ptr() || me == 0);
    RANK_CHECK_EQUAL(first, at::full({1 << 19}, 1.0, at::kDouble));
    RANK_CHECK_EQUAL(second, at::full({1 << 19}, 2.0, at::kDouble));
    void* reused = first.data_ptr();
    first = at::Tensor();
    auto third = broadcast_object(at::full({1 << 19}, 3.0 + me, at::kDouble), 0);
    RANK_CHECK(third.data_ptr() == reused || me == 0, "a freed block should serve the next receive");
    RANK_CHECK_EQUAL(third, at::full({1 << 19}, 3.0, at::kDouble));
    auto all = all_gather_object(at::full({1 << 20}, double(me), at::kDouble));
    for (int r = 0; r < default_group()->size(); ++r)
      RANK_CHECK_EQUAL(all[size_t(r)].toTensor(), at::full({1 << 20}, double(r), at::kDouble));
  });
}

TEST(Objects, TypedBroadcastKeepsExactTypes) {
  for_worlds({1, 2, 3}, [] {
    const int me = default_group()->rank();
    int64_t big = broadcast_object<int64_t>((int64_t(1) << 40) + me, 0);
    RANK_CHECK(big == (int64_t(1) << 40));
    double d = broadcast_object(0.1 + me, 0);
    RANK_CHECK(d == 0.1);
    using Nested = std::map<std::string, std::vector<std::tuple<int, double, std::optional<std::string>>>>;
    Nested n{{"a", {{me, 1.5, std::nullopt}, {2, 2.5, std::string("s")}}}};
    Nested got = broadcast_object(n, 0);
    RANK_CHECK(std::get<0>(got.at("a")[0]) == 0 && std::get<1>(got.at("a")[1]) == 2.5 && !std::get<2>(got.at("a")[0]) &&
               *std::get<2>(got.at("a")[1]) == "s");
  });
}

TEST(Helpers, ComputeGatherReduceWithExactTypes) {
  for_worlds({1, 2, 3, 4}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    RANK_CHECK(is_distributed() == (w > 1) && is_main_process() == (me == 0));
    int calls = 0;
    auto v = compute_and_broadcast(
        [&] {
          ++calls;
          return int64_t(9007199254740993) + me;
        },
        w - 1);
    static_assert(std::is_same_v<decltype(v), int64_t>);
    RANK_CHECK(v == int64_t(9007199254740993) + w - 1 && calls == (me == w - 1 ? 1 : 0));
    auto s = compute_and_broadcast([&] { return std::string("from ") + std::to_string(me); });
    RANK_CHECK(s == "from 0");

    auto gathered = gather_from_all_ranks([&] { return std::vector<double>{me * 0.25, 1.0 / 3}; }, w - 1);
    RANK_CHECK(gathered.has_value() == (me == w - 1));
    if (gathered)
      for (int r = 0; r < w; ++r) RANK_CHECK((*gathered)[size_t(r)] == (std::vector<double>{r * 0.25, 1.0 / 3}));
    auto scalars = gather_scalar_from_all_ranks([&] { return int64_t(me) << 40; });
    static_assert(std::is_same_v<decltype(scalars), std::optional<std::vector<int64_t>>>);
    if (me == 0)
      for (int r = 0; r < w; ++r) RANK_CHECK((*scalars)[size_t(r)] == int64_t(r) << 40);

    double total = reduce_and_broadcast([&] { return 0.5 * me; },
                                        [](std::vector<double> xs) {
                                          double t = 0;
                                          for (double x : xs) t += x;
                                          return t;
                                        });
    RANK_CHECK(total == 0.25 * w * (w - 1));

    std::vector<int> order;
    zero_first(me == 0, [&] { order.push_back(me); });
    RANK_CHECK(order.size() == 1);
    int only = 0;
    zero_only([&] { ++only; });
    RANK_CHECK(only == (me == 0 ? 1 : 0));
    barrier();
  });
}

TEST(Helpers, LeaderFailuresReachEveryRank) {
  for_worlds({1, 2, 3}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    auto boom = [&] { throw std::runtime_error("dataset download failed"); };
    auto msg = RANK_EXPECT_THROW(std::runtime_error, compute_and_broadcast([&]() -> int {
                                   boom();
                                   return 0;
                                 }));
    RANK_CHECK(msg.find("dataset download failed") != std::string::npos, msg);
    if (me != 0) RANK_CHECK(msg.find("rank 0 failed") != std::string::npos, msg);

    int ran = 0;
    msg = RANK_EXPECT_THROW(std::runtime_error, zero_first(me == 0, [&] {
                              ++ran;
                              if (me == 0) boom();
                            }));
    RANK_CHECK(msg.find("dataset download failed") != std::string::npos && ran == (me == 0 ? 1 : 0), msg);

    Fabric fabric;
    msg = RANK_EXPECT_THROW(std::runtime_error, fabric.rank_zero_first([&] {
      if (me == 0) boom();
    }));
    RANK_CHECK(msg.find("dataset download failed") != std::string::npos, msg);
    msg = RANK_EXPECT_THROW(std::runtime_error, fabric.rank_zero_first(
                                                    [&] {
                                                      if (me == 0) boom();
                                                    },
                                                    true));
    RANK_CHECK(msg.find("dataset download failed") != std::string::npos, msg);

    msg = RANK_EXPECT_THROW(std::runtime_error, reduce_and_broadcast([&] { return me; },
                                                                     [&](std::vector<int>) -> int {
                                                                       boom();
                                                                       return 0;
                                                                     }));
    RANK_CHECK(msg.find("dataset download failed") != std::string::npos, msg);
    // fn1 failing on the last rank only
    msg = RANK_EXPECT_THROW(std::runtime_error, reduce_and_broadcast(
                                                    [&] {
                                                      if (me == w - 1) boom();
                                                      return me;
                                                    },
                                                    [&](std::vector<int> v) { return int(v.size()); }));
    RANK_CHECK(msg.find("dataset download failed") != std::string::npos, msg);

    // Errors are Error on the other ranks, the leader's own exception on the leader.
    try {
      compute_and_broadcast([&]() -> int {
        boom();
        return 0;
      });
    } catch (const Error& e) {
      RANK_CHECK(me != 0, "the leader should rethrow its own exception");
    } catch (const std::runtime_error& e) {
      RANK_CHECK(me == 0, "non-leaders should raise chorus::Error");
    }
    // The group still works.
    RANK_CHECK(compute_and_broadcast([&] { return me + 5; }) == 5);
  });
}

TEST(Objects, BadRanksAndUnmovableObjectsAreErrorsEverywhere) {
  for_worlds({1, 2, 3}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    Fabric fabric;
    auto msg = RANK_EXPECT_THROW(InvalidArgument, fabric.broadcast(c10::IValue(int64_t(1)), w + 5));
    RANK_CHECK(msg.find("not a rank") != std::string::npos, msg);
    std::vector<c10::IValue> list = {c10::IValue(1.5)};
    RANK_EXPECT_THROW(InvalidArgument, broadcast_object_list(list, -1));
    RANK_EXPECT_THROW(InvalidArgument, gather_from_all_ranks([] { return 1; }, w));
    RANK_EXPECT_THROW(InvalidArgument, compute_and_broadcast([] { return 1; }, -2));
    // A tensor on another device inside the leader's object: the leader's InvalidArgument, an
    // Error carrying it everywhere else.
    c10::impl::GenericList odd(c10::TensorType::get());
    odd.push_back(at::empty({2}, at::TensorOptions().device(at::kMeta)));
    msg = RANK_EXPECT_THROW(Error, fabric.broadcast(c10::IValue(odd), 0));
    RANK_CHECK(msg.find("meta") != std::string::npos, msg);
    RANK_CHECK(fabric.broadcast(c10::IValue(int64_t(me + 3)), 0).toInt() == 3);
  });
}

TEST(Helpers, RankZeroFirstOrder) {
  for_worlds({3}, [] {
    // Rank 0 writes a file first; the others read it in their turn.
    const int me = default_group()->rank();
    const std::string path = "/tmp/chorus-rzf-" + std::to_string(getppid());
    Fabric fabric;
    fabric.rank_zero_first([&] {
      if (me == 0) {
        FILE* f = std::fopen(path.c_str(), "w");
        std::fputs("ready", f);
        std::fclose(f);
      } else {
        FILE* f = std::fopen(path.c_str(), "r");
        RANK_CHECK(f != nullptr, "rank ", me, " ran before rank 0 finished");
        std::fclose(f);
      }
    });
    fabric.barrier("cleanup");
    if (me == 0) std::remove(path.c_str());
  });
}

}  // namespace
}  // namespace chorus::test
