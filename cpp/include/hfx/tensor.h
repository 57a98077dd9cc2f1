// Host tensors: the values hfx-run reads from and writes to safetensors files and feeds to a runtime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hfx {

/// A dense, contiguous (row-major) tensor in host memory.
/// `dtype` uses the manifest's names: "float32", "float16", "bfloat16", "int64", "int32", "bool", ...
struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel() * element_size(dtype) bytes

  int64_t numel() const;
  /// The values as double (for comparisons); throws hfx::Error for an unsupported dtype.
  std::vector<double> as_double() const;
};

/// Bytes per element of a manifest dtype name; throws hfx::Error for an unknown one.
size_t element_size(const std::string& dtype);

/// A tensor of int64 values with the given shape.
Tensor make_int64(const std::vector<int64_t>& shape, const std::vector<int64_t>& values);

/// Largest absolute elementwise difference between two tensors of the same shape (inf when a value
/// is NaN/inf in one and not the other); throws hfx::Error when the shapes differ.
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace hfx
