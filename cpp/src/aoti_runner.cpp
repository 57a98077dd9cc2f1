// AOTInductor packages: loaded with libtorch's torch::inductor::AOTIModelPackageLoader (CPU).
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstring>

#include "hfx/error.h"
#include "hfx/runner.h"

namespace hfx {

namespace {

at::ScalarType torch_type(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "float64") return at::kDouble;
  if (dtype == "float16") return at::kHalf;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "int64") return at::kLong;
  if (dtype == "int32") return at::kInt;
  if (dtype == "int16") return at::kShort;
  if (dtype == "int8") return at::kChar;
  if (dtype == "uint8") return at::kByte;
  if (dtype == "bool") return at::kBool;
  throw Error("dtype '" + dtype + "' has no libtorch scalar type here");
}

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: throw Error(std::string("an output has a libtorch dtype hfx does not read (") + c10::toString(type) + ")");
  }
}

class AotiPart final : public PartRunner {
 public:
  explicit AotiPart(const std::filesystem::path& path) : path_(path.string()) {
    if (!std::filesystem::is_regular_file(path)) throw Error(path_ + ": cannot open the AOTInductor package");
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path_);
    } catch (const std::exception& e) {
      std::string what = e.what();
      throw Error(path_ + ": not a loadable AOTInductor package (" + what.substr(0, what.find('\n')) + ")");
    }
  }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) override {
    std::vector<at::Tensor> feed;
    for (const auto& t : inputs) {
      if (static_cast<int64_t>(t.data.size()) != t.numel() * static_cast<int64_t>(element_size(t.dtype)))
        throw Error(path_ + ": an input holds the wrong number of bytes for its shape");
      at::Tensor tensor = at::empty(t.shape, at::TensorOptions().dtype(torch_type(t.dtype)));
      if (!t.data.empty()) std::memcpy(tensor.data_ptr(), t.data.data(), t.data.size());
      feed.push_back(std::move(tensor));
    }
    std::vector<at::Tensor> outputs;
    try {
      outputs = loader_->run(feed);
    } catch (const std::exception& e) {
      std::string what = e.what();
      throw Error(path_ + ": run failed (" + what.substr(0, what.find('\n')) + ")");
    }
    std::vector<Tensor> out;
    for (auto& o : outputs) {
      at::Tensor c = o.contiguous().cpu();
      Tensor t;
      t.dtype = dtype_name(c.scalar_type());
      t.shape.assign(c.sizes().begin(), c.sizes().end());
      const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
      t.data.assign(bytes, bytes + c.nbytes());
      out.push_back(std::move(t));
    }
    return out;
  }

 private:
  std::string path_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
};

}  // namespace

std::unique_ptr<PartRunner> load_aoti(const std::filesystem::path& path) { return std::make_unique<AotiPart>(path); }

}  // namespace hfx
