"""DataWarp's staging API (datawarp.h) for Python, over Spillway's libdatawarp.

Every call raises OSError (errno, strerror, path) when the C call returns a negative errno.
The functions and their semantics are those of the C library: docs/libdatawarp.md.
"""

import ctypes
import ctypes.util
import errno as _errno
import os
import threading
from collections import namedtuple

__all__ = [
    "IMMEDIATE", "AT_JOB_END", "REVOKE_AT_JOB_END", "ACTIVATE_DEFERRED",
    "DW_STAGE_IMMEDIATE", "DW_STAGE_AT_JOB_END", "DW_REVOKE_STAGE_AT_JOB_END", "DW_ACTIVATE_DEFERRED_STAGE",
    "StageCounts", "StripeConfiguration",
    "stage_file_in", "stage_directory_in", "stage_list_in",
    "stage_file_out", "stage_directory_out", "stage_list_out",
    "query_file_stage", "query_directory_stage", "query_list_stage",
    "wait_file_stage", "wait_directory_stage", "wait_list_stage",
    "terminate_file_stage", "terminate_directory_stage", "terminate_list_stage",
    "failed_stages", "set_stage_concurrency",
    "get_stripe_configuration", "set_stripe_configuration",
    "get_mds_path", "get_accounting_data_json", "wait_sync_complete",
    "CachePolicy", "get_cache_policy", "set_cache_policy",
]

# enum dw_stage_type
DW_STAGE_IMMEDIATE = IMMEDIATE = 0
DW_STAGE_AT_JOB_END = AT_JOB_END = 1
DW_REVOKE_STAGE_AT_JOB_END = REVOKE_AT_JOB_END = 2
DW_ACTIVATE_DEFERRED_STAGE = ACTIVATE_DEFERRED = 3

StageCounts = namedtuple("StageCounts", "complete pending deferred failed")
StripeConfiguration = namedtuple("StripeConfiguration", "stripe_size stripe_width starting_index")
# A cache instance's policy of a file or directory (dw_cache_policy_t): bytes, bytes, bools.
CachePolicy = namedtuple("CachePolicy", "modified_threshold read_ahead sync_on_close sync_to_pfs")


class _dw_cache_policy_t(ctypes.Structure):
    _fields_ = [("modified_threshold", ctypes.c_uint64), ("read_ahead", ctypes.c_uint64),
                ("sync_on_close", ctypes.c_int), ("sync_to_pfs", ctypes.c_int)]

_lib = None
_lock = threading.Lock()


def _library():
    global _lib
    with _lock:
        if _lib is None:
            name = os.environ.get("SPILLWAY_LIBDATAWARP") or ctypes.util.find_library("datawarp") or "libdatawarp.so.0"
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                raise OSError(_errno.ENOENT, f"cannot load libdatawarp ({name}): {e}; install it with "
                              "`make -C libdatawarp install` or set SPILLWAY_LIBDATAWARP") from None
            _declare(lib)
            _lib = lib
        return _lib


def _declare(lib):
    c_char_p, c_int, c_uint, c_void_p = ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
    pp = ctypes.POINTER(c_char_p)
    ip = ctypes.POINTER(c_int)
    sigs = {
        "dw_set_stage_concurrency": [c_char_p, c_uint],
        "dw_stage_file_in": [c_char_p, c_char_p],
        "dw_stage_directory_in": [c_char_p, c_char_p],
        "dw_stage_list_in": [c_char_p, pp],
        "dw_stage_file_out": [c_char_p, c_char_p, c_int],
        "dw_stage_directory_out": [c_char_p, c_char_p, c_int],
        "dw_stage_list_out": [pp, c_char_p, c_int],
        "dw_query_file_stage": [c_char_p, ip, ip, ip, ip],
        "dw_query_directory_stage": [c_char_p, ip, ip, ip, ip],
        "dw_query_list_stage": [pp, ip, ip, ip, ip],
        "dw_wait_file_stage": [c_char_p],
        "dw_wait_directory_stage": [c_char_p],
        "dw_wait_list_stage": [pp],
        "dw_terminate_file_stage": [c_char_p],
        "dw_terminate_directory_stage": [c_char_p],
        "dw_terminate_list_stage": [pp],
        "dw_open_failed_stage": [c_char_p, ctypes.POINTER(c_void_p)],
        "dw_read_failed_stage": [c_void_p, ctypes.c_char_p, c_int, ip],
        "dw_close_failed_stage": [c_void_p],
        "dw_set_stripe_configuration": [c_int, c_int, c_int],
        "dw_get_stripe_configuration": [c_int, ip, ip, ip],
        "dw_wait_sync_complete": [c_int],
        "dw_get_cache_policy": [c_int, ctypes.POINTER(_dw_cache_policy_t)],
        "dw_set_cache_policy": [c_int, ctypes.POINTER(_dw_cache_policy_t)],
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, c_int
    for name, args in {"dw_get_mds_path": [c_char_p, ctypes.c_uint64], "dw_get_accounting_data_json": [c_char_p, ip]}.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, c_void_p  # a malloc'd string: freed here
    lib._libc = ctypes.CDLL(None)
    lib._libc.free.argtypes, lib._libc.free.restype = [c_void_p], None


def _b(path):
    return None if path is None else os.fsencode(path)


def _list(paths):
    paths = [os.fsencode(p) for p in paths]
    arr = (ctypes.c_char_p * (len(paths) + 1))(*paths, None)
    return arr


def _check(rc, path=None):
    if rc < 0:
        if path is None:
            raise OSError(-rc, os.strerror(-rc))
        raise OSError(-rc, os.strerror(-rc), os.fsdecode(path) if isinstance(path, bytes) else str(path))
    return rc


def stage_file_in(dw_file_path, pfs_file_path):
    _check(_library().dw_stage_file_in(_b(dw_file_path), _b(pfs_file_path)), dw_file_path)


def stage_directory_in(dw_directory, pfs_directory):
    _check(_library().dw_stage_directory_in(_b(dw_directory), _b(pfs_directory)), dw_directory)


def stage_list_in(dw_directory, pfs_list):
    _check(_library().dw_stage_list_in(_b(dw_directory), _list(pfs_list)), dw_directory)


def stage_file_out(dw_file_path, pfs_file_path, stage_type=IMMEDIATE):
    _check(_library().dw_stage_file_out(_b(dw_file_path), _b(pfs_file_path), int(stage_type)), dw_file_path)


def stage_directory_out(dw_directory, pfs_directory, stage_type=IMMEDIATE):
    _check(_library().dw_stage_directory_out(_b(dw_directory), _b(pfs_directory), int(stage_type)), dw_directory)


def stage_list_out(dw_list, pfs_directory, stage_type=IMMEDIATE):
    _check(_library().dw_stage_list_out(_list(dw_list), _b(pfs_directory), int(stage_type)))


def _query(fn, arg, path):
    c, p, d, f = (ctypes.c_int() for _ in range(4))
    _check(fn(arg, ctypes.byref(c), ctypes.byref(p), ctypes.byref(d), ctypes.byref(f)), path)
    return StageCounts(c.value, p.value, d.value, f.value)


def query_file_stage(dw_file_path):
    return _query(_library().dw_query_file_stage, _b(dw_file_path), dw_file_path)


def query_directory_stage(dw_directory_path):
    return _query(_library().dw_query_directory_stage, _b(dw_directory_path), dw_directory_path)


def query_list_stage(dw_list):
    return _query(_library().dw_query_list_stage, _list(dw_list), None)


def wait_file_stage(dw_file_path):
    _check(_library().dw_wait_file_stage(_b(dw_file_path)), dw_file_path)


def wait_directory_stage(dw_directory_path):
    _check(_library().dw_wait_directory_stage(_b(dw_directory_path)), dw_directory_path)


def wait_list_stage(dw_list):
    _check(_library().dw_wait_list_stage(_list(dw_list)))


def terminate_file_stage(dw_file_path):
    _check(_library().dw_terminate_file_stage(_b(dw_file_path)), dw_file_path)


def terminate_directory_stage(dw_directory_path):
    _check(_library().dw_terminate_directory_stage(_b(dw_directory_path)), dw_directory_path)


def terminate_list_stage(dw_list):
    _check(_library().dw_terminate_list_stage(_list(dw_list)))


def failed_stages(dw_instance_path):
    """The failed stages under a path: a list of (path, errno) with a positive errno."""
    lib = _library()
    handle = ctypes.c_void_p()
    _check(lib.dw_open_failed_stage(_b(dw_instance_path), ctypes.byref(handle)), dw_instance_path)
    out = []
    try:
        buf = ctypes.create_string_buffer(4096)
        err = ctypes.c_int()
        while True:
            n = _check(lib.dw_read_failed_stage(handle, buf, len(buf), ctypes.byref(err)))
            if n == 0:
                return out
            out.append((os.fsdecode(buf.value), -err.value))
    finally:
        lib.dw_close_failed_stage(handle)


def set_stage_concurrency(dw_instance_path, concurrent_stages):
    _check(_library().dw_set_stage_concurrency(_b(dw_instance_path), int(concurrent_stages)), dw_instance_path)


def get_stripe_configuration(fd):
    s, w, i = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _check(_library().dw_get_stripe_configuration(int(fd), ctypes.byref(s), ctypes.byref(w), ctypes.byref(i)))
    return StripeConfiguration(s.value, w.value, i.value)


def set_stripe_configuration(fd, stripe_size, stripe_width):
    _check(_library().dw_set_stripe_configuration(int(fd), int(stripe_size), int(stripe_width)))


def _take_string(lib, ptr):
    try:
        return os.fsdecode(ctypes.string_at(ptr))
    finally:
        lib._libc.free(ptr)


def get_mds_path(dw_root, key):
    lib = _library()
    ptr = lib.dw_get_mds_path(_b(dw_root), int(key))
    if not ptr:
        raise OSError(_errno.EINVAL, f"{dw_root} is not the root of a burst buffer mount", str(dw_root))
    return _take_string(lib, ptr)


def get_accounting_data_json(path):
    """DataWarp's accounting JSON text ({"realm": {...}}) of the instance holding path."""
    lib = _library()
    code = ctypes.c_int()
    ptr = lib.dw_get_accounting_data_json(_b(path), ctypes.byref(code))
    if not ptr:
        _check(code.value or -_errno.EIO, path)
    return _take_string(lib, ptr)


def wait_sync_complete(fd):
    """Returns once the file's data is on the PFS (a cache instance's), or on the burst
    buffer (a scratch instance's: fsync)."""
    _check(_library().dw_wait_sync_complete(_fd(fd)))


def _fd(f):
    return f if isinstance(f, int) else f.fileno()


def get_cache_policy(fd):
    """The cache policy in effect for an open file or directory of a cache instance (a
    CachePolicy); OSError EOPNOTSUPP elsewhere. fd: a descriptor or an object with fileno()."""
    p = _dw_cache_policy_t()
    _check(_library().dw_get_cache_policy(_fd(fd), ctypes.byref(p)))
    return CachePolicy(p.modified_threshold, p.read_ahead, bool(p.sync_on_close), bool(p.sync_to_pfs))


def set_cache_policy(fd, policy=None, **settings):
    """Sets the cache policy of an open file or directory of a cache instance: a CachePolicy,
    or the current one with some fields changed (set_cache_policy(fd, sync_on_close=True))."""
    cur = policy if policy is not None else get_cache_policy(fd)
    cur = cur._replace(**settings)
    p = _dw_cache_policy_t(int(cur.modified_threshold), int(cur.read_ahead), int(bool(cur.sync_on_close)), int(bool(cur.sync_to_pfs)))
    _check(_library().dw_set_cache_policy(_fd(fd), ctypes.byref(p)))
