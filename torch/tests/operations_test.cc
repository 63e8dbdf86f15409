// Accelerate-style operations (collective ones at W = 1..4) and the collection walkers.
#include <gtest/gtest.h>

#include "torch_harness.h"

namespace chorus::test {
namespace {

c10::IValue nested(const at::Tensor& a, const at::Tensor& b) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("a", a);
  c10::impl::GenericList list(c10::TensorType::get());
  list.push_back(b);
  d.insert("list", list);
  d.insert("pair", c10::ivalue::Tuple::create({a * 2, std::string("label")}));
  return d;
}

TEST(Accelerate, BroadcastGatherReduce) {
  for_worlds({1, 2, 3, 4}, [] {
    auto g = default_group();
    const int w = g->size(), me = g->rank(), last = w - 1;
    at::Tensor t = at::full({2, 3}, float(me)).t();  // non-contiguous, in place
    broadcast(t, last);
    RANK_CHECK_EQUAL(t, at::full({3, 2}, float(last)));

    // gather: concatenated along dim 0, rows may differ, 0-d become one row; main process only.
    auto got = gather(at::full({me + 1, 2}, int64_t(me), at::kLong));
    RANK_CHECK(got.has_value() == (me == 0));
    std::vector<at::Tensor> rows;
    for (int r = 0; r < w; ++r) rows.push_back(at::full({r + 1, 2}, int64_t(r), at::kLong));
    if (got) RANK_CHECK_EQUAL(*got, at::cat(rows));
    auto scalars = gather(at::full({}, double(me), at::kDouble));
    if (me == 0) RANK_CHECK_EQUAL(*scalars, at::arange(w, at::kDouble));
    auto tree = gather(nested(at::full({1, 2}, float(me)), at::full({me + 2}, int(me), at::kInt)));
    RANK_CHECK(tree.isNone() == (me != 0));
    if (me == 0) {
      auto d = tree.toGenericDict();
      std::vector<at::Tensor> a, b;
      for (int r = 0; r < w; ++r) {
        a.push_back(at::full({1, 2}, float(r)));
        b.push_back(at::full({r + 2}, int(r), at::kInt));
      }
      RANK_CHECK_EQUAL(d.at("a").toTensor(), at::cat(a));
      RANK_CHECK_EQUAL(d.at("list").toList().get(0).toTensor(), at::cat(b));
      RANK_CHECK_EQUAL(d.at("pair").toTupleRef().elements()[0].toTensor(), at::cat(a) * 2);
      RANK_CHECK(d.at("pair").toTupleRef().elements()[1].toStringRef() == "label");
    }

    at::Tensor x = at::full({4}, float(me));
    at::Tensor same = reduce(x, "sum");
    RANK_CHECK(same.is_same(x));
    RANK_CHECK_EQUAL(x, at::full({4}, float(w * (w - 1) / 2)));
    at::Tensor y = at::full({4}, float(me));
    reduce(y);  // mean
    RANK_CHECK_EQUAL(y, at::full({4}, float(w - 1) / 2));
    at::Tensor z = at::full({4}, float(me));
    RANK_CHECK_EQUAL(reduce(z, "none"), at::full({4}, float(me)));
    at::Tensor ints = at::ones({2}, at::kLong);
    auto msg = RANK_EXPECT_THROW(InvalidArgument, reduce(ints));
    RANK_CHECK(msg.find("sum and divide") != std::string::npos, msg);
    RANK_EXPECT_THROW(InvalidArgument, reduce(ints, "median"));
    wait_for_everyone();
  });
}

TEST(Accelerate, PadAcrossProcesses) {
  for_worlds({1, 2, 3, 4}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    at::Tensor t = at::ones({2, me + 1, 3}, at::kInt);
    for (int64_t dim : {1, -2})
      for (bool first : {false, true}) {
        at::Tensor p = pad_across_processes(t, dim, -1, first);
        RANK_CHECK(p.sizes() == at::IntArrayRef({2, w, 3}), p.sizes());
        at::Tensor ones = p.narrow(1, first ? w - (me + 1) : 0, me + 1);
        RANK_CHECK_EQUAL(ones, t);
        RANK_CHECK(p.eq(-1).sum().item<int64_t>() == 2 * 3 * (w - me - 1));
      }
    RANK_CHECK(pad_across_processes(t, 5).is_same(t));  // no such dim: as it is
    at::Tensor rows = at::full({me + 1}, 2.0f);
    RANK_CHECK_EQUAL(pad_across_processes(rows), at::cat({rows, at::zeros({w - me - 1})}));
  });
}

TEST(Accelerate, RngStatesAndSeeds) {
  for_worlds({1, 2, 3}, [] {
    const int w = default_group()->size(), me = default_group()->rank();
    set_seed(1234, /*device_specific=*/true);
    at::Tensor mine = at::rand({4});
    auto all = all_gather_object(mine);
    for (int r = 0; r < w; ++r)
      RANK_CHECK(r == me || !at::equal(all[size_t(r)].toTensor(), mine), "seeds should differ per rank");
    synchronize_rng_states();
    at::Tensor synced = at::rand({4});
    auto all_synced = all_gather_object(synced);
    for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(all_synced[size_t(r)].toTensor(), synced);
    set_seed(7);
    at::Tensor a = at::rand({3});
    set_seed(7);
    RANK_CHECK_EQUAL(at::rand({3}), a);

    at::Generator gen = at::detail::createCPUGenerator(100 + me);
    synchronize_rng_states({"generator"}, gen);
    at::Tensor from_gen = at::rand({3}, gen);
    auto gens = all_gather_object(from_gen);
    for (int r = 0; r < w; ++r) RANK_CHECK_EQUAL(gens[size_t(r)].toTensor(), from_gen);
    auto msg = RANK_EXPECT_THROW(InvalidArgument, synchronize_rng_states({"cuda"}));
    RANK_CHECK(msg.find("cuda") != std::string::npos, msg);
    RANK_EXPECT_THROW(InvalidArgument, synchronize_rng_states({"generator"}));
  });
}

TEST(Walkers, ConcatenateSliceAndBatchSize) {
  auto tensors_only = [](const at::Tensor& x, const at::Tensor& y) {
    auto d = nested(x, y);
    (void)d.toGenericDict().erase("pair");
    return d;
  };
  auto a = tensors_only(at::ones({2, 3}), at::zeros({2}));
  auto b = tensors_only(at::full({1, 3}, 2.0f), at::ones({4}));
  auto cat = concatenate({a, b}).toGenericDict();
  EXPECT_TRUE(same(cat.at("a").toTensor(), at::cat({at::ones({2, 3}), at::full({1, 3}, 2.0f)})));
  EXPECT_TRUE(same(cat.at("list").toList().get(0).toTensor(), at::cat({at::zeros({2}), at::ones({4})})));
  EXPECT_THROW(concatenate({}), InvalidArgument);
  {  // dicts pair up by key, as Accelerate's (insertion order may differ); structures must match
    c10::impl::GenericDict x(c10::StringType::get(), c10::TensorType::get()), y = x.copy();
    x.insert("p", at::ones({1}));
    x.insert("q", at::zeros({1}));
    y.insert("q", at::full({1}, 3.0f));
    y.insert("p", at::full({1}, 2.0f));
    auto xy = concatenate({x, y}).toGenericDict();
    EXPECT_TRUE(same(xy.at("p").toTensor(), at::tensor({1.0f, 2.0f})));
    EXPECT_TRUE(same(xy.at("q").toTensor(), at::tensor({0.0f, 3.0f})));
    c10::impl::GenericDict z(c10::StringType::get(), c10::TensorType::get());
    z.insert("p", at::ones({1}));
    z.insert("r", at::ones({1}));
    EXPECT_THROW(concatenate({x, z}), InvalidArgument);
    EXPECT_THROW(concatenate({a, c10::IValue(at::ones({1}))}), InvalidArgument);
  }
  auto with_string = c10::ivalue::Tuple::create({at::ones({1}), std::string("x")});
  try {
    concatenate({with_string, with_string});
    ADD_FAILURE() << "concatenate accepted a string leaf";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("only tensors"), std::string::npos) << e.what();
  }

  auto sliced = slice_tensors(nested(at::ones({4, 3}), at::zeros({2})), 1, 3).toGenericDict();
  EXPECT_EQ(sliced.at("a").toTensor().size(0), 2);
  EXPECT_EQ(sliced.at("pair").toTupleRef().elements()[1].toStringRef(), "label");
  EXPECT_EQ(find_batch_size(a), 2);
  EXPECT_EQ(find_batch_size(c10::ivalue::Tuple::create({at::ones({5, 1})})), 5);
  EXPECT_THROW(find_batch_size(c10::impl::GenericList(c10::TensorType::get())), InvalidArgument);
  {  // the first item is followed even when empty, as Accelerate's
    c10::impl::GenericList first_empty(c10::AnyType::get());
    first_empty.push_back(c10::impl::GenericList(c10::TensorType::get()));
    first_empty.push_back(at::ones({3}));
    EXPECT_THROW(find_batch_size(first_empty), InvalidArgument);
  }
  EXPECT_THROW(find_batch_size(c10::IValue(std::string("no"))), InvalidArgument);
  EXPECT_THROW(find_batch_size(at::ones({})), InvalidArgument);
  EXPECT_EQ(find_device(a), at::Device(at::kCPU));
  EXPECT_FALSE(find_device(c10::IValue(int64_t(3))).has_value());
}

TEST(Walkers, DeviceStructureAndPrecision) {
  auto data = nested(at::ones({2, 3}, at::kHalf), at::zeros({2}, at::kBFloat16));
  auto moved = send_to_device(data, at::kCPU, false, {"a"}).toGenericDict();
  EXPECT_TRUE(moved.at("a").toTensor().is_same(data.toGenericDict().at("a").toTensor()));  // skipped key: same tensor
  {  // a skipped key counts at every depth, and keeps whatever it holds
    c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get()), outer = inner.copy();
    inner.insert("a", at::ones({1}, at::kHalf));
    inner.insert("b", at::ones({1}, at::kHalf));
    outer.insert("in", inner);
    auto moved2 = send_to_device(outer, at::Device(at::kCPU), false, {"a"}).toGenericDict();
    EXPECT_TRUE(moved2.at("in").toGenericDict().at("a").toTensor().is_same(inner.at("a").toTensor()));
    auto send = [](const c10::IValue& v, const std::vector<std::string>& skip) {
      return send_to_device(v, at::Device(at::kCPU), false, skip);
    };
    EXPECT_TRUE(send(outer, {"in"}).toGenericDict().at("in").toGenericDict().is(inner));
  }

  auto structure = get_data_structure(data);
  auto info = structure.toGenericDict().at("a");
  EXPECT_TRUE(is_tensor_information(info));
  EXPECT_FALSE(is_tensor_information(c10::ivalue::Tuple::create({int64_t(1), int64_t(2)})));
  EXPECT_EQ(TensorInformation::from_ivalue(info).shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(TensorInformation::from_ivalue(info).dtype, at::kHalf);
  auto rebuilt = initialize_tensors(structure).toGenericDict();
  EXPECT_EQ(rebuilt.at("list").toList().get(0).toTensor().scalar_type(), at::kBFloat16);
  EXPECT_EQ(rebuilt.at("a").toTensor().sizes(), at::IntArrayRef({2, 3}));
  EXPECT_TRUE(is_torch_tensor(at::ones({1})));
  EXPECT_FALSE(is_torch_tensor(c10::IValue(1.0)));

  auto fp32 = convert_to_fp32(data).toGenericDict();
  EXPECT_EQ(fp32.at("a").toTensor().scalar_type(), at::kFloat);
  EXPECT_EQ(fp32.at("list").toList().get(0).toTensor().scalar_type(), at::kFloat);
  EXPECT_EQ(fp32.at("pair").toTupleRef().elements()[1].toStringRef(), "label");
  auto model = convert_outputs_to_fp32([](const at::Tensor& x) { return x.to(at::kHalf) * 2; });
  EXPECT_EQ(model(at::ones({2})).scalar_type(), at::kFloat);

  auto point = c10::TupleType::createNamed(c10::QualifiedName("P"), std::vector<std::string>{"x"},
                                           std::vector<c10::TypePtr>{c10::TensorType::get()});
  auto kept = honor_type(c10::ivalue::Tuple::createNamed({at::ones({1})}, point), {c10::IValue(at::zeros({1}))});
  EXPECT_EQ(kept.type()->cast<c10::TupleType>()->name()->name(), "P");
  EXPECT_THROW(honor_type(c10::IValue(1), {}), InvalidArgument);
}

}  // namespace
}  // namespace chorus::test
