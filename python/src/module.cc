// chorus_torch._C: the creator torch.distributed calls for backend "chorus" (the package's
// __init__.py checks first that this Python's torch is the one this module was built against).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <string>
#include <vector>

#include "backend.h"
#include "work.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "chorus as a torch.distributed backend";
  // Note [Closing under the GIL]
  chorus::python::ProcessGroupChorus::run_teardown = [](const std::function<void()>& fn) {
    if (PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      fn();
    } else {
      fn();
    }
  };
  // torch's extended creator API: the group's name (torch's group_id, "0" for the default group)
  // and the global ranks of its members (empty for the default group) reach chorus's messages.
  m.def(
      "_create",
      [](const c10d::DistributedBackendOptions& opts, const py::object& /*pg_options*/) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(opts.timeout);
        std::vector<int> ranks(opts.global_ranks_in_group.begin(), opts.global_ranks_in_group.end());
        std::string name = "world";
        if (!ranks.empty()) {
          name = "group " + opts.group_id + " = world ranks [";
          for (size_t i = 0; i < ranks.size(); ++i) name += (i ? ", " : "") + std::to_string(ranks[i]);
          name += "]";
        }
        py::gil_scoped_release no_gil;  // the rendezvous blocks
        return chorus::python::ProcessGroupChorus::create(opts.store, opts.group_rank, opts.group_size, ms, name,
                                                          std::move(ranks));
      },
      py::arg("options"), py::arg("pg_options") = py::none());
  m.def(
      "_exiting",
      [](double patience_s) {
        py::gil_scoped_release no_gil;  // the threads being waited for may need it
        chorus::python::python_exiting(std::chrono::milliseconds(int64_t(patience_s * 1000)));
      },
      py::arg("patience_s") = 2.0);
  m.def("_engine", [](const c10::intrusive_ptr<c10d::Backend>& backend) {
    const auto* chorus_group = dynamic_cast<const chorus::python::ProcessGroupChorus*>(backend.get());
    if (!chorus_group) throw py::value_error("chorus_torch.engine: this group's backend is not chorus");
    return chorus_group->engine();
  });
}
