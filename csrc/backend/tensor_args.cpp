#include "backend/tensor_args.h"

#include <sstream>

#include "core/error.h"

namespace rsdp {

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << t.sizes();
  return os.str();
}

DType to_dtype(const OpContext& ctx, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kBool: return DType::kBool;
    case at::kComplexFloat: return DType::kComplex64;
    case at::kComplexDouble: return DType::kComplex128;
    default:
      RSDP_FAIL(ErrorKind::kValue, "rsdp rank ", ctx.rank, ": ", ctx.op, ": tensor ", describe(t),
                " has an unsupported dtype (supported: float32, float64, float16, bfloat16, "
                "int8, uint8, int32, int64, bool, complex64, complex128)");
  }
}

RedOp to_redop(const OpContext& ctx, const c10d::ReduceOp& op, DType dt, bool on_device) {
  RedOp r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r = RedOp::kSum; break;
    case c10d::ReduceOp::AVG: r = RedOp::kAvg; break;
    case c10d::ReduceOp::PRODUCT: r = RedOp::kProduct; break;
    case c10d::ReduceOp::MIN: r = RedOp::kMin; break;
    case c10d::ReduceOp::MAX: r = RedOp::kMax; break;
    case c10d::ReduceOp::BAND: r = RedOp::kBand; break;
    case c10d::ReduceOp::BOR: r = RedOp::kBor; break;
    case c10d::ReduceOp::BXOR: r = RedOp::kBxor; break;
    default:
      RSDP_FAIL(ErrorKind::kValue, "rsdp rank ", ctx.rank, ": ", ctx.op,
                ": reduce op PREMUL_SUM is not supported (use SUM or AVG)");
  }
  RSDP_CHECK(on_device ? redop_supported(dt, r) : host_redop_supported(dt, r), "rsdp rank ",
             ctx.rank, ": ", ctx.op, ": reduce op ", redop_name(r), " is not defined for ",
             dtype_name(dt), on_device && host_redop_supported(dt, r) ? " CUDA tensors" : " tensors");
  return r;
}

void check_tensor(const OpContext& ctx, const at::Tensor& t, const char* what) {
  RSDP_CHECK(t.defined(), "rsdp rank ", ctx.rank, ": ", ctx.op, ": ", what, " is undefined");
#ifdef RSDP_WITH_CUDA
  RSDP_CHECK(t.device().is_cpu() || t.device().is_cuda(), "rsdp rank ", ctx.rank, ": ", ctx.op,
             ": ", what, " ", describe(t), " is on ", t.device().str(),
             "; rsdp serves CPU and CUDA tensors");
#else
  RSDP_CHECK(t.device().is_cpu(), "rsdp rank ", ctx.rank, ": ", ctx.op, ": ", what, " ",
             describe(t), " is on ", t.device().str(),
             "; this build of torch_rsdp serves CPU tensors only (it was built without CUDA: "
             "rebuild it where torch has CUDA and nvcc is installed)");
#endif
  RSDP_CHECK(t.layout() == at::kStrided, "rsdp rank ", ctx.rank, ": ", ctx.op, ": ", what, " ",
             describe(t), " has layout ", t.layout(),
             "; rsdp takes dense (strided) tensors, and sparse COO tensors in all_reduce "
             "(SUM, AVG)");
  to_dtype(ctx, t);
}

void check_one(const OpContext& ctx, const std::vector<at::Tensor>& ts, const char* what) {
  RSDP_CHECK(ts.size() == 1, "rsdp rank ", ctx.rank, ": ", ctx.op, ": expects exactly one ",
             what, " tensor, got ", ts.size());
  check_tensor(ctx, ts[0], what);
}

void check_same_dtype(const OpContext& ctx, const at::Tensor& ref,
                      const std::vector<at::Tensor>& ts, const char* what) {
  for (size_t i = 0; i < ts.size(); ++i) {
    check_tensor(ctx, ts[i], what);
    RSDP_CHECK(ts[i].scalar_type() == ref.scalar_type(), "rsdp rank ", ctx.rank, ": ", ctx.op,
               ": ", what, "[", i, "] is ", describe(ts[i]), " but the input is ", describe(ref),
               "; dtypes must match");
    RSDP_CHECK(ts[i].device() == ref.device(), "rsdp rank ", ctx.rank, ": ", ctx.op, ": ", what,
               "[", i, "] ", describe(ts[i]), " is on ", ts[i].device().str(),
               " but the input is on ", ref.device().str(),
               "; all tensors of one op must be on one device");
  }
}

void check_rank(const OpContext& ctx, int64_t r, int size, const char* what) {
  RSDP_CHECK(r >= 0 && r < size, "rsdp rank ", ctx.rank, ": ", ctx.op, ": ", what, " ", r,
             " is out of range for a group of size ", size);
}

}  // namespace rsdp
