// A 32-bit counter in device memory that streams signal and wait on.
//
// This is how Work.wait() makes the caller's stream wait for an op without
// blocking the host, even before the backend's worker has queued the op:
// the caller's stream waits for the flag to reach the op's number
// (cuStreamWaitValue32, GEQ), and the backend's stream writes that number
// once the op's GPU work is done (cuStreamWriteValue32). An event could not
// do this: waiting on an event that is not recorded yet waits for nothing.
//
// The comparison is cyclic ((int32)(flag - value) >= 0), so the counter may
// wrap. The driver entry points are looked up at run time, so the extension
// needs no link against libcuda; where the driver lacks stream memory
// operations available() is false and callers fall back to events.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace rsdp {

class StreamFlag {
 public:
  explicit StreamFlag(int device);
  ~StreamFlag();
  StreamFlag(const StreamFlag&) = delete;
  StreamFlag& operator=(const StreamFlag&) = delete;

  bool available() const { return available_; }
  // A stream may be stuck waiting on this flag (an op timed out, the group
  // was aborted): the destructor then keeps the word instead of freeing it,
  // because cudaFree synchronises the device and would wait for that stream
  // forever. Four bytes go with the process instead of a hang at teardown.
  void abandon() { abandoned_.store(true); }
  // Queued on s: the flag becomes `value` when s gets here.
  void signal(cudaStream_t s, uint32_t value);
  // Queued on s: s stalls until the flag reaches `value`.
  void wait(cudaStream_t s, uint32_t value);

 private:
  int device_;
  uint32_t* word_ = nullptr;  // device memory
  bool available_ = false;
  std::atomic<bool> abandoned_{false};
};

}  // namespace rsdp
