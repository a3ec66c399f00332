"""The bpf() operations BCC's Python API lacks, through libbpf (the library
Debian's BCC itself links against): pinned objects, map access by file
descriptor (batched), and cgroup bpf_links.

BCC compiles and loads the programs, in a short-lived child (build.py) that
pins them; everything the long-running process does with them (pinned
programs and maps, links, `ebpf dump` and `ebpf cleanup`) goes through here.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from pathlib import Path
from typing import Callable, Generic, Iterator, Sequence, TypeVar

from backends.ebpf.maps.access import MapFullError, Packed

_lib = ct.CDLL("libbpf.so.1", use_errno=True)

# enum bpf_link_type (uapi/linux/bpf.h; tests/ebpf/test_kernel_abi.py checks it)
BPF_LINK_TYPE_CGROUP = 3

_c_int, _c_u32, _p = ct.c_int, ct.c_uint32, ct.c_void_p
_SIGNATURES = {
    "bpf_obj_get": (_c_int, [ct.c_char_p]),
    "bpf_obj_pin": (_c_int, [_c_int, ct.c_char_p]),
    "bpf_obj_get_info_by_fd": (_c_int, [_c_int, _p, ct.POINTER(_c_u32)]),
    "bpf_map_lookup_elem": (_c_int, [_c_int, _p, _p]),
    "bpf_map_update_elem": (_c_int, [_c_int, _p, _p, ct.c_uint64]),
    "bpf_map_delete_elem": (_c_int, [_c_int, _p]),
    "bpf_map_get_next_key": (_c_int, [_c_int, _p, _p]),
    "bpf_map_lookup_batch": (_c_int, [_c_int, _p, _p, _p, _p, ct.POINTER(_c_u32), _p]),
    "bpf_map_update_batch": (_c_int, [_c_int, _p, _p, ct.POINTER(_c_u32), _p]),
    "bpf_map_delete_batch": (_c_int, [_c_int, _p, ct.POINTER(_c_u32), _p]),
    "bpf_link_create": (_c_int, [_c_int, _c_int, _c_int, _p]),
    "bpf_link_update": (_c_int, [_c_int, _c_int, _p]),
    "bpf_link_detach": (_c_int, [_c_int]),
    "bpf_link_get_next_id": (_c_int, [_c_u32, ct.POINTER(_c_u32)]),
    "bpf_link_get_fd_by_id": (_c_int, [_c_u32]),
    "bpf_prog_get_fd_by_id": (_c_int, [_c_u32]),
    "libbpf_num_possible_cpus": (_c_int, []),
    "ring_buffer__new": (_p, [_c_int, _p, _p, _p]),
    "ring_buffer__consume": (_c_int, [_p]),
    "ring_buffer__free": (None, [_p]),
}
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    getattr(_lib, _name).restype = _restype
    getattr(_lib, _name).argtypes = _argtypes


def _check(result: int, what: str) -> int:
    """libbpf returns -errno (and sets errno) on failure."""
    if result < 0:
        code = -result if result != -1 else ct.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def possible_cpus() -> int:
    """How many values a lookup in a per-CPU map gives (the kernel's
    possible CPUs, not only the online ones)."""
    return _check(_lib.libbpf_num_possible_cpus(), "count the possible CPUs")


def obj_get(path: Path) -> int:
    """A new file descriptor for a pinned map, program or link."""
    return _check(_lib.bpf_obj_get(os.fsencode(path)), f"open pinned BPF object {path}")


def obj_pin(fd: int, path: Path) -> None:
    _check(_lib.bpf_obj_pin(fd, os.fsencode(path)), f"pin BPF object at {path}")


# The bpf_*_info mirrors are prefixes of the uapi structs with the C member
# names (test_kernel_abi.py compares each offset and size): the kernel fills
# as much of a struct as both sides know.


class MapInfo(ct.Structure):
    """The first fields of struct bpf_map_info."""

    _fields_ = [("type", _c_u32), ("id", _c_u32), ("key_size", _c_u32),
                ("value_size", _c_u32), ("max_entries", _c_u32), ("map_flags", _c_u32),
                ("name", ct.c_char * 16)]


class CgroupLinkInfo(ct.Structure):
    """The cgroup member of struct bpf_link_info's union."""

    _fields_ = [("cgroup_id", ct.c_uint64), ("attach_type", _c_u32)]


class LinkInfo(ct.Structure):
    """struct bpf_link_info up to its cgroup member (the union's first u64
    aligns it to 8 bytes, as in C); `info.cgroup_id` reads through."""

    _anonymous_ = ("cgroup",)
    _fields_ = [("type", _c_u32), ("id", _c_u32), ("prog_id", _c_u32),
                ("cgroup", CgroupLinkInfo)]


class ProgInfo(ct.Structure):
    """struct bpf_prog_info up to its name."""

    _fields_ = [("type", _c_u32), ("id", _c_u32), ("tag", ct.c_uint8 * 8),
                ("jited_prog_len", _c_u32), ("xlated_prog_len", _c_u32),
                ("jited_prog_insns", ct.c_uint64), ("xlated_prog_insns", ct.c_uint64),
                ("load_time", ct.c_uint64), ("created_by_uid", _c_u32),
                ("nr_map_ids", _c_u32), ("map_ids", ct.c_uint64), ("name", ct.c_char * 16)]


InfoT = TypeVar("InfoT", MapInfo, LinkInfo, ProgInfo)


def obj_info(fd: int, info_type: type[InfoT], of: str | None = None) -> InfoT:
    """What the kernel says about a map, link or program (`of` names it in
    an error)."""
    info = info_type()
    size = _c_u32(ct.sizeof(info))
    _check(_lib.bpf_obj_get_info_by_fd(fd, ct.byref(info), ct.byref(size)),
           f"read {info_type.__name__} of {of or f'BPF object fd {fd}'}")
    return info


K = TypeVar("K", bound=ct._SimpleCData | ct.Structure)
# A per-CPU map's value is an array of one value per possible CPU.
V = TypeVar("V", bound=ct.Structure | ct.Array)

# Entries per batched syscall when reading a whole map.
_READ_BATCH = 4096


class BpfMap(Generic[K, V]):
    """A BPF map by file descriptor, with ctypes keys and values (a
    `maps.access.MapAccess`)."""

    def __init__(self, fd: int, key_type: type[K], value_type: type[V], name: str) -> None:
        self.fd = fd
        self.key_type = key_type
        self.value_type = value_type
        self.name = name

    @classmethod
    def open_pinned(cls, path: Path, key_type: type[K], value_type: type[V],
                    name: str) -> BpfMap[K, V]:
        return cls(obj_get(path), key_type, value_type, name)

    def info(self) -> MapInfo:
        return obj_info(self.fd, MapInfo)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def get(self, key: K | int) -> V | None:
        """The value at key (an int for maps with integer keys), or None."""
        value = self.value_type()
        ckey = self.key_type(key) if isinstance(key, int) else key
        if _lib.bpf_map_lookup_elem(self.fd, ct.byref(ckey), ct.byref(value)) < 0:
            code = ct.get_errno()
            if code == errno.ENOENT:
                return None
            raise OSError(code, f"look up in map {self.name}: {os.strerror(code)}")
        return value

    def put(self, key: K, value: V) -> None:
        self.put_many([key], [value])

    def put_many(self, keys: Sequence[K], values: Sequence[V]) -> None:
        """Create or update entries with one syscall (in order)."""
        self.put_packed(_packed(self.key_type, keys), _packed(self.value_type, values))

    def delete_many(self, keys: Sequence[K]) -> None:
        """Delete entries (in order); keys already gone are fine."""
        self.delete_packed(_packed(self.key_type, keys))

    def put_packed(self, keys: Packed, values: Packed) -> None:
        """Create or update packed entries with one syscall (in order)."""
        count = self._count_of(keys, self.key_type, "keys")
        if count != self._count_of(values, self.value_type, "values"):
            raise ValueError(f"write to map {self.name}: {count} keys but "
                             f"{len(values) // ct.sizeof(self.value_type)} values; pass one "
                             f"value per key")
        if not count:
            return
        written = _c_u32(count)
        result = _lib.bpf_map_update_batch(self.fd, _c_buffer(keys), _c_buffer(values),
                                           ct.byref(written), None)
        if result < 0:
            code = -result
            message = (f"write {count} entries to map {self.name}: {os.strerror(code)} "
                       f"after {written.value}")
            raise (MapFullError if code == errno.E2BIG else OSError)(code, message)

    def delete_packed(self, keys: Packed) -> None:
        """Delete packed entries (in order); keys already gone are fine."""
        key_size, count = ct.sizeof(self.key_type), self._count_of(keys, self.key_type, "keys")
        buffer = _c_buffer(keys)
        done = 0
        while done < count:
            deleted = _c_u32(count - done)
            result = _lib.bpf_map_delete_batch(self.fd, ct.addressof(buffer) + done * key_size,
                                               ct.byref(deleted), None)
            if result >= 0:
                return
            if -result != errno.ENOENT:
                raise OSError(-result, f"delete from map {self.name}: {os.strerror(-result)}")
            # The batch stops at the first missing key: skip it, go on.
            done += deleted.value + 1

    def read_packed(self) -> tuple[bytes, bytes]:
        """Every entry, read in batches into two reused buffers and copied out
        as packed keys and values."""
        key_size, value_size = ct.sizeof(self.key_type), ct.sizeof(self.value_type)
        keys_out, values_out = bytearray(), bytearray()
        for keys, values, count in self._read_batches(reuse_buffers=True):
            keys_out += memoryview(keys).cast("B")[:count * key_size]
            values_out += memoryview(values).cast("B")[:count * value_size]
        return bytes(keys_out), bytes(values_out)

    def _count_of(self, packed: Packed, of: type, what: str) -> int:
        count, rest = divmod(len(memoryview(packed).cast("B")), ct.sizeof(of))
        if rest:
            raise ValueError(f"packed {what} for map {self.name} are {len(packed)} bytes, not "
                             f"a multiple of {ct.sizeof(of)}: pack whole entries")
        return count

    def items(self) -> Iterator[tuple[K, V]]:
        """Every entry, read in batches."""
        for keys, values, count in self._read_batches(reuse_buffers=False):
            yield from zip(keys[:count], values[:count])

    def count(self) -> int:
        """How many entries the map holds: the batches are read into the same
        two buffers and only their lengths added up, with no object per entry
        (docs/ebpf.md has the cost on a full reverse-NAT map)."""
        return sum(count for _, _, count in self._read_batches(reuse_buffers=True))

    def __len__(self) -> int:
        return self.count()

    def _read_batches(self, reuse_buffers: bool) -> Iterator[tuple[ct.Array, ct.Array, int]]:
        """(keys, values, count) of each batch of the map. The entries of a
        batch are views into its buffers: with reuse_buffers they are only
        valid until the next batch is read."""
        token_size = max(ct.sizeof(self.key_type), 4)
        in_batch, out_batch = ct.create_string_buffer(token_size), ct.create_string_buffer(
            token_size)
        capacity = _READ_BATCH
        buffers: tuple[ct.Array, ct.Array] | None = None
        first = True
        while True:
            if buffers is None or not reuse_buffers or len(buffers[0]) != capacity:
                buffers = (self.key_type * capacity)(), (self.value_type * capacity)()
            keys, values = buffers
            count = _c_u32(capacity)
            result = _lib.bpf_map_lookup_batch(self.fd, None if first else in_batch, out_batch,
                                               keys, values, ct.byref(count), None)
            if result < 0 and -result == errno.ENOSPC:
                capacity *= 2  # one hash bucket holds more than a batch
                continue
            if result < 0 and -result != errno.ENOENT:
                raise OSError(-result, f"read map {self.name}: {os.strerror(-result)}")
            yield keys, values, count.value
            if result < 0:  # ENOENT: that was the last batch
                return
            ct.memmove(in_batch, out_batch, token_size)
            first = False


def _packed(of: type[K] | type[V], items: Sequence) -> bytes:
    """ctypes keys or values (ints for integer keys), packed end to end."""
    return bytes((of * len(items))(*items)) if items else b""


def _c_buffer(packed: Packed) -> ct.Array:
    """A packed buffer as a ctypes array for a bpf() call: the buffer itself
    where it is writable, else a copy."""
    view = memoryview(packed).cast("B")
    array_type = ct.c_char * len(view)
    return array_type.from_buffer_copy(view) if view.readonly else array_type.from_buffer(view)


# -- cgroup links -------------------------------------------------------------


# int (*ring_buffer_sample_fn)(void *ctx, void *data, size_t size)
_SampleFn = ct.CFUNCTYPE(_c_int, _p, _p, ct.c_size_t)


class RingBuffer:
    """A consumer of a BPF ring buffer map (libbpf's ring_buffer): `consume`
    calls `on_sample` with the bytes of each record, on the calling thread."""

    def __init__(self, map_fd: int, on_sample: Callable[[bytes], None], name: str) -> None:
        self.name = name

        def sample(_ctx: int | None, data: int, size: int) -> int:
            on_sample(ct.string_at(data, size))
            return 0

        self._callback = _SampleFn(sample)  # kept: libbpf calls it until freed
        ring = _lib.ring_buffer__new(map_fd, self._callback, None, None)
        if not ring:
            code = ct.get_errno()
            raise OSError(code, f"read ring buffer {name}: {os.strerror(code)}")
        self._ring: int | None = ring

    def consume(self) -> int:
        """Consume every record there is now, without waiting; how many."""
        if self._ring is None:
            raise ValueError(f"ring buffer {self.name} is closed")
        consumed = _lib.ring_buffer__consume(self._ring)
        if consumed < 0:
            raise OSError(-consumed, f"read ring buffer {self.name}: {os.strerror(-consumed)}")
        return consumed

    def close(self) -> None:
        if self._ring is not None:
            _lib.ring_buffer__free(self._ring)
            self._ring = None


def link_create(prog_fd: int, cgroup_fd: int, attach_type: int) -> int:
    """Attach a program to a cgroup as a bpf_link (always in multi mode, like
    BPF_F_ALLOW_MULTI); the attachment lasts while the link is open or pinned."""
    return _check(_lib.bpf_link_create(prog_fd, cgroup_fd, attach_type, None),
                  f"create a cgroup link (attach type {attach_type})")


def link_update(link_fd: int, prog_fd: int) -> None:
    """Swap the program of a link in one step: no moment without a program."""
    _check(_lib.bpf_link_update(link_fd, prog_fd, None), "replace the program of a link")


def link_detach(link_fd: int) -> None:
    _check(_lib.bpf_link_detach(link_fd), "detach a link")


def link_ids() -> Iterator[int]:
    """The ids of every bpf_link on the machine."""
    current, next_id = 0, _c_u32()
    while (result := _lib.bpf_link_get_next_id(current, ct.byref(next_id))) != -errno.ENOENT:
        # Anything but the end of the list (EPERM without CAP_SYS_ADMIN) is an
        # error: an empty list would make `ebpf cleanup --cgroup` a silent no-op.
        _check(result, "list the BPF links of the machine")
        current = next_id.value
        yield current


def link_fd_by_id(link_id: int) -> int:
    return _check(_lib.bpf_link_get_fd_by_id(link_id), f"open link {link_id}")


def prog_map_ids(prog_fd: int, of: str) -> list[int]:
    """The ids of the maps a program uses (`of` names it in an error)."""
    count = obj_info(prog_fd, ProgInfo, of).nr_map_ids
    ids = (_c_u32 * max(count, 1))()
    info = ProgInfo(nr_map_ids=count, map_ids=ct.addressof(ids))
    size = _c_u32(ct.sizeof(info))
    _check(_lib.bpf_obj_get_info_by_fd(prog_fd, ct.byref(info), ct.byref(size)),
           f"read the map ids of {of}")
    return list(ids[:min(count, info.nr_map_ids)])


def prog_fd_by_id(prog_id: int) -> int:
    return _check(_lib.bpf_prog_get_fd_by_id(prog_id), f"open program {prog_id}")


def prog_name(prog_id: int) -> str:
    fd = prog_fd_by_id(prog_id)
    try:
        return obj_info(fd, ProgInfo, f"program {prog_id}").name.decode()
    finally:
        os.close(fd)
