// Python bindings of torch_rsdp._C: the backend factory that
// torch.distributed calls through Backend.register_backend, and the backend
// class itself (so Python sees BackendRSDP objects, not bare c10d backends).
// The top C++ layer: it joins the backend and RSDP's schedules, which do not
// include each other, and nothing includes it (tests/project/test_include_rules.py).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include "backend/backend_rsdp.h"
#include "backend/ring_step.h"
#include "rotation/linear_schedule.h"
#include "core/quantize.h"
#include "core/topology.h"
#include "core/traffic.h"
#include "transport/shm/adaptation.h"
#ifdef RSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "transport/nccl/nccl_comm.h"
#endif

namespace py = pybind11;

namespace {

// RSDP's schedules over the backend's ring hops: a ring step on the caller's thread, or the
// queued ring_shift where there is none (rsdp::RingHops, csrc/rotation/linear_schedule.h).
class BackendHops final : public rsdp::RingHops {
 public:
  explicit BackendHops(rsdp::BackendRSDP& b) : b_(b) {}
  std::function<void()> start(const at::Tensor& send, const at::Tensor& recv, int direction,
                              const std::optional<at::Tensor>& add) override {
    if (auto step = b_.ring_step(send, recv, direction, add)) return [step] { step->wait(); };
    auto work = b_.ring_shift(send, recv, direction, add, true, std::nullopt);
    return [work] { work->wait(); };
  }

 private:
  rsdp::BackendRSDP& b_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_rsdp native extension: the 'rsdp' c10d backend";
  // The base class must be registered with pybind before we derive from it.
  py::module::import("torch.distributed");

  py::class_<rsdp::RingStep, std::shared_ptr<rsdp::RingStep>>(
      m, "RingStep", "A ring shift in flight on the caller's thread (BackendRSDP.ring_step).")
      .def("wait", &rsdp::RingStep::wait, py::call_guard<py::gil_scoped_release>(),
           "Finishes the shift: waits for the neighbour's post, copies (or adds) it.")
      .def("is_completed", &rsdp::RingStep::completed);

  py::class_<rsdp::LinearGeometry>(m, "LinearGeometry",
                                   "A sharded Linear's shape and flat layout "
                                   "(csrc/rotation/linear_schedule.h).")
      .def(py::init([](bool split_out, bool transposed, int64_t fin, int64_t fout,
                       std::vector<int64_t> sizes, std::vector<int64_t> starts, int64_t w_off,
                       int64_t b_off) {
             rsdp::LinearGeometry g;
             g.split_out = split_out;
             g.transposed = transposed;
             g.fin = fin;
             g.fout = fout;
             g.sizes = std::move(sizes);
             g.starts = std::move(starts);
             g.w_off = w_off;
             g.b_off = b_off;
             return g;
           }),
           py::arg("split_out"), py::arg("transposed"), py::arg("fin"), py::arg("fout"),
           py::arg("sizes"), py::arg("starts"), py::arg("w_off"), py::arg("b_off"));
  m.def("_rsdp_linear_forward",
        [](rsdp::BackendRSDP& b, const rsdp::LinearGeometry& g, const at::Tensor& x2,
           const at::Tensor& src, const std::vector<at::Tensor>& bufs,
           const std::vector<int64_t>& origins, bool whole) {
          BackendHops ring(b);
          return rsdp::linear_forward(ring, g, x2, src, bufs, origins, whole);
        },
        py::arg("backend"), py::arg("geometry"),
        py::arg("x2"), py::arg("src"), py::arg("bufs"), py::arg("origins"),
        py::arg("whole") = false, py::call_guard<py::gil_scoped_release>());
  m.def("_rsdp_linear_backward",
        [](rsdp::BackendRSDP& b, const rsdp::LinearGeometry& g, const at::Tensor& x2,
           const at::Tensor& dy2, const std::optional<at::Tensor>& src,
           const std::optional<at::Tensor>& wbuf, const std::optional<at::Tensor>& acc,
           const std::optional<at::Tensor>& local, const std::vector<int64_t>& origins,
           bool need_x, bool whole) -> std::optional<at::Tensor> {
          BackendHops ring(b);
          at::Tensor gx = rsdp::linear_backward(ring, g, x2, dy2, src.value_or(at::Tensor()),
                                                wbuf.value_or(at::Tensor()),
                                                acc.value_or(at::Tensor()),
                                                local.value_or(at::Tensor()), origins, need_x,
                                                whole);
          if (!gx.defined()) return std::nullopt;
          return gx;
        },
        py::arg("backend"),
        py::arg("geometry"), py::arg("x2"), py::arg("dy2"), py::arg("src"), py::arg("wbuf"),
        py::arg("acc"), py::arg("local"), py::arg("origins"), py::arg("need_x"),
        py::arg("whole") = false, py::call_guard<py::gil_scoped_release>());

  py::class_<rsdp::BackendRSDP, c10d::Backend, c10::intrusive_ptr<rsdp::BackendRSDP>>(
      m, "BackendRSDP")
      .def_property_readonly("shm_bytes",
                             [](const rsdp::BackendRSDP& b) { return b.options().shm_bytes; })
      // As ProcessGroupGloo's: torch's ProcessGroup forwards these only to
      // gloo/NCCL/UCC and says "does not yet support sequence numbers" for a
      // plugin, so they are reached through pg._get_backend(device).
      .def("_get_sequence_number_for_group", &rsdp::BackendRSDP::getSequenceNumberForGroup,
           "How many collectives the group has issued.")
      .def("_set_sequence_number_for_group", &rsdp::BackendRSDP::setSequenceNumberForGroup,
           "Nothing to do: the count starts at 0 with the group (as gloo's).")
      .def_property_readonly("ring_order", &rsdp::BackendRSDP::ring_order,
                             "Group ranks in ring order (ranks of a node adjacent).")
      .def("ring_neighbours", &rsdp::BackendRSDP::ring_neighbours, py::arg("direction") = 1,
           "[rank sent to, rank received from] for a direction (+1 or -1).")
      .def("ring_shift", &rsdp::BackendRSDP::ring_shift, py::arg("send"), py::arg("recv"),
           py::arg("direction") = 1, py::arg("add") = std::nullopt, py::arg("async_op") = true,
           py::arg("residual") = std::nullopt, py::call_guard<py::gil_scoped_release>())
      .def(
          "ring_step",
          [](rsdp::BackendRSDP& b, const at::Tensor& send, const at::Tensor& recv, int direction,
             const std::optional<at::Tensor>& add) -> py::object {
            std::shared_ptr<rsdp::RingStep> step;
            {
              py::gil_scoped_release nogil;
              step = b.ring_step(send, recv, direction, add);
            }
            if (step) return py::cast(step);
            c10::intrusive_ptr<c10d::Work> work;
            {
              py::gil_scoped_release nogil;
              work = b.ring_shift(send, recv, direction, add, true, std::nullopt);
            }
            return py::cast(work);
          },
          py::arg("send"), py::arg("recv"), py::arg("direction") = 1,
          py::arg("add") = std::nullopt,
          "ring_shift(async_op=True) run on the calling thread where it can: staged and "
          "posted now, finished by wait() (a RingStep); else the queued op's Work.")
      .def(
          "topology",
          [](const rsdp::BackendRSDP& b) {
            const rsdp::Topology& t = b.topology();
            py::dict d;
            d["rank"] = t.rank;
            d["size"] = t.size();
            d["node"] = t.node();
            d["num_nodes"] = t.num_nodes();
            d["local_rank"] = t.local_rank();
            d["local_size"] = t.local_size();
            d["nodes"] = t.nodes;
            d["rail"] = t.rail(t.local_rank());
            d["leaders"] = t.leaders();
            d["uniform"] = t.uniform();
            d["describe"] = t.describe();
            const rsdp::Adaptation& adapt = b.adaptation();
            const rsdp::Handoff h = adapt.handoff();
            py::dict handoff;
            handoff["adapt"] = rsdp::adapt_mode_name(adapt.mode());
            handoff["mode"] = h.mode();
            handoff["step_ns"] = h.step_ns;
            handoff["pull_gbps"] = h.pull_gbps;
            handoff["cached_gbps"] = h.cached_gbps;
            handoff["streamed_gbps"] = h.streamed_gbps;
            handoff["probes"] = h.probes;
            handoff["stores"] = adapt.streaming() ? "streaming" : "cached";
            d["handoff"] = handoff;
            d["allreduce_oneshot_bytes"] = b.allreduce_oneshot_bytes();
            d["setup_store_requests"] = b.setup_store_requests();
            return d;
          },
          "Where the group's ranks live: nodes, local rank/size, rail, leaders.")
      .def(
          "comm_stats",
          [](const rsdp::BackendRSDP& b) {
            const rsdp::Traffic& t = b.traffic();
            py::dict d;
            d["intra_node_bytes"] = t.intra_bytes.load();
            d["inter_node_bytes"] = t.inter_bytes.load();
            d["intra_node_messages"] = t.intra_msgs.load();
            d["inter_node_messages"] = t.inter_msgs.load();
            d["one_copy_ops"] = t.one_copy_ops.load();
            d["ucx_endpoints"] = b.ucx_endpoints();
            return d;
          },
          "Payload bytes/messages this rank sent inside its node and to other nodes.")
      .def("reset_comm_stats", [](const rsdp::BackendRSDP& b) { b.traffic().reset(); })
      .def_property_readonly("pool_bytes_in_use", &rsdp::BackendRSDP::pool_bytes_in_use,
                             "Bytes of communication memory (allocate_tensor) now handed out.")
      .def("set_compression", &rsdp::BackendRSDP::set_compression, py::arg("all_gather"),
           py::arg("reduce_scatter"), py::arg("all_reduce"), py::arg("block"),
           py::arg("ring_shift") = "none", py::arg("ring_shift_reduce") = "none",
           py::call_guard<py::gil_scoped_release>(),
           "Which collectives cross nodes block-quantised (torch_rsdp.set_compression).")
      .def("compression", &rsdp::BackendRSDP::compression)
      .def("reduce_scatter_feedback", &rsdp::BackendRSDP::reduce_scatter_feedback,
           py::arg("output"), py::arg("input"), py::arg("residual"), py::arg("average") = false,
           py::arg("async_op") = true, py::call_guard<py::gil_scoped_release>(),
           "reduce_scatter_tensor with error feedback of its compressed stage.")
      // torch binds get_error on ProcessGroupNCCL only.
      .def("get_error", &rsdp::BackendRSDP::getError,
           "The first failure that broke the group (torch's ErrorType): SUCCESS, TIMEOUT, "
           "REMOTE_ERROR (a peer died) or COMM_ERROR.")
      .def("cuda_paths", &rsdp::BackendRSDP::cuda_paths,
           "Which transports serve the group's CUDA ops ('' before the first one).");

  // The quantisation kernels alone, for property tests and their speed
  // (torch_rsdp._compression.quantize_roundtrip / quant_speed).
  m.def(
      "_quantize_roundtrip",
      [](const at::Tensor& x, const std::string& bits, int64_t block) {
        TORCH_CHECK(x.is_cpu() && x.is_contiguous(), "a contiguous CPU tensor");
        const auto st = x.scalar_type();
        rsdp::DType dt = st == at::kFloat      ? rsdp::DType::kFloat32
                         : st == at::kBFloat16 ? rsdp::DType::kBFloat16
                         : st == at::kHalf     ? rsdp::DType::kFloat16
                                               : rsdp::DType::kFloat64;
        TORCH_CHECK(rsdp::compressible(dt), "float32, bfloat16 or float16, got ", st);
        TORCH_CHECK(bits == "int8" || bits == "int4", "bits: int8 or int4");
        TORCH_CHECK(block >= 2 && block % 2 == 0, "block: even, >= 2");
        const auto b = bits == "int8" ? rsdp::QuantBits::kInt8 : rsdp::QuantBits::kInt4;
        const size_t n = x.numel();
        std::vector<uint8_t> q(rsdp::quant_bytes(n, b, block));
        at::Tensor y = at::empty_like(x);
        {
          py::gil_scoped_release nogil;
          rsdp::quantize(x.data_ptr(), dt, n, b, block, q.data());
          rsdp::dequantize(q.data(), n, b, block, dt, y.data_ptr());
        }
        return py::make_tuple(y, q.size());
      },
      py::arg("x"), py::arg("bits"), py::arg("block"));
  m.def(
      "_quant_speed",
      [](int64_t n, const std::string& bits, int64_t block, int reps) {
        const auto b = bits == "int8" ? rsdp::QuantBits::kInt8 : rsdp::QuantBits::kInt4;
        std::vector<float> x(n), y(n);
        for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) - 500.f;
        std::vector<uint8_t> q(rsdp::quant_bytes(n, b, block));
        py::gil_scoped_release nogil;
        using C = std::chrono::steady_clock;
        double tq = 1e30, td = 1e30;
        for (int r = 0; r < reps; ++r) {
          auto t0 = C::now();
          rsdp::quantize(x.data(), rsdp::DType::kFloat32, n, b, block, q.data());
          auto t1 = C::now();
          rsdp::dequantize(q.data(), n, b, block, rsdp::DType::kFloat32, y.data());
          auto t2 = C::now();
          tq = std::min(tq, std::chrono::duration<double>(t1 - t0).count());
          td = std::min(td, std::chrono::duration<double>(t2 - t1).count());
        }
        py::gil_scoped_acquire gil;
        return py::make_tuple(tq, td);
      },
      py::arg("n"), py::arg("bits"), py::arg("block"), py::arg("reps") = 5);

  m.def(
      "build_info",
      [] {
        py::dict d;
#ifdef RSDP_WITH_CUDA
        int v = 0;
        cudaRuntimeGetVersion(&v);
        d["cuda"] = true;
        d["cuda_version"] = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
        d["nccl_version"] = rsdp::nccl_version();
#else
        d["cuda"] = false;
        d["cuda_version"] = py::none();
        d["nccl_version"] = py::none();
#endif
        return d;
      },
      "What this build of the extension contains: CUDA support and the versions it uses.");

  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, std::vector<int> global_ranks,
         std::string group_name) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<rsdp::BackendRSDP>(store, rank, size, timeout,
                                                      std::move(global_ranks),
                                                      std::move(group_name));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("global_ranks"), py::arg("group_name"), py::call_guard<py::gil_scoped_release>(),
      "Creates the rsdp backend of one process group (called by torch.distributed).");
}
