// Package stage moves data between the parallel file system (PFS) and a burst-buffer namespace:
// DataWarp's stage_in and stage_out of a file, a directory or a list of files.
//
// Two halves live here. The launcher (Start, Run) runs on the storage agent, which is often
// root; it never touches user data itself. It starts a worker process (WorkerMain, wired as the
// hidden subcommand `spillway stage-worker`) with the job user's uid, gid and supplementary
// groups, so every open, read and write is checked by the kernel against the user's own
// rights. The worker first plans (walks the source: how many files, how many bytes), lets the
// agent reserve that capacity, then copies.
//
// Every access to the burst-buffer side goes through os.Root opened at the namespace root, and
// the last component of every written path is opened with O_NOFOLLOW, so neither ".." nor a
// symbolic link planted in the instance can make a stage read or write outside the instance.
//
// The launcher and the worker talk JSON lines over the worker's stdin and stdout, every line
// of a stage carrying its sequence number S (unique among the agent's stages):
//
//	agent → worker  {StageSpec fields…, "limits":{…}, "seq":S}  one line
//	worker → agent  {"event":"warning","message":"…","seq":S}    any number, at any time
//	worker → agent  {"event":"planning","files":n,"seq":S}       while planning, at most once per ProgressInterval
//	worker → agent  {"event":"plan","files":N,"bytes":B,"charge":C,"seq":S}    once
//	agent → worker  {"go":true,"seq":S}  or  {"refuse":"<reason>","seq":S}  once
//	worker → agent  {"event":"progress","files":n,"bytes":b,"seq":S} at most once per ProgressInterval
//	worker → agent  {"event":"done",…,"seq":S,"more":true} or {"event":"failed","error":"…","seq":S,"more":true}  the stage's last line
//
// After the decision the agent keeps the worker's stdin open; closing it (or SIGTERM) asks the
// worker to stop, remove the file it was writing and report "failed". A worker that sends no
// planning, plan, progress or warning line for StallTimeout is stopped so, and killed with
// SIGKILL CancelGrace later.
//
// "more" says the worker has closed the stage's directories and waits for the next request:
// the agent keeps it for the next stage of the same credential (pool.go) or closes its stdin,
// and it exits. A worker that ends without "more" (stopped, or a protocol error on either side)
// exits; one sent a request without a sequence number serves that stage only.
package stage

import (
	"fmt"
	"time"
)

// Limits bounds everything a stage may consume. The zero value of a field means "use the
// default" (see DefaultLimits); negative values are rejected by Validate. Every field but
// SyncAtEnd comes from the [stage] configuration key named in its comment (docs/config.md),
// and the error messages name that key.
type Limits struct {
	// Timeout (stage.timeout) bounds a whole stage, plan and copy together. DataWarp sites run
	// with Slurm's StageInTimeout/StageOutTimeout of 86400 s, so the default matches.
	Timeout time.Duration
	// StallTimeout (stage.stall_timeout) ends a stage whose worker shows no progress (no file
	// or byte moved, nothing planned) for that long: a source or destination that stopped
	// answering (a user's FUSE server they stalled, a hung PFS) must not hold the stage, and
	// the session's instance, until Timeout.
	StallTimeout time.Duration
	// CancelGrace (stage.cancel_grace) is how long a worker asked to stop (cancel, timeout) may
	// take to remove its partial file and exit before it is killed with SIGKILL.
	CancelGrace time.Duration
	// ProgressInterval (stage.progress_interval) is the shortest gap between two progress
	// lines from the worker.
	ProgressInterval time.Duration
	// ChunkBytes (stage.copy_chunk_size) is how much one copy call moves before the worker
	// updates its counters and checks for cancellation.
	ChunkBytes int64
	// BufferBytes (stage.copy_buffer_size) is the size of the buffer used when the kernel
	// cannot copy between the two files itself (copy_file_range unsupported); one buffer per
	// parallel copy.
	BufferBytes int
	// DefaultParallel (stage.files_in_flight) is how many files are copied at once when the
	// stage does not say.
	DefaultParallel int
	// MaxParallel (stage.max_parallel) caps StageSpec.Parallel; larger requests are lowered to it.
	MaxParallel int
	// MaxEntries (stage.max_files_per_stage) caps the files, directories and links one stage
	// may name (a directory tree or the lines of a list). The plan is kept in the worker's
	// memory, about 100 bytes an entry.
	MaxEntries int
	// MaxListBytes (stage.max_list_size) caps the size of a list file.
	MaxListBytes int64
	// MaxLineBytes (stage.worker_output_limit) caps one line of worker output; a longer line is
	// a protocol error that kills the worker. Messages are shortened by the worker to fit.
	MaxLineBytes int
	// MaxWarnings (stage.max_warnings) caps the warnings kept for one stage; later ones are
	// counted, not kept.
	MaxWarnings int
	// MaxStderrBytes (stage.worker_stderr_limit) caps the worker's standard error kept for
	// diagnosing a crash.
	MaxStderrBytes int
	// SyncAtEnd replaces the fsync of each file as it completes (DataWarp's documented
	// behaviour, the default) by one syncfs of each destination file system when all files are
	// written. Both guarantee every byte is on disk when the stage reports complete; for many
	// small files one flush is far cheaper than one per file. syncfs also flushes other
	// writers' data on that file system, which is why it is not the default.
	SyncAtEnd bool
	// Nice (stage.worker_nice) is the nice value a worker runs at, 0 to 19 (0: the agent's
	// own priority). A copy is background work: it yields the CPU to the data path's server
	// and the controller's requests sharing the node (a libdatawarp call waiting for its
	// answer while the copies of the calls before it run), and takes what they leave.
	Nice int
	// AllowRoot (stage.allow_root) permits stages for uid 0. Off by default: a stage for uid 0
	// is far more often a missing uid (the zero value) than a real root-owned job, and staging
	// as root would bypass every permission on the PFS.
	AllowRoot bool
	// WorkerIdleTimeout (stage.worker_idle_timeout) is how long a worker that ended a stage
	// cleanly waits for the next stage of the same credential before it is told to exit
	// (pool.go): a burst of stages of one user pays for one process, not one each.
	WorkerIdleTimeout time.Duration
	// MaxIdleWorkers (stage.max_idle_workers) caps the workers waiting so, all credentials
	// together; a worker ending a stage when the pool is full exits.
	MaxIdleWorkers int
	// WorkerMaxStages (stage.worker_max_stages) is how many stages one worker serves before it
	// exits, bounding whatever a long-lived worker could gather; 1 starts a worker for every
	// stage.
	WorkerMaxStages int
}

// DefaultLimits returns the limits used for every zero field.
func DefaultLimits() Limits {
	return Limits{
		Timeout:          24 * time.Hour,
		StallTimeout:     10 * time.Minute,
		CancelGrace:      10 * time.Second,
		ProgressInterval: 250 * time.Millisecond,
		ChunkBytes:       64 << 20,
		BufferBytes:      1 << 20,
		DefaultParallel:  8,
		MaxParallel:      64,
		MaxEntries:       2_000_000,
		MaxListBytes:     64 << 20,
		MaxLineBytes:     64 << 10,
		MaxWarnings:      100,
		MaxStderrBytes:   16 << 10,

		WorkerIdleTimeout: 5 * time.Second,
		MaxIdleWorkers:    8,
		WorkerMaxStages:   100,
	}
}

// WithDefaults returns l with every zero field replaced by its default.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.Timeout == 0 {
		l.Timeout = d.Timeout
	}
	if l.StallTimeout == 0 {
		l.StallTimeout = d.StallTimeout
	}
	if l.CancelGrace == 0 {
		l.CancelGrace = d.CancelGrace
	}
	if l.ProgressInterval == 0 {
		l.ProgressInterval = d.ProgressInterval
	}
	if l.ChunkBytes == 0 {
		l.ChunkBytes = d.ChunkBytes
	}
	if l.BufferBytes == 0 {
		l.BufferBytes = d.BufferBytes
	}
	if l.DefaultParallel == 0 {
		l.DefaultParallel = d.DefaultParallel
	}
	if l.MaxParallel == 0 {
		l.MaxParallel = d.MaxParallel
	}
	if l.MaxEntries == 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxListBytes == 0 {
		l.MaxListBytes = d.MaxListBytes
	}
	if l.MaxLineBytes == 0 {
		l.MaxLineBytes = d.MaxLineBytes
	}
	if l.MaxWarnings == 0 {
		l.MaxWarnings = d.MaxWarnings
	}
	if l.MaxStderrBytes == 0 {
		l.MaxStderrBytes = d.MaxStderrBytes
	}
	if l.WorkerIdleTimeout == 0 {
		l.WorkerIdleTimeout = d.WorkerIdleTimeout
	}
	if l.MaxIdleWorkers == 0 {
		l.MaxIdleWorkers = d.MaxIdleWorkers
	}
	if l.WorkerMaxStages == 0 {
		l.WorkerMaxStages = d.WorkerMaxStages
	}
	return l
}

// minLineBytes keeps MaxLineBytes large enough for a plan line and a shortened message.
const minLineBytes = 1024

// Validate reports the first limit that cannot work, naming the field.
func (l Limits) Validate() error {
	type check struct {
		name string
		bad  bool
	}
	for _, c := range []check{
		{"Timeout", l.Timeout < 0},
		{"StallTimeout", l.StallTimeout < 0},
		{"CancelGrace", l.CancelGrace < 0},
		{"ProgressInterval", l.ProgressInterval < 0},
		{"ChunkBytes", l.ChunkBytes < 0},
		{"BufferBytes", l.BufferBytes < 0},
		{"DefaultParallel", l.DefaultParallel < 0},
		{"MaxParallel", l.MaxParallel < 0},
		{"MaxEntries", l.MaxEntries < 0},
		{"MaxListBytes", l.MaxListBytes < 0},
		{"MaxLineBytes", l.MaxLineBytes < 0},
		{"MaxWarnings", l.MaxWarnings < 0},
		{"MaxStderrBytes", l.MaxStderrBytes < 0},
		{"WorkerIdleTimeout", l.WorkerIdleTimeout < 0},
		{"MaxIdleWorkers", l.MaxIdleWorkers < 0},
		{"WorkerMaxStages", l.WorkerMaxStages < 0},
	} {
		if c.bad {
			return fmt.Errorf("staging limit %s is negative; use a positive value, or 0 for the default", c.name)
		}
	}
	if l.Nice < 0 || l.Nice > 19 {
		return fmt.Errorf("staging limit Nice is %d; give a nice value from 0 (the agent's priority) to 19", l.Nice)
	}
	if l.MaxLineBytes > 0 && l.MaxLineBytes < minLineBytes {
		return fmt.Errorf("staging limit MaxLineBytes is %d; it must be at least %d", l.MaxLineBytes, minLineBytes)
	}
	return nil
}

// MaxRequestBytes caps the first line the worker reads (the stage request). A request is a few
// paths and a map of namespace roots, far below this.
const MaxRequestBytes = 1 << 20

// Worker events.
const (
	eventPlan     = "plan"
	eventProgress = "progress"
	// eventPlanning: the worker is still planning; Files is the entries it has listed so far
	// (a sign of life while it walks a large tree).
	eventPlanning = "planning"
	eventWarning  = "warning"
	eventDone     = "done"
	eventFailed   = "failed"
	// eventProtected: a split stage's prepare step removed the source's write bits; Mode is
	// the mode it had (agentapi.StageStatus.ProtectedMode).
	eventProtected = "protected"
)

// event is one line of worker output. Files and Bytes are totals in a plan line and counts
// done so far in progress and done lines.
type event struct {
	Event   string `json:"event"`
	Files   int64  `json:"files"`
	Bytes   uint64 `json:"bytes"`
	Charge  uint64 `json:"charge,omitempty"` // eventPlan: what the bytes take on disk (plan.charge)
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
	Mode    uint32 `json:"mode,omitempty"` // eventProtected
	// Seq is the stage's sequence number (workerRequest.Seq), on every line of the stage.
	Seq uint64 `json:"seq,omitempty"`
	// More, on a final line (done, failed): the worker has closed the stage's directories
	// and waits for another request; without it the worker exits.
	More bool `json:"more,omitempty"`
}

// decision is the agent's answer to a plan.
type decision struct {
	Go     bool   `json:"go,omitempty"`
	Refuse string `json:"refuse,omitempty"`
	Seq    uint64 `json:"seq,omitempty"` // the request's
}
