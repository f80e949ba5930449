#pragma once
// Result<T>: a value or an Error with a message a user can act on.
// Used at every module boundary (loaders, tokenizer, templates, model
// construction). Errors name the file and the item that was wrong.
#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace rill {

struct Error {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  // Requires ok().
  T& value() & {
    assert(ok());
    return std::get<T>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

  // Requires !ok().
  const Error& error() const {
    assert(!ok());
    return std::get<Error>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Result<void>.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace rill

// Propagates an error from an expression returning Result<T> or Status.
#define RILL_CONCAT_INNER(a, b) a##b
#define RILL_CONCAT(a, b) RILL_CONCAT_INNER(a, b)
#define RILL_TRY(expr)                                           \
  do {                                                           \
    auto rill_try_status_ = (expr);                              \
    if (!rill_try_status_.ok()) return rill_try_status_.error(); \
  } while (0)
// Assigns the value of a Result<T> expression to `lhs` or returns its error.
#define RILL_ASSIGN_OR_RETURN(lhs, expr)                                                       \
  auto RILL_CONCAT(rill_res_, __LINE__) = (expr);                                              \
  if (!RILL_CONCAT(rill_res_, __LINE__).ok()) return RILL_CONCAT(rill_res_, __LINE__).error(); \
  lhs = std::move(RILL_CONCAT(rill_res_, __LINE__)).value()
