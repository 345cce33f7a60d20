#!/bin/bash
# Stage a directory in before the job starts: its contents (recursively, modes kept) appear
# under $DW_JOB_STRIPED/inputs. The copy runs as you: files you cannot read are refused.
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=directory source=%d/examples/data/inputs destination=$DW_JOB_STRIPED/inputs
set -eu
find "$DW_JOB_STRIPED/inputs" -type f -printf '%M %s %P\n' | sort -k3
