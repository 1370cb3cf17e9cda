// The client process of CudaEventsGpuTest (cuda_events_gpu_test.cc), a
// plain program the test starts, doing what a co-located worker does with
// Execute's CUDA IPC events. On device 0 it allocates the activations
// [B, S, C] fp32, the indices [B, R] int32 and the output [B, R, C] fp32
// (zeros), creates two interprocess events, and on its own non-blocking
// stream produces the inputs slowly (garbage first, a long chain of large
// device copies, then the real values), records `wait` after them, and
// writes "<acts> <idx> <out> <wait> <record> <uuid>\n" (64-byte handles in
// hex) to fd 3 without waiting for its stream. Then it reads one byte from
// fd 4 (the server replied), makes its stream wait on `record`, copies the
// output to the host, synchronizes, writes the output's bytes in hex and
// "\n" to fd 3, and exits 0 at EOF on fd 4. Values: acts[i] = i % 9973,
// idx[b, r] = (37 r + b) % S. Any CUDA failure: stderr and exit 1.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/gpu_uuid.h"

namespace {

constexpr int kReplyFd = 3;
constexpr int kGoFd = 4;
constexpr int64_t kB = 4, kS = 1024, kC = 256, kR = 512;  // as cuda_events_gpu_test.cc
constexpr size_t kScratchBytes = size_t{128} << 20;
constexpr int kSlowCopies = 100;

bool Ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "cuda_event_client: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

std::string Hex(const void* p, size_t n) {
  return absl::BytesToHexString(absl::string_view(static_cast<const char*>(p), n));
}

bool WriteAll(const std::string& s) {
  return write(kReplyFd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

}  // namespace

int main() {
  const size_t acts_bytes = kB * kS * kC * sizeof(float);
  const size_t idx_bytes = kB * kR * sizeof(int32_t);
  const size_t out_bytes = kB * kR * kC * sizeof(float);
  // void*: cuda_runtime_api.h has no typed (template) overloads.
  void* acts = nullptr;
  void* idx = nullptr;
  void* out = nullptr;
  void* scratch_memory = nullptr;
  if (!Ok(cudaSetDevice(0), "cudaSetDevice") || !Ok(cudaMalloc(&acts, acts_bytes), "cudaMalloc") ||
      !Ok(cudaMalloc(&idx, idx_bytes), "cudaMalloc") ||
      !Ok(cudaMalloc(&out, out_bytes), "cudaMalloc") ||
      !Ok(cudaMalloc(&scratch_memory, 2 * kScratchBytes), "cudaMalloc") ||
      !Ok(cudaMemset(out, 0, out_bytes), "cudaMemset")) {
    return 1;
  }
  char* const scratch = static_cast<char*>(scratch_memory);
  void* pinned[3] = {nullptr, nullptr, nullptr};
  if (!Ok(cudaMallocHost(&pinned[0], acts_bytes), "cudaMallocHost") ||
      !Ok(cudaMallocHost(&pinned[1], idx_bytes), "cudaMallocHost") ||
      !Ok(cudaMallocHost(&pinned[2], out_bytes), "cudaMallocHost")) {
    return 1;
  }
  auto* const host_acts = static_cast<float*>(pinned[0]);
  auto* const host_idx = static_cast<int32_t*>(pinned[1]);
  void* const host_out = pinned[2];
  for (int64_t i = 0; i < kB * kS * kC; ++i) host_acts[i] = static_cast<float>(i % 9973);
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t r = 0; r < kR; ++r) host_idx[b * kR + r] = static_cast<int32_t>((37 * r + b) % kS);
  }
  cudaEvent_t wait_event = nullptr;
  cudaEvent_t record_event = nullptr;
  cudaStream_t stream = nullptr;
  const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
  if (!Ok(cudaEventCreateWithFlags(&wait_event, flags), "cudaEventCreateWithFlags") ||
      !Ok(cudaEventCreateWithFlags(&record_event, flags), "cudaEventCreateWithFlags") ||
      !Ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return 1;
  }
  // The inputs, produced late on the client's stream: a server that did not
  // wait on `wait` would read the 0xFF garbage (NaN activations, indices out
  // of range) or a half-written copy.
  bool ok = Ok(cudaMemsetAsync(acts, 0xFF, acts_bytes, stream), "cudaMemsetAsync") &&
            Ok(cudaMemsetAsync(idx, 0xFF, idx_bytes, stream), "cudaMemsetAsync");
  for (int i = 0; ok && i < kSlowCopies; ++i) {
    ok = Ok(
        cudaMemcpyAsync(scratch + (i % 2) * kScratchBytes, scratch + ((i + 1) % 2) * kScratchBytes,
                        kScratchBytes, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync");
  }
  ok = ok &&
       Ok(cudaMemcpyAsync(acts, host_acts, acts_bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync") &&
       Ok(cudaMemcpyAsync(idx, host_idx, idx_bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync") &&
       Ok(cudaEventRecord(wait_event, stream), "cudaEventRecord");
  if (!ok) return 1;
  cudaIpcMemHandle_t mem[3];
  cudaIpcEventHandle_t events[2];
  cudaDeviceProp prop{};
  if (!Ok(cudaIpcGetMemHandle(&mem[0], acts), "cudaIpcGetMemHandle") ||
      !Ok(cudaIpcGetMemHandle(&mem[1], idx), "cudaIpcGetMemHandle") ||
      !Ok(cudaIpcGetMemHandle(&mem[2], out), "cudaIpcGetMemHandle") ||
      !Ok(cudaIpcGetEventHandle(&events[0], wait_event), "cudaIpcGetEventHandle") ||
      !Ok(cudaIpcGetEventHandle(&events[1], record_event), "cudaIpcGetEventHandle") ||
      !Ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) {
    return 1;
  }
  std::string line;
  for (const cudaIpcMemHandle_t& h : mem) absl::StrAppend(&line, Hex(h.reserved, sizeof(h)), " ");
  for (const cudaIpcEventHandle_t& h : events) {
    absl::StrAppend(&line, Hex(h.reserved, sizeof(h)), " ");
  }
  absl::StrAppend(&line, tokensel::FormatGpuUuid(prop.uuid.bytes), "\n");
  if (!WriteAll(line)) return 1;
  char c;
  if (read(kGoFd, &c, 1) != 1) return 1;
  // After the server's reply: our reads of the output wait on its event.
  if (!Ok(cudaStreamWaitEvent(stream, record_event, 0), "cudaStreamWaitEvent") ||
      !Ok(cudaMemcpyAsync(host_out, out, out_bytes, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync") ||
      !Ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) {
    return 1;
  }
  if (!WriteAll(Hex(host_out, out_bytes) + "\n")) return 1;
  close(kReplyFd);
  while (read(kGoFd, &c, 1) > 0) {
  }
  return 0;
}
