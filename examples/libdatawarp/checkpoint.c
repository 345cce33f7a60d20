/*
 * checkpoint.c — the DataWarp checkpoint pattern with libdatawarp.
 *
 * A "simulation" runs STEPS steps and writes a checkpoint every EVERY steps into the burst
 * buffer ($DW_JOB_STRIPED). Each new checkpoint is asked to be staged out to the PFS at the
 * end of the job (DW_STAGE_AT_JOB_END); the previous one's request is then revoked
 * (DW_REVOKE_STAGE_AT_JOB_END) and its file removed from the burst buffer. When the job ends,
 * only the newest checkpoint is copied to the PFS, while the job's own time was spent
 * computing, not copying.
 *
 * Build:  cc -o checkpoint checkpoint.c $(pkg-config --cflags --libs cray-datawarp)
 * Run:    spillway run job.sh /pfs/me/results     (job.sh is next to this file)
 */
#include <datawarp.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, const char *path, int rc)
{
	fprintf(stderr, "checkpoint: %s %s: %s\n", what, path, strerror(-rc));
	exit(1);
}

int main(int argc, char **argv)
{
	const char *bb = getenv("DW_JOB_STRIPED");
	char cur[4096], prev[4096] = "", dest[4096];
	long steps, every, step;
	double state = 0;

	if (argc != 4) {
		fprintf(stderr, "usage: checkpoint STEPS EVERY PFS_DIRECTORY\n");
		return 2;
	}
	if (bb == NULL) {
		fprintf(stderr, "checkpoint: DW_JOB_STRIPED is not set: run me in a job with #DW jobdw\n");
		return 2;
	}
	steps = atol(argv[1]);
	every = atol(argv[2]);
	for (step = 1; step <= steps; step++) {
		state += 1.0 / (double)step; /* the "simulation" */
		if (step % every != 0)
			continue;

		/* 1. write the checkpoint into the burst buffer */
		snprintf(cur, sizeof(cur), "%sckpt.%06ld", bb, step);
		FILE *f = fopen(cur, "w");
		if (f == NULL || fprintf(f, "step %ld state %.12f\n", step, state) < 0 || fclose(f) != 0) {
			perror(cur);
			return 1;
		}

		/* 2. stage the newest at job end */
		snprintf(dest, sizeof(dest), "%s/ckpt.%06ld", argv[3], step);
		int rc = dw_stage_file_out(cur, dest, DW_STAGE_AT_JOB_END);
		if (rc != 0)
			die("stage at job end", cur, rc);

		/* 3. revoke the previous one (after setting the new: a failure in between leaves
		 *    both staged, never neither) and free its space */
		if (prev[0] != '\0') {
			rc = dw_stage_file_out(prev, NULL, DW_REVOKE_STAGE_AT_JOB_END);
			if (rc != 0)
				die("revoke", prev, rc);
			unlink(prev);
		}
		snprintf(prev, sizeof(prev), "%s", cur);
		printf("step %ld: checkpoint %s, staged at job end to %s\n", step, cur, dest);
	}
	return 0;
}
