#!/bin/bash
#SBATCH --job-name=bb-use --nodes=1 --time=5 --output=bb-use-%j.out
#DW persistentdw name=myproject
# Uses the persistent instance "myproject": its files outlive this job.
echo "persistent instance: $DW_PERSISTENT_STRIPED_myproject"
date >> "$DW_PERSISTENT_STRIPED_myproject/log.txt"
cat "$DW_PERSISTENT_STRIPED_myproject/log.txt"
