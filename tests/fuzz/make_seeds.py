"""Writes the seed corpora of the fuzz targets in tests/fuzz/corpus/<target>/ (the layouts are
in each fuzz_<target>.cpp): valid messages of several kinds, and the lies and truncations the
decoders must refuse. The seeds are committed; run this again only to change them:

    python tests/fuzz/make_seeds.py

It rewrites the seeds it names and leaves every other file (the regression-* inputs the fuzzers
found, store_records/) alone. The regression-* seeds here are inputs the parser before the fix
accepted (a broken invariant); the fuzzers' own finds are kept as they came."""

from __future__ import annotations

import struct
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"

# csrc/core/op_desc.h, dtype.h, reduce_op.h, quantize.h, transport/ucx/ucx_wire.h
KIND = dict(broadcast=0, allreduce=1, reduce=2, allgather=3, gather=4, scatter=5,
            reduce_scatter=6, alltoall=7, barrier=8, ring_shift=9)
DTYPE = dict(float32=0, float64=1, float16=2, bfloat16=3, int8=4, uint8=5, int32=6, int64=7)
SUM, AVG, MAX = 0, 1, 4
MAGIC, NOTICE_MAGIC, MSG_MAGIC = 0x58435552, 0x4E435552, 0x52534450
INLINE_MAX, HDR = 8192, 56


def header(kind="allreduce", dtype="float32", count=10, nbytes=40, step=0, seq=5, aux=0,
           root=-1, redop=SUM, direction=0, wire_bits=0, magic=MAGIC) -> bytes:
    """A WireHeader (56 bytes, little-endian, no padding)."""
    return struct.pack("<IIQQQQiBBBbB7x", magic, step, seq, count, aux, nbytes, root,
                       KIND[kind], DTYPE[dtype], redop, direction, wire_bits)


def ucx_header() -> dict:
    seeds = {}
    ops = {
        "allreduce": dict(kind="allreduce", count=10, nbytes=40),
        "broadcast-root2": dict(kind="broadcast", dtype="int64", count=3, nbytes=24, root=2),
        "allgather-sizes": dict(kind="allgather", dtype="int32", count=7, nbytes=12,
                                aux=0x9E3779B97F4A7C15),
        "ring-shift-back": dict(kind="ring_shift", dtype="bfloat16", count=5, nbytes=10,
                                redop=MAX, direction=-1, step=3),
        "reduce-scatter-avg": dict(kind="reduce_scatter", count=4, nbytes=16, redop=AVG),
        "barrier": dict(kind="barrier", dtype="uint8", count=0, nbytes=0),
        "allreduce-int8-wire": dict(kind="allreduce", count=64, nbytes=72, wire_bits=8),
        "allreduce-int4-wire": dict(kind="allreduce", count=63, nbytes=36, wire_bits=4),
    }
    for name, op in ops.items():
        h = header(**op)
        seeds[f"valid-{name}"] = h + h + bytes(range(op["nbytes"]))
    full = dict(count=2048, nbytes=INLINE_MAX)
    seeds["valid-inline-max"] = header(**full) + header(**full) + b"\x11" * INLINE_MAX
    big = dict(count=4000, nbytes=16000)
    seeds["valid-payload-follows"] = header(**big) + header(**big)
    want = header(count=10, nbytes=40)
    lies = {
        "other-op": dict(kind="broadcast", root=0),
        "other-dtype": dict(dtype="float64"),
        "other-count": dict(count=11),
        "other-step": dict(step=1),
        "other-seq": dict(seq=6),
        "other-root": dict(root=1),
        "other-redop": dict(redop=MAX),
        "other-direction": dict(direction=1),
        "other-wire-bits": dict(wire_bits=8),
        "bytes-larger": dict(nbytes=44),
        "bytes-huge": dict(nbytes=(1 << 64) - 1),
    }
    for name, diff in lies.items():
        op = dict(count=10, nbytes=40)
        op.update(diff)
        payload = bytes(min(op["nbytes"], 40)) if op["nbytes"] <= INLINE_MAX else b""
        seeds[f"lie-{name}"] = want + header(**op) + payload
    seeds["lie-wrong-magic"] = want + header(count=10, nbytes=40, magic=0x12345678) + bytes(40)
    seeds["lie-truncated-header"] = want + header(count=10, nbytes=40)[:30]
    seeds["lie-empty"] = want
    seeds["lie-payload-short"] = want + header(count=10, nbytes=40) + bytes(39)
    seeds["lie-payload-long"] = want + header(count=10, nbytes=40) + bytes(41)
    # A header that announces a payload of its own but carries bytes inline.
    seeds["lie-follows-with-inline"] = header(**big) + header(**big) + bytes(64)
    # A header that says inline where this rank expects a separate payload.
    seeds["lie-inline-for-large"] = header(**big) + header(count=4000, nbytes=100) + bytes(100)
    return seeds


def notice(origin=3, kind=3, text=b"allreduce(float32 SUM, 10 elements) as collective #5: "
           b"timeout", length=None, magic=NOTICE_MAGIC) -> bytes:
    n = len(text) if length is None else length
    return struct.pack("<IiII", magic, origin, kind, n) + text


def ucx_notice() -> dict:
    # group: 4 members, stride 1, offset 2 -> global ranks 2..5; the sender is group rank 1.
    group = bytes([3, 0, 2, 1])
    return {
        "valid": group + notice(),
        "valid-utf8": group + notice(text="rang 3: délai dépassé ✓".encode()),
        "valid-empty-text": group + notice(text=b""),
        "lie-len-past-end": group + notice(length=900),
        "lie-len-huge": group + notice(length=0xFFFFFFFF),
        "lie-kind": group + notice(kind=9),
        "lie-origin-not-member": group + notice(origin=77),
        "lie-origin-negative": group + notice(origin=-1),
        "lie-wrong-magic": group + notice(magic=0),
        "lie-short": group + notice()[:10],
        "lie-empty": group,
        "lie-control-chars": group + notice(text=b"a\x00b\x1b[31mred\x7f\r\n"),
        "lie-bad-utf8": group + notice(text=b"\xff\xfe\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xe2"),
        "lie-sender-unknown": bytes([3, 0, 2, 19]) + notice(magic=0),
        "full-text": group + notice(text=b"x" * 1000),
    }


def ring(cap, head, tail, seq, posted, to_send, data: dict) -> bytes:
    """A ring of `cap` bytes whose stream positions `data` maps to bytes."""
    buf = bytearray(cap)
    for pos, chunk in data.items():
        for i, b in enumerate(chunk):
            buf[(pos + i) % cap] = b
    return struct.pack("<HQQIHH", cap - 1, head, tail, seq, posted, to_send) + bytes(buf)


def msg(seq, nbytes, tag=7, magic=MSG_MAGIC) -> bytes:
    return struct.pack("<IIqQ", magic, seq, tag, nbytes)


def shm_ring() -> dict:
    t = 1000
    one = msg(5, 40) + bytes(range(40))
    two = one + msg(6, 40) + bytes(40)
    return {
        "valid-whole": ring(256, t + 64, t, 5, 40, 40, {t: one}),
        "valid-two": ring(256, t + 128, t, 5, 40, 40, {t: two}),
        "valid-wraps": ring(100, 190 + 64, 190, 5, 40, 40, {190: one}),
        "valid-partial": ring(256, t + 24 + 10, t, 5, 40, 100, {t: one[:34]}),
        "valid-header-only": ring(256, t + 24, t, 5, 0, 0, {t: msg(5, 0)}),
        "valid-empty": ring(256, t, t, 5, 40, 300, {}),
        "valid-full": ring(64, t + 64, t, 5, 40, 40, {t: one}),
        "lie-head-behind-tail": ring(256, t - 1, t, 5, 40, 40, {t: one}),
        "lie-head-past-ring": ring(256, t + 257, t, 5, 40, 40, {t: one}),
        "lie-wrong-magic": ring(256, t + 64, t, 5, 40, 40, {t: msg(5, 40, magic=0) + bytes(40)}),
        "lie-wrong-seq": ring(256, t + 64, t, 5, 40, 40, {t: msg(9, 40) + bytes(40)}),
        "lie-size": ring(256, t + 64, t, 5, 16, 40, {t: one}),
        "lie-size-huge": ring(256, t + 64, t, 5, 40, 40, {t: msg(5, 1 << 62)}),
        "lie-tiny-ring": ring(8, t + 8, t, 5, 40, 40, {t: one[:8]}),
    }


def quant_bytes(count, bits, block):
    return -(-count // block) * 4 + (count if bits == 8 else (count + 1) // 2)


def quant(bits, dtype, block, count, delta, scales, codes: bytes) -> bytes:
    head = struct.pack("<BBHHb", 1 if bits == 8 else 0, dtype, (block - 32) // 2, count, delta)
    return head + struct.pack(f"<{len(scales)}f", *scales) + codes


def quantize() -> dict:
    nan, inf = float("nan"), float("inf")
    seeds = {}
    # int8 float32, 100 elements in blocks of 32: 4 scales, 100 codes incl. the non-finite ones.
    codes8 = bytes([0, 1, 126, 127, 129, 128, 130, 255] * 13)[:100]
    seeds["valid-int8-f32"] = quant(8, 0, 32, 100, 0, [0.5, 1e-3, 2.0, 0.0], codes8)
    seeds["valid-int8-bf16-scales"] = quant(8, 1, 32, 100, 0, [nan, inf, -inf, 1e-45], codes8)
    seeds["valid-int8-f16-huge-scale"] = quant(8, 2, 32, 100, 0, [3.4e38, -3.4e38, 1.0, 7.0],
                                               codes8)
    codes4 = bytes([0x76, 0x98, 0xA5, 0x0F, 0xF0, 0x88] * 9)[:51]
    seeds["valid-int4-f32-odd"] = quant(4, 0, 64, 101, 0, [0.25, 4.0], codes4)
    seeds["valid-int4-bf16"] = quant(4, 1, 34, 101, 0, [1.0, 2.0, nan], codes4)
    seeds["valid-empty"] = quant(8, 0, 32, 0, 0, [], b"")
    n = 4000
    seeds["valid-int8-inline"] = quant(8, 0, 1024, n, 0, [0.01] * 4, bytes(range(256)) * 15)
    big = 8191
    blocks = -(-big // 32)
    seeds["valid-int8-follows"] = quant(8, 0, 32, big, 0, [1.0] * blocks, bytes(big))
    # Floats that round-trip through quantize: 1.5, -2.25, ... read from the payload.
    vals = struct.pack("<8f", 1.5, -2.25, 1e-30, 3e38, nan, inf, -inf, 0.0) * 4
    seeds["roundtrip-f32"] = struct.pack("<BBHHb", 1, 0, 0, 32, 0) + vals[:quant_bytes(32, 8, 32)]
    seeds["roundtrip-f32-int4"] = struct.pack("<BBHHb", 0, 0, 0, 9, 0) + vals[:36]
    for delta in (-1, 1, 100, -100):
        seeds[f"lie-bytes{delta:+d}"] = quant(8, 0, 32, 100, delta, [1.0] * 4, codes8)
    return seeds


def options() -> dict:
    return {
        "valid-all": "RSDP_SHM_BYTES=2M\nRSDP_P2P_BYTES=1MiB\n"
                     "RSDP_POOL_BYTES=4G\nRSDP_SPIN_US=50\nRSDP_DEBUG=1\nRSDP_NODE_ID=node0\n"
                     "RSDP_CUDA_STAGING_BYTES=64M\n"
                     "RSDP_TEST_EMULATE_DEVICE=jitter=5,stall=1@7\nRSDP_CUDA_INTRA=ipc\n"
                     "RSDP_ALGO_ALLREDUCE=ring\nRSDP_ALGO_BROADCAST=auto\n",
        "valid-bytes-plain": "RSDP_SHM_BYTES=65536\n",
        "valid-bytes-suffixes": "RSDP_P2P_BYTES=64kB\nRSDP_POOL_BYTES=0\nRSDP_CUDA_STAGING_BYTES=1Gi\n",
        "valid-max": "RSDP_POOL_BYTES=1024G\n",
        "valid-emulate": "RSDP_TEST_EMULATE_DEVICE=1\n",
        "regression-bytes-negative": "RSDP_SHM_BYTES=-1\n",
        "regression-bytes-past-2-64": "RSDP_SHM_BYTES=99999999999999999999\n",
        "bad-shift-wraps": "RSDP_POOL_BYTES=17179869185G\n",
        "bad-too-large": "RSDP_P2P_BYTES=1025G\n",
        "bad-blank": "RSDP_SHM_BYTES= 64K\n",
        "bad-plus": "RSDP_SHM_BYTES=+64K\n",
        "bad-suffix": "RSDP_SHM_BYTES=64Q\n",
        "bad-too-small": "RSDP_SHM_BYTES=4K\n",
        "regression-spin-overflow": "RSDP_SPIN_US=99999999999\n",
        "bad-spin-negative": "RSDP_SPIN_US=-5\n",
        "bad-spin-text": "RSDP_SPIN_US=abc\n",
        "bad-jitter-overflow": "RSDP_TEST_EMULATE_DEVICE=jitter=99999999999\n",
        "bad-stall-overflow": "RSDP_TEST_EMULATE_DEVICE=stall=1@18446744073709551616\n",
        "bad-stall-rank": "RSDP_TEST_EMULATE_DEVICE=stall=-1@3\n",
        "bad-emulate-item": "RSDP_TEST_EMULATE_DEVICE=jitter=5,,stall\n",
        "regression-intra-two-words": "RSDP_CUDA_INTRA=ipc nccl\n",
        "bad-intra": "RSDP_CUDA_INTRA=gloo\n",
        "valid-wire-lie": "RSDP_TEST_WIRE_LIE=dtype\n",
        "bad-wire-lie-two-words": "RSDP_TEST_WIRE_LIE=op bits\n",
        "long-node-id": "RSDP_NODE_ID=" + "n" * 1500 + "\n",
    }


def main():
    targets = dict(ucx_header=ucx_header(), ucx_notice=ucx_notice(), shm_ring=shm_ring(),
                   quantize=quantize(), options=options())
    for target, seeds in targets.items():
        d = CORPUS / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (d / name).write_bytes(data.encode() if isinstance(data, str) else data)
        print(f"{d}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
