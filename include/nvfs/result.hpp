// Error values for the whole code base: an errno plus, where a person will read
// it, a one-line message. No exception crosses a public nvfs API.
#pragma once

#include <cerrno>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace nvfs {

// An errno (positive, never 0) and an optional one-line message without the
// trailing newline. The message is empty on hot paths so an Error never
// allocates there.
struct Error {
  int code = EIO;
  std::string message;

  Error() = default;
  explicit Error(int errno_value) : code(errno_value) {}
  Error(int errno_value, std::string msg) : code(errno_value), message(std::move(msg)) {}

  // The message, or strerror(code) when there is none.
  std::string Describe() const;
};

// Either a T or an Error. [[nodiscard]] so a failure cannot be dropped silently.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}       // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }
  Error&& take_error() { return std::get<1>(std::move(v_)); }
  int code() const { return ok() ? 0 : error().code; }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : err_(std::move(error)), failed_(true) {}  // NOLINT
  static Status Ok() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return err_; }
  Error&& take_error() { return std::move(err_); }
  int code() const { return failed_ ? err_.code : 0; }

 private:
  Error err_;
  bool failed_ = false;
};

// Formats a message printf-style into an Error.
Error MakeError(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace nvfs

// Propagates a failed Status/Result from the enclosing function.
#define NVFS_TRY(expr)                                   \
  do {                                                   \
    auto&& nvfs_try_r_ = (expr);                         \
    if (!nvfs_try_r_.ok()) return nvfs_try_r_.take_error(); \
  } while (0)
