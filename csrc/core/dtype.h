// Element types the transport and algorithms understand. The c10d glue maps
// at::ScalarType onto these, so nothing below csrc/backend needs torch headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rsdp {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
  kComplex64,
  kComplex128,
};

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
    case DType::kComplex64: return 8;
    case DType::kComplex128: return 16;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kComplex64: return "complex64";
    case DType::kComplex128: return "complex128";
  }
  return "?";
}

inline bool dtype_is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

inline bool dtype_is_complex(DType t) {
  return t == DType::kComplex64 || t == DType::kComplex128;
}

inline bool dtype_is_integral(DType t) {  // bool counts as integral here
  return !dtype_is_floating(t) && !dtype_is_complex(t);
}

}  // namespace rsdp
