// ExecuTorch loading: corrupt programs are errors. With HFX_FIXTURES (a folder holding model.pte, set
// by tests/test_cpp.py), a truncated copy of a real program is refused too and the real one runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <unistd.h>
#include <fstream>

#include "hfx/error.h"
#include "hfx/runner.h"

namespace fs = std::filesystem;

static fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("hfx-et-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

static std::string load_error(const fs::path& path) {
  try {
    hfx::load_executorch(path);
  } catch (const hfx::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Executorch, GarbageAndMissingFilesAreErrors) {
  const auto garbage = scratch("garbage.pte");
  std::ofstream(garbage) << std::string(4096, 'z');
  EXPECT_NE(load_error(garbage).find("not a valid ExecuTorch program"), std::string::npos);
  const auto empty = scratch("empty.pte");
  std::ofstream{empty};
  EXPECT_NE(load_error(empty).find("not a valid ExecuTorch program"), std::string::npos);
  EXPECT_NE(load_error(scratch("missing.pte")).find("cannot open"), std::string::npos);
}

TEST(Executorch, TruncatedRealProgramIsAnError) {
  const char* fixtures = std::getenv("HFX_FIXTURES");
  if (fixtures == nullptr || !*fixtures) GTEST_SKIP() << "HFX_FIXTURES not set (tests/test_cpp.py sets it)";
  const fs::path real = fs::path(fixtures) / "model.pte";
  ASSERT_TRUE(fs::exists(real)) << real;
  EXPECT_NO_THROW(hfx::load_executorch(real));
  std::ifstream in(real, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t keep : {size_t{16}, bytes.size() / 2, bytes.size() - 1}) {
    const auto cut = scratch("cut-" + std::to_string(keep) + ".pte");
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, keep);
    const std::string error = load_error(cut);
    EXPECT_FALSE(error.empty()) << "a program cut to " << keep << " of " << bytes.size() << " bytes loaded";
  }
}
