package directive

import (
	"strings"
	"testing"
)

// A typical batch script: a dozen #SBATCH lines, a jobdw, a few stages, a long body.
var typicalScript = []byte("#!/bin/bash\n" + strings.Repeat("#SBATCH --option=value\n", 12) +
	"#DW jobdw type=scratch access_mode=striped(MFS=16GiB) capacity=2TiB pool=wlm_pool\n" +
	"#DW persistentdw name=reference\n" +
	"#DW stage_in type=directory source=/lustre/me/inputs destination=$DW_JOB_STRIPED/inputs\n" +
	"#DW stage_in type=file source=/lustre/me/config.yaml destination=$DW_JOB_STRIPED/\n" +
	"#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=/lustre/me/out.%j\n" +
	strings.Repeat("srun ./simulation --input $DW_JOB_STRIPED/inputs --output $DW_JOB_STRIPED/out\n", 200) + "\x00")

// A script at the directive limit: 10000 stage_in lines.
var manyDirectives = []byte("#DW jobdw capacity=1TiB\n" +
	strings.Repeat("#DW stage_in type=file source=/lustre/me/file destination=$DW_JOB_STRIPED/file\n", 9999))

func BenchmarkParseTypical(b *testing.B) {
	b.SetBytes(int64(len(typicalScript)))
	for b.Loop() {
		if _, err := Parse(typicalScript); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseManyDirectives(b *testing.B) {
	b.SetBytes(int64(len(manyDirectives)))
	for b.Loop() {
		if _, err := Parse(manyDirectives); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSubstitute(b *testing.B) {
	b.SetBytes(int64(len(typicalScript)))
	s := Symbols{JobID: "123456", User: "alice", WorkDir: "/home/alice/run", JobName: "sim"}
	for b.Loop() {
		Substitute(typicalScript, s)
	}
}

func BenchmarkFormat(b *testing.B) {
	s, err := Parse(typicalScript)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		Format(s)
	}
}
