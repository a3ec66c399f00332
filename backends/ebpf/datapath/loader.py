"""Build (in a child), pin, adopt and attach the socket load balancer.

Everything the datapath needs lives under the bpffs directory (default
/sys/fs/bpf/kpng-py), so it outlives the process and the next start adopts it:

    services, backends, reverse_nat, affinity   the maps (BCC's BPF_TABLE_PINNED
                                                creates them or reuses the pin)
    programs/BUILD/connect4 ... getpeername6    the programs of one build, BUILD
                                                a hash of its sources and cflags
    links/connect4 ... links/getpeername6       one cgroup bpf_link per hook

BCC runs only in a short-lived child (build.py): this process never maps
LLVM. A start whose build is pinned already, over the maps its programs use,
compiles nothing.

Programs are attached as bpf_links (cgroup links are always multi-attach, as
with BPF_F_ALLOW_MULTI). A restart swaps the program inside each pinned link
with BPF_LINK_UPDATE, which the kernel does in one step: no connect() ever
runs with no program or with two. See docs/ebpf.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import stat
import time
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path
from typing import Iterator, Mapping, NoReturn

from backends.ebpf.datapath.build import BuildFailed, BuildRequest, HookProgram, build_in_child
from backends.ebpf.datapath.ownership import START_WAIT_SECONDS, DatapathInUse, DatapathLock, holder
from backends.ebpf.datapath.privileges import check_privileges, privilege_hint
from backends.ebpf.maps import libbpf
from backends.ebpf.maps.layout import BPF_MAP_TYPE_LRU_HASH, DEFAULT_PIN_DIR, MAP_SPECS, MapSpec
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

BPF_SOURCE_DIR = Path(__file__).resolve().parents[1] / "bpf"
LINKS_DIR = "links"
PROGRAMS_DIR = "programs"
# Part of every build's identity: bump it when what a build pins changes.
BUILD_FORMAT = "1"
PROGRAM_PREFIX = "kpng_"


class AttachType(IntEnum):
    """The members of enum bpf_attach_type (uapi/linux/bpf.h) used here,
    named as in C: tests/ebpf/test_kernel_abi.py checks each value."""

    BPF_CGROUP_INET4_CONNECT = 10
    BPF_CGROUP_INET6_CONNECT = 11
    BPF_CGROUP_UDP4_SENDMSG = 14
    BPF_CGROUP_UDP6_SENDMSG = 15
    BPF_CGROUP_UDP4_RECVMSG = 19
    BPF_CGROUP_UDP6_RECVMSG = 20
    BPF_CGROUP_INET4_GETPEERNAME = 29
    BPF_CGROUP_INET6_GETPEERNAME = 30


@dataclass(frozen=True)
class Hook:
    """One sock_addr program and where it attaches."""

    name: str                 # the pin under links/, and what the docs call it
    function: str             # the C function (and the kernel's program name)
    attach_type: AttachType


HOOKS = (
    Hook("connect4", "kpng_connect4", AttachType.BPF_CGROUP_INET4_CONNECT),
    Hook("connect6", "kpng_connect6", AttachType.BPF_CGROUP_INET6_CONNECT),
    Hook("sendmsg4", "kpng_sendmsg4", AttachType.BPF_CGROUP_UDP4_SENDMSG),
    Hook("sendmsg6", "kpng_sendmsg6", AttachType.BPF_CGROUP_UDP6_SENDMSG),
    Hook("recvmsg4", "kpng_recvmsg4", AttachType.BPF_CGROUP_UDP4_RECVMSG),
    Hook("recvmsg6", "kpng_recvmsg6", AttachType.BPF_CGROUP_UDP6_RECVMSG),
    Hook("getpeername4", "kpng_getpeer4", AttachType.BPF_CGROUP_INET4_GETPEERNAME),
    Hook("getpeername6", "kpng_getpeer6", AttachType.BPF_CGROUP_INET6_GETPEERNAME),
)


@dataclass(frozen=True)
class Mount:
    point: Path
    fstype: str


def _mounts() -> list[Mount]:
    with open("/proc/mounts", encoding="utf-8") as mounts:
        return [Mount(Path(parts[1].replace("\\040", " ")), parts[2])
                for parts in (line.split() for line in mounts) if len(parts) >= 3]


def mount_point(fstype: str) -> Path | None:
    """The first mount point of a filesystem type."""
    return next((m.point for m in _mounts() if m.fstype == fstype), None)


def mount_holding(path: Path) -> Mount | None:
    """The innermost mount that holds an absolute, resolved path."""
    holding = [m for m in _mounts() if path == m.point or m.point in path.parents]
    return max(holding, key=lambda m: len(m.point.parts), default=None)


def default_cgroup() -> Path:
    """The node's cgroup v2 root, from /proc/mounts."""
    root = mount_point("cgroup2")
    if root is None:
        raise BackendSetupError("no cgroup v2 filesystem is mounted; mount one "
                                "(mount -t cgroup2 none /sys/fs/cgroup) or pass --cgroup")
    return root


def cgroup_id(cgroup: Path) -> int:
    """The kernel's id of a cgroup v2 directory (its inode number)."""
    return os.stat(cgroup).st_ino


def _resolved(flag: str, given: Path) -> tuple[Path, str]:
    """A flag's path without symlinks and "..", relative ones taken from the
    cwd, and how to name it in an error."""
    path = Path(os.path.realpath(given))
    return path, f"{flag} {given}" + ("" if path == given else f" (that is {path})")


def checked_bpffs_dir(given: Path) -> Path:
    """--bpffs-dir, resolved and checked. Only the returned path may be used
    afterwards: it is what the checks saw, and it is compiled into the
    programs (KPNG_PIN_DIR)."""
    path, named = _resolved("--bpffs-dir", given)
    if any(c in str(path) for c in '"\\\n'):
        raise BackendSetupError(f"{named} has a quote, backslash or newline; pick a plain path")
    mount = mount_holding(path)
    if mount is None or mount.fstype != "bpf":
        raise BackendSetupError(f"{named} is not on a bpf filesystem; mount one "
                                "(mount -t bpf bpf /sys/fs/bpf) or pick a directory under it")
    if path == mount.point:
        # It is often world-writable (1777) on purpose, and made root-only it
        # would lock every other BPF user out.
        raise BackendSetupError(f"{named} is the root of a bpf filesystem, which kpng-py "
                                "would make root-only (0700); pick a directory under it, "
                                f"such as {path / DEFAULT_PIN_DIR.name}")
    return path


# Where systemd's hybrid layout mounts cgroup v2, under the v1 tmpfs.
HYBRID_UNIFIED = "unified"


def _is_cgroup2(path: Path) -> bool:
    mount = mount_holding(path)
    return mount is not None and mount.fstype == "cgroup2" and (path / "cgroup.procs").is_file()


def checked_cgroup(given: Path) -> Path:
    """--cgroup, resolved and checked (only the returned path may be used).
    The root of a hybrid layout (v1 controllers on a tmpfs, v2 mounted at
    `unified` under it, as systemd makes it) stands for its v2 root, so one
    manifest mounting the node's /sys/fs/cgroup fits both layouts."""
    path, named = _resolved("--cgroup", given)
    if _is_cgroup2(path):
        return path
    unified = path / HYBRID_UNIFIED
    if mount_point_is(unified, "cgroup2"):
        log.info("--cgroup is the root of a hybrid cgroup layout; using its cgroup v2 hierarchy",
                 extra=fields(cgroup=unified))
        return unified
    found = [str(m.point) for m in _mounts() if m.fstype == "cgroup2"]
    raise BackendSetupError(
        f"{named} is not a cgroup v2 directory (it is on {_fstype_of(path)}); the cgroup2 "
        f"mounts here: {', '.join(found) or 'none'}; pass one of them (or a directory under "
        "one)")


def mount_point_is(path: Path, fstype: str) -> bool:
    """Whether `path` is itself the mount point of a filesystem of `fstype`."""
    return any(m.point == path and m.fstype == fstype for m in _mounts())


def _fstype_of(path: Path) -> str:
    mount = mount_holding(path)
    return "no mounted filesystem" if mount is None else f"{mount.fstype} at {mount.point}"


@dataclass(frozen=True)
class DatapathConfig:
    bpffs_dir: Path
    cgroup: Path
    # Entries per map, by MapSpec.pin.
    map_sizes: Mapping[str, int] = field(default_factory=dict)
    # Reject with EPERM instead of ECONNREFUSED (what kernels without
    # bpf_set_retval get; chosen automatically when loading needs it).
    reject_with_eperm: bool = False
    # Count connections per endpoint too (the map pinned as backend_counters).
    endpoint_counters: bool = False

    def size(self, spec: MapSpec) -> int:
        if not spec.resizable:
            return spec.default_size
        return self.map_sizes.get(spec.pin, spec.default_size)

    def checked(self) -> DatapathConfig:
        """This configuration with its paths resolved and checked; fails
        early, naming the flag and the fix."""
        return replace(self, bpffs_dir=checked_bpffs_dir(self.bpffs_dir),
                       cgroup=checked_cgroup(self.cgroup))


class Datapath:
    """The loaded programs and the pinned maps they share, in this process.
    `config` is the checked one: its paths are resolved; `build` names the
    programs' directory under programs/."""

    def __init__(self, config: DatapathConfig, build: str,
                 maps: dict[str, libbpf.BpfMap], programs: dict[str, int],
                 lock: DatapathLock) -> None:
        self.config = config
        self.build = build
        self.maps = maps
        self._programs = programs  # hook name -> program fd (owned here)
        self._lock = lock

    @classmethod
    def load(cls, config: DatapathConfig) -> Datapath:
        """Adopt or create the pinned maps, and adopt the pinned programs of
        this build or build them. Nothing is attached yet: the caller fills
        the maps first. The datapath's lock is taken first, waiting for a
        stopping owner (ownership.py)."""
        check_privileges()
        config = config.checked()
        lock: DatapathLock | None = None
        try:
            build = build_identity(config)
            config.bpffs_dir.parent.mkdir(parents=True, exist_ok=True)
            _private_directory(config.bpffs_dir)
            lock = DatapathLock.wait_for(config.bpffs_dir, START_WAIT_SECONDS)
            if lock is None:
                raise DatapathInUse(
                    f"the datapath under {config.bpffs_dir} is owned by a running kpng-py "
                    f"({holder(config.bpffs_dir)}), still after {START_WAIT_SECONDS:g} s: two "
                    "processes would overwrite each other's maps. Stop that one first, or give "
                    "this one another --bpffs-dir (and --cgroup)")
            return cls._loaded(config, build, lock)
        except OSError as err:
            raise BackendSetupError(f"cannot set up the datapath under {config.bpffs_dir}: "
                                    f"{err}{privilege_hint(err)}") from err
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    @classmethod
    def _loaded(cls, config: DatapathConfig, build: str, lock: DatapathLock) -> Datapath:
        """`load`'s work once the lock is held."""
        _private_directory(config.bpffs_dir / LINKS_DIR)
        _private_directory(config.bpffs_dir / PROGRAMS_DIR)
        _refuse_shrinking_below_entries(config)
        replaced = {spec.pin: old for spec in MAP_SPECS
                    if (old := _set_aside_incompatible(config, spec)) is not None}
        programs = _adopted_programs(config, build)
        if programs is None:
            programs = _built_programs(config, build)
        maps = {spec.pin: open_pinned_map(config.bpffs_dir, spec) for spec in MAP_SPECS}
        for spec in MAP_SPECS:
            if not spec.matches(maps[spec.pin].info(), config.size(spec)):
                raise BackendSetupError(
                    f"map {config.bpffs_dir / spec.pin} does not have the expected layout "
                    f"after loading; run `kpng-py ebpf cleanup --bpffs-dir {config.bpffs_dir}`")
        _copy_replaced(config.bpffs_dir, replaced, maps)
        return cls(config, build, maps, programs, lock)

    def attach(self) -> None:
        """Attach every program to the cgroup, replacing the previous ones
        without a gap. An OSError names the hook, cgroup and pin."""
        cgroup = self.config.cgroup
        try:
            cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise _named(err, f"open cgroup {cgroup} to attach the programs") from err
        try:
            target = cgroup_id(cgroup)
            for hook in HOOKS:
                pin = self.config.bpffs_dir / LINKS_DIR / hook.name
                try:
                    _attach_hook(pin, hook, self._programs[hook.name], cgroup_fd, target)
                except OSError as err:
                    raise _named(err, f"attach {hook.function} to cgroup {cgroup} "
                                      f"(link pinned at {pin})") from err
        finally:
            os.close(cgroup_fd)
        # Every link runs this build now: the others' programs (and the maps
        # only they still held, such as a resized map's old one) can go.
        try:
            for other in _builds(self.config.bpffs_dir):
                if other.name != self.build:
                    _remove_build(other)
        except OSError as err:  # the datapath works; `ebpf cleanup` removes them
            log.warning("could not unpin the programs of earlier builds",
                        extra=fields(bpffs_dir=self.config.bpffs_dir, error=err))
        log.info("datapath attached", extra=fields(cgroup=self.config.cgroup,
                                                   bpffs_dir=self.config.bpffs_dir,
                                                   build=self.build))

    def missing(self) -> dict[str, list[str]]:
        """What of this datapath is no longer in place (another process took
        it away: a cleanup, a hand-made change), by object: "maps" and
        "programs" whose pin is gone or names another object, "links" whose
        pin is gone or that no longer run this build's program on the
        cgroup. Empty while all is in place."""
        missing: dict[str, list[str]] = {}
        directory = self.config.bpffs_dir
        for pin, map_id in self._map_ids.items():
            if _pinned_id(directory / pin, libbpf.MapInfo) != map_id:
                missing.setdefault("maps", []).append(pin)
        target = _cgroup_id_or_none(self.config.cgroup)
        for hook in HOOKS:
            program_id = self._program_ids[hook.name]
            if _pinned_id(directory / PROGRAMS_DIR / self.build / hook.name,
                          libbpf.ProgInfo) != program_id:
                missing.setdefault("programs", []).append(hook.name)
            link = _pinned_link(directory / LINKS_DIR / hook.name)
            if link is None or (link.cgroup_id, link.prog_id) != (target, program_id):
                missing.setdefault("links", []).append(hook.name)
        return missing

    @functools.cached_property
    def _map_ids(self) -> dict[str, int]:
        """The kernel's id of each map this process holds: a pin that names
        another is not this datapath's."""
        return {pin: bpf_map.info().id for pin, bpf_map in self.maps.items()}

    @functools.cached_property
    def _program_ids(self) -> dict[str, int]:
        return {hook: libbpf.obj_info(fd, libbpf.ProgInfo, f"program {hook}").id
                for hook, fd in self._programs.items()}

    def restore(self) -> None:
        """Put back what `missing` finds gone, from this process's own
        handles: pins of its maps and programs (whose contents were never
        lost: this process holds them), and links attached anew. The
        directory's lock is taken again if the directory was made again."""
        directory = self.config.bpffs_dir
        directory.parent.mkdir(parents=True, exist_ok=True)
        _private_directory(directory)
        if not self._lock.held():
            self._lock.renew()
        build_dir = directory / PROGRAMS_DIR / self.build
        for path in (directory / LINKS_DIR, directory / PROGRAMS_DIR, build_dir):
            _private_directory(path)
        for pin, bpf_map in self.maps.items():
            _pin_again(bpf_map.fd, directory / pin, self._map_ids[pin], libbpf.MapInfo)
        for hook, fd in self._programs.items():
            _pin_again(fd, build_dir / hook, self._program_ids[hook], libbpf.ProgInfo)
        self.attach()

    def close(self) -> None:
        """Release this process's handles and the datapath's lock; links,
        programs and maps stay pinned, so the datapath keeps working."""
        for bpf_map in self.maps.values():
            bpf_map.close()
        for fd in self._programs.values():
            os.close(fd)
        self._programs = {}
        self._lock.release()


def _pinned_id(path: Path, info_type: type[libbpf.InfoT]) -> int | None:
    """The kernel's id of the map or program pinned at `path`; None if none is."""
    try:
        fd = libbpf.obj_get(path)
    except OSError:
        return None
    try:
        return libbpf.obj_info(fd, info_type, f"the object pinned at {path}").id
    except OSError:
        return None  # another kind of object
    finally:
        os.close(fd)


def _pinned_link(path: Path) -> libbpf.LinkInfo | None:
    fd = _open_link(path)
    if fd is None:
        return None
    try:
        return libbpf.obj_info(fd, libbpf.LinkInfo, f"the link pinned at {path}")
    finally:
        os.close(fd)


def _cgroup_id_or_none(cgroup: Path) -> int | None:
    try:
        return cgroup_id(cgroup)
    except FileNotFoundError:
        return None


def _pin_again(fd: int, path: Path, object_id: int,
               info_type: type[libbpf.InfoT]) -> None:
    """Pin the object of `fd` at `path` unless it is pinned there; whatever
    else is pinned there goes."""
    if _pinned_id(path, info_type) == object_id:
        return
    path.unlink(missing_ok=True)
    libbpf.obj_pin(fd, path)


def _named(err: OSError, what: str) -> OSError:
    """err, its message prefixed with the object it concerns."""
    return OSError(err.errno, f"{what}: {err.strerror}{privilege_hint(err)}")


def _private_directory(path: Path) -> None:
    """Create a root-only directory (0700; the kernel creates pins 0600), or
    tighten one that exists. /sys/fs/bpf is often world-writable (1777):
    a directory another user made could have our pins swapped, so it is
    refused."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise BackendSetupError(f"{path} is not a directory; remove it or pick another "
                                "--bpffs-dir")
    if info.st_uid != os.geteuid():
        raise BackendSetupError(f"{path} belongs to uid {info.st_uid}, not to this process "
                                f"(uid {os.geteuid()}); remove it or pick another --bpffs-dir")
    if stat.S_IMODE(info.st_mode) != 0o700:
        log.warning("made the datapath's directory root-only", extra=fields(
            directory=path, mode=oct(stat.S_IMODE(info.st_mode))))
        path.chmod(0o700)


def open_pinned_map(bpffs_dir: Path, spec: MapSpec) -> libbpf.BpfMap:
    """The map of `spec` pinned under `bpffs_dir`; a per-CPU map's values are
    arrays of one value per possible CPU (what the kernel reads and writes)."""
    value = spec.value * libbpf.possible_cpus() if spec.per_cpu else spec.value
    return libbpf.BpfMap.open_pinned(bpffs_dir / spec.pin, spec.key, value, spec.pin)


def _set_aside_incompatible(config: DatapathConfig, spec: MapSpec) -> libbpf.BpfMap | None:
    """BCC reuses any map pinned at a path, whatever its layout or size. A pin
    that does not match this build and these flags is unpinned (the programs
    still running keep it until their links are updated) so that BCC creates a
    fresh one; it is returned when its entries can be copied over."""
    path = config.bpffs_dir / spec.pin
    if not path.exists():
        return None
    old = open_pinned_map(config.bpffs_dir, spec)
    info = old.info()
    if spec.matches(info, config.size(spec)):
        old.close()
        return None
    log.warning("pinned map does not match; replacing it", extra=fields(
        map=spec.pin, pinned_entries=info.max_entries, wanted_entries=config.size(spec),
        same_layout=spec.same_layout(info)))
    path.unlink()
    if spec.same_layout(info) and not spec.ring_buffer:  # events in flight are not kept
        return old
    old.close()
    return None


def _refuse_shrinking_below_entries(config: DatapathConfig) -> None:
    """A pinned map the flags make smaller than what it holds would be
    copied into its new one in part, and the programs swapped in over it:
    the datapath in force half gone. Such a start is refused before anything
    is touched. An LRU map may shrink (the kernel evicts its oldest entries,
    which is what it does when full anyway)."""
    too_small = []
    for spec in MAP_SPECS:
        path = config.bpffs_dir / spec.pin
        if spec.type == BPF_MAP_TYPE_LRU_HASH or spec.ring_buffer or not path.exists():
            continue
        pinned = open_pinned_map(config.bpffs_dir, spec)
        try:
            info = pinned.info()
            # Not copied (another layout starts empty), or not smaller: fits.
            if not spec.same_layout(info) or info.max_entries <= config.size(spec):
                continue
            entries = pinned.count()
        finally:
            pinned.close()
        if entries > config.size(spec):
            too_small.append(f"{spec.size_flag} {config.size(spec)} is below the "
                             f"{entries} entries map {spec.pin} holds (give at least "
                             f"{entries})")
    if too_small:
        raise BackendSetupError(
            f"refusing to resize the datapath under {config.bpffs_dir}: "
            f"{'; '.join(too_small)}. The datapath in force stays as it is; to start smaller "
            "anyway, remove it first (`kpng-py ebpf cleanup`, which stops translating until "
            "the next start has synced)")


def _copy_replaced(bpffs_dir: Path, replaced: Mapping[str, libbpf.BpfMap],
                   maps: Mapping[str, libbpf.BpfMap]) -> None:
    """Copy each set-aside map into its new one. Should one copy fail
    (checked to fit beforehand, so not for room), every set-aside map is
    pinned again in place of its new one, and the start fails: nothing is
    attached yet, so the programs in force keep their maps whole."""
    try:
        for pin, old in replaced.items():
            items = list(old.items())
            maps[pin].put_many([k for k, _ in items], [v for _, v in items])
    except OSError as err:
        for pin, old in replaced.items():
            (bpffs_dir / pin).unlink(missing_ok=True)
            libbpf.obj_pin(old.fd, bpffs_dir / pin)
        raise BackendSetupError(f"cannot copy the entries of the resized maps under "
                                f"{bpffs_dir}: {err}; the previous maps stay pinned and in "
                                "force") from err
    finally:
        for old in replaced.values():
            old.close()


def _cflags(config: DatapathConfig, reject_with_eperm: bool) -> list[str]:
    flags = [f'-DKPNG_MAPS_HEADER="{BPF_SOURCE_DIR / "lb_maps.h"}"',
             f'-DKPNG_PIN_DIR="{config.bpffs_dir}"']
    flags += [f"-D{spec.size_macro}={config.size(spec)}" for spec in MAP_SPECS]
    if config.endpoint_counters:
        flags.append("-DKPNG_ENDPOINT_COUNTERS")
    if reject_with_eperm:
        flags.append("-DKPNG_REJECT_WITH_EPERM")
    return flags


def _variants(config: DatapathConfig) -> tuple[tuple[str, ...], ...]:
    """The cflags a build tries, in order. Kernels before 5.18 lack
    bpf_set_retval: their verifier rejects the first variant, and the
    program is rebuilt to reject with EPERM."""
    return tuple(tuple(_cflags(config, eperm))
                 for eperm in ((True,) if config.reject_with_eperm else (False, True)))


def _build_request(config: DatapathConfig, pin_dir: Path) -> BuildRequest:
    return BuildRequest(BPF_SOURCE_DIR / "sock_lb.c", _variants(config),
                        tuple(HookProgram(h.name, h.function, h.attach_type) for h in HOOKS),
                        pin_dir)


def build_identity(config: DatapathConfig) -> str:
    """The name of a build's directory under programs/: a hash of the
    sources, the cflags of every variant (map sizes, pin directory, EPERM
    choice) and the hooks. Equal names, equal programs."""
    request = _build_request(config, Path())
    digest = hashlib.sha256(BUILD_FORMAT.encode())
    for source in (request.source, BPF_SOURCE_DIR / "lb_maps.h"):
        digest.update(source.read_bytes())
    digest.update(json.dumps([request.variants,
                              [[h.pin, h.function, h.attach_type] for h in request.hooks]]
                             ).encode())
    return digest.hexdigest()[:32]


def _adopted_programs(config: DatapathConfig, build: str) -> dict[str, int] | None:
    """The pinned programs of this build, if all are there and use exactly
    the maps pinned now (a map replaced or removed since means a rebuild)."""
    pin_dir = config.bpffs_dir / PROGRAMS_DIR / build
    if not pin_dir.is_dir() or not all((config.bpffs_dir / s.pin).exists() for s in MAP_SPECS):
        return None
    pinned_maps = set()
    for spec in MAP_SPECS:
        bpf_map = open_pinned_map(config.bpffs_dir, spec)
        try:
            pinned_maps.add(bpf_map.info().id)
        finally:
            bpf_map.close()
    programs: dict[str, int] = {}
    try:
        for hook in HOOKS:
            pin = pin_dir / hook.name
            programs[hook.name] = libbpf.obj_get(pin)
            if not set(libbpf.prog_map_ids(programs[hook.name], f"the program pinned at {pin}")
                       ) <= pinned_maps:
                log.warning("pinned programs use maps that are no longer pinned; rebuilding",
                            extra=fields(build=build, hook=hook.name))
                break
        else:
            log.info("adopted the pinned eBPF programs; nothing compiled",
                     extra=fields(build=build, compiled=False))
            return dict(programs)
    except FileNotFoundError as err:
        log.warning("pinned programs are incomplete; rebuilding",
                    extra=fields(build=build, error=err))
    for fd in programs.values():
        os.close(fd)
    return None


def _built_programs(config: DatapathConfig, build: str) -> dict[str, int]:
    """Build in a child, pinned under programs/BUILD_next, moved to
    programs/BUILD once complete; the pins opened."""
    programs_dir = config.bpffs_dir / PROGRAMS_DIR
    staging = programs_dir / f"{build}_next"  # bpffs names have no dots
    _remove_build(staging)
    _private_directory(staging)
    started = time.monotonic()
    request = _build_request(config, staging)
    try:
        result = build_in_child(request)
    except BuildFailed as err:
        _remove_build(staging)
        raise BackendSetupError(f"cannot build the eBPF programs of {request.source}: "
                                f"{err}") from err
    if result.variant is None:
        _remove_build(staging)
        _raise_unloadable(request.source, result.errors[0].as_exception())
    if result.errors:
        log.warning("loading failed; rebuilt without bpf_set_retval (services without "
                    "endpoints will fail with EPERM)",
                    extra=fields(error=result.errors[0].message))
    final = programs_dir / build
    _remove_build(final)
    staging.rename(final)
    log.info("eBPF programs built in a child process", extra=fields(
        build=build, compiled=True,
        reject_with_eperm=config.reject_with_eperm or result.variant > 0,
        seconds=round(time.monotonic() - started, 3)))
    return {hook.name: libbpf.obj_get(final / hook.name) for hook in HOOKS}


def _raise_unloadable(source: Path, cause: Exception) -> NoReturn:
    # The capabilities were checked before: the cause is the kernel or its
    # headers (or a permission refused by an LSM), not a missing "root".
    hint = privilege_hint(cause) if isinstance(cause, OSError) else ""
    raise BackendSetupError(
        f"cannot load the eBPF programs of {source}: {cause}{hint}; BCC "
        "compiles them against the running kernel's headers (install "
        f"linux-headers-{platform.release()}), and the kernel needs cgroup sock_addr hooks "
        "with bpf_link (see docs/ebpf.md)") from cause


def _builds(bpffs_dir: Path) -> list[Path]:
    programs_dir = bpffs_dir / PROGRAMS_DIR
    return sorted(programs_dir.iterdir()) if programs_dir.is_dir() else []


def _remove_build(pin_dir: Path) -> list[str]:
    """Unpin a build's programs (attached ones stay, held by their links) and
    remove its directory; returns what was removed."""
    if not pin_dir.is_dir():
        return []
    removed = []
    for pin in sorted(pin_dir.iterdir()):
        pin.unlink()
        removed.append(str(pin))
    pin_dir.rmdir()
    return [*removed, str(pin_dir)]


def _attach_hook(pin: Path, hook: Hook, prog_fd: int, cgroup_fd: int, target: int) -> None:
    previous = _open_link(pin)
    try:
        if previous is not None:
            info = libbpf.obj_info(previous, libbpf.LinkInfo, f"the link pinned at {pin}")
            if info.cgroup_id == target and info.attach_type == hook.attach_type:
                libbpf.link_update(previous, prog_fd)
                return
        # First start, or another cgroup: the new link is attached and pinned
        # before the old one goes, so that no connect() runs untranslated.
        link = libbpf.link_create(prog_fd, cgroup_fd, hook.attach_type)
        try:
            staging = pin.with_name(pin.name + "_next")  # bpffs names have no dots
            staging.unlink(missing_ok=True)
            libbpf.obj_pin(link, staging)
            staging.rename(pin)
        finally:
            os.close(link)
        if previous is not None:
            _detach_quietly(previous)
    finally:
        if previous is not None:
            os.close(previous)


def _open_link(pin: Path) -> int | None:
    try:
        return libbpf.obj_get(pin)
    except FileNotFoundError:
        return None


def _detach_quietly(link_fd: int) -> None:
    try:
        libbpf.link_detach(link_fd)
    except OSError as err:  # already detached (its cgroup was removed)
        log.debug("link already detached", extra=fields(error=err))


@dataclass(frozen=True)
class AttachedLink:
    hook: str
    link_id: int
    prog_id: int
    cgroup_id: int


def pinned_links(bpffs_dir: Path) -> Iterator[AttachedLink]:
    for hook in HOOKS:
        fd = _open_link(bpffs_dir / LINKS_DIR / hook.name)
        if fd is None:
            continue
        try:
            info = libbpf.obj_info(fd, libbpf.LinkInfo, f"the link of hook {hook.name}")
        finally:
            os.close(fd)
        yield AttachedLink(hook.name, info.id, info.prog_id, info.cgroup_id)


def cleanup(bpffs_dir: Path, cgroup: Path | None = None) -> list[str]:
    """Detach and unpin everything a datapath installed under bpffs_dir. With
    a cgroup, also detach every kpng-py program attached to it, whichever
    directory pins it (an installation with another --bpffs-dir). Returns
    what was removed."""
    removed: list[str] = []
    links_dir = bpffs_dir / LINKS_DIR
    for pin in sorted(links_dir.glob("*")) if links_dir.is_dir() else ():
        fd = _open_link(pin)
        if fd is not None:
            _detach_quietly(fd)
            os.close(fd)
        pin.unlink()
        removed.append(str(pin))
    if cgroup is not None:
        removed += _detach_kpng_links(cgroup_id(cgroup))
    for spec in MAP_SPECS:
        pin = bpffs_dir / spec.pin
        if pin.exists():
            pin.unlink()
            removed.append(str(pin))
    for build in _builds(bpffs_dir):
        removed += _remove_build(build)
    for directory in (links_dir, bpffs_dir / PROGRAMS_DIR, bpffs_dir):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
            removed.append(str(directory))
    return removed


def _detach_kpng_links(target: int) -> list[str]:
    removed = []
    for link_id in list(libbpf.link_ids()):
        try:
            fd = libbpf.link_fd_by_id(link_id)
        except FileNotFoundError:
            continue  # gone meanwhile; any other error is reported
        try:
            info = libbpf.obj_info(fd, libbpf.LinkInfo, f"link {link_id}")
            if (info.type == libbpf.BPF_LINK_TYPE_CGROUP and info.cgroup_id == target
                    and libbpf.prog_name(info.prog_id).startswith(PROGRAM_PREFIX)):
                _detach_quietly(fd)
                removed.append(f"link {link_id}")
        finally:
            os.close(fd)
    return removed
