#include "runtime/distributed/nccl.h"

#include "absl/strings/str_cat.h"

namespace kiln {

// The entry points, typed by the declarations in nccl.h (decltype keeps them in step with
// the toolkit's header).
struct NcclLibrary::Api {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
};

NcclLibrary::NcclLibrary(std::unique_ptr<DynamicLibrary> library, std::unique_ptr<Api> api)
    : library_(std::move(library)), api_(std::move(api)) {}

NcclLibrary::~NcclLibrary() = default;

absl::StatusOr<std::unique_ptr<NcclLibrary>> NcclLibrary::Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<DynamicLibrary>> library = DynamicLibrary::Open(path);
  if (!library.ok()) {
    return absl::NotFoundError(absl::StrCat("NCCL not found: ", library.status().message(),
                                            " (data-parallel training needs NCCL's libnccl.so.2 on the loader's path, "
                                            "e.g. the CUDA toolkit's lib directory in LD_LIBRARY_PATH)"));
  }
  auto api = std::make_unique<Api>();
  absl::Status resolved = absl::OkStatus();
  auto resolve = [&](const char* symbol, auto& fn) {
    if (resolved.ok()) resolved = (*library)->Resolve(symbol, fn);
  };
  resolve("ncclGetVersion", api->get_version);
  resolve("ncclGetUniqueId", api->get_unique_id);
  resolve("ncclCommInitRank", api->comm_init_rank);
  resolve("ncclCommDestroy", api->comm_destroy);
  resolve("ncclCommGetAsyncError", api->comm_get_async_error);
  resolve("ncclAllReduce", api->all_reduce);
  resolve("ncclReduceScatter", api->reduce_scatter);
  resolve("ncclAllGather", api->all_gather);
  resolve("ncclGroupStart", api->group_start);
  resolve("ncclGroupEnd", api->group_end);
  resolve("ncclGetErrorString", api->get_error_string);
  if (!resolved.ok()) {
    return absl::NotFoundError(absl::StrCat(resolved.message(), ": kiln needs NCCL >= 2.x with the standard API"));
  }
  return std::unique_ptr<NcclLibrary>(new NcclLibrary(*std::move(library), std::move(api)));
}

absl::Status NcclLibrary::CallStatus(ncclResult_t result, absl::string_view call, int rank) const {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* message = api_->get_error_string(result);
  const std::string who = rank < 0 ? std::string(call) : absl::StrCat(call, " (rank ", rank, ")");
  return absl::InternalError(absl::StrCat(who, ": ", message ? message : "unknown NCCL error", " (ncclResult_t ",
                                          static_cast<int>(result), ")"));
}

absl::StatusOr<int> NcclLibrary::Version() const {
  int version = 0;
  absl::Status s = CallStatus(api_->get_version(&version), "ncclGetVersion", -1);
  if (!s.ok()) return s;
  return version;
}

absl::StatusOr<std::string> NcclLibrary::VersionString() const {
  absl::StatusOr<int> code = Version();
  if (!code.ok()) return code.status();
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z before 2.9, X*10000 + Y*100 + Z from 2.9 on.
  const int v = *code;
  if (v >= 10000) return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  return absl::StrCat(v / 1000, ".", (v % 1000) / 100, ".", v % 100);
}

absl::StatusOr<ncclUniqueId> NcclLibrary::GetUniqueId() const {
  ncclUniqueId id{};
  absl::Status s = CallStatus(api_->get_unique_id(&id), "ncclGetUniqueId", -1);
  if (!s.ok()) return s;
  return id;
}

absl::StatusOr<ncclComm_t> NcclLibrary::CommInitRank(int world_size, const ncclUniqueId& id, int rank) const {
  ncclComm_t comm = nullptr;
  absl::Status s = CallStatus(api_->comm_init_rank(&comm, world_size, id, rank), "ncclCommInitRank", rank);
  if (!s.ok()) return s;
  return comm;
}

absl::Status NcclLibrary::CommDestroy(ncclComm_t comm, int rank) const {
  return CallStatus(api_->comm_destroy(comm), "ncclCommDestroy", rank);
}

absl::Status NcclLibrary::CommGetAsyncError(ncclComm_t comm, int rank) const {
  ncclResult_t async = ncclSuccess;
  absl::Status s = CallStatus(api_->comm_get_async_error(comm, &async), "ncclCommGetAsyncError", rank);
  if (!s.ok()) return s;
  return CallStatus(async, "an asynchronous NCCL operation", rank);
}

absl::Status NcclLibrary::AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                    ncclComm_t comm, cudaStream_t stream, int rank) const {
  return CallStatus(api_->all_reduce(send, recv, count, type, op, comm, stream), "ncclAllReduce", rank);
}

absl::Status NcclLibrary::ReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, int rank) const {
  return CallStatus(api_->reduce_scatter(send, recv, recv_count, type, op, comm, stream), "ncclReduceScatter", rank);
}

absl::Status NcclLibrary::AllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                                    ncclComm_t comm, cudaStream_t stream, int rank) const {
  return CallStatus(api_->all_gather(send, recv, send_count, type, comm, stream), "ncclAllGather", rank);
}

absl::Status NcclLibrary::GroupStart(int rank) const { return CallStatus(api_->group_start(), "ncclGroupStart", rank); }

absl::Status NcclLibrary::GroupEnd(int rank) const { return CallStatus(api_->group_end(), "ncclGroupEnd", rank); }

}  // namespace kiln
