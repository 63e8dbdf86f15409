// Note [Sharded parameters]
// A C++ module has no forward hooks, and its members (LinearImpl::weight, ...) hold the parameter
// tensors themselves, so chorus can neither wrap the forward nor swap the tensors. It changes what
// the tensors are instead: each parameter's TensorImpl gets a storage chorus owns, empty while the
// parameter is sharded, and the dispatch key PrivateUse3 (a key no backend of this build uses).
// Sizes, dtype, device (CPU), version counter and autograd identity stay, so the module, autograd's
// graph and AccumulateGrad see the parameter they always saw.
//
// Every operator whose arguments include such a tensor, or a view of one, now reaches
// on_sharded_op: the fallback for PrivateUse3, plus the same kernel registered for every aten
// operator that has a CompositeExplicitAutograd kernel (copy_, clone, the views... would otherwise
// run on PrivateUse3 without asking). It asks the owner (ShardedState::touch) for the full values:
// inside forward(fn) or a backward, or while GatheredParameters holds the parameter, the owner
// gathers the parameter's unit into the storage; anywhere else it throws InvalidArgument naming
// the parameter and what to do. Then the operator runs as a CPU operator on the full values. A few
// operators that only read sizes and options (empty_like, new_empty...; AccumulateGrad uses them)
// never gather.
//
// Operators run above the backend key (autograd, CompositeImplicitAutograd decompositions) are
// untouched, so gradients flow as on any CPU tensor. Outputs are ordinary CPU tensors: kernels
// allocate them from the parameter's options, whose device is the CPU.
#include "parallel/sharded/param_kernel.h"

#include <torch/library.h>

#include <mutex>

#include "groups/placement.h"

namespace chorus::detail {

namespace {

// Operators that read only sizes, strides and options of their tensor arguments.
bool reads_no_values(const c10::OperatorName& name) {
  static const char* const names[] = {"aten::empty_like",
                                      "aten::new_empty",
                                      "aten::new_empty_strided",
                                      "aten::new_zeros",
                                      "aten::new_ones",
                                      "aten::new_full",
                                      "aten::zeros_like",
                                      "aten::ones_like",
                                      "aten::full_like",
                                      "aten::_has_same_storage_numel",
                                      "aten::is_set_to",
                                      "aten::size",
                                      "aten::stride",
                                      "aten::is_nonzero_size"};
  for (const char* n : names)
    if (name.name == n) return true;
  return false;
}

void on_sharded_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!reads_no_values(op.operator_name())) {
    const size_t nargs = op.schema().arguments().size();
    auto touch = [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      if (Placement p = placement_of(t); p.owner) {
        p.owner->touch(p.index, op.operator_name().name);
        return;
      }
      if (t.key_set().has(c10::DispatchKey::PrivateUse3))
        throw InvalidArgument(concat("a parameter of a ShardedDataParallel that no longer exists reached ",
                                     op.operator_name().name,
                                     ": its values went with it; load full_state_dict() into a new module"));
    };
    for (size_t i = stack->size() - nargs; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isTensor()) {
        touch(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) touch(t);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef())
          if (e.isTensor()) touch(e.toTensor());
      }
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse3, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&on_sharded_op>()); }

// The operators that CompositeExplicitAutograd would run on PrivateUse3 without reaching the
// fallback get on_sharded_op for PrivateUse3 explicitly. Once, before the first sharded parameter.
void register_composite_overrides() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse3, __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasSchema()) continue;
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
        continue;
      if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse3)) continue;
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&on_sharded_op>());
    }
  });
}

}  // namespace

c10::intrusive_ptr<c10::StorageImpl> make_sharded(at::Tensor& p, const std::shared_ptr<ShardOwner>& owner,
                                                  size_t index) {
  register_composite_overrides();
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                       at::DataPtr(nullptr, at::Device(at::kCPU)),
                                                       /*allocator=*/nullptr, /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), p.dtype());
  impl->set_sizes_contiguous(p.sizes());
  p.unsafeGetTensorImpl()->shallow_copy_from(impl);
  register_shard(storage.get(), owner, index);
  return storage;
}

void fill_storage(c10::StorageImpl& storage, void* values, size_t nbytes) {
  storage.set_data_ptr_noswap(at::DataPtr(values, at::Device(at::kCPU)));
  storage.set_nbytes(values ? nbytes : 0);
}

}  // namespace chorus::detail
