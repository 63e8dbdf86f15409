// chorus_torch._C: the creator torch.distributed calls for backend "chorus", and the check that the
// libtorch this module was built against is the one loaded.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>

#include "backend.h"

namespace py = pybind11;

namespace {

// The real path of the libtorch_cpu mapped into this process (this module and torch's Python both
// link it), from /proc/self/maps.
std::string loaded_libtorch() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find('/');
    if (at == std::string::npos || line.find("libtorch_cpu.so") == std::string::npos) continue;
    char buf[PATH_MAX];
    const std::string path = line.substr(at);
    return realpath(path.c_str(), buf) ? std::string(buf) : path;
  }
  return "(no libtorch_cpu mapped)";
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "chorus as a torch.distributed backend";
  m.def(
      "_create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::duration<float> timeout) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
        py::gil_scoped_release no_gil;  // the rendezvous blocks
        static int groups = 0;
        return chorus::python::ProcessGroupChorus::create(store, rank, size, ms, "group " + std::to_string(groups++));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"));
  m.def("_loaded_libtorch", &loaded_libtorch);
  m.attr("_built_libtorch") = CHORUS_BUILT_LIBTORCH;
}
