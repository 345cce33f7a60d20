// Command spillway is the multi-call binary of the Spillway burst buffer: `spillway run`,
// the controller and agent daemons, and DataWarp's dwstat, dwcli and dw_wlm_cli (also under
// those names; the small dw_wlm_cli binary, cmd/dw_wlm_cli, runs those three alone).
package main

import (
	"os"

	"github.com/spillway-hpc/spillway/internal/spillwaycli"
)

func main() {
	os.Exit(spillwaycli.Main(os.Args))
}
