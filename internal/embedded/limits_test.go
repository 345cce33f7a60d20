package embedded

import (
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
)

// TestStageLimitsFollowTheConfiguration: every stage worker limit comes from its [stage] key
// (a key that parses but does not reach the worker would be a silent lie).
func TestStageLimitsFollowTheConfiguration(t *testing.T) {
	cfg, err := config.Parse([]byte(`
[stage]
timeout = "2h"
stall_timeout = "20m"
cancel_grace = "3s"
progress_interval = "1s"
copy_chunk_size = "8MiB"
copy_buffer_size = "256KiB"
files_in_flight = 4
max_parallel = 16
max_files_per_stage = 1000
max_list_size = "2MiB"
worker_output_limit = "128KiB"
max_warnings = 7
worker_stderr_limit = "4KiB"
allow_root = true
`), "t.toml", config.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	l := StageLimits(cfg)
	got := []any{l.Timeout, l.StallTimeout, l.CancelGrace, l.ProgressInterval, l.ChunkBytes, l.BufferBytes, l.DefaultParallel, l.MaxParallel,
		l.MaxEntries, l.MaxListBytes, l.MaxLineBytes, l.MaxWarnings, l.MaxStderrBytes, l.AllowRoot}
	want := []any{2 * time.Hour, 20 * time.Minute, 3 * time.Second, time.Second, int64(8 << 20), 256 << 10, 4, 16,
		1000, int64(2 << 20), 128 << 10, 7, 4 << 10, true}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("limit %d: got %v, want %v", i, got[i], want[i])
		}
	}
	if err := l.Validate(); err != nil {
		t.Error(err)
	}
	if err := StageLimits(config.Defaults()).Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}
