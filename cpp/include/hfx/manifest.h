// The export.json manifest of an artifact folder written by hf-exporters (a single export, or a
// generation folder written by GenerationArtifacts.save_pretrained).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace hfx {

/// Version of the manifest layout this reader understands (hf_exporters writes schema_version 1).
constexpr int kSchemaVersion = 1;

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;  // the example's shape
};

/// One graph of the folder. A single export is one part named "model" with role "forward".
struct Part {
  std::string name;
  std::string role;  // "forward", "prefill", "decode" or "encoder"
  std::filesystem::path file;  // absolute path, inside the folder (for dynamo: the AOTInductor package when there is one)
  std::string format;          // "executorch" (.pte), "aoti" (AOTInductor package), "exported_program" or "onnx"
  std::string method = "forward";  // ExecuTorch: the program's method (the parts of a multi-method .pte share its file)
  bool named_method = false;        // whether the manifest names the method (parts sharing a file must)
  std::vector<TensorSpec> inputs;
  std::vector<std::string> outputs;
  std::string cache_kind;  // "dynamic", "static", "program" (held in the program), "encoder_decoder" or "" (no cache)
  int cache_layers = 0;
  int64_t max_cache_len = -1;  // static and program caches: the positions the cache holds
};

struct Manifest {
  std::filesystem::path directory;
  int schema_version = 0;
  std::string backend;  // "executorch", "dynamo", "onnx"
  std::string kind;     // "generation" or "export"
  std::string model_class;
  bool is_encoder_decoder = false;
  int64_t vocab_size = -1;  // generation folders: token ids are in [0, vocab_size) (-1: not recorded)
  std::vector<int64_t> eos_token_ids;  // generation folders: generation_config.json's eos_token_id (one id or a list; none when absent)
  std::map<std::string, Part> parts;

  /// The part with `role`; throws hfx::Error when the folder has none.
  const Part& part_with_role(const std::string& role) const;
};

/// Read and check `directory`/export.json. Throws hfx::Error when the folder or manifest is missing
/// or not JSON, the schema version is unknown, a field is missing or of the wrong type, a part's
/// file is missing, or a file path leaves the folder.
Manifest read_manifest(const std::filesystem::path& directory);

}  // namespace hfx
