// safetensors files: an 8-byte little-endian header length, a JSON header
// ({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the data.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "hfx/tensor.h"

namespace hfx {

/// Read every tensor of a safetensors file. Throws hfx::Error for a missing or malformed file
/// (short header, bad JSON, an unknown dtype, offsets outside the data or not matching the shape).
std::map<std::string, Tensor> read_safetensors(const std::filesystem::path& path);

/// Write `tensors` as a safetensors file (dtypes F32, F16, BF16, I64, I32, BOOL, ...).
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors);

/// Manifest dtype name <-> safetensors dtype code ("float32" <-> "F32"); throw hfx::Error when unknown.
std::string to_safetensors_dtype(const std::string& dtype);
std::string from_safetensors_dtype(const std::string& code);

}  // namespace hfx
