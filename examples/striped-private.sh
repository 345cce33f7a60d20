#!/bin/bash
# One instance, two views: $DW_JOB_STRIPED is shared by every compute node of the job;
# $DW_JOB_PRIVATE is each node's own namespace (other nodes do not see its files). Both
# share the instance's capacity. Private namespaces cannot be staged (as in DataWarp).
#DW jobdw type=scratch access_mode=striped,private capacity=1GiB
set -eu
echo "striped: $DW_JOB_STRIPED"
echo "private: $DW_JOB_PRIVATE"
echo shared > "$DW_JOB_STRIPED/shared.txt"
echo "mine on $(hostname)" > "$DW_JOB_PRIVATE/mine.txt"
ls "$DW_JOB_STRIPED" "$DW_JOB_PRIVATE"
