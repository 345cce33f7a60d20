#!/bin/bash
# Create a persistent instance named "demo": it outlives this job, and later jobs of yours
# use it with #DW persistentdw name=demo. Under Slurm submit this with sbatch -N0.
#BB create_persistent name=demo capacity=1GiB access_mode=striped type=scratch
echo "persistent instance demo created"
