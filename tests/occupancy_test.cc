// BlocksPerSm against the CUDA occupancy calculator's arithmetic, worked by hand for kernels
// kiln compiles (codegen/occupancy.h).
#include "codegen/occupancy.h"

#include "gtest/gtest.h"

namespace kiln {
namespace {

Target Arch(int compute_capability) {
  Target t;
  t.compute_capability = compute_capability;
  return t;
}

void Expect(const Occupancy& o, int blocks, const std::string& limit) {
  EXPECT_EQ(o.blocks_per_sm, blocks) << o.limit;
  EXPECT_EQ(o.limit, limit) << o.blocks_per_sm;
}

TEST(Occupancy, HopperGemvBlocksAreBoundByRegisters) {
  const Target h = Arch(90);
  // 4 warps of 71 registers: 72 a thread, 2304 a warp, 28 warps of 65536, 7 blocks.
  Expect(BlocksPerSm(h, 128, 71, 32), 7, "registers");
  // 59: 64 a thread, 2048 a warp, 32 warps, 8 blocks.
  Expect(BlocksPerSm(h, 128, 59, 32), 8, "registers");
  // 40: 1280 a warp, 51 warps, 12 blocks (threads would allow 16).
  Expect(BlocksPerSm(h, 128, 40, 16), 12, "registers");
}

TEST(Occupancy, SharedMemoryCountsTheReservedKilobyte) {
  const Target h = Arch(90);
  // Paged attention's 70208 dynamic + 16 static bytes, 1 KB reserved: 71,296 a block (128-byte
  // units), 3 of 228 KB; its 139 registers also allow 3 (144 a thread, 14 warps): registers
  // are checked first and keep the tie.
  Expect(BlocksPerSm(h, 128, 139, 70208 + 16), 3, "registers");
  Expect(BlocksPerSm(h, 128, 32, 70208 + 16), 3, "shared memory");
  // 1 KB reserved a block: 227 KB of data leaves room for one.
  Expect(BlocksPerSm(h, 128, 32, 227 * 1024), 1, "shared memory");
}

TEST(Occupancy, ThreadsAndBlockSlots) {
  Expect(BlocksPerSm(Arch(90), 1024, 32, 0), 2, "threads");
  Expect(BlocksPerSm(Arch(90), 64, 16, 0), 32, "blocks");
  Expect(BlocksPerSm(Arch(86), 256, 32, 0), 6, "threads");  // 1536 threads an SM
  Expect(BlocksPerSm(Arch(86), 32, 16, 0), 16, "blocks");   // 16 block slots
  Expect(BlocksPerSm(Arch(80), 128, 32, 100 * 1024), 1, "shared memory");  // 164 KB an SM
}

TEST(Occupancy, BlocksThatDoNotFitGiveZero) {
  EXPECT_EQ(BlocksPerSm(Arch(90), 1024, 255, 0).blocks_per_sm, 0);  // 8192 a warp x 32 warps
  EXPECT_EQ(BlocksPerSm(Arch(90), 2048, 32, 0).blocks_per_sm, 0);   // more than a block may have
  EXPECT_EQ(BlocksPerSm(Arch(90), 128, 32, 300 * 1024).blocks_per_sm, 0);
}

}  // namespace
}  // namespace kiln
