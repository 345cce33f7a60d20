package directive

import (
	"slices"
	"testing"
)

// Scripts as published by DataWarp sites. Directive lines are quoted as published; the
// surrounding #SBATCH lines and commands are shortened.

// NERSC's Cori tutorial (shared/seeds/000, 002), with each continuation line repeating #DW as
// Slurm requires.
func TestNERSCTutorial(t *testing.T) {
	src := "#!/bin/bash\n" +
		"#SBATCH -p regular -N 10 -t 00:10:00\n" +
		"#DW jobdw capacity=1000GB access_mode=striped type=scratch\n" +
		"#DW stage_in source=/lustre/inputs destination=$DW_JOB_STRIPED/inputs \\\n" +
		"#DW type=directory\n" +
		"#DW stage_in source=/lustre/file.dat destination=$DW_JOB_STRIPED/ type=file\n" +
		"#DW stage_out source=$DW_JOB_STRIPED/outputs destination=/lustre/outputs \\\n" +
		"#DW type=directory\n" +
		"srun my.x --indir=$DW_JOB_STRIPED/inputs --infile=$DW_JOB_STRIPED/file.dat \\\n" +
		"--outdir=$DW_JOB_STRIPED/outputs\n"
	s := accept(t, src)
	if s.JobDW.Capacity != 1000e9 || len(s.StageIn) != 2 || len(s.StageOut) != 1 {
		t.Fatalf("%+v", s)
	}
	if s.StageIn[0] != (Stage{Line: 4, Type: "directory", Source: "/lustre/inputs", Destination: "$DW_JOB_STRIPED/inputs"}) {
		t.Errorf("%+v", s.StageIn[0])
	}
	if s.StageOut[0] != (Stage{Line: 7, Type: "directory", Source: "$DW_JOB_STRIPED/outputs", Destination: "/lustre/outputs"}) {
		t.Errorf("%+v", s.StageOut[0])
	}
}

// The same slide as printed: the continuation lines lack #DW. Slurm would end the leading
// block at "type=directory", so the user must hear why, not lose the stage-out silently.
func TestNERSCSlideAsPrinted(t *testing.T) {
	src := "#!/bin/bash\n" +
		"#SBATCH -p regular -N 10 -t 00:10:00\n" +
		"#DW jobdw capacity=1000GB access_mode=striped type=scratch\n" +
		"#DW stage_in source=/lustre/inputs destination=$DW_JOB_STRIPED/inputs \\\n" +
		"type=directory\n" +
		"#DW stage_in source=/lustre/file.dat destination=$DW_JOB_STRIPED/ type=file\n"
	_, err := Parse([]byte(src))
	errs := err.(*Errors)
	findFault(t, errs, expectFault{4, "", []string{"line 5 is a command", "#DW   type=directory"}})
	if !hasWarning(errs.Warnings, 6, "ignored", "line 5") {
		t.Errorf("the stage_in after the broken block is not reported: %v", errs.Warnings)
	}
}

// KAUST SC17 burst-buffer tutorial (intro/*.sh, complex_workflow/persistent_vis/*.sh).
func TestKAUSTTutorial(t *testing.T) {
	accept(t, "#!/bin/bash\n#SBATCH -N 1\n"+
		"#DW jobdw capacity=200GB access_mode=striped type=scratch pool=dev_pool\n"+
		"#DW stage_in source=/global/cscratch1/sd/djbard/SC17_BB_Tutorial_data/spPlates/ destination=$DW_JOB_STRIPED/spPlates/ type=directory\n"+
		"#DW stage_in source=/global/cscratch1/sd/djbard/SC17_BB_Tutorial/intro/readfits.py destination=$DW_JOB_STRIPED/ type=file\n"+
		"#DW stage_in source=/global/cscratch1/sd/djbard/SC17_BB_Tutorial/intro/pmf1k destination=$DW_JOB_STRIPED/ type=file\n")

	s := accept(t, "#!/bin/bash\n\n#### Request a 200GB scratch allocation, striped over BB nodes \n"+
		"#DW jobdw capacity=200GB access_mode=striped type=scratch pool=wlm_pool\n\n"+
		"#### Stage a file out of the BB onto scratch. \n"+
		"#DW stage_out destination=/global/cscratch1/sd/djbard/train/csgf-hpc-day/IntroToBB/data/hello.txt source=$DW_JOB_STRIPED/hello.txt type=file\n\n\n\necho done\n")
	if s.JobDW.Pool != "wlm_pool" || s.StageOut[0].Source != "$DW_JOB_STRIPED/hello.txt" {
		t.Errorf("%+v", s)
	}

	// create_persistent with a trailing blank, then a line of blanks.
	s = accept(t, "#!/bin/bash\n#SBATCH -o \"job_create_persistent.log\"\n\n"+
		"#BB create_persistent name=my_persistent_reservation capacity=300GB access_mode=striped type=scratch \n               \n\necho\n")
	if len(s.Create) != 1 || s.Create[0].Capacity != 300e9 {
		t.Errorf("%+v", s.Create)
	}
	accept(t, "#!/bin/bash\n#BB create_persistent name=george_test capacity=600G access=striped type=scratch\n")
	accept(t, "#!/bin/bash\n#BB destroy_persistent name=george_test\n")
	accept(t, "#!/bin/bash \n\n#SBATCH --partition=workq\n##SBATCH -A k01\n\n#DW persistentdw name=george_test\n\n"+
		"#DW stage_in type=directory source=/project/k01/markomg/burstbuffer/complex/stage_in_bb/  destination=$DW_PERSISTENT_STRIPED_george_test\n\nmodule load python\n")

	// intro/use_persistent.sh has a typo that DataWarp only reported at stage-in time.
	errs := reject(t, "#!/bin/bash\n#SBATCH -N 1\n"+
		"#DW persistentdw name=my_persistent_reservation\n"+
		"#DW stage_in source=/global/cscratch1/sd/djbard/train/csgf-hpc-day/IntroToBB/data  destination=$DW_JPERSISTENT_STRIPED_my_persistent_reservation/data  type=directory\n")
	findFault(t, errs, expectFault{4, "destination", []string{"did you mean $DW_PERSISTENT_STRIPED_my_persistent_reservation?"}})
}

// NERSC BB-unit-tests job scripts (jobdw/, stage_in/, stage_out/, persistTest/).
func TestNERSCUnitTests(t *testing.T) {
	sb := "#!/bin/bash\n#SBATCH -p debug\n#SBATCH -N 1\n#SBATCH -t 00:10:00\n#SBATCH -J x\n#SBATCH --output x.%j.out \n#SBATCH --error x.%j.err\n"
	s := accept(t, sb+"#DW jobdw type=scratch capacity=600GB access_mode=striped\n"+
		"#DW stage_in source=/global/cscratch1/sd/melrom/testSuite/files/100MB destination=$DW_JOB_STRIPED/100MB type=file\n"+
		"#DW stage_in source=/global/cscratch1/sd/melrom/testSuite/files/100GB destination=$DW_JOB_STRIPED/100GB type=file\n"+
		"#DW stage_in source=/global/cscratch1/sd/melrom/testSuite/files/2MB destination=$DW_JOB_STRIPED/2MB type=file\n\nsrun true\n")
	if len(s.StageIn) != 3 || s.StageIn[2].Line != 11 {
		t.Errorf("%+v", s.StageIn)
	}

	// bb_so1.sh puts its stage_out after the commands: Slurm ignores it; Spillway says so.
	s = accept(t, sb+"#DW jobdw type=scratch capacity=600GB access_mode=striped\n\ncd $SLURM_SUBMIT_DIR\nmkdir OutFile\n\n"+
		"#DW stage_out type=file source=$DW_JOB_STRIPED/1MB destination=/global/cscratch1/sd/melrom/testSuite/stage_out/OutFile/1MB\n")
	if len(s.StageOut) != 0 || !hasWarning(s.Warnings, 13, "ignored", "line 10") {
		t.Errorf("%+v %v", s.StageOut, s.Warnings)
	}

	// bb_si3.sh stages into $DW_JOB_STRIPED of a private-only buffer: refused at submit.
	errs := reject(t, sb+"#DW jobdw type=scratch capacity=200GB access_mode=private\n"+
		"#DW stage_in source=/global/cscratch1/sd/melrom/testSuite/files/2MB destination=$DW_JOB_STRIPED/2MB type=file\n")
	findFault(t, errs, expectFault{9, "destination", []string{"needs access_mode striped"}})

	// bb_so3.sh: a stage_out list without a destination, inside the leading block (the
	// commented-out commands are comments).
	errs = reject(t, sb+"#DW jobdw type=scratch capacity=800GB access_mode=striped\n\n#cd $DW_JOB_STRIPED\n#mkdir stageOutArea\n\n"+
		"#DW stage_out type=list source=/global/cscratch1/sd/melrom/testSuite/stage_out/stageOutArea\n\nwait\n")
	findFault(t, errs, expectFault{13, "destination", []string{"destination is required"}})

	s = accept(t, "#!/bin/bash\n#SBATCH -N 1\n#BB create_persistent name=BBSuiteT1 capacity=1TB access=striped type=scratch\n")
	if s.Create[0].Name != "BBSuiteT1" || s.Create[0].Capacity != 1e12 {
		t.Errorf("%+v", s.Create)
	}
	accept(t, "#!/bin/bash\n#DW persistentdw name=BBSuiteT1 \n")
}

// LANL scripts with optimization_strategy (spec [27]) and max_mds (DWS tests).
func TestLANLStyle(t *testing.T) {
	s := accept(t, "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1TiB optimization_strategy=interference max_mds=yes\n")
	if s.JobDW.OptimizationStrategy != "interference" || !s.JobDW.MaxMDS {
		t.Errorf("%+v", s.JobDW)
	}
}

// Cray's CUG 2018 cache paper and the CSCS summer school (client_cache suboption).
func TestCrayCacheExamples(t *testing.T) {
	s := accept(t, "#DW jobdw type=cache access_mode=striped(MFS=10GiB,client_cache) capacity=100TiB pfs=/lus/scratch/me/run\n")
	j := s.JobDW
	if j.Type != "cache" || j.MaxFileSize != 10<<30 || !j.ClientCache || !slices.Equal(j.EnvVars(), []string{VarJobStripedCache}) {
		t.Errorf("%+v", j)
	}
	accept(t, "#DW jobdw type=scratch access_mode=striped(client_cache=yes) capacity=10GiB\n")
}

// What Slurm itself generates and forwards (slurm-datawarp-protocol.md §5.4, §6).
func TestSlurmGenerated(t *testing.T) {
	// srun --bb="capacity=1G access=striped type=scratch swap=2"
	s := accept(t, "#!/bin/bash\n#DW swap 2GiB\n#DW jobdw capacity=1GiB access_mode=striped type=scratch")
	if s.Swap.SizePerNode != 2<<30 || s.JobDW.Capacity != 1<<30 {
		t.Errorf("%+v", s)
	}
	// sbatch --bbf splices the file after the first line.
	accept(t, "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped,private capacity=2GiB\n#SBATCH -o out\nsrun true\n\x00")
	// The observed job (a), before and after symbol replacement.
	orig := "#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n" +
		"#DW stage_in type=file source=/home/bbuser/run/data.in destination=$DW_JOB_STRIPED/data.in\n" +
		"#DW stage_out type=file destination=/home/bbuser/run/data.out.%j source=$DW_JOB_STRIPED/data.out\nsrun ./job\n\x00"
	accept(t, orig)
	memfd := "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n" +
		"#DW stage_in type=file source=/home/bbuser/run/data.in destination=$DW_JOB_STRIPED/data.in\n" +
		"#DW stage_out type=file destination=/home/bbuser/run/data.out.1 source=$DW_JOB_STRIPED/data.out\n"
	s = accept(t, memfd)
	if s.StageOut[0].Destination != "/home/bbuser/run/data.out.1" {
		t.Errorf("%+v", s.StageOut)
	}
}

// Slurm's own burst_buffer.shtml example uses pfs= with type=scratch and a destination that
// is not a burst-buffer path; DataWarp never documented either. Spillway refuses both, by name.
func TestSlurmDocExampleRefused(t *testing.T) {
	errs := reject(t, "#!/bin/bash\n#DW jobdw type=scratch capacity=1GB access_mode=striped,private pfs=/scratch\n"+
		"#DW stage_in type=file source=/tmp/a destination=/ss/file1\n#DW stage_out type=file destination=/tmp/b source=/ss/file1\nsrun application.sh\n")
	findFault(t, errs, expectFault{2, "pfs", []string{"only for type=cache"}})
}
