#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "runtime/mapped_file.h"
#include "runtime/memory_estimate.h"
#include "runtime/tensor_bytes.h"

namespace kiln {
namespace {

// F64 elements are copied with memcpy, which is only the file's byte order on a little-endian
// host (every machine kiln targets); runtime/tensor_bytes.h does the same for kiln's dtypes.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

using Json = nlohmann::ordered_json;  // keeps header order, so the encoder writes tensor order

constexpr int kHeaderLengthBytes = 8;
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the safetensors library's own limit
constexpr absl::string_view kMetadataKey = "__metadata__";

// A dtype as the file names it, and the kiln dtype its values are held in.
struct FileDType {
  absl::string_view name;
  DType dtype;
  int bytes;
};
constexpr FileDType kFileDTypes[] = {
    {"F32", DType::kF32, 4},         {"BF16", DType::kBF16, 2},       {"F16", DType::kF16, 2},
    {"F8_E4M3", DType::kF8E4M3, 1},  {"F8_E5M2", DType::kF8E5M2, 1},  {"I32", DType::kI32, 4},
    {"I64", DType::kI64, 8},         {"BOOL", DType::kPred, 1},
    // Hugging Face files sometimes hold f64 tensors. kiln has no f64, so they are read as
    // f32 (each value rounded once); the encoder never writes F64 (F32 comes first above).
    {"F64", DType::kF32, 8},
};

const FileDType& FileDTypeOf(DType dtype) {
  for (const FileDType& f : kFileDTypes) {
    if (f.dtype == dtype) return f;
  }
  KILN_CHECK(false && "every kiln dtype has a safetensors dtype");
  return kFileDTypes[0];
}

const FileDType* FindFileDType(absl::string_view name) {
  for (const FileDType& f : kFileDTypes) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

template <typename T>
T Load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

template <typename T>
void Store(T x, char* p) {
  std::memcpy(p, &x, sizeof(T));
}

// The values are then rounded to the dtype by HostTensor::FromValues, which is exact for
// everything but F64 (rounded to f32), E5M2 ±inf (saturated to ±57344, as numerics.h
// defines the format) and I64 beyond 2^53 (held in a double).
std::vector<double> DecodeValues(const char* data, int64_t count, const FileDType& f) {
  if (f.bytes == 8 && f.dtype == DType::kF32) {
    std::vector<double> v(count);
    std::memcpy(v.data(), data, count * sizeof(double));
    return v;
  }
  return DecodeElements(f.dtype, data, count);
}

// One tensor's header entry, checked against itself and the data buffer's size.
struct Entry {
  std::string name;
  const FileDType* dtype = nullptr;
  std::vector<int64_t> dims;
  int64_t num_elements = 1;
  uint64_t begin = 0, end = 0;
};

class HeaderReader {
 public:
  HeaderReader(absl::string_view source, uint64_t data_bytes) : source_(source), data_bytes_(data_bytes) {}

  absl::Status Error(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", why));
  }
  absl::Status TensorError(absl::string_view name, absl::string_view why) const {
    return Error(absl::StrCat("tensor '", name, "': ", why));
  }

  absl::StatusOr<std::map<std::string, std::string>> ReadMetadata(const Json& json) const {
    if (!json.is_object()) return Error(absl::StrCat("\"__metadata__\" must be an object, got ", json.type_name()));
    std::map<std::string, std::string> metadata;
    for (const auto& [key, value] : json.items()) {
      if (!value.is_string()) {
        return Error(absl::StrCat("\"__metadata__\" value for '", key, "' must be a string, got ", value.type_name()));
      }
      metadata[key] = value.get<std::string>();
    }
    return metadata;
  }

  absl::StatusOr<Entry> ReadEntry(const std::string& name, const Json& json) const {
    if (!json.is_object()) {
      return TensorError(name, absl::StrCat("expected an object with dtype, shape and data_offsets, got ",
                                            json.type_name()));
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!json.contains(field)) return TensorError(name, absl::StrCat("missing \"", field, "\""));
    }
    Entry e;
    e.name = name;
    const Json& dtype = json["dtype"];
    if (dtype.is_string()) e.dtype = FindFileDType(dtype.get<std::string>());
    if (e.dtype == nullptr) {
      std::vector<absl::string_view> known;
      for (const FileDType& f : kFileDTypes) known.push_back(f.name);
      return TensorError(name, absl::StrCat("unknown or unsupported dtype ", dtype.dump(), " (kiln reads ",
                                            absl::StrJoin(known, ", "), ")"));
    }

    const Json& shape = json["shape"];
    if (!shape.is_array()) return TensorError(name, absl::StrCat("\"shape\" must be a list, got ", shape.dump()));
    for (const Json& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
        return TensorError(name, absl::StrCat("\"shape\" ", shape.dump(), " must hold non-negative integers"));
      }
      e.dims.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(e.num_elements, e.dims.back(), &e.num_elements)) {
        return TensorError(name, absl::StrCat("shape ", shape.dump(), " overflows 64-bit element counts"));
      }
    }
    // The limit every reader shares (ir/types.h): a header may not ask for more.
    absl::Status within_limit = CheckTensorSizeLimit(e.dtype->dtype, e.dims);
    if (!within_limit.ok()) return TensorError(name, within_limit.message());
    int64_t num_bytes;
    if (__builtin_mul_overflow(e.num_elements, int64_t{e.dtype->bytes}, &num_bytes)) {
      return TensorError(name, absl::StrCat("shape ", shape.dump(), " overflows 64-bit byte counts"));
    }

    const Json& offsets = json["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return TensorError(name, absl::StrCat("\"data_offsets\" must be [begin, end] with non-negative integers, got ",
                                            offsets.dump()));
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end) {
      return TensorError(name, absl::StrCat("data_offsets ", offsets.dump(), " end before they begin"));
    }
    if (e.end > data_bytes_) {
      return TensorError(name, absl::StrCat("data_offsets ", offsets.dump(), " run past the end of the data (",
                                            data_bytes_, " bytes): truncated file?"));
    }
    if (e.end - e.begin != static_cast<uint64_t>(num_bytes)) {
      return TensorError(name, absl::StrCat("data_offsets ", offsets.dump(), " hold ", e.end - e.begin,
                                            " bytes, but shape ", shape.dump(), " of ", e.dtype->name, " needs ",
                                            num_bytes));
    }
    return e;
  }

  // Tensors must tile the data buffer exactly: no overlaps, no gaps, nothing after the end.
  absl::Status CheckLayout(const std::vector<Entry>& by_offset) const {
    uint64_t covered = 0;
    const Entry* previous = nullptr;
    for (const Entry& e : by_offset) {
      if (e.begin < covered) {
        return TensorError(e.name, absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] overlap tensor '",
                                                previous->name, "' [", previous->begin, ", ", previous->end, "]"));
      }
      if (e.begin > covered) {
        return Error(absl::StrCat("data bytes [", covered, ", ", e.begin, ") belong to no tensor (offsets do not ",
                                  "cover the data)"));
      }
      covered = e.end;
      previous = &e;
    }
    if (covered != data_bytes_) {
      return Error(absl::StrCat("data bytes [", covered, ", ", data_bytes_, ") belong to no tensor (offsets do not ",
                                "cover the data)"));
    }
    return absl::OkStatus();
  }

 private:
  absl::string_view source_;
  uint64_t data_bytes_;
};

// Parses the header, rejecting duplicate top-level keys (the JSON library would otherwise
// keep the last one silently).
absl::StatusOr<Json> ParseHeader(absl::string_view text, const HeaderReader& reader) {
  std::string duplicate;
  std::set<std::string> keys;
  auto note_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && duplicate.empty() &&
        !keys.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), note_duplicates);
  } catch (const Json::parse_error& e) {
    return reader.Error(absl::StrCat("header is not valid JSON (at byte ", e.byte, " of the header): ", e.what()));
  } catch (const Json::exception& e) {
    return reader.Error(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return reader.Error(absl::StrCat("header must be a JSON object, got ", header.type_name()));
  if (!duplicate.empty()) return reader.Error(absl::StrCat("name '", duplicate, "' appears twice in the header"));
  return header;
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(const Safetensors& st) {
  Json header = Json::object();
  if (!st.metadata.empty()) header[std::string(kMetadataKey)] = st.metadata;
  uint64_t data_bytes = 0;
  for (const NamedTensor& t : st.tensors) {
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError("safetensors: \"__metadata__\" is reserved and cannot name a tensor");
    }
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor name '", t.name, "' is used twice"));
    }
    const uint64_t end = data_bytes + t.tensor.num_elements() * FileDTypeOf(t.tensor.type().dtype).bytes;
    if (t.tensor.num_elements() != t.tensor.type().num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", t.name, "' holds ",
                                                     t.tensor.num_elements(), " values but its type ",
                                                     t.tensor.type().ToString(), " has ",
                                                     t.tensor.type().num_elements(), " elements"));
    }
    header[t.name] = {{"dtype", std::string(FileDTypeOf(t.tensor.type().dtype).name)},
                      {"shape", t.tensor.type().dims},
                      {"data_offsets", {data_bytes, end}}};
    data_bytes = end;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const Json::exception& e) {  // names and metadata that are not valid UTF-8
    return absl::InvalidArgumentError(absl::StrCat("safetensors: cannot encode the header: ", e.what()));
  }
  json.append((kHeaderLengthBytes - json.size() % kHeaderLengthBytes) % kHeaderLengthBytes, ' ');

  std::string out(kHeaderLengthBytes + json.size() + data_bytes, '\0');
  Store<uint64_t>(json.size(), out.data());
  std::memcpy(out.data() + kHeaderLengthBytes, json.data(), json.size());
  char* data = out.data() + kHeaderLengthBytes + json.size();
  for (const NamedTensor& t : st.tensors) {
    EncodeTensorBytes(t.tensor, data);
    data += t.tensor.num_elements() * FileDTypeOf(t.tensor.type().dtype).bytes;
  }
  return out;
}

absl::StatusOr<Safetensors> DecodeSafetensors(absl::string_view bytes, absl::string_view source_name) {
  if (bytes.size() < kHeaderLengthBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": file is ", bytes.size(),
                                                   " bytes, too short for the 8-byte header length: truncated file?"));
  }
  const uint64_t header_bytes = Load<uint64_t>(bytes.data());
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": header length ", header_bytes,
                                                   " is absurd (over the ", kMaxHeaderBytes, "-byte limit)"));
  }
  if (header_bytes > bytes.size() - kHeaderLengthBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": header length ", header_bytes,
                                                   " is larger than the file (", bytes.size(),
                                                   " bytes): truncated file?"));
  }
  const absl::string_view data = bytes.substr(kHeaderLengthBytes + header_bytes);
  const HeaderReader reader(source_name, data.size());
  ASSIGN_OR_RETURN(Json header, ParseHeader(bytes.substr(kHeaderLengthBytes, header_bytes), reader));

  Safetensors st;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      ASSIGN_OR_RETURN(st.metadata, reader.ReadMetadata(value));
    } else {
      ASSIGN_OR_RETURN(Entry e, reader.ReadEntry(key, value));
      entries.push_back(std::move(e));
    }
  }
  // File order is data order; the stable sort keeps header order among empty tensors.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  RETURN_IF_ERROR(reader.CheckLayout(entries));
  // Values are held as doubles (ir/host_tensor.h): a file of 2-byte weights grows
  // fourfold when decoded, so ask before decoding rather than die of bad_alloc halfway.
  double elements = 0;
  for (const Entry& e : entries) elements += static_cast<double>(e.num_elements);
  RETURN_IF_ERROR(CheckFitsHostMemory(HostTensorBytes(elements), absl::StrCat("decoding ", source_name),
                                      absl::StrCat(entries.size(), " tensors of ", elements, " values, as doubles")));

  for (const Entry& e : entries) {
    std::vector<double> values = DecodeValues(data.data() + e.begin, e.num_elements, *e.dtype);
    st.tensors.push_back({e.name, HostTensor::FromValues(TensorType{e.dtype->dtype, e.dims}, std::move(values))});
  }
  return st;
}

absl::Status WriteSafetensorsFile(const std::string& path, const Safetensors& st) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors(st);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat("cannot write ", path, ": ", bytes.status().message()));
  }
  return WriteFileAtomically(path, *bytes);
}

absl::StatusOr<Safetensors> ReadSafetensorsFile(const std::string& path) {
  // Mapped, not read: the decoded values are the only copy held in memory.
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  return DecodeSafetensors(file->bytes(), path);
}

}  // namespace kiln
