package directive

import (
	"testing"
)

const striped = "#DW jobdw type=scratch access_mode=striped capacity=1GiB\n" // line 1

func TestStageAccepted(t *testing.T) {
	cases := []struct {
		name string
		src  string
	}{
		{"file in, keys in any order", striped + "#DW stage_in destination=$DW_JOB_STRIPED/a source=/pfs/a type=file\n"},
		{"directory in", striped + "#DW stage_in type=directory source=/pfs/dir destination=$DW_JOB_STRIPED/dir\n"},
		{"into the root directory (KAUST form)", striped + "#DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/\n"},
		{"braced variable", striped + "#DW stage_in type=file source=/pfs/a destination=${DW_JOB_STRIPED}/a\n"},
		{"inner .. that stays inside", striped + "#DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/x/../a\n"},
		{"file out", striped + "#DW stage_out type=file source=$DW_JOB_STRIPED/out destination=/pfs/out\n"},
		{"directory out of the root", striped + "#DW stage_out type=directory source=$DW_JOB_STRIPED destination=/pfs/out\n"},
		{"symbols", striped + "#DW stage_out type=file source=$DW_JOB_STRIPED/out destination=/pfs/out.%j\n"},
		{"%d working directory", striped + "#DW stage_in type=file source=%d/input destination=$DW_JOB_STRIPED/input\n"},
		{"striped,private stages striped", "#DW jobdw access_mode=striped,private capacity=1GiB\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n"},
		{"loadbalance stage_in", "#DW jobdw access_mode=loadbalance capacity=1GiB\n#DW stage_in type=directory source=/ref destination=$DW_JOB_LDBAL/ref\n"},
		{"persistent", "#DW persistentdw name=alpha\n#DW stage_in type=file source=/a destination=$DW_PERSISTENT_STRIPED_alpha/a\n#DW stage_out type=file source=${DW_PERSISTENT_STRIPED_alpha}/b destination=/b\n"},
		{"list in", striped + "#DW stage_in type=list source=/pfs/files.txt destination=$DW_JOB_STRIPED\n"},
		{"list out", striped + "#DW stage_out type=list source=/pfs/outputs.txt destination=/pfs/results\n"},
		{"PFS path with ..", striped + "#DW stage_in type=file source=/pfs/a/../b destination=$DW_JOB_STRIPED/b\n"},
		{"several stages", striped + "#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n#DW stage_in type=file source=/b destination=$DW_JOB_STRIPED/b\n#DW stage_out type=file source=$DW_JOB_STRIPED/c destination=/c\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := accept(t, c.src)
			if len(s.StageIn)+len(s.StageOut) == 0 {
				t.Fatal("no stages")
			}
		})
	}
}

func TestStageFieldsAsWritten(t *testing.T) {
	s := accept(t, striped+"#DW stage_in type=file source=/pfs/a destination=${DW_JOB_STRIPED}/x/../a\n#DW stage_out type=directory source=$DW_JOB_STRIPED/o destination=/pfs/o.%j\n")
	in, out := s.StageIn[0], s.StageOut[0]
	if in != (Stage{Line: 2, Type: "file", Source: "/pfs/a", Destination: "${DW_JOB_STRIPED}/x/../a"}) {
		t.Errorf("%+v", in)
	}
	if out != (Stage{Line: 3, Type: "directory", Source: "$DW_JOB_STRIPED/o", Destination: "/pfs/o.%j"}) {
		t.Errorf("%+v", out)
	}
}

func TestStageErrors(t *testing.T) {
	cases := []struct {
		name  string
		src   string
		line  int
		field string
		has   []string
	}{
		{"missing type", striped + "#DW stage_in source=/a destination=$DW_JOB_STRIPED/a\n", 2, "type", []string{"type is required"}},
		{"missing source", striped + "#DW stage_in type=file destination=$DW_JOB_STRIPED/a\n", 2, "source", []string{"source is required"}},
		{"missing destination", striped + "#DW stage_out type=file source=$DW_JOB_STRIPED/a\n", 2, "destination", []string{"destination is required"}},
		{"bad type", striped + "#DW stage_in type=files source=/a destination=$DW_JOB_STRIPED/a\n", 2, "type", []string{"did you mean file?", "file, directory or list"}},
		{"unknown key", striped + "#DW stage_in type=file src=/a destination=$DW_JOB_STRIPED/a\n", 2, "src", []string{"Unsupported argument - src", "source="}},
		{"relative PFS path", striped + "#DW stage_in type=file source=data/a destination=$DW_JOB_STRIPED/a\n", 2, "source", []string{"must be absolute", "start it with /"}},
		{"env var on PFS side", striped + "#DW stage_in type=file source=$SCRATCH/a destination=$DW_JOB_STRIPED/a\n", 2, "source", []string{"not expanded", "absolute path"}},
		{"tilde", striped + "#DW stage_out type=file source=$DW_JOB_STRIPED/a destination=~/a\n", 2, "destination", []string{"~ is not expanded"}},
		{"wildcard", striped + "#DW stage_in type=file source=/pfs/*.dat destination=$DW_JOB_STRIPED/\n", 2, "source", []string{"wildcards", "type=directory"}},
		{"swapped sides", striped + "#DW stage_in type=file source=$DW_JOB_STRIPED/a destination=/pfs/a\n", 2, "source", []string{"did you swap source and destination?"}},
		{"Slurm doc example /ss path", striped + "#DW stage_in type=file source=/tmp/a destination=/ss/file1\n", 2, "destination", []string{"must be inside a burst buffer", "$DW_JOB_STRIPED/"}},
		{"escape with ..", striped + "#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/../etc/passwd\n", 2, "destination", []string{"paths that escape an instance", ".."}},
		{"escape deeper", striped + "#DW stage_out type=directory source=$DW_JOB_STRIPED/a/../../b destination=/b\n", 2, "source", []string{"paths that escape an instance"}},
		{"private refused", "#DW jobdw access_mode=private capacity=1GiB\n#DW stage_in type=file source=/a destination=$DW_JOB_PRIVATE/a\n", 2, "destination",
			[]string{"not supported for access_mode=private, by design in DataWarp", "striped,private"}},
		{"striped needs striped", "#DW jobdw access_mode=private capacity=1GiB\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n", 2, "destination",
			[]string{"needs access_mode striped", "line 1", "access_mode=striped"}},
		{"striped needs a jobdw", "#DW persistentdw name=p\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n", 2, "destination", []string{"needs a #DW jobdw"}},
		{"ldbal needs loadbalance", striped + "#DW stage_in type=file source=/a destination=$DW_JOB_LDBAL/a\n", 2, "destination", []string{"needs access_mode loadbalance"}},
		{"no stage_out from loadbalance", "#DW jobdw access_mode=ldbalance capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_LDBAL/a destination=/a\n", 2, "source", []string{"read-only"}},
		{"cache is not staged", "#DW jobdw type=cache pfs=/p capacity=1GiB\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n", 2, "destination", []string{"type=cache, which is not staged"}},
		{"cache variable", "#DW jobdw type=cache pfs=/p capacity=1GiB\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED_CACHE/a\n", 2, "destination", []string{"cache buffer (type=cache) is not staged"}},
		{"persistent not attached", striped + "#DW stage_out type=file source=$DW_PERSISTENT_STRIPED_beta/a destination=/a\n", 2, "source", []string{"beta is not attached", "#DW persistentdw name=beta"}},
		{"persistent typo", "#DW persistentdw name=alpha\n#DW stage_in type=file source=/a destination=$DW_PERSISTENT_STRIPED_alpah/a\n", 2, "destination", []string{"did you mean $DW_PERSISTENT_STRIPED_alpha?"}},
		{"created but not attached", "#BB create_persistent name=gamma capacity=1GiB\n#DW jobdw capacity=1GiB\n#DW stage_in type=file source=/a destination=$DW_PERSISTENT_STRIPED_gamma/a\n", 3, "destination",
			[]string{"line 1 creates it", "#DW persistentdw name=gamma"}},
		{"glued variable", striped + "#DW stage_in type=file source=/a destination=$DW_JOB_STRIPEDdata\n", 2, "destination", []string{"not a DataWarp variable", "$DW_JOB_STRIPED/data"}},
		{"braced glued variable", striped + "#DW stage_in type=file source=/a destination=${DW_JOB_STRIPED}data\n", 2, "destination", []string{"expected / after", "${DW_JOB_STRIPED}/data"}},
		{"unterminated brace", striped + "#DW stage_in type=file source=/a destination=${DW_JOB_STRIPED/a\n", 2, "destination", []string{"malformed variable"}},
		{"other variable", striped + "#DW stage_in type=file source=/a destination=$HOME/a\n", 2, "destination", []string{"$HOME is not expanded"}},
		{"bad persistent name in variable", striped + "#DW stage_in type=file source=/a destination=$DW_PERSISTENT_STRIPED_9/a\n", 2, "destination", []string{"not a persistent buffer name"}},
		{"file out of the whole buffer", striped + "#DW stage_out type=file source=$DW_JOB_STRIPED/ destination=/a\n", 2, "source", []string{"type=file needs a file"}},
		{"list file must be on the PFS", striped + "#DW stage_in type=list source=$DW_JOB_STRIPED/l destination=$DW_JOB_STRIPED\n", 2, "source", []string{"not expanded"}},
		{"list out destination on the PFS", striped + "#DW stage_out type=list source=/pfs/l destination=$DW_JOB_STRIPED\n", 2, "destination", []string{"not expanded"}},
		{"trailing backslash", striped + "#DW stage_in type=file source=/a\\ destination=$DW_JOB_STRIPED/a\n", 2, "source", []string{"cannot end with \\"}},
		{"trailing backslash on the burst-buffer side", striped + "#DW stage_in type=file destination=$DW_JOB_STRIPED/a\\ source=/a\n", 2, "destination", []string{"cannot end with \\"}},
		{"quotes", striped + "#DW stage_in type=file source=\"/a b\" destination=$DW_JOB_STRIPED/a\n", 2, "source", []string{"quotes are not understood"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			findFault(t, reject(t, c.src), expectFault{c.line, c.field, c.has})
		})
	}
}

func TestOnlyStagesRefused(t *testing.T) {
	errs := reject(t, "#!/bin/bash\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n#DW stage_out type=file source=$DW_JOB_STRIPED/b destination=/b\n")
	findFault(t, errs, expectFault{2, "", []string{"asks for no burst buffer", "Slurm refuses", "#DW jobdw"}})
	if len(errs.List) != 1 {
		t.Errorf("one clear error expected, got:\n%v", errs)
	}
}

func TestStagePathsCheckedEvenWhenTypeIsWrong(t *testing.T) {
	errs := reject(t, striped+"#DW stage_out type=files source=$DW_JOB_PRIVATE/out destination=out\n")
	findFault(t, errs, expectFault{2, "type", []string{"did you mean file?"}})
	findFault(t, errs, expectFault{2, "source", []string{"access_mode=private"}})
	findFault(t, errs, expectFault{2, "destination", []string{"must be absolute"}})
}

func TestContinuationErrorNamesTheDirective(t *testing.T) {
	errs := reject(t, striped+"#DW stage_in source=/a destination=$DW_JOB_STRIPED/a \\\ntype=file\n")
	findFault(t, errs, expectFault{2, "", []string{"#DW stage_in: the directive ends with"}})
	errs = reject(t, "#DW jobdw capacity=1GiB \\ \n#DW type=scratch\n")
	findFault(t, errs, expectFault{1, "", []string{"#DW jobdw: blanks after"}})
}

func TestFaultyJobDWDoesNotCascade(t *testing.T) {
	errs := reject(t, "#DW jobdw capacity=1XB\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n")
	if len(errs.List) != 1 || errs.List[0].Line != 1 {
		t.Errorf("a faulty jobdw should be the only error:\n%v", errs)
	}
}
