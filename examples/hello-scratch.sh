#!/bin/bash
# The smallest burst-buffer job: a 1 GiB scratch instance, striped, that lives as long as
# the job. Nothing is staged; whatever the job leaves there is gone at teardown.
#DW jobdw type=scratch access_mode=striped capacity=1GiB
set -eu
echo "hello from $DW_JOB_STRIPED"
echo "hello, burst buffer" > "$DW_JOB_STRIPED/hello.txt"
cat "$DW_JOB_STRIPED/hello.txt"
df -h "$DW_JOB_STRIPED"
