package cli

// dwcli cache: libdatawarp's cache calls from a shell (dw_get_cache_policy,
// dw_set_cache_policy, dw_wait_sync_complete). They work on the mount directly, through the
// attributes a cache instance's mount answers (cache.PolicyXattr, cache.SyncXattr): no
// controller is asked.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

const dwcliCacheUsage = `Usage: dwcli cache policy [--modified-threshold SIZE] [--read-ahead SIZE]
                          [--sync-on-close yes|no|default] [--sync-to-pfs yes|no|default] PATH
       dwcli cache sync PATH...

A cache instance's calls ($DW_JOB_STRIPED_CACHE, #DW jobdw type=cache):
  policy  print the cache policy of a file or directory (the instance's defaults unless set
          on the file, or on the directory it was created in); with settings, set them first
          (the others are kept; "default" goes back to the instance's). A directory's policy
          is taken by the files created in it afterwards.
  sync    return once each file's data is on the PFS (dw_wait_sync_complete)
--json prints one JSON object, {"errno": 0, ...} or {"errno": N, "error": "..."}, and exits
with status N. Off a cache instance: EOPNOTSUPP (sync of a scratch instance's file only
fsyncs it: nothing is kept there for the PFS).

  dwcli cache policy --sync-on-close yes $DW_JOB_STRIPED_CACHE/out
  dwcli cache sync $DW_JOB_STRIPED_CACHE/out/result.h5
`

// cacheErr is a cache command's failure: its errno and a message naming the path.
func cacheErr(path string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = syscall.EIO
	}
	switch errno {
	case syscall.EOPNOTSUPP, syscall.ENODATA:
		return errorfErrno(syscall.EOPNOTSUPP, "%s is not in a cache instance (#DW jobdw type=cache): it has no cache policy", path)
	case syscall.EINVAL:
		return errorfErrno(errno, "%s: %v (a sync is of a regular file; a setting is modified_threshold and read_ahead in bytes, sync_on_close and sync_to_pfs yes or no)", path, errno)
	}
	return errorfErrno(errno, "%s: %v", path, errno)
}

func readPolicy(path string) (cache.Policy, error) {
	buf := make([]byte, 256)
	n, err := unix.Getxattr(path, cache.PolicyXattr, buf)
	if err != nil {
		return cache.Policy{}, cacheErr(path, err)
	}
	o, err := cache.ParseOverride(string(buf[:n]), cache.Override{})
	if err != nil {
		return cache.Policy{}, errorfErrno(syscall.EIO, "%s: the mount answered a policy this dwcli cannot read (%q): %v", path, buf[:n], err)
	}
	return o.Apply(cache.Policy{}), nil
}

func policyJSON(p cache.Policy) map[string]any {
	return map[string]any{"modified_threshold": p.ModifiedThreshold, "read_ahead": p.ReadAhead,
		"sync_on_close": p.SyncOnClose, "sync_to_pfs": p.SyncToPFS}
}

// syncPath is dw_wait_sync_complete of path: fsync, then (a cache's file) the sync attribute.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return cacheErr(path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return cacheErr(path, errors.Unwrap(err))
	}
	fd := int(f.Fd())
	if _, err := unix.Fgetxattr(fd, cache.PolicyXattr, make([]byte, 256)); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENODATA) {
			return nil // not a cache's: the fsync was all
		}
		return cacheErr(path, err)
	}
	for {
		err := unix.Fsetxattr(fd, cache.SyncXattr, []byte("1"), 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return cacheErr(path, err)
		}
		return nil
	}
}

func dwcliCacheMain(args []string, stdout, stderr io.Writer) int {
	fs := NewFlags("dwcli cache", dwcliCacheUsage, stderr)
	asJSON := fs.Bool("json", false, "print JSON and exit with the errno")
	mt := fs.String("modified-threshold", "", "policy: a file's dirty bytes on a server past which they are flushed (SIZE, 0: none, or default)")
	ra := fs.String("read-ahead", "", "policy: bytes read ahead of a sequential reader (SIZE or default)")
	soc := fs.String("sync-on-close", "", "policy: close() returns once the data is on the PFS (yes, no or default)")
	stp := fs.String("sync-to-pfs", "", "policy: fsync() returns once the data is on the PFS (yes, no or default)")
	if len(args) == 0 {
		fmt.Fprint(stdout, dwcliCacheUsage)
		return 64
	}
	if code, ok := ParseInterspersed(fs, args, stdout); !ok {
		if hasJSON(args) {
			return jsonOut(stdout, nil, errorfErrno(syscall.EINVAL, "bad command line; see dwcli cache --help"))
		}
		return code
	}
	finish := func(extra map[string]any, err error) int {
		if *asJSON {
			return jsonOut(stdout, extra, err)
		}
		if err != nil {
			fmt.Fprintln(stderr, "dwcli cache: "+err.Error())
			return 1
		}
		return 0
	}
	mistake := func(format string, a ...any) int {
		err := errorfErrno(syscall.EINVAL, format, a...)
		if *asJSON {
			return jsonOut(stdout, nil, err)
		}
		fmt.Fprintln(stderr, "dwcli cache: "+err.Error())
		return 64
	}
	words := fs.Args()
	if len(words) == 0 {
		return mistake("give policy or sync (dwcli cache --help)")
	}
	verb, paths := words[0], words[1:]
	switch verb {
	case "sync":
		if *mt != "" || *ra != "" || *soc != "" || *stp != "" {
			return mistake("sync takes no policy settings (dwcli cache policy sets them)")
		}
		if len(paths) == 0 {
			return mistake("sync what? give files of a cache instance")
		}
		for _, p := range paths {
			if err := syncPath(p); err != nil {
				return finish(nil, err)
			}
			if !*asJSON {
				fmt.Fprintf(stdout, "%s: synced\n", p)
			}
		}
		return finish(map[string]any{"synced": paths}, nil)
	case "policy":
		if len(paths) != 1 {
			return mistake("policy takes one path, got %d", len(paths))
		}
		p := paths[0]
		var settings []string
		for _, s := range []struct{ key, val string }{{"modified_threshold", *mt}, {"read_ahead", *ra}} {
			if s.val == "" {
				continue
			}
			if s.val == "default" {
				settings = append(settings, s.key+"=default")
				continue
			}
			n, err := units.ParseSize(s.val)
			if err != nil {
				return mistake("--%s %q: %v", strings.ReplaceAll(s.key, "_", "-"), s.val, err)
			}
			settings = append(settings, fmt.Sprintf("%s=%d", s.key, n))
		}
		for _, s := range []struct{ key, val string }{{"sync_on_close", *soc}, {"sync_to_pfs", *stp}} {
			switch s.val {
			case "":
			case "yes", "no", "default":
				settings = append(settings, s.key+"="+s.val)
			default:
				return mistake("--%s %q: expected yes, no or default", strings.ReplaceAll(s.key, "_", "-"), s.val)
			}
		}
		if len(settings) > 0 {
			// A cache's file or directory first: elsewhere the attribute would be stored.
			if _, err := readPolicy(p); err != nil {
				return finish(nil, err)
			}
			if err := unix.Setxattr(p, cache.PolicyXattr, []byte(strings.Join(settings, " ")), 0); err != nil {
				return finish(nil, cacheErr(p, err))
			}
		}
		pol, err := readPolicy(p)
		if err != nil {
			return finish(nil, err)
		}
		if !*asJSON {
			fmt.Fprintln(stdout, pol.Text())
		}
		return finish(map[string]any{"path": p, "policy": policyJSON(pol)}, nil)
	}
	return mistake("unknown command %q: expected policy or sync", verb)
}
