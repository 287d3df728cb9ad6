// NCCL on the GPU, as far as one GPU allows (issue 17's runner needs several): a one-rank
// communicator made from an id that went through the rendezvous file
// (runtime/distributed/rendezvous.h), its collectives on a device buffer (with one rank
// all-reduce, reduce-scatter and all-gather each hand the input back), and an all-reduce
// captured in a CUDA graph and replayed, which is how the runner will put the gradients'
// all-reduce inside the training step's graph. Skips without a GPU or without libnccl.so.2.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/distributed/rendezvous.h"

#ifdef KILN_WITH_CUDA
#include "runtime/distributed/nccl.h"
#include "tests/testing/gpu.h"
#endif

namespace kiln {
namespace {

#ifdef KILN_WITH_CUDA

class GpuNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    device_ = testing::TestDevice();
    absl::StatusOr<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load();
    if (!nccl.ok()) GTEST_SKIP() << "no NCCL on this machine: " << nccl.status();
    nccl_ = *std::move(nccl);
    ASSERT_TRUE(device_->MakeCurrent().ok());
    // Rank 0's id, handed over through the rendezvous file as a second rank would get it.
    absl::StatusOr<ncclUniqueId> id = nccl_->GetUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    const Rendezvous r{.path = (std::filesystem::path(::testing::TempDir()) / "kiln_nccl_rendezvous").string(),
                       .run_id = "gpu_nccl_test",
                       .world_size = 1};
    ASSERT_TRUE(PublishRendezvous(r, std::string(id->internal, sizeof(id->internal))).ok());
    absl::StatusOr<std::string> got = AwaitRendezvous(r, 0, sizeof(ncclUniqueId));
    ASSERT_TRUE(got.ok()) << got.status();
    ncclUniqueId handed{};
    std::copy(got->begin(), got->end(), handed.internal);
    absl::StatusOr<ncclComm_t> comm = nccl_->CommInitRank(1, handed, 0);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = *comm;
  }
  void TearDown() override {
    if (comm_ != nullptr) EXPECT_TRUE(nccl_->CommDestroy(comm_, 0).ok());
  }

  // n floats i * 0.5 on the device.
  DeviceMemory Ramp(int64_t n) {
    absl::StatusOr<void*> p = device_->Allocate(n * 4, "a test buffer");
    EXPECT_TRUE(p.ok()) << p.status();
    std::vector<float> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i);
    EXPECT_EQ(cudaMemcpy(*p, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return DeviceMemory(*p);
  }
  DeviceMemory Zeros(int64_t n) {
    absl::StatusOr<void*> p = device_->Allocate(n * 4, "a test buffer");
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(cudaMemset(*p, 0, n * 4), cudaSuccess);
    return DeviceMemory(*p);
  }
  // How many of `n` floats at p differ from i * 0.5.
  int64_t Mismatches(const void* p, int64_t n) {
    std::vector<float> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += host[i] != 0.5f * static_cast<float>(i);
    return bad;
  }

  CudaDevice* device_ = nullptr;
  std::unique_ptr<NcclLibrary> nccl_;
  ncclComm_t comm_ = nullptr;
};

TEST_F(GpuNcclTest, OneRanksCollectivesHandTheInputBack) {
  constexpr int64_t n = 1 << 20;
  DeviceMemory in = Ramp(n), out = Zeros(n), gathered = Zeros(n), scattered = Zeros(n);
  const cudaStream_t stream = device_->stream();
  ASSERT_TRUE(nccl_->AllReduce(in.get(), out.get(), n, ncclFloat32, ncclSum, comm_, stream, 0).ok());
  ASSERT_TRUE(nccl_->GroupStart(0).ok());
  ASSERT_TRUE(nccl_->AllGather(in.get(), gathered.get(), n, ncclFloat32, comm_, stream, 0).ok());
  ASSERT_TRUE(nccl_->ReduceScatter(in.get(), scattered.get(), n, ncclFloat32, ncclSum, comm_, stream, 0).ok());
  ASSERT_TRUE(nccl_->GroupEnd(0).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(nccl_->CommGetAsyncError(comm_, 0).ok());
  EXPECT_EQ(Mismatches(out.get(), n), 0);
  EXPECT_EQ(Mismatches(gathered.get(), n), 0);
  EXPECT_EQ(Mismatches(scattered.get(), n), 0);
}

TEST_F(GpuNcclTest, AnAllReduceCapturedInAGraphReplays) {
  constexpr int64_t n = 1 << 18;
  DeviceMemory in = Ramp(n), out = Zeros(n);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status enqueued = nccl_->AllReduce(in.get(), out.get(), n, ncclFloat32, ncclSum, comm_, stream, 0);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(enqueued.ok()) << enqueued;
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_GE(nodes, 1u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaMemsetAsync(out.get(), 0, n * 4, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(Mismatches(out.get(), n), 0) << "replay " << replay;
  }
  EXPECT_TRUE(nccl_->CommGetAsyncError(comm_, 0).ok());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(GpuNcclTest, ABadCallNamesTheCallAndTheRank) {
  // A data type NCCL does not have: refused before anything reaches the GPU.
  DeviceMemory buffer = Zeros(16);
  const absl::Status s = nccl_->AllReduce(buffer.get(), buffer.get(), 16, static_cast<ncclDataType_t>(255), ncclSum,
                                          comm_, device_->stream(), 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(std::string(s.message()).rfind("ncclAllReduce (rank 0): ", 0), 0u) << s;
}

#else

TEST(GpuNcclTest, NeedsTheCudaBuild) { GTEST_SKIP() << "built without the CUDA toolkit: no GPU, no NCCL"; }

#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln
