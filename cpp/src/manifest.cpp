#include "hfx/manifest.h"

#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "hfx/error.h"

namespace hfx {

namespace fs = std::filesystem;
using nlohmann::json;

const Part& Manifest::part_with_role(const std::string& role) const {
  for (const auto& [name, part] : parts)
    if (part.role == role) return part;
  throw Error(directory.string() + ": the folder has no part with role '" + role + "'");
}

namespace {

fs::path inside(const fs::path& root, const std::string& relative, const std::string& where) {
  const fs::path rel(relative);
  if (relative.empty() || rel.is_absolute()) throw Error(where + ": file '" + relative + "' is not a path relative to the folder");
  const fs::path base = fs::weakly_canonical(root);
  const fs::path full = fs::weakly_canonical(base / rel);
  auto b = base.begin(), f = full.begin();
  for (; b != base.end(); ++b, ++f)
    if (f == full.end() || *b != *f) throw Error(where + ": file '" + relative + "' is outside the folder");
  if (!fs::is_regular_file(full)) throw Error(where + ": file '" + relative + "' is missing");
  return full;
}

std::vector<TensorSpec> tensor_specs(const json& list, const std::string& where) {
  if (!list.is_array()) throw Error(where + ": 'inputs' is not a list");
  std::vector<TensorSpec> out;
  for (const auto& item : list) {
    TensorSpec spec;
    spec.name = item.at("name").get<std::string>();
    spec.dtype = item.at("dtype").get<std::string>();
    spec.shape = item.at("shape").get<std::vector<int64_t>>();
    out.push_back(std::move(spec));
  }
  return out;
}

/// The file hfx runs for a part entry (or a single export's manifest) and its format.
std::pair<fs::path, std::string> runnable_file(const fs::path& directory, const std::string& backend, const json& entry,
                                               const std::string& file_key, const std::string& where) {
  if (backend == "dynamo" && entry.contains("aoti_package"))
    return {inside(directory, entry.at("aoti_package").get<std::string>(), where), "aoti"};
  const std::string format = backend == "executorch" ? "executorch" : backend == "onnx" ? "onnx" : "exported_program";
  return {inside(directory, entry.at(file_key).get<std::string>(), where), format};
}

std::vector<std::string> output_names(const json& list, const std::string& where) {
  if (!list.is_array()) throw Error(where + ": 'outputs' is not a list");
  std::vector<std::string> out;
  for (const auto& item : list) out.push_back(item.is_string() ? item.get<std::string>() : item.at("name").get<std::string>());
  return out;
}

}  // namespace

namespace {

/// The JSON document in the file `path`. Throws hfx::Error when it is not JSON.
json read_json(const fs::path& path) {
  std::ifstream in(path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

/// The end-of-sequence ids of a generation folder's generation_config.json (an id or a list of ids); none when the
/// file or the field is absent or null. Throws hfx::Error when the file is not JSON or the field holds something else.
std::vector<int64_t> eos_token_ids(const fs::path& path) {
  std::vector<int64_t> ids;
  if (!fs::is_regular_file(path)) return ids;
  const json config = read_json(path);
  const json eos = config.is_object() && config.contains("eos_token_id") ? config["eos_token_id"] : json();
  for (const json& id : eos.is_array() ? eos : (eos.is_null() ? json::array() : json::array({eos}))) {
    if (!id.is_number_integer()) throw Error(path.string() + ": eos_token_id is not a token id or a list of them");
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

}  // namespace

Manifest read_manifest(const fs::path& directory) {
  if (!fs::is_directory(directory)) throw Error(directory.string() + ": not a folder");
  const fs::path path = directory / "export.json";
  if (!fs::is_regular_file(path)) throw Error(path.string() + ": export.json is missing (not a folder written by hf-exporters)");
  const json doc = read_json(path);
  const std::string where = path.string();
  Manifest m;
  m.directory = fs::weakly_canonical(directory);
  try {
    if (!doc.is_object()) throw Error(where + ": not a JSON object");
    if (!doc.contains("schema_version") || !doc["schema_version"].is_number_integer())
      throw Error(where + ": schema_version is missing");
    m.schema_version = doc["schema_version"].get<int>();
    if (m.schema_version != kSchemaVersion)
      throw Error(where + ": unknown schema_version " + std::to_string(m.schema_version) + " (this reader knows " + std::to_string(kSchemaVersion) + ")");
    m.backend = doc.at("backend").get<std::string>();
    m.model_class = doc.value("model_class", std::string());
    m.kind = doc.value("kind", std::string("export"));
    m.is_encoder_decoder = doc.value("is_encoder_decoder", false);
    if (doc.contains("vocab_size") && !doc["vocab_size"].is_null()) m.vocab_size = doc["vocab_size"].get<int64_t>();
    if (m.kind == "generation") {
      m.eos_token_ids = eos_token_ids(directory / "generation_config.json");
      const json& parts = doc.at("parts");
      if (!parts.is_object() || parts.empty()) throw Error(where + ": 'parts' is empty or not an object");
      for (const auto& [name, entry] : parts.items()) {
        const std::string part_where = where + ": part '" + name + "'";
        Part p;
        p.name = name;
        p.role = entry.at("role").get<std::string>();
        std::tie(p.file, p.format) = runnable_file(directory, m.backend, entry, "file", part_where);
        const bool named_method = entry.contains("method");
        p.method = entry.value("method", std::string("forward"));
        // the exporter's own constant methods all start with "hf_exporters_" (the mutated-input count, index bounds, ...)
        if (p.method.empty() || p.method.rfind("hf_exporters_", 0) == 0)
          throw Error(part_where + ": 'method' is not a method name: '" + p.method + "'");
        // parts sharing a file (one multi-method program) must each name a different method of it
        for (const auto& [other_name, other] : m.parts) {
          if (other.file != p.file) continue;
          if (!named_method || !other.named_method)
            throw Error(part_where + ": shares " + p.file.filename().string() + " with part '" + other_name + "', and not both name a 'method' of it");
          if (other.method == p.method)
            throw Error(part_where + ": shares " + p.file.filename().string() + " and method '" + p.method + "' with part '" + other_name + "'");
        }
        p.named_method = named_method;
        p.inputs = tensor_specs(entry.at("inputs"), part_where);
        p.outputs = output_names(entry.at("outputs"), part_where);
        if (entry.contains("cache") && entry["cache"].is_object()) {
          p.cache_kind = entry["cache"].value("kind", std::string());
          p.cache_layers = entry["cache"].value("layers", 0);
          p.max_cache_len = entry["cache"].value("max_cache_len", static_cast<int64_t>(-1));
          if (p.cache_kind == "program" && p.max_cache_len < 1)
            throw Error(part_where + ": a cache held in the program needs a 'max_cache_len' of at least 1");
        }
        m.parts.emplace(name, std::move(p));
      }
    } else {
      Part p;
      p.name = "model";
      p.role = "forward";
      std::tie(p.file, p.format) = runnable_file(directory, m.backend, doc, "artifact", where);
      p.inputs = tensor_specs(doc.at("inputs"), where);
      p.outputs = output_names(doc.at("outputs"), where);
      m.parts.emplace(p.name, std::move(p));
    }
  } catch (const json::exception& e) {
    throw Error(where + ": a field is missing or has the wrong type (" + std::string(e.what()) + ")");
  }
  return m;
}

}  // namespace hfx
