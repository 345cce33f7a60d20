package directive

import (
	"slices"
	"strings"
	"testing"
)

// The control plane of cache instances (issue 20 items 1 and 10): the grammar of
// #DW jobdw type=cache, #BB create_persistent type=cache, a job with a scratch and a cache
// instance, and the exact wording of every refusal (line, field, fix).

func TestCacheJobDWAccepted(t *testing.T) {
	s := accept(t, header+"#DW jobdw type=cache access_mode=ldbal capacity=1TiB pfs=/lustre/me/run/ pool=fast modified_threshold=64MiB read_ahead=8MiB sync_on_close=yes sync_to_pfs=no\n")
	j := s.JobDW
	if j == nil || j.Type != "cache" || j.PFS != "/lustre/me/run" || !slices.Equal(j.AccessModes, []string{"loadbalance"}) ||
		j.ModifiedThreshold != 64<<20 || j.ReadAhead != 8<<20 || !j.SyncOnClose || j.SyncToPFS || j.Pool != "fast" {
		t.Fatalf("got %+v", j)
	}
	if !slices.Equal(j.EnvVars(), []string{VarJobLoadbalanceCache}) {
		t.Errorf("EnvVars = %v", j.EnvVars())
	}
	for _, mode := range []string{"loadbalance", "ldbalance", "ldbal"} {
		s := accept(t, "#DW jobdw type=cache access_mode="+mode+" capacity=1GiB pfs=/p\n")
		if !slices.Equal(s.JobDW.AccessModes, []string{"loadbalance"}) {
			t.Errorf("%s: %v", mode, s.JobDW.AccessModes)
		}
	}
	if s := accept(t, "#DW jobdw type=cache capacity=1GiB pfs=%d/run\n"); s.JobDW.PFS != "%d/run" {
		t.Errorf("pfs with %%d: %q", s.JobDW.PFS)
	}
	if s := accept(t, "#DW jobdw type=cache capacity=1GiB pfs=/\n"); s.JobDW.PFS != "/" {
		t.Errorf("pfs=/: %q", s.JobDW.PFS)
	}
}

// exactErrors parses src and returns every rendered error, one a line.
func exactErrors(t *testing.T, src string) string {
	t.Helper()
	errs := reject(t, src)
	var lines []string
	for _, e := range errs.List {
		lines = append(lines, e.Error())
	}
	return strings.Join(lines, "\n")
}

func TestCacheRefusalsExact(t *testing.T) {
	cases := []struct{ src, want string }{
		{"#DW jobdw type=cache access_mode=striped,private capacity=1GiB pfs=/p\n",
			`line 1: #DW jobdw: access_mode=private is not available for type=cache (as in DataWarp): a cache's files are the PFS directory's, which every compute node sees; use access_mode=striped or access_mode=loadbalance`},
		{"#DW jobdw type=cache capacity=1GiB\n",
			`line 1: #DW jobdw: type=cache needs pfs=; add pfs=<absolute PFS directory to cache>, e.g. pfs=/lustre/me/run1`},
		{"#DW jobdw type=cache capacity=1GiB pfs=lustre/me\n",
			`line 1: #DW jobdw: pfs="lustre/me": a PFS path must be absolute; start it with /, e.g. /lustre/scratch/me/lustre/me`},
		{"#DW jobdw type=cache capacity=1GiB pfs=/lustre/me/../other\n",
			`line 1: #DW jobdw: pfs="/lustre/me/../other" contains "..": the site's allowed directories are matched against the path as written; write the directory itself, e.g. pfs=/lustre/other`},
		{"#DW jobdw type=cache capacity=1GiB pfs=/lustre//me/./run\n",
			`line 1: #DW jobdw: pfs="/lustre//me/./run" is not in clean form (an empty or "." component); write pfs=/lustre/me/run`},
		{"#DW jobdw type=cache capacity=1GiB pfs=%d/../x\n",
			`line 1: #DW jobdw: pfs="%d/../x" contains "..": the site's allowed directories are matched against the path as written; write the directory itself, e.g. pfs=%d/x`},
		{"#DW jobdw type=scratch capacity=1GiB pfs=/p\n",
			`line 1: #DW jobdw: pfs= is only for type=cache: a scratch buffer starts empty; remove pfs= and copy data in with #DW stage_in, or use type=cache`},
		{"#DW jobdw capacity=1GiB read_ahead=1MiB\n",
			`line 1: #DW jobdw: read_ahead is a cache tunable, only for type=cache; remove read_ahead, or use type=cache pfs=<dir>`},
		{"#DW jobdw capacity=1GiB modified_threshold=1MiB sync_on_close=yes\n",
			"line 1: #DW jobdw: modified_threshold is a cache tunable, only for type=cache; remove modified_threshold, or use type=cache pfs=<dir>\n" +
				`line 1: #DW jobdw: sync_on_close is a cache tunable, only for type=cache; remove sync_on_close, or use type=cache pfs=<dir>`},
		{"#BB create_persistent name=c capacity=1GiB type=cache access_mode=private pfs=/p\n",
			`line 1: #BB create_persistent: access_mode=private is not available for a persistent buffer (as in DataWarp): each job's compute nodes would get namespaces no other job sees; use access_mode=striped (or loadbalance); for a private view, ask for it per job: #DW jobdw access_mode=striped,private`},
		{"#BB create_persistent name=c capacity=1GiB type=cache\n",
			`line 1: #BB create_persistent: type=cache needs pfs=; add pfs=<absolute PFS directory to cache>, e.g. pfs=/lustre/me/project`},
		{"#BB create_persistent name=c capacity=1GiB pfs=/p\n",
			`line 1: #BB create_persistent: pfs= is only for type=cache: a scratch buffer starts empty; remove pfs=, or add type=cache`},
		{"#BB create_persistent name=c capacity=1GiB type=cache pfs=/a/..\n",
			`line 1: #BB create_persistent: pfs="/a/.." contains "..": the site's allowed directories are matched against the path as written; write the directory itself, e.g. pfs=/`},
	}
	for _, c := range cases {
		if got := exactErrors(t, c.src); got != c.want {
			t.Errorf("%q:\ngot  %s\nwant %s", c.src, got, c.want)
		}
	}
}

func TestScratchAndCacheInOneJob(t *testing.T) {
	s := accept(t, header+
		"#DW jobdw type=scratch access_mode=striped capacity=100GiB\n"+
		"#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lustre/me/run\n"+
		"#DW stage_in type=file source=/lustre/me/in destination=$DW_JOB_STRIPED/in\n")
	if len(s.JobDWs) != 2 || s.JobDW != s.JobDWs[0] {
		t.Fatalf("JobDWs = %+v, JobDW = %+v", s.JobDWs, s.JobDW)
	}
	if sc, ca := s.JobDWOfType("scratch"), s.JobDWOfType("cache"); sc == nil || ca == nil || sc.Line != 3 || ca.Line != 4 || ca.PFS != "/lustre/me/run" {
		t.Fatalf("scratch %+v cache %+v", sc, ca)
	}
	// The cache may come first; stages still go to the scratch one.
	s = accept(t, "#DW jobdw type=cache capacity=1TiB pfs=/p\n#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/o\n")
	if s.JobDW.Type != "cache" || s.JobDWOfType("scratch").Line != 2 {
		t.Fatalf("%+v", s.JobDWs)
	}
	if got, want := Format(s), "#DW jobdw type=cache capacity=1TiB pfs=/p\n#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/o\n"; got != want {
		t.Errorf("Format:\n%s\nwant\n%s", got, want)
	}
}

func TestTwoJobDWOfOneTypeExact(t *testing.T) {
	cases := []struct{ src, want string }{
		{"#DW jobdw capacity=1GiB\n#DW jobdw type=scratch capacity=2GiB\n",
			"line 2: #DW jobdw: only one #DW jobdw of type=scratch per job is allowed (the first is on line 1); put all the capacity into one #DW jobdw type=scratch; a job may add one #DW jobdw type=cache access_mode=striped pfs=<dir>, and use #DW persistentdw for other buffers"},
		{"#DW jobdw type=cache capacity=1GiB pfs=/a\n#DW jobdw type=cache capacity=2GiB pfs=/b\n",
			"line 2: #DW jobdw: only one #DW jobdw of type=cache per job is allowed (the first is on line 1); put all the capacity into one #DW jobdw type=cache; a job may add one #DW jobdw type=scratch, and use #DW persistentdw for other buffers"},
		{"#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=2GiB pfs=/b\n#DW jobdw type=cache capacity=3GiB pfs=/c\n",
			"line 3: #DW jobdw: only one #DW jobdw of type=cache per job is allowed (the first is on line 2); put all the capacity into one #DW jobdw type=cache; a job may add one #DW jobdw type=scratch, and use #DW persistentdw for other buffers"},
	}
	for _, c := range cases {
		if got := exactErrors(t, c.src); got != c.want {
			t.Errorf("%q:\ngot  %s\nwant %s", c.src, got, c.want)
		}
	}
}

func TestCacheStagesExact(t *testing.T) {
	cases := []struct{ src, want string }{
		{"#DW jobdw type=cache capacity=1GiB pfs=/p\n#DW stage_in type=file source=/p/a destination=$DW_JOB_STRIPED/a\n",
			"line 2: #DW stage_in: destination=\"$DW_JOB_STRIPED/a\": the #DW jobdw on line 1 is type=cache, which is not staged: it reads and writes its pfs= directory itself; use type=scratch to stage data, or add a #DW jobdw type=scratch access_mode=striped capacity=<size> beside the cache"},
		{"#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=1GiB pfs=/p\n#DW stage_in type=file source=/p/a destination=$DW_JOB_STRIPED_CACHE/a\n",
			"line 3: #DW stage_in: destination=\"$DW_JOB_STRIPED_CACHE/a\": a cache buffer (type=cache) is not staged: it reads and writes its pfs= directory itself; remove the directive, or use type=scratch with $DW_JOB_STRIPED"},
		{"#DW persistentdw name=c\n#DW stage_out type=file source=$DW_PERSISTENT_CACHE_STRIPED_c/a destination=/p/a\n",
			"line 2: #DW stage_out: source=\"$DW_PERSISTENT_CACHE_STRIPED_c/a\": a cache buffer (type=cache) is not staged: it reads and writes its pfs= directory itself; remove the directive, or stage into a scratch buffer"},
	}
	for _, c := range cases {
		if got := exactErrors(t, c.src); got != c.want {
			t.Errorf("%q:\ngot  %s\nwant %s", c.src, got, c.want)
		}
	}
}

func TestPersistentCacheCreate(t *testing.T) {
	s := accept(t, "#BB create_persistent name=proj capacity=10TiB access_mode=striped type=cache pfs=/lustre/proj/\n")
	c := s.Create[0]
	if c.Type != "cache" || c.PFS != "/lustre/proj" || !slices.Equal(c.AccessModes, []string{"striped"}) {
		t.Fatalf("%+v", c)
	}
	if got, want := Format(s), "#BB create_persistent name=proj capacity=10TiB access_mode=striped type=cache pfs=/lustre/proj optimization_strategy=bandwidth\n"; got != want {
		t.Errorf("Format = %q, want %q", got, want)
	}
	if got := PersistentCacheVar("proj", "striped"); got != "DW_PERSISTENT_CACHE_STRIPED_proj" {
		t.Errorf("striped var %q", got)
	}
	if got := PersistentCacheVar("proj", "loadbalance"); got != "DW_PERSISTENT_CACHE_LDBAL_proj" {
		t.Errorf("ldbal var %q", got)
	}
	if v, rest, ok := SplitDWPath("$DW_PERSISTENT_CACHE_LDBAL_proj/x"); !ok || v != "DW_PERSISTENT_CACHE_LDBAL_proj" || rest != "/x" {
		t.Errorf("SplitDWPath: %q %q %v", v, rest, ok)
	}
}
