#!/bin/bash
#SBATCH --job-name=bb-destroy --nodes=0 --time=5
#BB destroy_persistent name=myproject
# Destroys "myproject" and its data (burst_buffer/datawarp; a zero-node job runs no script).
