// Python bindings of the hfx runner (module hf_exporters' runtime="cpp" path loads it from build/cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "hfx/error.h"
#include "hfx/manifest.h"
#include "hfx/runner.h"
#include "hfx/safetensors.h"

namespace py = pybind11;

PYBIND11_MODULE(_hfx, m) {
  m.doc() = "hfx: run artifact folders written by hf-exporters with the C++ runtimes";
  py::register_exception<hfx::Error>(m, "HfxError", PyExc_RuntimeError);
  py::class_<hfx::Tensor>(m, "Tensor")
      .def(py::init([](std::string dtype, std::vector<int64_t> shape, py::bytes data) {
        std::string raw = data;
        return hfx::Tensor{std::move(dtype), std::move(shape), std::vector<uint8_t>(raw.begin(), raw.end())};
      }))
      .def_readonly("dtype", &hfx::Tensor::dtype)
      .def_readonly("shape", &hfx::Tensor::shape)
      .def_property_readonly("data", [](const hfx::Tensor& t) { return py::bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size()); });
  py::class_<hfx::PartRunner>(m, "PartRunner")
      .def("run", &hfx::PartRunner::run, py::call_guard<py::gil_scoped_release>())
      .def("input_bounds", &hfx::PartRunner::input_bounds, "The largest shape each tensor input takes (empty when the runtime does not say).");
  m.def("load_executorch", &hfx::load_executorch, "Load a method of a .pte program (forward by default).", py::arg("path"),
        py::arg("method") = "forward");
  m.def("load_aoti", &hfx::load_aoti, "Load an AOTInductor package (*.aoti.pt2).");
  m.def(
      "generate_greedy",
      [](const std::string& directory, const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos) {
        const auto result = hfx::generate_greedy(hfx::read_manifest(directory), prompt, max_new_tokens, eos);
        return py::make_tuple(result.ids, result.new_tokens, result.seconds);
      },
      py::arg("directory"), py::arg("prompt"), py::arg("max_new_tokens"), py::arg("eos_token_id") = -1);
  m.def(
      "run_forward",
      [](const std::string& directory, const std::map<std::string, hfx::Tensor>& inputs, const std::string& part) {
        return hfx::run_forward(hfx::read_manifest(directory), inputs, part);
      },
      py::arg("directory"), py::arg("inputs"), py::arg("part") = "");
  m.def("schema_version", [] { return hfx::kSchemaVersion; });
}
