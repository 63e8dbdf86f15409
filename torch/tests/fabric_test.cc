// Fabric's operations and the Lightning-style utilities.
#include <gtest/gtest.h>

#include "torch_harness.h"

namespace chorus::test {
namespace {

c10::IValue batch_of(int r) {
  auto stats = c10::TupleType::createNamed(c10::QualifiedName("Stats"), std::vector<std::string>{"loss", "acc"},
                                           std::vector<c10::TypePtr>{c10::TensorType::get(), c10::FloatType::get()});
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("x", at::arange(6, at::kFloat).reshape({2, 3}) + r);
  d.insert("steps", int64_t(10 + r));
  d.insert("tag", std::string("rank") + std::to_string(r));
  c10::impl::GenericList list(c10::TensorType::get());
  list.push_back(at::full({4}, int64_t(r), at::kLong));
  list.push_back(at::full({}, double(r), at::kDouble));
  d.insert("list", list);
  d.insert("stats", c10::ivalue::Tuple::createNamed({at::full({1}, 1.0f + r), 0.5 * r}, stats));
  d.insert("mask", at::full({3}, r % 2 == 1, at::kBool));
  return d;
}

TEST(Fabric, RanksBarrierPrintAndDevice) {
  for_worlds({1, 2, 3, 4}, [] {
    Fabric fabric;
    fabric.launch();
    const int w = fabric.world_size(), me = fabric.global_rank();
    RANK_CHECK(w == default_group()->size() && me == default_group()->rank());
    RANK_CHECK(fabric.local_rank() == me && fabric.node_rank() == 0 && fabric.is_global_zero() == (me == 0));
    fabric.barrier("start");
    testing::internal::CaptureStdout();
    fabric.print("loss", 1.5, 3);
    const std::string out = testing::internal::GetCapturedStdout();
    RANK_CHECK(out == (me == 0 ? "loss 1.5 3\n" : ""), "printed '", out, "'");
    auto t = at::ones({2});
    RANK_CHECK(fabric.to_device(t).device() == at::Device(at::kCPU));
    RANK_CHECK(fabric.to_device(batch_of(me)).toGenericDict().at("x").toTensor().device().is_cpu());
    RANK_EXPECT_THROW(InvalidArgument, Fabric({.accelerator = "cuda"}));
  });
}

TEST(Fabric, AllGatherStacksTensorsAndCollections) {
  for_worlds({1, 2, 3, 4}, [] {
    Fabric fabric;
    const int w = fabric.world_size(), me = fabric.global_rank();
    RANK_CHECK_EQUAL(fabric.all_gather(at::full({2, 2}, float(me))),
                     at::arange(w, at::kFloat).reshape({w, 1, 1}).expand({w, 2, 2}).contiguous());
    auto got = fabric.all_gather(batch_of(me));
    RANK_CHECK(*got.type() == *batch_of(me).type(), got.type()->annotation_str());
    auto d = got.toGenericDict();
    std::vector<c10::IValue> per_rank;
    for (int r = 0; r < w; ++r) per_rank.push_back(batch_of(r));
    auto x = std::vector<at::Tensor>(), l0 = x, l1 = x, loss = x, mask = x;
    for (auto& b : per_rank) {
      auto bd = b.toGenericDict();
      x.push_back(bd.at("x").toTensor());
      l0.push_back(bd.at("list").toList().get(0).toTensor());
      l1.push_back(bd.at("list").toList().get(1).toTensor());
      loss.push_back(bd.at("stats").toTupleRef().elements()[0].toTensor());
      mask.push_back(bd.at("mask").toTensor());
    }
    RANK_CHECK_EQUAL(d.at("x").toTensor(), at::stack(x));
    RANK_CHECK_EQUAL(d.at("list").toList().get(0).toTensor(), at::stack(l0));
    RANK_CHECK_EQUAL(d.at("list").toList().get(1).toTensor(), at::stack(l1));
    RANK_CHECK_EQUAL(d.at("mask").toTensor(), at::stack(mask));
    RANK_CHECK_EQUAL(d.at("steps").toTensor(), at::arange(w, at::kLong) + 10);  // numbers travel as exact 0-d tensors
    RANK_CHECK(d.at("tag").toStringRef() == "rank" + std::to_string(me));       // strings stay
    auto stats = d.at("stats");
    RANK_CHECK(stats.type()->cast<c10::TupleType>()->name()->name() == "Stats");
    RANK_CHECK_EQUAL(stats.toTupleRef().elements()[0].toTensor(), at::stack(loss));
    RANK_CHECK_EQUAL(stats.toTupleRef().elements()[1].toTensor(), at::arange(w, at::kDouble) * 0.5);
  });
}

TEST(Fabric, AllReduceEveryOpOnTensorsAndCollections) {
  for_worlds({1, 2, 3, 4}, [] {
    Fabric fabric;
    const int w = fabric.world_size(), me = fabric.global_rank();
    at::Tensor x = at::arange(5, at::kDouble) + me;
    const double tri = w * (w - 1) / 2.0;
    RANK_CHECK_EQUAL(fabric.all_reduce(x), at::arange(5, at::kDouble) + tri / w);  // mean by default
    RANK_CHECK_EQUAL(x, at::arange(5, at::kDouble) + me);                          // input untouched
    RANK_CHECK_EQUAL(fabric.all_reduce(x, nullptr, ReduceOp::Sum), at::arange(5, at::kDouble) * w + tri);
    RANK_CHECK_EQUAL(fabric.all_reduce(x, nullptr, "max"), at::arange(5, at::kDouble) + (w - 1));
    RANK_CHECK_EQUAL(fabric.all_reduce(x, nullptr, ReduceOp::Min), at::arange(5, at::kDouble));
    at::Tensor two = at::full({3}, 2, at::kInt);
    RANK_CHECK_EQUAL(fabric.all_reduce(two, nullptr, ReduceOp::Product), at::full({3}, 1 << w, at::kInt));
    at::Tensor bits = at::full({2}, int64_t(1) << me, at::kLong);
    RANK_CHECK_EQUAL(fabric.all_reduce(bits, nullptr, "bor"), at::full({2}, (int64_t(1) << w) - 1, at::kLong));
    RANK_CHECK_EQUAL(fabric.all_reduce(bits, nullptr, ReduceOp::BitwiseAnd), at::full({2}, w == 1 ? 1 : 0, at::kLong));
    RANK_CHECK_EQUAL(fabric.all_reduce(bits, nullptr, ReduceOp::BitwiseXor),
                     at::full({2}, (int64_t(1) << w) - 1, at::kLong));

    // A collection: float leaves averaged, number leaves come back as numbers of their type.
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("loss", at::full({}, float(me)));
    d.insert("count", int64_t(me + 1));
    d.insert("lr", 0.5 * me);
    d.insert("name", std::string("n"));
    auto summed = fabric.all_reduce(c10::IValue(d), nullptr, ReduceOp::Sum).toGenericDict();
    RANK_CHECK_EQUAL(summed.at("loss").toTensor(), at::full({}, float(tri)));
    RANK_CHECK(summed.at("count").isInt() && summed.at("count").toInt() == w * (w + 1) / 2);
    RANK_CHECK(summed.at("lr").isDouble() && summed.at("lr").toDouble() == 0.5 * tri);
    RANK_CHECK(summed.at("name").toStringRef() == "n");
    auto msg = RANK_EXPECT_THROW(InvalidArgument, fabric.all_reduce(c10::IValue(d)));  // mean of an int leaf
    RANK_CHECK(
        msg.find("['count']") != std::string::npos && msg.find("convert to a floating type") != std::string::npos, msg);
    (void)d.erase("count");
    auto mean = fabric.all_reduce(c10::IValue(d)).toGenericDict();
    RANK_CHECK(mean.at("lr").toDouble() == 0.5 * tri / w);
  });
}

TEST(Fabric, CollectionsThatDifferAreMismatchesOnEveryRank) {
  for_worlds({2, 3}, [] {
    Fabric fabric;
    const int me = fabric.global_rank();
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("a", at::ones({2}));
    if (me == 1) d.insert("b", at::ones({2}));
    auto msg = RANK_EXPECT_THROW(CollectiveMismatch, fabric.all_reduce(c10::IValue(d)));
    RANK_CHECK(msg.find("rank 1: {'a':T<Float,cpu>[2],'b':T<Float,cpu>[2]}") != std::string::npos, msg);
    c10::impl::GenericDict e(c10::StringType::get(), c10::AnyType::get());
    e.insert("a", at::ones({me == 1 ? 3 : 2}));
    RANK_EXPECT_THROW(CollectiveMismatch, fabric.all_gather(c10::IValue(e)));
    c10::impl::GenericDict f(c10::StringType::get(), c10::AnyType::get());
    f.insert("a", at::ones({2}, me == 1 ? at::kDouble : at::kFloat));
    RANK_EXPECT_THROW(CollectiveMismatch, fabric.all_reduce(c10::IValue(f), nullptr, ReduceOp::Sum));
    RANK_EXPECT_THROW(CollectiveMismatch, gather(c10::IValue(f)));
    // and the group goes on
    RANK_CHECK_EQUAL(fabric.all_reduce(at::ones({1}), nullptr, ReduceOp::Sum),
                     at::full({1}, float(fabric.world_size())));
  });
}

TEST(Lightning, AllGatherWithGradSumsTheGradientsOfOwnSlice) {
  for_worlds({1, 2, 3, 4}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    at::Tensor x = at::full({2}, double(me + 1), at::kDouble).requires_grad_();
    at::Tensor y = all_gather_with_grad(x);
    RANK_CHECK(y.sizes() == at::IntArrayRef({w, 2}));
    // On rank `me`, slice r is weighted by (r + 1) * (me + 1).
    at::Tensor weights = (at::arange(w, at::kDouble) + 1).unsqueeze(1) * double(me + 1);
    (y * weights).sum().backward();
    const double want = (me + 1) * (w * (w + 1) / 2.0);
    RANK_CHECK_EQUAL(x.grad(), at::full({2}, want, at::kDouble));
    Fabric fabric;
    at::Tensor z = at::ones({3}, at::kDouble).requires_grad_();
    fabric.all_gather(z, nullptr, true).sum().backward();
    RANK_CHECK_EQUAL(z.grad(), at::full({3}, double(w), at::kDouble));
    auto plain = all_gather_ddp_if_available(z);
    RANK_CHECK(!plain.requires_grad() && plain.sizes() == at::IntArrayRef({w, 3}));
  });
}

TEST(Lightning, GatherAllTensorsAndSyncDdp) {
  for_worlds({1, 2, 3, 4}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    auto parts = gather_all_tensors(at::full({me + 1, 3 - me % 2}, float(me)));
    RANK_CHECK(int(parts.size()) == w);
    for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(parts[size_t(r)], at::full({r + 1, 3 - r % 2}, float(r)));
    at::Tensor t = at::full({2}, float(me));
    sync_ddp(t);
    RANK_CHECK_EQUAL(t, at::full({2}, float(w * (w - 1) / 2)));
    at::Tensor m = at::full({2}, float(me));
    sync_ddp_if_available(m, nullptr, "avg");
    RANK_CHECK_EQUAL(m, at::full({2}, float(w - 1) / 2));
    at::Tensor i = at::ones({2}, at::kInt);
    auto msg = RANK_EXPECT_THROW(InvalidArgument, sync_ddp(i, nullptr, "mean"));
    RANK_CHECK(msg.find("sum and divide") != std::string::npos, msg);
  });
}

// A cluster environment of the user's own, pointing at the test's store.
class StoreEnvironment : public ClusterEnvironment {
 public:
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override { return "127.0.0.1"; }
  int main_port() const override { return std::stoi(std::getenv("CHORUS_STORE_PORT")); }
  int world_size() const override { return std::stoi(std::getenv("WORLD_SIZE")); }
  int global_rank() const override { return std::stoi(std::getenv("RANK")); }
  int local_rank() const override { return global_rank(); }
  int node_rank() const override { return 0; }
  bool store_hosted() const override { return true; }
};

TEST(Lightning, InitDistConnectionFromAClusterEnvironment) {
  for_worlds({1, 3}, [] {
    auto before = default_group();
    RANK_CHECK(init_dist_connection(StoreEnvironment(), "auto") == before);  // already initialized
    destroy_process_group();
    RANK_CHECK(!is_initialized() && !is_distributed());
    RANK_EXPECT_THROW(InvalidArgument, init_dist_connection(StoreEnvironment(), "auto", 5, 2));
    auto g = init_dist_connection(StoreEnvironment(), "shm");
    at::Tensor t = at::ones({3});
    g->all_reduce_(t);
    RANK_CHECK_EQUAL(t, at::full({3}, float(g->size())));
    RANK_CHECK(is_initialized() && default_group() == g);
  });
}

}  // namespace
}  // namespace chorus::test
