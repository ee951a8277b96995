"""Rank 0's commands to the other ranks of an mlx.launch group, through mx.distributed collectives.

Every command is one all_sum of a fixed-size header (rank 0 writes the payload's length and its
first INLINE bytes, every other rank zeros), plus one all_sum of the rest for a long payload. The
same header carries, in one slot per rank, each rank's digest of its result of the previous
command: rank 0 compares them with its own, so a rank that computed something else (a divergence
that would corrupt every later step) is caught at the next command instead of serving wrong tokens.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import msgspec
import numpy as np

from runtime.owner_messages import GroupCommand

INLINE = 1024  # payload bytes carried by the header itself: a decode or verify command fits
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(GroupCommand)


class GroupLost(RuntimeError):
    """The group cannot go on: a rank died, stopped answering, or diverged from rank 0."""


def init_group():
    """The group mlx.launch set up (MLX_HOSTFILE / MLX_RANK, or MPI, JACCL)."""
    try:
        return mx.distributed.init(strict=True)
    except RuntimeError as e:
        raise GroupLost(f"no distributed group: {e}; start the ranks with mlx.launch") from None


def barrier() -> None:
    """Every rank waits here until all have come."""
    mx.eval(mx.distributed.all_sum(mx.array([1.0]), stream=mx.cpu))


class Channel:
    def __init__(self, group):
        self.group, self.rank, self.size = group, group.rank(), group.size()
        self.head = 4 + 4 * self.size  # length, then one digest per rank
        self.commands, self.seconds = 0, 0.0  # what broadcasting has cost (rank 0's view)

    def send(self, msg: GroupCommand, digest: int) -> list[int]:
        """Rank 0: broadcast msg; returns every rank's digest of its previous result."""
        started = time.perf_counter()
        header, rest = self.frame(msg, digest)
        out = self._sum(header)
        if rest:
            self._sum(np.frombuffer(rest, np.uint8))
        self.commands += 1
        self.seconds += time.perf_counter() - started
        return self._digests(out)

    def receive(self, digest: int) -> GroupCommand:
        """Any other rank: wait for rank 0's next command, telling it this rank's last digest."""
        out = self._sum(self._header(digest))
        return self.unframe(out, lambda n: self._sum(np.zeros(n, np.uint8)).tobytes())

    def idle_broadcast(self) -> None:
        """One header's all_sum, every rank together: a command's broadcast alone, to time it."""
        self._sum(self._header(0))

    def frame(self, msg: GroupCommand, digest: int) -> tuple[np.ndarray, bytes]:
        """The header rank 0 contributes (length, its digest, the payload's start) and the rest."""
        data = _encoder.encode(msg)
        header = self._header(digest)
        header[0:4] = np.frombuffer(len(data).to_bytes(4, "little"), np.uint8)
        inline = data[:INLINE]
        header[self.head:self.head + len(inline)] = np.frombuffer(inline, np.uint8)
        return header, data[INLINE:]

    def unframe(self, header: np.ndarray, rest) -> GroupCommand:
        """The command from a summed header; rest(n) gets the payload's n bytes past INLINE."""
        length = int.from_bytes(header[0:4].tobytes(), "little")
        data = header[self.head:self.head + min(length, INLINE)].tobytes()
        if length > INLINE:
            data += rest(length - INLINE)
        return _decoder.decode(data)

    def _header(self, digest: int) -> np.ndarray:
        header = np.zeros(self.head + INLINE, np.uint8)
        slot = 4 + 4 * self.rank
        header[slot:slot + 4] = np.frombuffer(digest.to_bytes(4, "little"), np.uint8)
        return header

    def _digests(self, out: np.ndarray) -> list[int]:
        return [int.from_bytes(out[4 + 4 * r:8 + 4 * r].tobytes(), "little") for r in range(self.size)]

    def _sum(self, buf: np.ndarray) -> np.ndarray:
        # Only one rank writes each byte, so the sum is that rank's byte (no carries).
        try:
            out = mx.distributed.all_sum(mx.array(buf), group=self.group, stream=mx.cpu)
            mx.eval(out)
        except RuntimeError as e:
            raise GroupLost(f"distributed group lost: {e}") from None
        return np.asarray(out)

    def gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's values (same count on each), in rank order: start-up facts and checks."""
        out = mx.distributed.all_gather(mx.array(values, dtype=mx.int64), group=self.group, stream=mx.cpu)
        mx.eval(out)
        flat = np.array(out).tolist()
        return [flat[r * len(values):(r + 1) * len(values)] for r in range(self.size)]


def digest(result: Any) -> int:
    """A result's integers (tokens, counts, ids), not its timings: what every rank must agree on."""
    found: list = []
    _integers(msgspec.to_builtins(result), found)
    return zlib.crc32(repr(found).encode())


def error_digest(error: BaseException) -> int:
    return zlib.crc32(f"error {type(error).__name__}".encode())


def _integers(value, found: list) -> None:
    if isinstance(value, (bool, int, str)):
        found.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _integers(key, found)
            _integers(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _integers(item, found)


def join(channel: Channel, model_path, settings: list) -> list[int]:
    """Start-up, on every rank together: refuse a group whose ranks load other model files or other
    settings (they would compute other results, or meet in other collectives); returns every
    rank's process id."""
    import os
    from pathlib import Path

    path = Path(model_path)
    files = sorted((p.name, p.stat().st_size) for p in path.glob("*.safetensors"))
    mine = zlib.crc32(msgspec.json.encode(settings) + (path / "config.json").read_bytes() + repr(files).encode())
    facts = channel.gather_ints([mine, os.getpid()])
    if odd := [rank for rank, (fp, _) in enumerate(facts) if fp != facts[0][0]]:
        raise GroupLost(f"rank {odd[0]} loads another model or other settings than rank 0 "
                        f"(start every rank with the same command line and model files)")
    return [pid for _, pid in facts]
