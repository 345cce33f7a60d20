// Command spillway is the multi-call binary of the Spillway burst buffer: `spillway run`,
// the controller and agent daemons, and DataWarp's dwstat and dwcli (also under those names).
package main

import (
	"os"

	"github.com/spillway-hpc/spillway/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args))
}
