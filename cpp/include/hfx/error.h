#pragma once

#include <stdexcept>
#include <string>

namespace hfx {

/// Every failure hfx reports (bad folder, bad manifest, corrupt artifact, bad inputs, runtime error).
/// The message is one line meant for the user; hfx-run prints it after "error: " and exits with 1.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace hfx
