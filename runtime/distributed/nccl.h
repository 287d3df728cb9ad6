// NCCL, loaded at run time: dlopen("libnccl.so.2") and the handful of entry points kiln's
// data-parallel training calls, with the types of the toolkit's nccl.h.
//
// Never linked: the `kiln` binary must start, and train on one GPU or the CPU, on machines
// without NCCL (tests/cli_binary_deps_test.cc checks the binary's NEEDED entries), and only
// `kiln train --gpus N` with N > 1 needs it. Load() says which library it tried and what
// dlopen said; every call's error names the NCCL call and the rank, so that of several
// processes' logs the failing one is plain: "ncclAllReduce (rank 1): unhandled cuda error".
//
// Usage:
//   ASSIGN_OR_RETURN(std::unique_ptr<NcclLibrary> nccl, NcclLibrary::Load());
//   ASSIGN_OR_RETURN(ncclComm_t comm, nccl->CommInitRank(world, id, rank));
//   RETURN_IF_ERROR(nccl->AllReduce(grads, grads, n, ncclFloat32, ncclSum, comm, stream, rank));
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/dynamic_library.h"

namespace kiln {

inline constexpr absl::string_view kNcclLibraryName = "libnccl.so.2";

class NcclLibrary {
 public:
  // dlopen(path) (the dynamic loader's search path applies to a bare name) and resolves
  // every entry point below; fails naming the library and dlerror(), or the missing symbol.
  static absl::StatusOr<std::unique_ptr<NcclLibrary>> Load(const std::string& path = std::string(kNcclLibraryName));
  ~NcclLibrary();
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

  const std::string& path() const { return library_->path(); }
  // ncclGetVersion's code, e.g. 22809, and as "2.28.9".
  absl::StatusOr<int> Version() const;
  absl::StatusOr<std::string> VersionString() const;

  // Rank 0 makes the id; every rank passes the same id to CommInitRank (a rendezvous by
  // file or TCP carries it between processes).
  absl::StatusOr<ncclUniqueId> GetUniqueId() const;
  absl::StatusOr<ncclComm_t> CommInitRank(int world_size, const ncclUniqueId& id, int rank) const;
  absl::Status CommDestroy(ncclComm_t comm, int rank) const;
  // The error a communicator hit asynchronously (a peer that died, a network failure);
  // polled so that a rank never waits forever on one that is gone.
  absl::Status CommGetAsyncError(ncclComm_t comm, int rank) const;

  absl::Status AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                         ncclComm_t comm, cudaStream_t stream, int rank) const;
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                             ncclComm_t comm, cudaStream_t stream, int rank) const;
  absl::Status AllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
                         cudaStream_t stream, int rank) const;
  absl::Status GroupStart(int rank) const;
  absl::Status GroupEnd(int rank) const;

  // OK for ncclSuccess; else an error "CALL (rank R): NCCL's message (ncclResult_t N)".
  // rank < 0: the call is not a rank's (ncclGetVersion, ncclGetUniqueId before a rank exists).
  absl::Status CallStatus(ncclResult_t result, absl::string_view call, int rank) const;

 private:
  struct Api;
  NcclLibrary(std::unique_ptr<DynamicLibrary> library, std::unique_ptr<Api> api);

  std::unique_ptr<DynamicLibrary> library_;
  std::unique_ptr<Api> api_;
};

}  // namespace kiln
