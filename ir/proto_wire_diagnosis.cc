#include "ir/proto_wire_diagnosis.h"

#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"

namespace kiln {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

constexpr int kMaxDepth = 32;  // ir.proto nests 5 deep; deeper is corrupt input

class WireWalker {
 public:
  explicit WireWalker(absl::string_view bytes) : bytes_(bytes) {}

  // Walks [begin, end) as a `type` message; `path` names it in the report.
  bool Walk(size_t begin, size_t end, const Descriptor* type, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Fail(begin, path, absl::StrCat("messages nest deeper than ", kMaxDepth));
    std::map<int, int> seen;  // repeated-field index by field number, for the path
    size_t pos = begin;
    while (pos < end) {
      const size_t tag_at = pos;
      uint64_t tag = 0;
      if (!ReadVarint(pos, end, tag)) return Fail(tag_at, path, "a field tag is cut off or longer than 10 bytes");
      const int number = static_cast<int>(tag >> 3);
      const int wire_type = static_cast<int>(tag & 7);
      if (number == 0) return Fail(tag_at, path, "field number 0 is not valid");
      const FieldDescriptor* field = type ? type->FindFieldByNumber(number) : nullptr;
      std::string field_path = path;
      if (field != nullptr) {
        absl::StrAppend(&field_path, ".", field->name());
        if (field->is_repeated()) absl::StrAppend(&field_path, "[", seen[number]++, "]");
      } else {
        absl::StrAppend(&field_path, ".<field ", number, ">");
      }
      switch (wire_type) {
        case 0: {
          uint64_t ignored;
          if (!ReadVarint(pos, end, ignored)) return Fail(tag_at, field_path, "a varint is cut off");
          break;
        }
        case 1:
        case 5: {
          const size_t width = wire_type == 1 ? 8 : 4;
          if (end - pos < width) {
            return Fail(tag_at, field_path, absl::StrCat("a ", width, "-byte value is cut off (", end - pos,
                                                         " bytes left)"));
          }
          pos += width;
          break;
        }
        case 2: {
          uint64_t length = 0;
          if (!ReadVarint(pos, end, length)) return Fail(tag_at, field_path, "a length is cut off");
          if (length > end - pos) {
            return Fail(tag_at, field_path,
                        absl::StrCat("length ", length, " runs past the end of its enclosing message (", end - pos,
                                     " bytes left): truncated?"));
          }
          const bool is_message = field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE;
          if (is_message && !Walk(pos, pos + length, field->message_type(), field_path, depth + 1)) return false;
          pos += length;
          break;
        }
        default:
          return Fail(tag_at, field_path, absl::StrCat("wire type ", wire_type, " is not one protobuf 3 writes"));
      }
      if (field != nullptr && !WireTypeFits(*field, wire_type)) {
        return Fail(tag_at, field_path,
                    absl::StrCat("wire type ", wire_type, " does not fit the field's type ", field->type_name()));
      }
    }
    return true;
  }

  const std::string& report() const { return report_; }

 private:
  static bool WireTypeFits(const FieldDescriptor& field, int wire_type) {
    if (wire_type == 2) return true;  // strings, messages, bytes and packed repeated scalars
    switch (field.type()) {
      case FieldDescriptor::TYPE_DOUBLE:
      case FieldDescriptor::TYPE_FIXED64:
      case FieldDescriptor::TYPE_SFIXED64: return wire_type == 1;
      case FieldDescriptor::TYPE_FLOAT:
      case FieldDescriptor::TYPE_FIXED32:
      case FieldDescriptor::TYPE_SFIXED32: return wire_type == 5;
      case FieldDescriptor::TYPE_STRING:
      case FieldDescriptor::TYPE_BYTES:
      case FieldDescriptor::TYPE_MESSAGE: return false;
      default: return wire_type == 0;
    }
  }

  bool ReadVarint(size_t& pos, size_t end, uint64_t& value) const {
    value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos >= end) return false;
      const uint8_t byte = static_cast<uint8_t>(bytes_[pos++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << (shift < 64 ? shift : 63);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  bool Fail(size_t at, const std::string& path, absl::string_view why) {
    report_ = absl::StrCat("at byte ", at, " (", path, "): ", why);
    return false;
  }

  absl::string_view bytes_;
  std::string report_;
};

void DropLogMessage(google::protobuf::LogLevel, const char*, int, const std::string&) {}

}  // namespace

std::string DiagnoseProtoWireFault(absl::string_view bytes, const Descriptor& type) {
  WireWalker walker(bytes);
  if (walker.Walk(0, bytes.size(), &type, type.name(), 0)) return "";
  return walker.report();
}

void SilenceProtobufLogging() { google::protobuf::SetLogHandler(&DropLogMessage); }

}  // namespace kiln
