#include "runtime/cuda/kernel_launch.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/cuda_status.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<KernelLibrary>> KernelLibrary::Load(const CompiledKernel& compiled) {
  std::unique_ptr<KernelLibrary> lib(new KernelLibrary());
  lib->name_ = compiled.name;
  const std::string what = absl::StrCat("kernel ", compiled.name, " (", compiled.cubin.size(), "-byte cubin)");
  KILN_RETURN_IF_CUDA_ERROR(
      cudaLibraryLoadData(&lib->library_, compiled.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), what);
  KILN_RETURN_IF_CUDA_ERROR(cudaLibraryGetKernel(&lib->kernel_, lib->library_, compiled.name.c_str()), what);
  return lib;
}

KernelLibrary::~KernelLibrary() {
  if (library_ != nullptr) cudaLibraryUnload(library_);
}

absl::StatusOr<KernelLaunch> PrepareLaunch(const KernelLibrary& library, const KernelSpec& spec, int device_ordinal) {
  KernelLaunch launch;
  launch.kernel = library.kernel();
  launch.grid = dim3(spec.grid[0], spec.grid[1], spec.grid[2]);
  launch.block = dim3(spec.block[0], spec.block[1], spec.block[2]);
  launch.shared_bytes = spec.shared_bytes;
  launch.name = spec.name;
  launch.programmatic = spec.waits_for_grid_dependency;
  constexpr uint32_t kDefaultSharedLimit = 48 * 1024;
  if (spec.shared_bytes > kDefaultSharedLimit) {
    KILN_RETURN_IF_CUDA_ERROR(
        cudaKernelSetAttributeForDevice(launch.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(spec.shared_bytes), device_ordinal),
        absl::StrCat("kernel ", spec.name, " (", spec.shared_bytes, " bytes of shared memory)"));
  }
  return launch;
}

absl::Status EnqueueLaunch(const KernelLaunch& launch, absl::Span<void* const> pointers, cudaStream_t stream,
                           absl::string_view context) {
  // cudaLaunchKernel takes the address of each argument.
  void* args[16];
  std::vector<void*> many;
  void** arg_addresses = args;
  if (pointers.size() > 16) {
    many.resize(pointers.size());
    arg_addresses = many.data();
  }
  for (size_t i = 0; i < pointers.size(); ++i) arg_addresses[i] = const_cast<void**>(&pointers[i]);
  if (launch.programmatic) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = launch.grid;
    config.blockDim = launch.block;
    config.dynamicSmemBytes = launch.shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const cudaError_t error = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(launch.kernel), arg_addresses);
    if (error != cudaSuccess) {
      return CudaStatus(error, "cudaLaunchKernelExC", absl::StrCat("kernel ", launch.name, " of ", context));
    }
    return absl::OkStatus();
  }
  const cudaError_t error = cudaLaunchKernel(reinterpret_cast<const void*>(launch.kernel), launch.grid, launch.block,
                                             arg_addresses, launch.shared_bytes, stream);
  if (error != cudaSuccess) {
    return CudaStatus(error, "cudaLaunchKernel", absl::StrCat("kernel ", launch.name, " of ", context));
  }
  return absl::OkStatus();
}

}  // namespace kiln
