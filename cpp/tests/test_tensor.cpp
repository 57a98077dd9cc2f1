#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>

#include "hfx/error.h"
#include "hfx/safetensors.h"
#include "hfx/tensor.h"

namespace fs = std::filesystem;

static fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("hfx-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

static hfx::Tensor floats(const std::vector<int64_t>& shape, const std::vector<float>& values) {
  hfx::Tensor t{"float32", shape, std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

TEST(Tensor, MaxAbsDiffIsElementwise) {
  EXPECT_DOUBLE_EQ(hfx::max_abs_diff(floats({2}, {1.f, 2.f}), floats({2}, {1.f, 2.5f})), 0.5);
  EXPECT_TRUE(std::isinf(hfx::max_abs_diff(floats({1}, {NAN}), floats({1}, {0.f}))));
  EXPECT_THROW(hfx::max_abs_diff(floats({2}, {1.f, 2.f}), floats({1, 2}, {1.f, 2.f})), hfx::Error);
}

TEST(Safetensors, RoundTrip) {
  const auto path = temp_path("round.safetensors");
  std::map<std::string, hfx::Tensor> tensors{{"ids", hfx::make_int64({1, 3}, {5, 6, 7})}, {"x", floats({2, 2}, {1, 2, 3, 4})}};
  hfx::write_safetensors(path, tensors);
  const auto back = hfx::read_safetensors(path);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at("ids").shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(back.at("ids").as_double(), (std::vector<double>{5, 6, 7}));
  EXPECT_EQ(back.at("x").dtype, "float32");
  EXPECT_EQ(back.at("x").as_double(), (std::vector<double>{1, 2, 3, 4}));
}

TEST(Safetensors, MalformedFilesAreErrors) {
  const auto short_file = temp_path("short.safetensors");
  std::ofstream(short_file) << "abc";
  EXPECT_THROW(hfx::read_safetensors(short_file), hfx::Error);
  EXPECT_THROW(hfx::read_safetensors(temp_path("missing.safetensors")), hfx::Error);

  auto write_header = [](const fs::path& path, const std::string& header, size_t data_bytes) {
    std::ofstream out(path, std::ios::binary);
    uint64_t len = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
    out << header << std::string(data_bytes, '\0');
  };
  const auto bad_json = temp_path("badjson.safetensors");
  write_header(bad_json, "{not json", 0);
  try {
    hfx::read_safetensors(bad_json);
    FAIL() << "no error";
  } catch (const hfx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the header is not JSON"), std::string::npos) << e.what();
  }
  const auto past_end = temp_path("pastend.safetensors");
  write_header(past_end, R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  try {
    hfx::read_safetensors(past_end);
    FAIL() << "no error";
  } catch (const hfx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x': data_offsets outside the data"), std::string::npos) << e.what();
  }
  const auto wrong_size = temp_path("wrongsize.safetensors");
  write_header(wrong_size, R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  EXPECT_THROW(hfx::read_safetensors(wrong_size), hfx::Error);
  const auto bad_dtype = temp_path("baddtype.safetensors");
  write_header(bad_dtype, R"({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}})", 1);
  EXPECT_THROW(hfx::read_safetensors(bad_dtype), hfx::Error);
}
