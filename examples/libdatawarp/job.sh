#!/bin/sh
#DW jobdw type=scratch access_mode=striped capacity=1GiB
# The checkpoint pattern with libdatawarp (docs/libdatawarp.md). Build the program first:
#   cc -o checkpoint checkpoint.c $(pkg-config --cflags --libs cray-datawarp)
# then, with a results directory on the PFS:
#   spillway run job.sh /pfs/me/results
# After the job only the newest checkpoint (ckpt.000100) is in /pfs/me/results.
set -e
results=${1:?give the PFS directory for the checkpoints}
exec "$(dirname "$0")/checkpoint" 100 10 "$results"
