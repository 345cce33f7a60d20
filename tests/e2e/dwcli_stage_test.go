package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DataWarp's own grammar of dwcli stage, in a real job on a home, moving real data: the job
// names its session and configuration by id (dwcli ls), stages a PFS directory in with
// --backing-path and --dir, writes, stages a directory out, waits, and queries with
// DataWarp's columns (issue 23 item 6). The job runs as nobody.
func TestDwcliStageDataWarpGrammarInAJob(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	in, out := w.pfsDir("in"), w.pfsDir("out")
	if err := os.WriteFile(filepath.Join(in, "input.dat"), []byte("input\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dw := `"$SPILLWAY_BIN" dwcli stage`
	script := w.script("job.sh", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\nset -e\n"+
		`sess=$("$SPILLWAY_BIN" dwcli ls sessions)`+"\n"+
		`conf=$("$SPILLWAY_BIN" dwcli ls configurations)`+"\n"+
		"mkdir $DW_JOB_STRIPED/input $DW_JOB_STRIPED/results\n"+
		// The mount caches that the file is not there yet (warpfs leases): the stage-in,
		// which writes into the namespace beside its server, must drop that before it ends.
		"if test -e $DW_JOB_STRIPED/input/input.dat; then exit 3; fi\n"+
		dw+" in --session $sess --configuration $conf --backing-path "+in+"/ --dir /input\n"+
		dw+" wait --session $sess --configuration $conf --dir /input\n"+
		"cp $DW_JOB_STRIPED/input/input.dat $DW_JOB_STRIPED/results/copy.dat\n"+
		"echo result > $DW_JOB_STRIPED/results/r.dat\n"+
		// ${path#$DW_JOB_STRIPED}, as DataWarp's scripts wrote it
		`d=$DW_JOB_STRIPED/results; `+dw+" out --session $sess --configuration $conf --backing-path "+out+"/ --dir ${d#$DW_JOB_STRIPED}\n"+
		dw+" wait --session $sess --configuration $conf\n"+
		dw+" query --session $sess --configuration $conf\n")
	r := w.run("run", script)
	if r.code != 0 {
		t.Fatalf("the job:\n%s", r)
	}
	for name, want := range map[string]string{"copy.dat": "input\n", "r.dat": "result\n"} {
		if data, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(data) != want {
			t.Errorf("%s on the PFS: %q %v", name, data, err)
		}
	}
	// The query: DataWarp's header, a line per stage, column 8 "-" once ended.
	var header string
	rows := 0
	for _, line := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "sess":
			header = strings.Join(f, " ")
		case header != "" && len(f) >= 10:
			rows++
			if f[4] != "complete" || f[7] != "-" || f[6] == "0" {
				t.Errorf("query row %q: want complete, files > 0, 8th column -", line)
			}
		}
	}
	if header != "sess conf dir direction state backing_path files remaining bytes error" || rows != 2 {
		t.Errorf("query: header %q, %d rows:\n%s", header, rows, r)
	}
	w.waitNoSessions()
	w.assertClean()
}
