#!/bin/bash
# Use the persistent instance "demo" (create it first: spillway run examples/persistent-create.sh).
# It appears at $DW_PERSISTENT_STRIPED_demo; files written there stay for the next job.
#DW persistentdw name=demo
set -eu
echo "run at $(date +%T) by job $SPILLWAY_JOB_ID" >> "$DW_PERSISTENT_STRIPED_demo/log.txt"
cat "$DW_PERSISTENT_STRIPED_demo/log.txt"
