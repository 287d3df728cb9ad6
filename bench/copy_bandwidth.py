"""The card's copy bandwidth, as the decode floor counts it (bench/generate_h200.sh): a
device-to-device copy of 2 GiB, bytes read plus bytes written over the median time of 20
copies timed with CUDA events. DESIGN.md's 4.26 TB/s for the H200 is this figure; on another
card (an H100) the floor is taken from this run's own measurement. Prints TB/s."""
import statistics
import sys

import torch


def main() -> int:
    n = 1 << 30  # bf16 elements: 2 GiB a buffer
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    tbs = 2 * src.numel() * src.element_size() / statistics.median(times) / 1e12
    print(f"{tbs:.3f}")
    print(f"copy bandwidth: {tbs:.3f} TB/s ({torch.cuda.get_device_name()}, median of 20 copies of 2 GiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
