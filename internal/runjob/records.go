package runjob

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// A run record says which process owns a `spillway run` session, so that a run that dies
// (SIGKILL, a crash, a closed terminal it could not survive) leaves enough behind for the next
// command on the home to clean its session up (Reap). One JSON file per run in the home's
// runs directory, written atomically, removed when the session is released.
//
// The owner is a pid plus the process's start time (in clock ticks since boot, from
// /proc/PID/stat): a pid reused by an unrelated process is not mistaken for the run.
type Record struct {
	Token    string    `json:"token"`
	JobID    int64     `json:"job_id"`
	Script   string    `json:"script"`
	PID      int       `json:"pid"`
	PIDStart uint64    `json:"pid_start"` // start time of PID, clock ticks since boot
	Started  time.Time `json:"started"`
	Phase    string    `json:"phase"` // the phase the run was in: job_process, setup, ... teardown
	// JobRan: the job was started (so its stage-out is due). JobPID and JobStart name the
	// job's process (the leader of its process group) while it runs.
	JobRan   bool   `json:"job_ran,omitempty"`
	JobPID   int    `json:"job_pid,omitempty"`
	JobStart uint64 `json:"job_start,omitempty"`
	// StageOut is what the job's #DW stage_out directives ask, so that a run killed during or
	// after its job still gets its stage-out (as a job interrupted under Slurm does).
	StageOut []lifecycle.StageRequest `json:"stage_out,omitempty"`
	// Self and ConnArgs rebuild the commands printed for a kept session (see Commands).
	Self     []string `json:"self"`
	ConnArgs []string `json:"conn_args,omitempty"`

	State    string    `json:"state"`             // see the State constants
	Exit     string    `json:"exit,omitempty"`    // why the owner exited without releasing the session
	Actions  []string  `json:"actions,omitempty"` // what the cleanup did so far
	Note     string    `json:"note,omitempty"`    // what to print about the session (cleanup or kept)
	Reported bool      `json:"reported,omitempty"`
	Updated  time.Time `json:"updated"`
}

// Record states.
const (
	StateRunning  = "running"  // the owner looks after the session (unless it is gone)
	StateExited   = "exited"   // the owner exited without releasing the session; Reap takes over
	StateCleaning = "cleaning" // Reap is staging out or tearing down the session of a gone run
	StateCleaned  = "cleaned"  // Reap released the session; Note waits to be printed
	StateKept     = "kept"     // kept on purpose (failed stage-out): left alone until removed
)

// Records is a home's directory of run records.
type Records struct{ Dir string }

func (rs Records) path(token string) string { return filepath.Join(rs.Dir, token+".json") }

// Begin records a new run owned by this process.
func (rs Records) Begin(token string, jobID int64, script string, self, connArgs []string) (*Record, error) {
	if err := os.MkdirAll(rs.Dir, 0o700); err != nil {
		return nil, err
	}
	start, err := ProcStart(os.Getpid())
	if err != nil {
		return nil, err
	}
	rec := &Record{Token: token, JobID: jobID, Script: script, PID: os.Getpid(), PIDStart: start, Started: time.Now(),
		Phase: "job_process", Self: self, ConnArgs: connArgs, State: StateRunning}
	return rec, rs.Save(rec)
}

// Adopt makes this process the owner of an existing session's record (a retried stage-out),
// creating the record if there is none.
func (rs Records) Adopt(token string, jobID int64, self, connArgs []string) (*Record, error) {
	unlock, err := rs.Lock() // not in the middle of a cleanup pass
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := rs.Load(token)
	if err != nil {
		if rec, err = rs.Begin(token, jobID, "", self, connArgs); err != nil {
			return nil, err
		}
	}
	start, err := ProcStart(os.Getpid())
	if err != nil {
		return nil, err
	}
	rec.PID, rec.PIDStart, rec.Started = os.Getpid(), start, time.Now()
	rec.State, rec.Exit, rec.Note, rec.Reported, rec.Actions = StateRunning, "", "", false, nil
	rec.JobRan, rec.JobPID, rec.JobStart = true, 0, 0 // only a session whose job ran is kept
	rec.Self, rec.ConnArgs = self, connArgs
	return rec, rs.Save(rec)
}

// Save writes a record atomically.
func (rs Records) Save(rec *Record) error {
	rec.Updated = time.Now()
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(rs.Dir, "."+rec.Token+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), rs.path(rec.Token))
}

// Load reads one record.
func (rs Records) Load(token string) (*Record, error) {
	data, err := os.ReadFile(rs.path(token))
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("run record %s: %w", rs.path(token), err)
	}
	return &rec, nil
}

// Remove forgets a run.
func (rs Records) Remove(token string) {
	os.Remove(rs.path(token))
}

// List returns every record, oldest job first. Unreadable files are skipped.
func (rs Records) List() []*Record {
	entries, err := os.ReadDir(rs.Dir)
	if err != nil {
		return nil
	}
	var out []*Record
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		if rec, err := rs.Load(strings.TrimSuffix(name, ".json")); err == nil {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].JobID < out[j].JobID })
	return out
}

// Lock takes the records' lock (one cleanup pass at a time, in any process).
func (rs Records) Lock() (unlock func(), err error) {
	if err := os.MkdirAll(rs.Dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(rs.Dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// ProcStart returns a process's start time in clock ticks since boot (field 22 of
// /proc/PID/stat), which tells a process from a later one that reuses its pid.
func ProcStart(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces and parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); the start time is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// Alive reports whether the process pid started at start still runs. A zombie has finished.
func Alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	got, err := ProcStart(pid)
	if err != nil || got != start {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return false
		}
	}
	return true
}

// killJob kills what is left of a gone run's job: its process group, when the group's
// leader is still the job (same start time) or gone (the kernel does not reuse a pid while
// it names a process group, so only the job's own processes can be in that group then).
func killJob(rec *Record) (bool, error) {
	if rec.JobPID <= 0 {
		return false, nil
	}
	if got, err := ProcStart(rec.JobPID); err == nil && got != rec.JobStart {
		return false, nil // the pid is another process's now, and the group is not the job's
	}
	err := syscall.Kill(-rec.JobPID, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return false, nil
	}
	return err == nil, err
}
