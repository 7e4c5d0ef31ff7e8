#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): for wire_fuzz,
well-formed scripts of every message kind of ferry's core wire format (src/core/wire.hpp), each
frame as [u16 little-endian length][bytes]; for parcel_header_fuzz, well-formed parcel headers;
for mpi_header_fuzz, well-formed MPI parcelport headers, aggregates among them; for notify_fuzz,
put notifications as a transport reports them; for heartbeat_fuzz, keepalive heartbeats, each
frame as [u8 length][bytes]; for coll_header_fuzz, collectives' messages after their sender's rank;
for atomic_request_fuzz, atomics' requests around a region.
The fuzzers mutate them; the replay tests run them as they are."""
import os
import struct
import sys

AM, MSG, RTS_AM, RTS_MSG, RTS_IOVEC, FIN, BARRIER, FRAG, ATOMIC, ATOMIC_REPLY = range(1, 11)
U32, U64, F64 = 5, 7, 9  # DataType
FETCH_ADD, ADD, SWAP, CSWAP, FETCH_AND, FETCH_OR, FETCH_XOR = range(7)  # AtomicOp


def header(kind, target=0, src=0, tag=0, aux=0, reserved=0):
    return struct.pack("<BBHiII", kind, reserved, target, src, tag, aux)


def rts(size, addr=0x10000, key=0, send_op=1):
    return struct.pack("<QQQQ", size, addr, key, send_op)


def fragments(kind, total, piece, msg_id=1, target=0, tag=0):
    out = []
    for offset in range(0, total, piece):
        n = min(piece, total - offset)
        out.append(header(FRAG, target, 0, tag, msg_id, kind) + struct.pack("<II", offset, total) + bytes([offset & 0xFF]) * n)
    return out


def script(frames):
    return b"".join(struct.pack("<H", len(f)) + f for f in frames)


seeds = {
    "am_8": [header(AM, 0, tag=3) + b"\x01" * 8],
    "am_empty_target3": [header(AM, 3)],
    "msg_8": [header(MSG, tag=5) + b"\x02" * 8],
    "msg_64_truncated": [header(MSG, tag=6) + b"\x03" * 100],
    "frag_am_3000": fragments(AM, 3000, 1000),
    "frag_msg_5000_heap": fragments(MSG, 5000, 1000, msg_id=2, tag=9),
    "frag_reordered": list(reversed(fragments(AM, 3000, 1000, msg_id=3))),
    "rts_am": [header(RTS_AM, 1, tag=4) + rts(100000)],
    "rts_msg": [header(RTS_MSG, tag=7) + rts(70000, send_op=2)],
    "rts_iovec": [header(RTS_IOVEC, 2, tag=8, aux=2) + rts(16, 0, 0, 3) + b"\x04" * 16
                  + struct.pack("<QQQ", 4096, 0x20000, 0) + struct.pack("<QQQ", 0, 0, 0)],
    "fin": [header(FIN) + struct.pack("<Q", 0)],
    "barrier": [header(BARRIER, tag=(1 << 8) | 2)],
    # An atomic's request (AtomicBody: addr, key, operand, compare, id) names no region of the
    # harness's device: answered -EFAULT. A reply (id, value, error) names no atomic of it.
    "atomic_request": [header(ATOMIC, U64, reserved=FETCH_ADD) + struct.pack("<QQQQQ", 0x10000, 0, 1, 0, 5)],
    "atomic_request_f64_swap": [header(ATOMIC, F64, reserved=SWAP) + struct.pack("<QQQQQ", 0x10000, 0, 1, 0, 6)],
    "atomic_reply": [header(ATOMIC_REPLY) + struct.pack("<QQiI", 5, 42, 0, 0)],
}
seeds["mixed"] = [f for name in ("am_8", "frag_am_3000", "rts_msg", "msg_8", "rts_iovec", "fin") for f in seeds[name]]


def parcel_header(parts, zc_sizes, nzc, piggyback):
    """parcel_header_fuzz's input: the iovec part count, then a header (src/parcel/header.hpp)."""
    head = struct.pack("<IIHBBI", 7, len(nzc), len(zc_sizes), 1 if piggyback else 0, 0, 0)
    return bytes([parts]) + head + b"".join(struct.pack("<Q", s) for s in zc_sizes) + (nzc if piggyback else b"")


parcel_seeds = {
    "small_piggyback": parcel_header(0, [], b"\x05" * 40, True),
    "zc_two_piggyback": parcel_header(0, [4096, 0], b"\x06" * 24, True),
    "zc_apart": parcel_header(0, [100, 200, 300], b"\x07" * 500, False),
    "iovec_piggyback": parcel_header(2, [16384, 8], b"\x08" * 16, True),
    "iovec_apart": parcel_header(3, [16384, 8], b"\x09" * 3000, False),
}

MPI_SIGNATURE, MPI_PIGGYBACK, MPI_AGGREGATE = 0x46525931, 1, 2


def mpi_header(zc_sizes, nzc, flags, tag=11):
    """mpi_header_fuzz's input: an MPI parcelport header (src/parcel/mpi_header.hpp)."""
    head = struct.pack("<IiIIQ", MPI_SIGNATURE, tag, flags, len(zc_sizes), len(nzc))
    return head + b"".join(struct.pack("<Q", s) for s in zc_sizes) + (nzc if flags & MPI_PIGGYBACK else b"")


def mpi_aggregate(parcels):
    """An mpi_a nzc: the index (count, then nzc size and zero-copy count per parcel), then the nzcs."""
    index = struct.pack("<Q", len(parcels)) + b"".join(struct.pack("<QQ", len(n), z) for n, z in parcels)
    return index + b"".join(n for n, _ in parcels)


mpi_seeds = {
    "piggyback": mpi_header([], b"\x0a" * 40, MPI_PIGGYBACK),
    "zc_piggyback": mpi_header([4096, 0], b"\x0b" * 24, MPI_PIGGYBACK),
    "apart": mpi_header([100, 200], b"\x0c" * 5000, 0),
    "aggregate": mpi_header([64, 8, 16], mpi_aggregate([(b"\x0d" * 12, 1), (b"", 0), (b"\x0e" * 7, 2)]),
                            MPI_PIGGYBACK | MPI_AGGREGATE),
    "aggregate_apart": mpi_header([64], mpi_aggregate([(b"\x0f" * 30, 1)]), MPI_AGGREGATE),
}

def notice(target, tag, length, writer=None, rank_in_data=0):
    """notify_fuzz's record: remote data (writer rank << 32 | target << 16 | tag), the bytes
    written, and the rank the transport names (-1: none, the data carries it)."""
    data = (rank_in_data << 32) | (target << 16) | tag
    return struct.pack("<QQi", data, length, -1 if writer is None else writer)


notify_seeds = {
    "rank_in_data": notice(1, 7, 64),
    "transport_names_writer": notice(2, 9, 4096, writer=0),
    "several": notice(1, 1, 8) + notice(3, 2, 0, writer=0) + notice(0, 0xFFFF, 1 << 20),
}

def beat(kind, rank=0, subject=0):
    """A keepalive heartbeat (src/core/heartbeats.hpp): magic, kind, padding, sender rank,
    subject (a notice's failed rank)."""
    frame = struct.pack("<IB3xII", 0x42485246, kind, rank, subject)
    return bytes([len(frame)]) + frame


heartbeat_seeds = {
    "alive": beat(1),
    "departing": beat(2),
    "many": beat(1) * 40 + beat(2),
    "other_sender": beat(1, rank=3) + beat(1),
    "malformed_then_good": (bytes([5]) + b"\xab" * 5) * 40 + beat(1),
    "notice": beat(3, subject=2) + beat(1),
    "notice_of_itself": beat(3, subject=0) + beat(3, subject=9) + beat(1),
}

def coll(kind, size, payload=b"", sender=1, step=0, team=1, seq=0):
    """coll_header_fuzz's input: the sender's rank, then a collective's message
    (src/coll/wire.hpp): magic, step, kind, team, seq, size, then the data or the key."""
    return struct.pack("<i", sender) + struct.pack("<IHHQQQ", 0x4C4F4346, step, kind, team, seq, size) + payload


def coll_key(rank, size, base=0x10000, key=7, device=0, shared=0):
    """A RemoteKey: base, size, key, rank, device, shared."""
    return struct.pack("<QQQiiQ", base, size, key, rank, device, shared)


def atomic_request(op, dtype, offset, key=7, operand=1, compare=0):
    """atomic_request_fuzz's input: the op and type bytes of the header, then an AtomicBody
    whose address the target folds into its window (offset 64..127 is the region)."""
    return struct.pack("<BH", op, dtype) + struct.pack("<QQQQQ", offset, key, operand, compare, 1)


atomic_seeds = {
    "fetch_add_u64": atomic_request(FETCH_ADD, U64, 64),
    "cswap_u32_last": atomic_request(CSWAP, U32, 124, compare=0),
    "cswap_no_match": atomic_request(CSWAP, U64, 72, compare=99),
    "f64_add": atomic_request(ADD, F64, 80, operand=0x3FF8000000000000),
    "f64_fetch_or": atomic_request(FETCH_OR, F64, 80),
    "straddles_end": atomic_request(FETCH_XOR, U64, 124),
    "misaligned": atomic_request(SWAP, U64, 68),
    "outside": atomic_request(FETCH_AND, U64, 8),
    "wrong_key": atomic_request(FETCH_ADD, U64, 64, key=8),
    "unknown_op": atomic_request(42, U64, 64),
    "unknown_type": atomic_request(FETCH_ADD, 300, 64),
}


coll_seeds = {
    "data_empty": coll(0, 0),
    "data_8": coll(0, 8, b"\x01" * 8, step=3),
    "data_short": coll(0, 16, b"\x02" * 8),
    "rts": coll(1, 1 << 20, coll_key(1, 1 << 20)),
    "rts_other_sender": coll(1, 4096, coll_key(2, 4096)),
    "rts_small_key": coll(1, 4096, coll_key(1, 100)),
    "fin": coll(2, 0, sender=3, step=5),
    "fin_with_payload": coll(2, 0, b"\x00" * 4),
    "unknown_kind": coll(9, 0),
    "bad_magic": struct.pack("<i", 0) + b"\xff" * 32,
}

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
for target, files in (("wire", {n: script(f) for n, f in seeds.items()}), ("parcel_header", parcel_seeds),
                      ("mpi_header", mpi_seeds), ("notify", notify_seeds),
                      ("heartbeat", heartbeat_seeds), ("coll_header", coll_seeds), ("atomic_request", atomic_seeds)):
    out = os.path.join(root, target)
    os.makedirs(out, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(files)} seeds to {out}")
