// The handle of a ring shift run on the caller's thread (BackendRSDP::ring_step,
// [Note: ring steps on the caller's thread] in backend_ring.cpp): wait()
// finishes it; a failed step raises from every wait().
#pragma once

#include <ATen/ATen.h>

#include <exception>

#include "primitives/ring_shift.h"

namespace rsdp {

class BackendRSDP;

class RingStep {
 public:
  RingStep(c10::intrusive_ptr<BackendRSDP> backend, at::Tensor send, at::Tensor recv,
           at::Tensor add);
  void wait();
  bool completed() const { return done; }
  const at::Tensor& output() const { return recv_; }

  // Guarded by the backend's ring_mu_.
  RingShiftOp op;
  bool done = false;
  std::exception_ptr error;
  void release_tensors();

 private:
  c10::intrusive_ptr<BackendRSDP> backend_;
  at::Tensor send_, recv_, add_;
};

}  // namespace rsdp
