#!/bin/bash
#SBATCH --job-name=bb-create --nodes=1 --time=5
#BB create_persistent name=myproject capacity=2GiB access_mode=striped type=scratch
# Creates the persistent instance "myproject" (burst_buffer/datawarp only; with the lua
# plugin use: spillway persistent create myproject --capacity 2GiB).
true
