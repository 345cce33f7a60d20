"""pycheck: the Python package (python/spillway_datawarp) inside a job
(tests/e2e/libdatawarp_test.go). Prints "ok NAME" / "FAIL NAME: ..." and "failures N"."""
import errno
import json
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


def raises(name, want, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        check(name, e.errno == want, f"errno {e.errno} ({e}), want {want}")
        return
    check(name, False, "no error")


root = os.environ["DW_JOB_STRIPED"]
pfs = sys.argv[1]
a = os.path.join(root, "py.dat")
with open(a, "w") as f:
    f.write("python\n")
dw.stage_file_out(a, os.path.join(pfs, "py.dat"))
dw.wait_file_stage(a)
counts = dw.query_file_stage(a)
check("query_file_stage", counts == dw.StageCounts(1, 0, 0, 0), counts)
check("stage_file_out copied", open(os.path.join(pfs, "py.dat")).read() == "python\n")
raises("missing file: OSError ENOENT", errno.ENOENT, dw.query_file_stage, os.path.join(root, "missing"))
never = os.path.join(root, "never")
open(never, "w").close()
raises("never staged: OSError EINVAL", errno.EINVAL, dw.wait_file_stage, never)
raises("outside any instance: OSError EINVAL", errno.EINVAL, dw.stage_file_out, os.path.join(pfs, "py.dat"), "/tmp/x")
raises("unwritable PFS directory: OSError EACCES", errno.EACCES, dw.stage_file_out, a, os.path.join(pfs, "readonly", "x"))
k1, k2 = os.path.join(root, "k1"), os.path.join(root, "k2")
for k in (k1, k2):
    open(k, "w").write(k)
dw.stage_file_out(k1, os.path.join(pfs, "k1"), dw.AT_JOB_END)
dw.stage_file_out(k2, os.path.join(pfs, "k2"), dw.AT_JOB_END)
dw.stage_file_out(k1, None, dw.REVOKE_AT_JOB_END)
check("rotation: one deferred", dw.query_list_stage([k2]) == dw.StageCounts(0, 0, 1, 0), dw.query_list_stage([k2]))
e = os.path.join(root, "e.dat")
open(e, "w").write("e")
dw.stage_file_out(e, os.path.join(pfs, "locked", "e.dat"))
dw.wait_file_stage(e)  # as Cray's: returns once the stage ended, failed or not
check("wait on a failed stage returns; query says failed", dw.query_file_stage(e).failed == 1, dw.query_file_stage(e))
check("failed_stages", dw.failed_stages(root) == [(e, errno.EACCES)], dw.failed_stages(root))
dw.stage_file_out(e, os.path.join(pfs, "e.dat"))
dw.wait_file_stage(e)
with open(os.path.join(root, "s"), "w") as f:
    check("get_stripe_configuration", dw.get_stripe_configuration(f.fileno()) == (8388608, 1, 0))
    raises("get_cache_policy on scratch: OSError EOPNOTSUPP", errno.EOPNOTSUPP, dw.get_cache_policy, f)
    raises("set_cache_policy on scratch: OSError EOPNOTSUPP", errno.EOPNOTSUPP, dw.set_cache_policy, f, dw.CachePolicy(0, 0, True, False))
    dw.wait_sync_complete(f)
check("get_mds_path", dw.get_mds_path(root, 7) == root)
acct = json.loads(dw.get_accounting_data_json(root))
check("get_accounting_data_json", acct["realm"]["server_count"] == 1 and acct["realm"]["namespace_count"] == 1, acct)
check("get_accounting_data_json counters", all(k in acct["realm"]["fragments"][0] for k in ("bytes_written", "bytes_read", "files_created", "write_limit", "max_window_write"))
      and all(k in acct["realm"]["namespaces"][0] for k in ("stage_bytes_read", "stage_bytes_written", "max_offset_written")), acct)
raises("get_accounting_data_json outside: OSError EINVAL", errno.EINVAL, dw.get_accounting_data_json, pfs)
print("failures", failures)
sys.exit(failures)
