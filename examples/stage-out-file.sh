#!/bin/bash
# Produce a result in the burst buffer and stage it out after the job ends, to
# out/result-<job id>.txt in the submission directory. The staged-out file is written as you.
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/result.txt destination=%d/out/result-%j.txt
set -eu
date > "$DW_JOB_STRIPED/result.txt"
echo "computed in the burst buffer on $(hostname)" >> "$DW_JOB_STRIPED/result.txt"
echo "wrote $DW_JOB_STRIPED/result.txt; it is staged out after the job"
