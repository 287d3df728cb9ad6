#include "ir/gemm_slots.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// A 0/1 flag attribute that may be left out (meaning 0).
absl::StatusOr<bool> OptionalFlag(const AttrMap& attrs, absl::string_view name) {
  if (!attrs.Has(name)) return false;
  ASSIGN_OR_RETURN(int64_t v, attrs.GetInt(name));
  if (v != 0 && v != 1) return absl::InvalidArgumentError(absl::StrCat("gemm ", name, "=", v, " must be 0 or 1"));
  return v == 1;
}

}  // namespace

absl::StatusOr<GemmSlots> GemmSlotsOf(const AttrMap& attrs) {
  GemmSlots s;
  ASSIGN_OR_RETURN(double beta, attrs.GetFloat("beta"));
  ASSIGN_OR_RETURN(std::string epilogue, attrs.GetSymbol("epilogue"));
  if (epilogue != "none" && epilogue != "bias") {
    return absl::InvalidArgumentError(
        absl::StrCat("gemm epilogue '", epilogue, "' is not one kiln lowers (none, bias)"));
  }
  ASSIGN_OR_RETURN(const bool scaled, OptionalFlag(attrs, "scaled"));
  ASSIGN_OR_RETURN(s.amax, OptionalFlag(attrs, "amax"));
  if (beta != 0) s.c = s.num_operands++;
  if (epilogue == "bias") s.bias = s.num_operands++;
  if (scaled) {
    s.a_scale = s.num_operands++;
    s.b_scale = s.num_operands++;
    s.d_scale = s.num_operands++;
  }
  return s;
}

}  // namespace kiln
