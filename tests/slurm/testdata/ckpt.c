/*
 * ckpt: a job's checkpoints through libdatawarp, written against Cray's datawarp.h as an
 * application does (tests/slurm/libdatawarp_test.go builds it with
 * `cc ckpt.c $(pkg-config --cflags --libs cray-datawarp)` against the installed library).
 *
 *   ckpt PFS_DIR MIB
 *
 * Writes ckpt.1 (FIRST_FACTOR x MIB MiB), ckpt.2 and ckpt.3 (MIB MiB) into $DW_JOB_STRIPED, mode
 * 0644: ckpt.1 is staged out DW_STAGE_IMMEDIATE, seen write-protected while it runs, and waited
 * for; ckpt.2 and then ckpt.3 are marked DW_STAGE_AT_JOB_END,
 * and ckpt.2's request is revoked. Byte i of ckpt.N is (i * 31 + N) & 0xff.
 *
 * Prints "ok NAME" or "FAIL NAME: ..." per check and "failures N"; exits with N.
 */
#define _GNU_SOURCE
#include <datawarp.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../e2e/testdata/libdatawarp/check.h"


/* ckpt.1 is this many times larger than the others: its stage-out lasts long enough to be seen. */
#define FIRST_FACTOR 6L


static void write_ckpt(const char *p, int n, long mib)
{
	static unsigned char buf[1 << 20];
	long off = 0, b;
	size_t i;
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || fchmod(fd, 0644) != 0) {
		printf("FAIL setup: cannot create %s: %s\n", p, strerror(errno));
		exit(100);
	}
	for (b = 0; b < mib; b++) {
		for (i = 0; i < sizeof(buf); i++, off++)
			buf[i] = (unsigned char)((off * 31 + n) & 0xff);
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
			printf("FAIL setup: writing %s: %s\n", p, strerror(errno));
			exit(100);
		}
	}
	if (close(fd) != 0) {
		printf("FAIL setup: closing %s: %s\n", p, strerror(errno));
		exit(100);
	}
}

int main(int argc, char **argv)
{
	char dw[2048], pfs[2048], ck[3][4096], pck[3][4096];
	const char *root = getenv("DW_JOB_STRIPED");
	int i, rc, c, p, d, f;
	long mib;
	struct stat sb;
	const char *kept[3] = {ck[0], ck[2], NULL};

	if (argc != 3 || root == NULL || (mib = atol(argv[2])) <= 0) {
		fprintf(stderr, "usage: ckpt PFS_DIR MIB (in a job with $DW_JOB_STRIPED)\n");
		return 2;
	}
	snprintf(dw, sizeof(dw), "%s", root);
	snprintf(pfs, sizeof(pfs), "%s", argv[1]);
	for (i = 0; i < 3; i++) {
		snprintf(ck[i], sizeof(ck[i]), "%s%sckpt.%d", dw, dw[strlen(dw) - 1] == '/' ? "" : "/", i + 1);
		snprintf(pck[i], sizeof(pck[i]), "%s/ckpt.%d", pfs, i + 1);
	}

	/* ckpt.1, FIRST_FACTOR times larger: now, and wait for it. While it is staged out it is
	 * write-protected (SEACAS opens it for writing and takes EACCES for "stage-out in
	 * progress"); it is writable again once the stage is over. */
	write_ckpt(ck[0], 1, mib * FIRST_FACTOR);
	rc = dw_stage_file_out(ck[0], pck[0], DW_STAGE_IMMEDIATE);
	CHECK("immediate: stage ckpt.1", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	{
		int protected = 0, polls = 0, fd;
		do {
			fd = open(ck[0], O_WRONLY);
			if (fd >= 0)
				close(fd);
			else if (errno == EACCES)
				protected = 1;
			rc = dw_query_file_stage(ck[0], &c, &p, &d, &f);
			polls++;
		} while (rc == 0 && p > 0 && !protected);
		CHECK("immediate: ckpt.1 write-protected (EACCES) while staged out", protected,
		      "never seen protected in %d polls (rc %d)", polls, rc);
	}
	rc = dw_wait_file_stage(ck[0]);
	CHECK("immediate: wait ckpt.1", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	rc = dw_query_file_stage(ck[0], &c, &p, &d, &f);
	CHECK("immediate: ckpt.1 complete", rc == 0 && c == 1 && p == 0 && d == 0 && f == 0,
	      "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	CHECK("immediate: ckpt.1 on the PFS", stat(pck[0], &sb) == 0 && sb.st_size == (mib * FIRST_FACTOR) << 20,
	      "%s: %s, %lld bytes", pck[0], strerror(errno), (long long)sb.st_size);
	CHECK("immediate: ckpt.1 writable again, the PFS copy with its mode",
	      stat(ck[0], &sb) == 0 && (sb.st_mode & 07777) == 0644 && stat(pck[0], &sb) == 0 && (sb.st_mode & 07777) == 0644,
	      "modes: %o", (unsigned)(sb.st_mode & 07777));

	/* ckpt.2, then ckpt.3: the newest at job end, the previous revoked. */
	write_ckpt(ck[1], 2, mib);
	rc = dw_stage_file_out(ck[1], pck[1], DW_STAGE_AT_JOB_END);
	CHECK("at_job_end: ckpt.2", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	write_ckpt(ck[2], 3, mib);
	rc = dw_stage_file_out(ck[2], pck[2], DW_STAGE_AT_JOB_END);
	CHECK("at_job_end: ckpt.3", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	rc = dw_stage_file_out(ck[1], NULL, DW_REVOKE_STAGE_AT_JOB_END);
	CHECK("revoke: ckpt.2", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	rc = dw_query_file_stage(ck[2], &c, &p, &d, &f);
	CHECK("at_job_end: ckpt.3 deferred", rc == 0 && c == 0 && p == 0 && d == 1 && f == 0,
	      "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	rc = dw_query_file_stage(ck[1], &c, &p, &d, &f);
	CHECK("revoke: ckpt.2 no longer staged", rc == -EINVAL, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	rc = dw_query_list_stage(kept, &c, &p, &d, &f);
	CHECK("query: the checkpoints kept", rc == 0 && c == 1 && p == 0 && d == 1 && f == 0,
	      "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	CHECK("deferred: ckpt.3 not yet on the PFS", access(pck[2], F_OK) != 0, "%s exists", pck[2]);

	printf("failures %d\n", failures);
	return failures;
}
