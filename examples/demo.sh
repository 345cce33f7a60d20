#!/bin/bash
# The README's demo: stage a directory in, compute in the burst buffer, stage the results out.
# Run it from the top of the source tree: spillway run examples/demo.sh
# (%d is the directory the job was submitted from, as in Slurm; %j the job id.)
#SBATCH --job-name=spillway-demo
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=directory source=%d/examples/data/inputs destination=$DW_JOB_STRIPED/inputs
#DW stage_out type=directory source=$DW_JOB_STRIPED/results destination=%d/out/demo-%j
set -euo pipefail
echo "burst buffer: $DW_JOB_STRIPED"
df -h "$DW_JOB_STRIPED" | sed 's/^/  /'
echo "staged in:"
(cd "$DW_JOB_STRIPED/inputs" && find . -type f | sort | sed 's/^/  /')
mkdir -p "$DW_JOB_STRIPED/results"
# "Compute": count words in every input, in the burst buffer.
cat "$DW_JOB_STRIPED"/inputs/*.txt | tr ' ' '\n' | grep -v '^$' | sort | uniq -c | sort -rn > "$DW_JOB_STRIPED/results/wordcount.txt"
sha256sum "$DW_JOB_STRIPED"/inputs/*.txt | sed "s#$DW_JOB_STRIPED/##" > "$DW_JOB_STRIPED/results/checksums.txt"
echo "results (staged out to out/demo-$SPILLWAY_JOB_ID after the job):"
head -3 "$DW_JOB_STRIPED/results/wordcount.txt" | sed 's/^/  /'
