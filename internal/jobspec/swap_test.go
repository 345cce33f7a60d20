package jobspec

import (
	"testing"

	"github.com/spillway-hpc/spillway/internal/directive"
)

// TestSbatchNodes: the node count a script asks Slurm for, as Slurm's datawarp plugin counts
// swap (max_nodes, else min_nodes): -N and --nodes in their forms, a range's maximum, the last
// one given; none after the first command; 0 when there is none or it is not a count.
func TestSbatchNodes(t *testing.T) {
	cases := []struct {
		script string
		want   int
	}{
		{"#!/bin/bash\n#SBATCH -N 4\n", 4},
		{"#!/bin/bash\n#SBATCH -N4\n", 4},
		{"#!/bin/bash\n#SBATCH --nodes=2-6 --time=10\n", 6},
		{"#!/bin/bash\n#SBATCH --nodes 3\n#SBATCH -N 5\n", 5},
		{"#!/bin/bash\n#SBATCH --output=x\n#DW swap 1GiB\n", 0},
		{"#!/bin/bash\necho hi\n#SBATCH -N 9\n", 0},
		{"#!/bin/bash\n#SBATCH -N many\n", 0},
		{"#!/bin/bash\n#SBATCH --nodes=99999999999999999999\n", 0},
		{"", 0},
	}
	for _, c := range cases {
		if got := SbatchNodes([]byte(c.script)); got != c.want {
			t.Errorf("%q: %d, want %d", c.script, got, c.want)
		}
	}
}

// TestSetupWithSwap: a job's #DW swap becomes the setup's swap request, reserved for the
// nodes given, in the #DW jobdw's pool when it names none; a job with swap alone has no
// other instance.
func TestSetupWithSwap(t *testing.T) {
	s, err := directive.Parse([]byte("#!/bin/bash\n#DW jobdw capacity=1GiB pool=fast\n#DW swap 2GiB\n"))
	if err != nil {
		t.Fatal(err)
	}
	req, err := Setup(s, "7", "SLURM", 1000, 1000, []string{"cn1", "cn2"})
	if err != nil || req.Swap == nil || req.Swap.SizePerNode != 2<<30 || req.Swap.Nodes != 2 || req.Swap.Pool != "fast" || req.Swap.Line != 3 {
		t.Fatalf("%+v %v", req.Swap, err)
	}
	s, _ = directive.Parse([]byte("#!/bin/bash\n#DW swap 2GiB pool=p2\n"))
	req, err = Setup(s, "8", "SLURM", 1000, 1000, nil)
	if err != nil || req.Instance != nil || req.Swap == nil || req.Swap.Pool != "p2" || req.Swap.Nodes != 0 {
		t.Fatalf("swap alone: %+v %+v %v", req.Instance, req.Swap, err)
	}
	if err := Supported(s); err != nil {
		t.Errorf("#DW swap is refused: %v", err)
	}
}
