#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>
#include <fstream>

#include "hfx/error.h"
#include "hfx/manifest.h"

namespace fs = std::filesystem;

namespace {

fs::path folder(const std::string& name, const std::string& manifest, bool with_file = true) {
  const fs::path dir = fs::temp_directory_path() / ("hfx-manifest-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir / "decode");
  if (with_file) std::ofstream(dir / "decode" / "model.pte") << "x";
  std::ofstream(dir / "export.json") << manifest;
  return dir;
}

std::string generation_manifest(const std::string& version = "1", const std::string& file = "decode/model.pte") {
  return R"({"schema_version": )" + version + R"(, "kind": "generation", "backend": "executorch", "model_class": "LlamaForCausalLM",
    "parts": {"decode": {"role": "decode", "file": ")" + file + R"(",
      "inputs": [{"name": "input_ids", "shape": [2, 1], "dtype": "int64"}],
      "outputs": ["logits", "present_0"], "cache": {"kind": "dynamic", "layers": 1}}}})";
}

std::string error_of(const fs::path& dir) {
  try {
    hfx::read_manifest(dir);
  } catch (const hfx::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Manifest, ReadsAGenerationFolder) {
  const auto m = hfx::read_manifest(folder("ok", generation_manifest()));
  EXPECT_EQ(m.backend, "executorch");
  EXPECT_EQ(m.kind, "generation");
  const auto& decode = m.part_with_role("decode");
  EXPECT_EQ(decode.inputs.at(0).name, "input_ids");
  EXPECT_EQ(decode.outputs, (std::vector<std::string>{"logits", "present_0"}));
  EXPECT_EQ(decode.cache_kind, "dynamic");
  EXPECT_THROW(m.part_with_role("encoder"), hfx::Error);
}

TEST(Manifest, ReadsASingleExport) {
  const auto dir = folder("single", R"({"schema_version": 1, "backend": "executorch", "artifact": "decode/model.pte",
    "inputs": [{"name": "input_ids", "shape": [2, 8], "dtype": "int64"}], "outputs": [{"name": "last_hidden_state", "shape": [2, 8, 4], "dtype": "float32"}]})");
  const auto m = hfx::read_manifest(dir);
  EXPECT_EQ(m.part_with_role("forward").outputs, (std::vector<std::string>{"last_hidden_state"}));
}

TEST(Manifest, BadFoldersAreErrors) {
  EXPECT_NE(error_of(folder("version", generation_manifest("99"))).find("unknown schema_version 99"), std::string::npos);
  EXPECT_NE(error_of(folder("missing", generation_manifest(), false)).find("file 'decode/model.pte' is missing"), std::string::npos);
  EXPECT_NE(error_of(folder("escape", generation_manifest("1", "../../../etc/passwd"))).find("is outside the folder"), std::string::npos);
  EXPECT_NE(error_of(folder("absolute", generation_manifest("1", "/etc/passwd"))).find("is not a path relative to the folder"), std::string::npos);
  EXPECT_NE(error_of(folder("notjson", "{")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(folder("noversion", "{}")).find("schema_version is missing"), std::string::npos);
  EXPECT_NE(error_of(folder("field", R"({"schema_version": 1, "backend": "executorch", "kind": "generation", "parts": {"p": {"role": 3}}})"))
                .find("a field is missing or has the wrong type"),
            std::string::npos);
  EXPECT_NE(error_of(fs::temp_directory_path() / "hfx-no-such-folder").find("not a folder"), std::string::npos);
  const fs::path empty = fs::temp_directory_path() / ("hfx-empty-" + std::to_string(::getpid()));
  fs::create_directories(empty);
  EXPECT_NE(error_of(empty).find("export.json is missing"), std::string::npos);
}
