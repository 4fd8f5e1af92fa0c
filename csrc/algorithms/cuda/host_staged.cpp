#include "algorithms/cuda/host_staged.h"

#include "algorithms/collectives.h"
#include "cuda/cuda_check.h"

namespace rsdp {
namespace {

// The CPU algorithms run with device dispatch off, and it comes back on
// however they end.
class HostScope {
 public:
  explicit HostScope(GroupComm& g) : g_(g) { g_.device_op = false; }
  ~HostScope() { g_.device_op = true; }

 private:
  GroupComm& g_;
};

char* data(std::vector<char>& v) { return v.empty() ? nullptr : v.data(); }

}  // namespace

void HostStaged::sync() { RSDP_CUDA_CHECK(cudaStreamSynchronize(s_)); }

HostStaged::Bytes HostStaged::down(const void* dev, size_t bytes) {
  Bytes h(bytes);
  if (bytes && dev)
    RSDP_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev, bytes, cudaMemcpyDeviceToHost, s_));
  return h;
}

void HostStaged::up(void* dev, const Bytes& host) {
  if (!host.empty() && dev)
    RSDP_CUDA_CHECK(cudaMemcpyAsync(dev, host.data(), host.size(), cudaMemcpyHostToDevice, s_));
}

void HostStaged::broadcast(void* buf, size_t count, DType dt, int root, Millis timeout) {
  Bytes h = down(buf, count * dtype_size(dt));
  sync();
  {
    HostScope scope(g_);
    coll::broadcast(g_, data(h), count, dt, root, timeout);
  }
  up(buf, h);
  sync();
}

void HostStaged::allreduce(void* buf, size_t count, DType dt, RedOp op, Millis timeout) {
  Bytes h = down(buf, count * dtype_size(dt));
  sync();
  {
    HostScope scope(g_);
    coll::allreduce(g_, data(h), count, dt, op, timeout);
  }
  up(buf, h);
  sync();
}

void HostStaged::reduce(void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout) {
  Bytes h = down(buf, count * dtype_size(dt));
  sync();
  {
    HostScope scope(g_);
    coll::reduce(g_, data(h), count, dt, op, root, timeout);
  }
  if (g_.rank() == root) up(buf, h);
  sync();
}

void HostStaged::allgather(const void* in, void* const* outs, const uint64_t* counts, DType dt,
                           Millis timeout) {
  const int n = g_.size();
  const size_t es = dtype_size(dt);
  Bytes hin = down(in, counts[g_.rank()] * es);
  sync();
  std::vector<Bytes> hout(n);
  std::vector<void*> ptrs(n);
  for (int p = 0; p < n; ++p) {
    hout[p].resize(counts[p] * es);
    ptrs[p] = data(hout[p]);
  }
  {
    HostScope scope(g_);
    coll::allgather(g_, data(hin), ptrs.data(), counts, dt, timeout);
  }
  for (int p = 0; p < n; ++p) up(outs[p], hout[p]);
  sync();
}

void HostStaged::gather(const void* in, void* const* outs, size_t count, DType dt, int root,
                        Millis timeout) {
  const int n = g_.size();
  const bool is_root = g_.rank() == root;
  Bytes hin = down(in, count * dtype_size(dt));
  sync();
  std::vector<Bytes> hout(is_root ? n : 0, Bytes(count * dtype_size(dt)));
  std::vector<void*> ptrs;
  for (auto& b : hout) ptrs.push_back(data(b));
  {
    HostScope scope(g_);
    coll::gather(g_, data(hin), ptrs.data(), count, dt, root, timeout);
  }
  for (size_t p = 0; p < hout.size(); ++p) up(outs[p], hout[p]);
  sync();
}

void HostStaged::scatter(const void* const* ins, void* out, size_t count, DType dt, int root,
                         Millis timeout) {
  const int n = g_.size();
  const size_t bytes = count * dtype_size(dt);
  std::vector<Bytes> hin;
  std::vector<const void*> ptrs;
  if (g_.rank() == root)
    for (int p = 0; p < n; ++p) hin.push_back(down(ins[p], bytes));
  for (auto& b : hin) ptrs.push_back(data(b));
  sync();
  Bytes hout(bytes);
  {
    HostScope scope(g_);
    coll::scatter(g_, ptrs.data(), data(hout), count, dt, root, timeout);
  }
  up(out, hout);
  sync();
}

void HostStaged::reduce_scatter(const void* const* ins, void* out, const uint64_t* counts,
                                DType dt, RedOp op, Millis timeout) {
  const int n = g_.size();
  const size_t es = dtype_size(dt);
  std::vector<Bytes> hin;
  std::vector<const void*> ptrs;
  for (int p = 0; p < n; ++p) hin.push_back(down(ins[p], counts[p] * es));
  for (auto& b : hin) ptrs.push_back(data(b));
  sync();
  Bytes hout(counts[g_.rank()] * es);
  {
    HostScope scope(g_);
    coll::reduce_scatter(g_, ptrs.data(), data(hout), counts, dt, op, timeout);
  }
  up(out, hout);
  sync();
}

void HostStaged::alltoall(const void* const* sends, const uint64_t* send_bytes,
                          void* const* recvs, const uint64_t* recv_bytes, DType dt,
                          Millis timeout) {
  const int n = g_.size();
  std::vector<Bytes> hin, hout(n);
  std::vector<const void*> sp;
  std::vector<void*> rp;
  for (int p = 0; p < n; ++p) hin.push_back(down(sends[p], send_bytes[p]));
  for (int p = 0; p < n; ++p) {
    hout[p].resize(recv_bytes[p]);
    sp.push_back(data(hin[p]));
    rp.push_back(data(hout[p]));
  }
  sync();
  {
    HostScope scope(g_);
    coll::alltoall(g_, sp.data(), send_bytes, rp.data(), recv_bytes, dt, timeout);
  }
  for (int p = 0; p < n; ++p) up(recvs[p], hout[p]);
  sync();
}

void HostStaged::ring_shift(const std::vector<int>& order, const void* send, void* recv,
                            size_t count, DType dt, int direction, const void* add,
                            Millis timeout) {
  const size_t bytes = count * dtype_size(dt);
  Bytes hs = down(send, bytes), ha = add ? down(add, bytes) : Bytes();
  sync();
  Bytes hr(bytes);
  {
    HostScope scope(g_);
    coll::ring_shift(g_, order, data(hs), data(hr), count, dt, direction,
                     add ? data(ha) : nullptr, timeout);
  }
  up(recv, hr);
  sync();
}

}  // namespace rsdp
