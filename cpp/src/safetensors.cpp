#include "hfx/safetensors.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hfx/error.h"

namespace hfx {

namespace {
const std::pair<const char*, const char*> kDtypes[] = {
    {"float32", "F32"}, {"float64", "F64"}, {"float16", "F16"}, {"bfloat16", "BF16"}, {"int64", "I64"},
    {"int32", "I32"},   {"int16", "I16"},   {"int8", "I8"},     {"uint8", "U8"},      {"bool", "BOOL"},
};
}  // namespace

std::string to_safetensors_dtype(const std::string& dtype) {
  for (const auto& [ours, code] : kDtypes)
    if (dtype == ours) return code;
  throw Error("dtype '" + dtype + "' has no safetensors code");
}

std::string from_safetensors_dtype(const std::string& code) {
  for (const auto& [ours, theirs] : kDtypes)
    if (code == theirs) return ours;
  throw Error("unknown safetensors dtype '" + code + "'");
}

std::map<std::string, Tensor> read_safetensors(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open the safetensors file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) throw Error(path.string() + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > bytes.size() - 8) throw Error(path.string() + ": header length " + std::to_string(header_len) + " runs past the end of the file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + ": the header is not JSON (" + std::string(e.what()) + ")");
  }
  if (!header.is_object()) throw Error(path.string() + ": the header is not a JSON object");
  const size_t data_start = 8 + header_len;
  const size_t data_len = bytes.size() - data_start;
  std::map<std::string, Tensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      Tensor t;
      t.dtype = from_safetensors_dtype(entry.at("dtype").get<std::string>());
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_len)
        throw Error("data_offsets outside the data");
      const uint64_t expected = static_cast<uint64_t>(t.numel()) * element_size(t.dtype);
      if (offsets[1] - offsets[0] != expected)
        throw Error("data_offsets span " + std::to_string(offsets[1] - offsets[0]) + " bytes, the shape needs " + std::to_string(expected));
      t.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_start + offsets[0]),
                    bytes.begin() + static_cast<std::ptrdiff_t>(data_start + offsets[1]));
      out.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw Error(path.string() + ": tensor '" + name + "': malformed entry (" + std::string(e.what()) + ")");
    } catch (const Error& e) {
      throw Error(path.string() + ": tensor '" + name + "': " + e.what());
    }
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", to_safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8) text.push_back(' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(path.string() + ": cannot write");
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  if (!out) throw Error(path.string() + ": write failed");
}

}  // namespace hfx
