// A cubin is an ELF64 file. ptxas records a kernel's register count and frame size in the
// `.nv.info` section as attribute records, each naming the kernel by its index in `.symtab`;
// a kernel's static shared memory is the size of its `.nv.shared.<kernel>` section. Every
// offset read here is checked against the file's size first: a truncated or foreign file is
// an error, never a read past the end.
#include "codegen/cubin_info.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// .nv.info attribute records: a format byte, an attribute byte, then a 16-bit field that is
// the value (formats 1-3) or the size of the payload that follows (format 4, EIFMT_SVAL).
constexpr uint8_t kFormatSizedValue = 0x04;
constexpr uint8_t kAttrFrameSize = 0x11;  // EIATTR_FRAME_SIZE: {symbol, bytes}
constexpr uint8_t kAttrRegCount = 0x2f;   // EIATTR_REGCOUNT: {symbol, registers}

class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  // Little-endian T at `offset`, or nullopt past the end.
  template <typename T>
  std::optional<T> Get(uint64_t offset) const {
    if (offset > bytes_.size() || bytes_.size() - offset < sizeof(T)) return std::nullopt;
    T v;
    std::memcpy(&v, bytes_.data() + offset, sizeof(T));
    return v;
  }
  // The NUL-terminated string at `offset`, or nullopt when it runs past the end.
  std::optional<absl::string_view> String(uint64_t offset) const {
    if (offset >= bytes_.size()) return std::nullopt;
    const size_t end = bytes_.find('\0', offset);
    if (end == absl::string_view::npos) return std::nullopt;
    return bytes_.substr(offset, end - offset);
  }
  uint64_t size() const { return bytes_.size(); }

 private:
  absl::string_view bytes_;
};

constexpr uint32_t kNoBits = 8;  // SHT_NOBITS: no bytes in the file (.nv.shared.*)

struct Section {
  absl::string_view name;
  uint32_t type = 0, link = 0;
  uint64_t offset = 0, size = 0;
  bool InFile() const { return type != kNoBits; }
};

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("cubin: ", why));
}

absl::StatusOr<std::vector<Section>> ReadSections(const Reader& r) {
  const std::optional<uint32_t> magic = r.Get<uint32_t>(0);
  const std::optional<uint8_t> elf_class = r.Get<uint8_t>(4), data = r.Get<uint8_t>(5);
  if (!magic || *magic != 0x464c457fu) return Malformed("not an ELF file");
  if (!elf_class || !data || *elf_class != 2 || *data != 1) return Malformed("not a 64-bit little-endian ELF file");
  const std::optional<uint64_t> shoff = r.Get<uint64_t>(0x28);
  const std::optional<uint16_t> shentsize = r.Get<uint16_t>(0x3a), shnum = r.Get<uint16_t>(0x3c),
                                shstrndx = r.Get<uint16_t>(0x3e);
  if (!shoff || !shentsize || !shnum || !shstrndx) return Malformed("the ELF header is cut short");
  if (*shentsize < 64) return Malformed(absl::StrCat("section headers of ", *shentsize, " bytes (64 expected)"));
  if (*shstrndx >= *shnum) return Malformed("the section-name table is not a section");
  std::vector<Section> sections(*shnum);
  std::vector<uint32_t> name_offsets(*shnum);
  for (uint16_t i = 0; i < *shnum; ++i) {
    const uint64_t at = *shoff + static_cast<uint64_t>(i) * *shentsize;
    const std::optional<uint32_t> name = r.Get<uint32_t>(at), link = r.Get<uint32_t>(at + 0x28);
    const std::optional<uint64_t> offset = r.Get<uint64_t>(at + 0x18), size = r.Get<uint64_t>(at + 0x20);
    const std::optional<uint32_t> type = r.Get<uint32_t>(at + 4);
    if (!name || !link || !offset || !size || !type) return Malformed(absl::StrCat("section header ", i, " is past the end"));
    // SHT_NOBITS occupies no bytes of the file, whatever its size says.
    if (*type != kNoBits && (*offset > r.size() || r.size() - *offset < *size)) {
      return Malformed(absl::StrCat("section ", i, " runs past the end of the file"));
    }
    name_offsets[i] = *name;
    sections[i] = Section{.type = *type, .link = *link, .offset = *offset, .size = *size};
  }
  const Section& names = sections[*shstrndx];
  if (!names.InFile()) return Malformed("the section-name table has no bytes in the file");
  for (uint16_t i = 0; i < *shnum; ++i) {
    if (name_offsets[i] >= names.size) return Malformed(absl::StrCat("section ", i, "'s name is past its table"));
    const std::optional<absl::string_view> name = r.String(names.offset + name_offsets[i]);
    if (!name) return Malformed(absl::StrCat("section ", i, "'s name runs past the end"));
    sections[i].name = *name;
  }
  return sections;
}

const Section* Find(const std::vector<Section>& sections, absl::string_view name) {
  for (const Section& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<KernelResources> ReadKernelResources(absl::string_view cubin, absl::string_view kernel) {
  const Reader r(cubin);
  absl::StatusOr<std::vector<Section>> sections = ReadSections(r);
  if (!sections.ok()) return sections.status();

  // The kernel's index in the symbol table (64-bit entries of 24 bytes; the name first).
  const Section* symtab = Find(*sections, ".symtab");
  if (symtab == nullptr) return Malformed("no .symtab");
  if (symtab->link >= sections->size()) return Malformed(".symtab's string table is not a section");
  const Section& strtab = (*sections)[symtab->link];
  if (!symtab->InFile() || !strtab.InFile()) return Malformed(".symtab or its strings have no bytes in the file");
  std::optional<uint32_t> symbol;
  for (uint64_t i = 0; i < symtab->size / 24 && !symbol; ++i) {
    const std::optional<uint32_t> name = r.Get<uint32_t>(symtab->offset + i * 24);
    if (!name || *name >= strtab.size) continue;
    const std::optional<absl::string_view> s = r.String(strtab.offset + *name);
    if (s && *s == kernel) symbol = static_cast<uint32_t>(i);
  }
  if (!symbol) return absl::NotFoundError(absl::StrCat("cubin: no kernel named '", kernel, "'"));

  KernelResources resources;
  bool have_registers = false;
  const Section* info = Find(*sections, ".nv.info");
  if (info == nullptr) return Malformed("no .nv.info (not a CUDA cubin?)");
  if (!info->InFile()) return Malformed(".nv.info has no bytes in the file");
  for (uint64_t at = info->offset, end = info->offset + info->size; at + 4 <= end;) {
    const std::optional<uint8_t> format = r.Get<uint8_t>(at), attribute = r.Get<uint8_t>(at + 1);
    const std::optional<uint16_t> field = r.Get<uint16_t>(at + 2);
    if (!format || !attribute || !field) return Malformed(".nv.info runs past the end of the file");
    const uint64_t payload = at + 4;
    at = payload + (*format == kFormatSizedValue ? *field : 0);
    if (at > end) return Malformed(".nv.info: a record runs past its section");
    if (*format != kFormatSizedValue || *field < 8 || (*attribute != kAttrRegCount && *attribute != kAttrFrameSize)) {
      continue;
    }
    const std::optional<uint32_t> record_symbol = r.Get<uint32_t>(payload), value = r.Get<uint32_t>(payload + 4);
    if (!record_symbol || !value) return Malformed(".nv.info runs past the end of the file");
    if (*record_symbol != *symbol) continue;
    if (*attribute == kAttrRegCount) {
      resources.registers = static_cast<int>(*value);
      have_registers = true;
    } else {
      resources.frame_bytes = *value;
    }
  }
  if (!have_registers) return Malformed(absl::StrCat("no register count for '", kernel, "' in .nv.info"));
  if (const Section* shared = Find(*sections, absl::StrCat(".nv.shared.", kernel)); shared != nullptr) {
    resources.static_shared_bytes = static_cast<int64_t>(shared->size);
    // sm_90 cubins lay the shared memory the driver reserves for itself a block (1 KB,
    // cudaDevAttrReservedSharedMemoryPerBlock) out at the start of the kernel's section and
    // mark it with .nv.shared.reserved.0: left out, as ptxas's "bytes smem" leaves it out.
    constexpr int64_t kReservedSharedBytes = 1024;
    if (Find(*sections, ".nv.shared.reserved.0") != nullptr && resources.static_shared_bytes >= kReservedSharedBytes) {
      resources.static_shared_bytes -= kReservedSharedBytes;
    }
  }
  return resources;
}

}  // namespace kiln
