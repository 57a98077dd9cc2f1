#include "hfx/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "hfx/error.h"

namespace hfx {

size_t element_size(const std::string& dtype) {
  if (dtype == "float32" || dtype == "int32" || dtype == "uint32") return 4;
  if (dtype == "float64" || dtype == "int64" || dtype == "uint64") return 8;
  if (dtype == "float16" || dtype == "bfloat16" || dtype == "int16") return 2;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool") return 1;
  throw Error("unknown dtype '" + dtype + "'");
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

static float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

std::vector<double> Tensor::as_double() const {
  const int64_t n = numel();
  if (static_cast<int64_t>(data.size()) != n * static_cast<int64_t>(element_size(dtype))) {
    throw Error("tensor data holds " + std::to_string(data.size()) + " bytes for " + std::to_string(n) + " " + dtype + " elements");
  }
  std::vector<double> out(static_cast<size_t>(n));
  const uint8_t* p = data.data();
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == "float32") {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    } else if (dtype == "float64") {
      std::memcpy(&out[i], p + 8 * i, 8);
    } else if (dtype == "int64") {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      out[i] = static_cast<double>(v);
    } else if (dtype == "int32") {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    } else if (dtype == "bool" || dtype == "uint8") {
      out[i] = p[i];
    } else if (dtype == "int8") {
      out[i] = static_cast<int8_t>(p[i]);
    } else if (dtype == "float16") {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = half_to_float(h);
    } else if (dtype == "bfloat16") {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      out[i] = v;
    } else {
      throw Error("cannot compare tensors of dtype '" + dtype + "'");
    }
  }
  return out;
}

Tensor make_int64(const std::vector<int64_t>& shape, const std::vector<int64_t>& values) {
  Tensor t{"int64", shape, {}};
  if (t.numel() != static_cast<int64_t>(values.size())) throw Error("make_int64: shape and value count differ");
  t.data.resize(values.size() * 8);
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) {
    auto fmt = [](const std::vector<int64_t>& s) {
      std::string out = "[";
      for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
      return out + "]";
    };
    throw Error("shape " + fmt(a.shape) + " differs from expected shape " + fmt(b.shape));
  }
  const auto x = a.as_double();
  const auto y = b.as_double();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool fx = std::isfinite(x[i]), fy = std::isfinite(y[i]);
    if (fx != fy) return std::numeric_limits<double>::infinity();
    if (!fx) {
      if (!(std::isnan(x[i]) && std::isnan(y[i])) && x[i] != y[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(x[i] - y[i]));
  }
  return worst;
}

}  // namespace hfx
