#!/bin/bash
#SBATCH --job-name=bb-demo --nodes=1 --time=5 --output=bb-demo-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=wlm_pool
#DW stage_in type=directory source=%d/input destination=$DW_JOB_STRIPED/input
#DW stage_out type=file source=$DW_JOB_STRIPED/result.txt destination=%d/result-%j.txt
# A burst-buffer job under Slurm: submit it from the directory holding input/
# (sbatch stage-in-out.sh); %d is that directory, %j the job id.
echo "burst buffer: $DW_JOB_STRIPED"
ls -l "$DW_JOB_STRIPED/input"
wc -l "$DW_JOB_STRIPED"/input/* > "$DW_JOB_STRIPED/result.txt"
scontrol show burst | grep -E "JobID=$SLURM_JOB_ID "
