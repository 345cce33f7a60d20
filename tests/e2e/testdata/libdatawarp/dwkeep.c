/*
 * dwkeep: checks libdatawarp's kept connection to the controller
 * (tests/e2e/libdatawarp_keep_test.go).
 *
 *   dwkeep PEER MODE PFS_DIR
 *
 * PEER is the controller as the connections show it: tcp:PORT or unix:PATH. The calls name
 * $DW_JOB_STRIPED's mount. Modes:
 *   seq       two calls in a row share one connection, which stays open between them
 *   threads   8 threads stage, wait and query at once: every answer right; one connection
 *             kept after
 *   fork      a forked child's calls use a connection of its own, not its parent's; the
 *             parent's stays good
 *   setuid    started as root: root keeps nothing; as nobody (seteuid) a call keeps one; as
 *             uid 4242 (seteuid) the next call is 4242's (EINVAL: nobody's mount), on a new
 *             connection; as nobody again, nobody's
 *   pause     a stage-out, then "paused" and a line read from stdin (the test closes the
 *             connection meanwhile: a controller restart, an idle timeout), then another
 *             stage-out: made, once, on a new connection
 *
 * Prints "ok NAME" or "FAIL NAME: ..." per check, "kept N" lines (the kept connection's socket
 * inode after a call, 0 for none), and "failures N"; exits with the number of failures.
 */
#define _GNU_SOURCE
#include <datawarp.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static const char *dw, *pfs, *peer;


/* conns counts this process's connections to the controller; *ino is one's socket inode. */
static int conns(unsigned long *ino)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;
	*ino = 0;
	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		struct stat st;
		int match = 0;
		if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
			continue;
		if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
			continue;
		if (strncmp(peer, "tcp:", 4) == 0 && ss.ss_family == AF_INET)
			match = ntohs(((struct sockaddr_in *)&ss)->sin_port) == atoi(peer + 4);
		else if (strncmp(peer, "tcp:", 4) == 0 && ss.ss_family == AF_INET6)
			match = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) == atoi(peer + 4);
		else if (strncmp(peer, "unix:", 5) == 0 && ss.ss_family == AF_UNIX)
			match = strcmp(((struct sockaddr_un *)&ss)->sun_path, peer + 5) == 0;
		if (match) {
			n++;
			*ino = (unsigned long)st.st_ino;
		}
	}
	closedir(d);
	return n;
}

static unsigned long kept(void)
{
	unsigned long ino;
	int n = conns(&ino);
	printf("kept %lu (%d open)\n", n == 1 ? ino : 0, n);
	return n == 1 ? ino : 0;
}

static int query(void)
{
	int c, p, d, f;
	return dw_query_directory_stage(dw, &c, &p, &d, &f);
}

static char *path(const char *dir, const char *name)
{
	char *p;
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		abort();
	return p;
}

static void write_file(const char *p, const char *text)
{
	FILE *f = fopen(p, "w");
	if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
		perror(p);
		exit(100);
	}
}

/* stage_out stages name out and waits: 0 when made once (its query counts one stage,
 * complete) and the PFS holds it. */
static int stage_out(const char *name)
{
	char *x = path(dw, name), *px = path(pfs, name), got[64] = "";
	int rc, c = -1, p = -1, d = -1, f = -1;
	FILE *in = NULL;
	write_file(x, name);
	rc = dw_stage_file_out(x, px, DW_STAGE_IMMEDIATE);
	if (rc == 0)
		rc = dw_wait_file_stage(x);
	if (rc == 0)
		rc = dw_query_file_stage(x, &c, &p, &d, &f);
	if (rc == 0 && (c != 1 || p + d + f != 0))
		rc = -1000 - c;
	if (rc == 0 && ((in = fopen(px, "r")) == NULL || fgets(got, sizeof(got), in) == NULL || strcmp(got, name) != 0))
		rc = -2000;
	if (in != NULL)
		fclose(in);
	free(x);
	free(px);
	return rc;
}

static void *worker(void *arg)
{
	long n = (long)arg, failed = 0;
	int i;
	for (i = 0; i < 3; i++) {
		char name[64];
		int q;
		snprintf(name, sizeof(name), "t%ld.%d", n, i);
		if (stage_out(name) != 0)
			failed++;
		for (q = 0; q < 5; q++)
			failed += query() != 0;
	}
	return (void *)failed;
}

int main(int argc, char **argv)
{
	const char *mode;
	unsigned long k1, k2, k3;
	if (argc != 4) {
		fprintf(stderr, "usage: dwkeep tcp:PORT|unix:PATH seq|threads|fork|setuid|pause PFS_DIR\n");
		return 100;
	}
	peer = argv[1];
	mode = argv[2];
	pfs = argv[3];
	dw = getenv("DW_JOB_STRIPED");
	if (dw == NULL)
		return 100;
	if (strcmp(mode, "seq") == 0) {
		CHECK("seq: a call", query() == 0, "failed");
		k1 = kept();
		CHECK("seq: another call", query() == 0, "failed");
		k2 = kept();
		CHECK("seq: one connection kept between the calls, used by both", k1 != 0 && k1 == k2, "%lu then %lu", k1, k2);
	} else if (strcmp(mode, "threads") == 0) {
		pthread_t t[8];
		long i, failed = 0;
		for (i = 0; i < 8; i++)
			pthread_create(&t[i], NULL, worker, (void *)i);
		for (i = 0; i < 8; i++) {
			void *r;
			pthread_join(t[i], &r);
			failed += (long)r;
		}
		CHECK("threads: 8 threads' 144 calls at once, every answer right", failed == 0, "%ld failed", failed);
		CHECK("threads: one connection kept after", kept() != 0, "none, or more than one");
	} else if (strcmp(mode, "fork") == 0) {
		pid_t child;
		int status = -1;
		CHECK("fork: the parent's call", query() == 0, "failed");
		k1 = kept();
		child = fork();
		if (child == 0) {
			unsigned long ino;
			int before = conns(&ino), rc = query();
			k2 = kept();
			printf("child: %d connections before its call, rc %d, kept %lu, parent's %lu\n", before, rc, k2, k1);
			_exit(before == 0 && rc == 0 && stage_out("forked") == 0 && k2 != 0 && k2 != k1 ? 0 : 1);
		}
		while (waitpid(child, &status, 0) < 0 && errno == EINTR)
			;
		CHECK("fork: the child's calls on a connection of its own (its parent's closed in it)", WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
		CHECK("fork: the parent's next call", query() == 0, "failed");
		k3 = kept();
		CHECK("fork: the parent's connection kept through the child's calls", k1 != 0 && k3 == k1, "%lu then %lu", k1, k3);
	} else if (strcmp(mode, "setuid") == 0) {
		int rc;
		rc = query();
		CHECK("setuid: root's call keeps nothing", kept() == 0, "a connection kept (rc %d)", rc);
		if (setegid(65534) != 0 || seteuid(65534) != 0)
			return 100;
		CHECK("setuid: as nobody, nobody's mount", query() == 0, "failed");
		k1 = kept();
		CHECK("setuid: nobody's connection kept", k1 != 0, "none");
		if (seteuid(0) != 0 || seteuid(4242) != 0)
			return 100;
		rc = query();
		CHECK("setuid: as uid 4242, the call is 4242's (EINVAL: not one of its jobs)", rc == -EINVAL, "rc %d", rc);
		k2 = kept();
		CHECK("setuid: on a new connection", k2 != k1, "nobody's, %lu", k1);
		if (seteuid(0) != 0 || seteuid(65534) != 0)
			return 100;
		CHECK("setuid: as nobody again, nobody's", query() == 0, "failed");
	} else if (strcmp(mode, "pause") == 0) {
		char line[64];
		int rc = stage_out("before-pause");
		CHECK("pause: a stage-out", rc == 0, "rc %d", rc);
		k1 = kept();
		printf("paused\n");
		fflush(stdout);
		if (fgets(line, sizeof(line), stdin) == NULL)
			return 100;
		rc = stage_out("after-pause");
		CHECK("pause: the next stage-out made, once", rc == 0, "rc %d", rc);
		k2 = kept();
		CHECK("pause: on a new connection", k1 != 0 && k2 != k1, "%lu then %lu", k1, k2);
	} else {
		fprintf(stderr, "dwkeep: no mode %s\n", mode);
		return 100;
	}
	printf("failures %d\n", failures);
	return failures;
}
