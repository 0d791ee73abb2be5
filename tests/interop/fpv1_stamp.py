#!/usr/bin/env python3
"""Predicts the bytes that `flashpool bench --verify --rw write --jobs 1` writes in its one
sequential pass over --size (no --runtime), so that the interop suite can compare them with
what landed on the guest's /dev/ram0 (check host-data-on-ramdisk in tests/interop/run.sh).

A mirror of stamp() in crates/flashpool-bench/src/verify.rs ("FPV1" header: magic, CRC32C of
bytes 8.., LBA, seed, write generation; xorshift filler) and of the generation order of
crates/flashpool-bench/src/engine.rs (a job starts at generation 1 and takes generation+1 for
each write it issues; a sequential pass issues the units in LBA order). run.sh checks this
mirror against the bench itself on a local file (file:PATH) before trusting it.

  fpv1_stamp.py --lba-size 512 --bs 131072 --size 2097152 --seed 0x5eed [--out FILE]
prints the sha256 (hex) of the SIZE bytes."""
import argparse, hashlib, struct, sys

M64 = (1 << 64) - 1
MAGIC = 0x31565046  # "FPV1"
HEADER = 32


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rotl64(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def stamp(lba_size, lba, seed, generation):
    x = mix(seed ^ mix(lba) ^ rotl64(generation, 32)) | 1
    words = []
    for _ in range((lba_size - HEADER) // 8):
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        words.append(x)
    tail = struct.pack("<QQQ", lba, seed, generation) + struct.pack("<%dQ" % len(words), *words)
    return struct.pack("<II", MAGIC, crc32c(tail)) + tail


def pattern(lba_size, bs, size, seed):
    assert bs % lba_size == 0 and size % bs == 0, "bs must be a multiple of the LBA size, size of bs"
    per_io = bs // lba_size
    out = bytearray()
    generation = 1
    for unit in range(size // bs):
        generation += 1
        for i in range(per_io):
            out += stamp(lba_size, unit * per_io + i, seed, generation)
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lba-size", type=int, required=True)
    ap.add_argument("--bs", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--seed", type=lambda s: int(s, 0), required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    data = pattern(a.lba_size, a.bs, a.size, a.seed)
    if a.out:
        open(a.out, "wb").write(data)
    print(hashlib.sha256(data).hexdigest())


if __name__ == "__main__":
    sys.exit(main())
