"""Deterministic test inputs and exact closed-form expectations for collective tests.

Every rank can compute every other rank's input (they depend only on rank, index, dtype and
world size), so the expected result of a reduction is computed exactly in a wide type
(float64 / complex128 / int64 / bool logic) and cast back.  The value ranges are chosen per
dtype so that every partial result of every summation order is exactly representable
(float16: integers up to 2048, bfloat16: up to 256, int8/uint8: no overflow).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

LARGE = 100_003  # > RSDP_SHM_BYTES (65536) for every dtype, odd, prime-ish
COUNTS = (0, 1, 7, LARGE)

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)
COMPLEX = (torch.complex64, torch.complex128)
BOOL = (torch.bool,)
ALL_DTYPES = FLOATS + INTS + BOOL + COMPLEX

R = dist.ReduceOp
OP_NAMES = {
    "SUM": R.SUM, "AVG": R.AVG, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX,
    "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR,
}


def dname(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def ops_for(dtype: torch.dtype) -> list[str]:
    if dtype in FLOATS:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
    if dtype in COMPLEX:
        return ["SUM", "AVG"]
    if dtype == torch.bool:
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    # integers: AVG as NCCL computes it (the wrapped sum, divided truncating toward zero)
    return ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def _kind_for(op: str) -> str:
    return {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "minmax", "MAX": "minmax",
            "BAND": "bits", "BOR": "bits", "BXOR": "bits"}[op]


@functools.lru_cache(maxsize=256)
def _make_cached(kind: str, rank: int, n: int, dtype: torch.dtype, world: int, salt: int) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.int64)
    key = i * world + rank + salt * 7919  # distinct for every (rank, index)
    if dtype == torch.bool:
        if kind == "prod":
            return (key % 5) != 0
        if kind == "bits":
            return ((i * 3 + rank) % 5) < 2
        return ((key * 2654435761) % 7) < 3

    if kind in ("move", "minmax"):
        if dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
            v = key - (n * world) // 2  # negative and positive, all distinct
        elif dtype in COMPLEX:
            v = key - (n * world) // 2
            im = (key * 31) % 100_003 - 50_000
            return torch.complex(v.to(torch.float64), im.to(torch.float64)).to(dtype)
        elif dtype == torch.float16:
            v = key % 4093 - 2046  # |v| <= 2047, exact
        elif dtype == torch.bfloat16:
            v = key % 509 - 254  # |v| <= 255, exact
        elif dtype == torch.int8:
            v = key % 251 - 125
        elif dtype == torch.uint8:
            v = key % 251
        else:
            raise AssertionError(dtype)
        return v.to(dtype)

    if kind == "avg" and not (dtype.is_floating_point or dtype in COMPLEX):
        kind = "sum"  # integers: sums that do not divide evenly, negative ones too (truncation)
    if kind == "sum":
        # |sum over <= 4 ranks| must be exact and in range
        bound = {torch.float16: 255, torch.bfloat16: 31, torch.int8: 31, torch.uint8: 63,
                 torch.complex64: 1_000_000, torch.complex128: 1_000_000,
                 torch.float32: 1_000_000, torch.float64: 1_000_000,
                 torch.int32: 1_000_000, torch.int64: 1_000_000}[dtype]
        if dtype == torch.uint8:
            v = key % (bound + 1)
        else:
            v = key % (2 * bound + 1) - bound
        if dtype in COMPLEX:
            im = (key * 13) % (2 * bound + 1) - bound
            return torch.complex(v.to(torch.float64), im.to(torch.float64)).to(dtype)
        return v.to(dtype)

    if kind == "avg":
        # inputs are world * a, so both pre- and post-division are exact, and the sum
        # world * sum(a) stays exactly representable.
        bound = {torch.float16: 60, torch.bfloat16: 7, torch.complex64: 100_000,
                 torch.complex128: 100_000, torch.float32: 100_000, torch.float64: 100_000}[dtype]
        a = key % (2 * bound + 1) - bound
        if dtype in COMPLEX:
            b = (key * 17) % (2 * bound + 1) - bound
            return torch.complex((world * a).to(torch.float64), (world * b).to(torch.float64)).to(dtype)
        return (world * a).to(dtype)

    if kind == "prod":
        if dtype == torch.uint8:
            v = torch.tensor([1, 2], dtype=torch.int64)[(key % 2)]
        else:
            v = torch.tensor([1, 2, -1], dtype=torch.int64)[(key % 3)]
        return v.to(dtype)

    if kind == "bits":
        if dtype == torch.uint8:
            v = (key * 37 + 11) % 256
        elif dtype == torch.int8:
            v = (key * 37 + 11) % 256 - 128
        elif dtype == torch.int32:
            v = (key * 2654435761 + 12345) % (2**32) - 2**31
        elif dtype == torch.int64:
            h1 = (key * 2654435761 + 7) % 2**32 - 2**31
            h2 = (key * 40503 + 99991) % 2**32
            v = h1 * 2**32 + h2  # full 64-bit patterns, no overflow
        else:
            raise AssertionError(f"bitwise op on {dtype}")
        return v.to(dtype)
    raise AssertionError(kind)


def make(kind: str, rank: int, n: int, dtype: torch.dtype, world: int, salt: int = 0) -> torch.Tensor:
    """A fresh tensor (safe to modify in place)."""
    return _make_cached(kind, rank, n, dtype, world, salt).clone()


def make_for_op(op: str, rank: int, n: int, dtype: torch.dtype, world: int, salt: int = 0):
    return make(_kind_for(op), rank, n, dtype, world, salt)


def garbage(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A recognisable filler for output buffers (never equal to any expected tensor)."""
    if dtype == torch.bool:
        return torch.ones(n, dtype=dtype)  # expected tensors always contain some False for n>2
    if dtype == torch.uint8:
        return torch.full((n,), 253, dtype=dtype)
    if dtype == torch.int8:
        return torch.full((n,), -127, dtype=dtype)
    # expected floating values are always integers, so -3.5 can never match one
    return torch.full((n,), 3.5 - 1j if dtype in COMPLEX else -3.5, dtype=dtype)


def reduce_ref(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Exact reduction of equally-shaped tensors with the semantics of c10d ReduceOp."""
    dtype = tensors[0].dtype
    world = len(tensors)
    if dtype == torch.bool:
        st = torch.stack(tensors)
        if op in ("SUM", "MAX", "BOR"):
            return st.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return st.all(0)
        if op == "BXOR":
            return (st.to(torch.int64).sum(0) % 2).to(torch.bool)
        raise AssertionError(op)
    if dtype in COMPLEX:
        wide = torch.stack([t.to(torch.complex128) for t in tensors])
    elif dtype.is_floating_point:
        wide = torch.stack([t.to(torch.float64) for t in tensors])
    else:
        wide = torch.stack([t.to(torch.int64) for t in tensors])
    if op == "SUM":
        out = wide.sum(0)
    elif op == "AVG" and wide.dtype == torch.int64:
        out = torch.div(wide.sum(0).to(dtype).to(torch.int64), world, rounding_mode="trunc")
    elif op == "AVG":
        out = wide.sum(0) / world
    elif op == "PRODUCT":
        out = wide.prod(0)
    elif op == "MIN":
        out = wide.min(0).values
    elif op == "MAX":
        out = wide.max(0).values
    elif op in ("BAND", "BOR", "BXOR"):
        f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        out = functools.reduce(f, list(wide))
    else:
        raise AssertionError(op)
    return out.to(dtype)


def check_equal(got: torch.Tensor, exp: torch.Tensor, what: str) -> None:
    """Exact comparison with a readable message; raises AssertionError."""
    if got.dtype != exp.dtype:
        raise AssertionError(f"{what}: dtype {got.dtype} != expected {exp.dtype}")
    if tuple(got.shape) != tuple(exp.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)} != expected {tuple(exp.shape)}")
    if torch.equal(got, exp):
        return
    g = got.reshape(-1)
    e = exp.reshape(-1)
    bad = (g != e).nonzero().reshape(-1)
    first = bad[:5].tolist()
    pairs = ", ".join(f"[{k}] got {g[k].item()!r} expected {e[k].item()!r}" for k in first)
    raise AssertionError(f"{what}: {bad.numel()} of {g.numel()} elements differ; first: {pairs}")
