"""pycheck_cache: the Python package's cache calls inside a job with a cache instance
($DW_JOB_STRIPED_CACHE over the PFS directory argv[1]; tests/e2e/libdatawarp_test.go).
Prints "ok NAME" / "FAIL NAME: ..." and "failures N"."""
import errno
import os
import sys

import spillway_datawarp as dw

failures = 0


def check(name, cond, detail=""):
    global failures
    if cond:
        print("ok", name)
    else:
        failures += 1
        print(f"FAIL {name}: {detail}")
    sys.stdout.flush()


def on_pfs(name, data):
    try:
        with open(os.path.join(pfs, name), "rb") as f:
            return f.read() == data
    except OSError:
        return False


root = os.environ["DW_JOB_STRIPED_CACHE"]
pfs = sys.argv[1]
data = os.urandom((3 << 20) + 77)

with open(os.path.join(root, "p1"), "wb") as f:
    f.write(data)
    f.flush()
    check("written, not yet on the PFS", not on_pfs("p1", data))
    dw.wait_sync_complete(f)
    check("wait_sync_complete: on the PFS", on_pfs("p1", data))
    pol = dw.get_cache_policy(f)
    check("get_cache_policy: the defaults", pol.sync_on_close is False and pol.sync_to_pfs is False, pol)

with open(os.path.join(root, "p2"), "wb") as f:
    dw.set_cache_policy(f, sync_on_close=True, read_ahead=1 << 20)
    pol = dw.get_cache_policy(f)
    check("set_cache_policy, read back", pol.sync_on_close is True and pol.read_ahead == 1 << 20 and pol.sync_to_pfs is False, pol)
    f.write(data)
check("sync_on_close: on the PFS after close", on_pfs("p2", data))

try:
    dw.stage_file_out(os.path.join(root, "p2"), os.path.join(pfs, "p2.out"))
    check("stage_file_out of a cache file: OSError EINVAL", False, "no error")
except OSError as e:
    check("stage_file_out of a cache file: OSError EINVAL", e.errno == errno.EINVAL, e)
print("failures", failures)
sys.exit(failures)
