// Status helpers. Debian 12's Abseil (20220623) has Status and StatusOr but no
// status macros and no absl/log; these are named so they can later alias Abseil's.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status _kiln_status = (expr);             \
    if (!_kiln_status.ok()) return _kiln_status;      \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()) declares x from a StatusOr or returns its error. It
// expands to several statements: inside an if or a loop, use braces.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_statusor_, __LINE__), lhs, rexpr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

// CHECK is for internal invariants only, never for user input (DESIGN.md principle 4).
#define KILN_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__,   \
                   __LINE__, #cond);                                             \
      std::abort();                                                              \
    }                                                                            \
  } while (0)
