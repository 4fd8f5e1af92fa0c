// The oneCCL side of `python -m benchmarks collectives --peers oneccl`: one rank of a oneCCL
// job.
//
// benchmarks/common.py compiles this file on first use (into build/oneccl/, against the
// oneccl-cpu / oneccl-cpu-devel wheels) and starts N copies of it:
//
//     oneccl_peer PLAN.txt KVS_FILE RESULT.json RANK
//
// PLAN.txt is plain text, written by benchmarks/common.py from the collectives suite's own
// point list:
//     world_size rounds warmup_seconds warmup_max_ops timeout_s
//     op dtype count bytes iters reps warmup          (one line per point, in sweep order)
// so the sizes, the "bytes" definition (full buffer: the gathered output for allgather, the
// unreduced input for reduce_scatter, the whole send buffer for alltoall) and the iteration
// counts are those of the torch side by construction.
//
// Bootstrap: no MPI launcher. Rank 0 creates oneCCL's main key-value store (a TCP service of
// its own), writes its address to KVS_FILE (write to a temporary name, then rename, so a reader
// never sees half of it); the other ranks poll that file until the deadline and attach. The
// transport between ranks (oneCCL's ATL) is chosen by the environment benchmarks/common.py sets:
// OFI (libfabric) by default, no MPI library needed.
//
// The ops, on page-aligned host buffers:
//     allreduce      ccl::allreduce(send, recv, count, SUM)       (out of place, as the MPI peer)
//     allgather      ccl::allgather(chunk, out, count / n)
//     reduce_scatter ccl::reduce_scatter(inp, chunk, count / n, SUM)
//     broadcast      ccl::broadcast(buf, count, root 0)           (in place)
//     alltoall       ccl::alltoall(inp, out, count / n)
// each followed by event.wait(): an op is complete when its call returns, as in torch and MPI.
//
// Timing, as collectives.sweep_backend: the result is checked once from exact
// small-integer inputs (collectives.Collective's values), the verdict all-reduced (MAX) so
// every rank agrees; warm-up ops, then more warm-up for about warmup_seconds (an op count from
// the slowest rank's warm-up time, at most warmup_max_ops); per timed iteration ccl::barrier,
// a steady clock around `reps` back-to-back ops, divided by reps; the per-iteration times are
// all-reduced with MAX (the slowest rank per iteration). The plan's rounds repeat the sweep;
// the parent pools the samples and takes the median. A point that raises is reported as an
// error and the larger sizes of its op x dtype are skipped, as on the torch side.
//
// Rank 0 writes RESULT.json: {"library_version", "rows"}, rows in the collectives suite's raw
// format (backend "oneccl"), rewritten after every op x dtype so a crash keeps what was
// measured.
//
// Built with -DONECCL_RUNTIME_SHIM this file is instead a tiny libccl.so.2: the CPU wheel's
// libccl.so.1 (2022.2.0) lists libccl.so.2 as needed and takes four Intel compiler runtime
// symbols from it (fast memcpy/memset and the CPU feature word its bundled libm dispatches
// on), but only the full `oneccl` wheel, with SYCL, ships that file. The shim answers
// "features known, baseline x86-64 only", so the libm picks its generic code paths.

#ifdef ONECCL_RUNTIME_SHIM

#include <cstddef>
#include <cstring>

extern "C" {
// Word 0 bit 0 = "features initialised"; no other bit: generic code paths only.
unsigned long long __intel_cpu_feature_indicator_x[2] = {1, 0};
void __intel_cpu_features_init_x() { __intel_cpu_feature_indicator_x[0] |= 1; }
void* _intel_fast_memcpy(void* d, const void* s, size_t n) { return std::memcpy(d, s, n); }
void* _intel_fast_memset(void* d, int c, size_t n) { return std::memset(d, c, n); }
}

#else

#include <oneapi/ccl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct PlanPoint {
  std::string op, dtype;
  size_t count = 0, bytes = 0;
  int iters = 0, reps = 0, warmup = 0;
};

struct Plan {
  int world_size = 0, rounds = 1, warmup_max_ops = 0, timeout_s = 300;
  double warmup_seconds = 0;
  std::vector<PlanPoint> points;
};

Plan read_plan(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the plan " + path);
  Plan plan;
  in >> plan.world_size >> plan.rounds >> plan.warmup_seconds >> plan.warmup_max_ops >>
      plan.timeout_s;
  PlanPoint p;
  while (in >> p.op >> p.dtype >> p.count >> p.bytes >> p.iters >> p.reps >> p.warmup)
    plan.points.push_back(p);
  if (!in.eof() || plan.world_size < 1) throw std::runtime_error("malformed plan " + path);
  return plan;
}

// ------------------------------------------------------------------ element types

// Values are small integers (at most a few hundred), exact in every type below; float16 and
// bfloat16 are built from the float's bits (truncation is exact for such integers).
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if ((u & 0x7fffffff) == 0) return sign;
  if (exp <= 0 || exp >= 31) throw std::runtime_error("float16 value out of range");
  return static_cast<uint16_t>(sign | (exp << 10) | (mant >> 13));
}

struct DType {
  ccl::datatype type;
  size_t size;
  void (*store)(void* dst, size_t i, long long v);  // dst[i] = v
};

template <typename T>
void store_as(void* dst, size_t i, long long v) {
  static_cast<T*>(dst)[i] = static_cast<T>(v);
}
void store_bf16(void* dst, size_t i, long long v) {
  static_cast<uint16_t*>(dst)[i] = float_to_bf16(static_cast<float>(v));
}
void store_half(void* dst, size_t i, long long v) {
  static_cast<uint16_t*>(dst)[i] = float_to_half(static_cast<float>(v));
}

const std::map<std::string, DType>& dtypes() {
  static const std::map<std::string, DType> table = {
      {"float32", {ccl::datatype::float32, 4, store_as<float>}},
      {"float64", {ccl::datatype::float64, 8, store_as<double>}},
      {"int32", {ccl::datatype::int32, 4, store_as<int32_t>}},
      {"int64", {ccl::datatype::int64, 8, store_as<int64_t>}},
      {"bfloat16", {ccl::datatype::bfloat16, 2, store_bf16}},
      {"float16", {ccl::datatype::float16, 2, store_half}},
  };
  return table;
}

// Page-aligned, as large tensors and numpy arrays are in practice.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) {
    size_t rounded = std::max<size_t>(4096, (n + 4095) / 4096 * 4096);
    ptr = std::aligned_alloc(4096, rounded);
    if (!ptr) throw std::bad_alloc();
    std::memset(ptr, 0, rounded);  // touched: no page faults inside the timed loop
  }
  ~Buffer() { std::free(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// ------------------------------------------------------------------ one point

class Point {
 public:
  Point(const ccl::communicator& comm, const PlanPoint& p)
      : comm_(comm), op_(p.op), dt_(dtypes().at(p.dtype)), count_(p.count),
        n_(comm.size()), rank_(comm.rank()), chunk_(p.count / comm.size()) {
    const size_t es = dt_.size;
    if (op_ == "allreduce" || op_ == "reduce_scatter") {
      inp_ = std::make_unique<Buffer>(count_ * es);
      fill(inp_->ptr, 0, count_, rank_ + 1);
      out_ = std::make_unique<Buffer>((op_ == "allreduce" ? count_ : chunk_) * es);
    } else if (op_ == "allgather") {
      inp_ = std::make_unique<Buffer>(chunk_ * es);
      fill(inp_->ptr, 0, chunk_, 8 * rank_ + 1);
      out_ = std::make_unique<Buffer>(count_ * es);
    } else if (op_ == "broadcast") {  // in place: the root's buffer is the source
      out_ = std::make_unique<Buffer>(count_ * es);
      if (rank_ == 0) fill(out_->ptr, 0, count_, 1);
    } else if (op_ == "alltoall") {
      inp_ = std::make_unique<Buffer>(count_ * es);
      fill(inp_->ptr, 0, count_, 8 * rank_ + 1);
      out_ = std::make_unique<Buffer>(count_ * es);
    } else {
      throw std::runtime_error("unknown op " + op_);
    }
  }

  void run() {
    const auto t = dt_.type;
    if (op_ == "allreduce")
      ccl::allreduce(inp_->ptr, out_->ptr, count_, t, ccl::reduction::sum, comm_).wait();
    else if (op_ == "allgather")
      ccl::allgather(inp_->ptr, out_->ptr, chunk_, t, comm_).wait();
    else if (op_ == "reduce_scatter")
      ccl::reduce_scatter(inp_->ptr, out_->ptr, chunk_, t, ccl::reduction::sum, comm_).wait();
    else if (op_ == "broadcast")
      ccl::broadcast(out_->ptr, count_, t, 0, comm_).wait();
    else
      ccl::alltoall(inp_->ptr, out_->ptr, chunk_, t, comm_).wait();
  }

  // One untimed run into a poisoned output; true when this rank's output is exact.
  bool check() {
    const size_t out_count = out_->bytes / dt_.size;
    if (op_ != "broadcast")
      for (size_t i = 0; i < out_count; ++i) dt_.store(out_->ptr, i, -1);
    else if (rank_ != 0)
      std::memset(out_->ptr, 0, out_->bytes);
    run();
    Buffer want(out_->bytes);
    expected(want.ptr);
    return std::memcmp(want.ptr, out_->ptr, out_->bytes) == 0;
  }

 private:
  // Into dst[first + j], j < len: (position % 7) + offset, position counted from `first`'s
  // origin (collectives.Collective).
  void fill(void* dst, size_t first, size_t len, long long offset) const {
    for (size_t j = 0; j < len; ++j)
      dt_.store(dst, first + j, static_cast<long long>(j % 7) + offset);
  }

  void expected(void* dst) const {
    const long long n = n_, tri = n * (n + 1) / 2;
    if (op_ == "allreduce") {
      for (size_t i = 0; i < count_; ++i)
        dt_.store(dst, i, n * static_cast<long long>(i % 7) + tri);
    } else if (op_ == "reduce_scatter") {
      for (size_t j = 0; j < chunk_; ++j)
        dt_.store(dst, j, n * static_cast<long long>((rank_ * chunk_ + j) % 7) + tri);
    } else if (op_ == "broadcast") {
      fill(dst, 0, count_, 1);
    } else if (op_ == "allgather") {
      for (int k = 0; k < n_; ++k) fill(dst, k * chunk_, chunk_, 8 * k + 1);
    } else {  // alltoall: block k comes from rank k, its positions rank*chunk + j there
      for (int k = 0; k < n_; ++k)
        for (size_t j = 0; j < chunk_; ++j)
          dt_.store(dst, k * chunk_ + j,
                    static_cast<long long>((rank_ * chunk_ + j) % 7) + 8 * k + 1);
    }
  }

  const ccl::communicator& comm_;
  std::string op_;
  DType dt_;
  size_t count_;
  int n_, rank_;
  size_t chunk_;
  std::unique_ptr<Buffer> inp_, out_;
};

// ------------------------------------------------------------------ output

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string first_line(const std::string& s, size_t limit = 200) {
  return s.substr(0, std::min(s.find('\n'), limit));
}

void all_max(std::vector<double>& v, const ccl::communicator& comm) {
  ccl::allreduce(v.data(), v.data(), v.size(), ccl::reduction::max, comm).wait();
}

struct Result {
  std::string path, version;
  std::vector<std::string> rows;
  void flush() const {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << "{\"library_version\": " << json_string(version) << ", \"rows\": [";
      for (size_t i = 0; i < rows.size(); ++i) out << (i ? ",\n" : "\n") << rows[i];
      out << "]}\n";
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    std::rename(tmp.c_str(), path.c_str());
  }
};

void sweep(const ccl::communicator& comm, const Plan& plan, int rnd, Result& result) {
  const int n = comm.size(), rank = comm.rank();
  size_t i = 0;
  while (i < plan.points.size()) {  // the collectives suite's order: op, dtype, then sizes
    const std::string op = plan.points[i].op, dtype = plan.points[i].dtype;
    const auto t_start = Clock::now();
    std::string failed;
    for (; i < plan.points.size() && plan.points[i].op == op && plan.points[i].dtype == dtype;
         ++i) {
      const PlanPoint& p = plan.points[i];
      std::ostringstream row;
      row << "{\"backend\": \"oneccl\", \"backend_name\": \"oneccl\", \"op\": "
          << json_string(op) << ", \"dtype\": " << json_string(dtype) << ", \"bytes\": "
          << p.bytes << ", \"count\": " << p.count << ", \"world_size\": " << n
          << ", \"round\": " << rnd;
      if (!failed.empty()) continue;  // skip the larger sizes of this op x dtype
      std::unique_ptr<Point> point;
      bool ok = false;
      std::string err;
      try {
        point = std::make_unique<Point>(comm, p);
        ok = point->check();
      } catch (const std::exception& exc) {
        err = first_line(exc.what());
      }
      std::vector<double> flags = {ok ? 0.0 : 1.0, err.empty() ? 0.0 : 1.0};
      all_max(flags, comm);
      if (flags[1] > 0) {
        failed = err.empty() ? "failed on another rank" : err;
        row << ", \"error\": " << json_string(failed) << ", \"correct\": false}";
        result.rows.push_back(row.str());
        continue;
      }
      row << ", \"correct\": " << (flags[0] == 0 ? "true" : "false");
      const auto t_warm = Clock::now();
      for (int k = 0; k < p.warmup; ++k) point->run();
      // More warm-up for about warmup_seconds, an op count every rank agrees on.
      std::vector<double> per_op = {seconds_since(t_warm) / std::max(1, p.warmup)};
      all_max(per_op, comm);
      const long more = p.warmup == 0 ? 0 : static_cast<long>(std::min<double>(
          plan.warmup_max_ops, plan.warmup_seconds / std::max(per_op[0], 1e-7)));
      for (long k = 0; k < more; ++k) point->run();
      std::vector<double> times(p.iters);
      for (int it = 0; it < p.iters; ++it) {
        ccl::barrier(comm);
        const auto t0 = Clock::now();
        for (int k = 0; k < p.reps; ++k) point->run();
        times[it] = seconds_since(t0) / p.reps;
      }
      all_max(times, comm);  // the slowest rank, per iteration
      row << ", \"iters\": " << p.iters << ", \"reps\": " << p.reps << ", \"warmup\": "
          << p.warmup << ", \"samples_us\": [";
      for (int it = 0; it < p.iters; ++it) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.3f", it ? ", " : "", times[it] * 1e6);
        row << buf;
      }
      row << "]}";
      result.rows.push_back(row.str());
    }
    if (rank == 0) {
      result.flush();
      char tag[32] = "";
      if (plan.rounds > 1) std::snprintf(tag, sizeof tag, " round %d/%d", rnd + 1, plan.rounds);
      std::printf("[oneccl%s] %-14s %-9s done in %6.1f s%s%s\n", tag, op.c_str(), dtype.c_str(),
                  seconds_since(t_start), failed.empty() ? "" : "  ERROR: ", failed.c_str());
      std::fflush(stdout);
    }
  }
}

// Rank 0 publishes the main KVS address through `path`; the others wait for it.
std::shared_ptr<ccl::kvs> bootstrap(int rank, const std::string& path, int timeout_s) {
  if (rank == 0) {
    auto kvs = ccl::create_main_kvs();
    const auto addr = kvs->get_address();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(addr.data(), addr.size());
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    std::rename(tmp.c_str(), path.c_str());
    return kvs;
  }
  ccl::kvs::address_type addr;
  const auto t0 = Clock::now();
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(addr.data(), addr.size()) &&
        in.gcount() == static_cast<std::streamsize>(addr.size()))
      return ccl::create_kvs(addr);
    if (seconds_since(t0) > timeout_s)
      throw std::runtime_error("rank 0 did not publish its KVS address in " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s PLAN KVS_FILE RESULT RANK\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[4]);
  try {
    const Plan plan = read_plan(argv[1]);
    ccl::init();
    auto kvs = bootstrap(rank, argv[2], plan.timeout_s);
    auto comm = ccl::create_communicator(plan.world_size, rank, kvs);
    Result result{argv[3], ccl::get_library_version().full, {}};
    if (rank == 0) result.flush();
    for (int rnd = 0; rnd < plan.rounds; ++rnd) sweep(comm, plan, rnd, result);
    ccl::barrier(comm);
  } catch (const std::exception& exc) {
    std::fprintf(stderr, "oneccl_peer rank %d: %s\n", rank, exc.what());
    return 1;
  }
  return 0;
}

#endif  // ONECCL_RUNTIME_SHIM
