/*
 * dwcheck: checks every libdatawarp function inside a job (tests/e2e/libdatawarp_test.go).
 *
 *   dwcheck all PFS_DIR        every function and documented error; one line per check
 *   dwcheck rotate PFS_DIR     checkpoint rotation: AT_JOB_END on the newest, REVOKE the rest
 *   dwcheck terminate PFS_DIR  terminate a large stage-out while it runs
 *   dwcheck threads PFS_DIR    the same calls from several threads at once
 *   dwcheck direct PFS_DIR     the calls make no child process (no SIGCHLD), leave no
 *                              descriptor open, from 16 threads at once and from a child
 *                              forked while the threads call
 *   dwcheck cache PFS_DIR      a cache instance ($DW_JOB_STRIPED_CACHE over PFS_DIR): sync, policy
 *
 * Prints "ok NAME" or "FAIL NAME: ..." per check and exits with the number of failures.
 * Written against Cray's datawarp.h as a DataWarp user would.
 */
#define _GNU_SOURCE
#include <datawarp.h>

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static const char *dw; /* $DW_JOB_STRIPED, ending in '/' */
static const char *pfs;


/* Paths the checks make, freed at the end (so that valgrind reports only the library's
 * leaks). */
static char *paths[4096];
static int npaths;
static pthread_mutex_t paths_lock = PTHREAD_MUTEX_INITIALIZER;

static char *path(const char *base, const char *rel)
{
	char *p;
	if (asprintf(&p, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/", rel) < 0)
		abort();
	pthread_mutex_lock(&paths_lock);
	if (npaths == 4096)
		abort();
	paths[npaths++] = p;
	pthread_mutex_unlock(&paths_lock);
	return p;
}

static void free_paths(void)
{
	while (npaths > 0)
		free(paths[--npaths]);
}

/* R retries a call of the checks' own that a signal interrupted: on a mount whose servers are
 * on other hosts (a compute node under Slurm) the file system answers an interrupted request
 * with EINTR, and the interval timer below interrupts many. The library's calls are not
 * wrapped: they must not fail with EINTR. */
#define R(call)                                                  \
	({                                                       \
		long r_;                                         \
		while ((r_ = (long)(call)) == -1 && errno == EINTR) \
			;                                        \
		r_;                                              \
	})

static void write_file(const char *p, const char *content)
{
	size_t done = 0, len = strlen(content);
	int fd = (int)R(open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644));
	if (fd < 0) {
		printf("FAIL setup: cannot write %s: %s\n", p, strerror(errno));
		exit(100);
	}
	while (done < len) {
		long n = R(write(fd, content + done, len - done));
		if (n < 0) {
			printf("FAIL setup: cannot write %s: %s\n", p, strerror(errno));
			exit(100);
		}
		done += (size_t)n;
	}
	close(fd); /* EINTR here still closed it; the data went with the writes */
}

/* The buffer is each thread's own: the threads check compares copies from 4 threads at once
 * (a shared buffer let one thread's copy be compared against another's name). */
static char *read_file(const char *p)
{
	static __thread char buf[4096];
	size_t n = 0;
	int fd = (int)R(open(p, O_RDONLY));
	if (fd < 0)
		return NULL;
	for (;;) {
		long k = R(read(fd, buf + n, sizeof(buf) - 1 - n));
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	buf[n] = '\0';
	close(fd);
	return buf;
}

static int same(const char *p, const char *want)
{
	const char *got = read_file(p);
	return got != NULL && strcmp(got, want) == 0;
}

static void check_all(void)
{
	int c, p, d, f, rc;
	char *a = path(dw, "a.dat"), *pa = path(pfs, "a.dat");

	/* stage_file_out, IMMEDIATE, then query and wait */
	write_file(a, "first\n");
	rc = dw_stage_file_out(a, pa, DW_STAGE_IMMEDIATE);
	CHECK("stage_file_out", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	rc = dw_query_file_stage(a, &c, &p, &d, &f);
	CHECK("query_file_stage one state", rc == 0 && c + p + d + f == 1 && d == 0 && f == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	rc = dw_wait_file_stage(a);
	CHECK("wait_file_stage", rc == 0, "rc %d (%s)", rc, strerror(-rc));
	rc = dw_query_file_stage(a, &c, &p, &d, &f);
	CHECK("query_file_stage complete", rc == 0 && c == 1 && p == 0 && d == 0 && f == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	CHECK("stage_file_out copied", same(pa, "first\n"), "PFS has %s", read_file(pa));

	/* a second stage-out after more writes copies the new content */
	write_file(a, "second\n");
	rc = dw_stage_file_out(a, pa, DW_STAGE_IMMEDIATE);
	if (rc == 0)
		rc = dw_wait_file_stage(a);
	CHECK("second stage_file_out copies new content", rc == 0 && same(pa, "second\n"), "rc %d PFS has %s", rc, read_file(pa));

	/* the file stays writable by its owner after the stage */
	{
		struct stat st;
		CHECK("mode restored after stage-out", R(stat(a, &st)) == 0 && (st.st_mode & 0200), "mode %o", st.st_mode);
	}

	/* -ENOENT */
	{
		char *missing = path(dw, "missing.dat"), *pm = path(pfs, "missing.dat");
		rc = dw_stage_file_out(missing, pm, DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out missing file: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_query_file_stage(missing, &c, &p, &d, &f);
		CHECK("query_file_stage missing file: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_wait_file_stage(missing);
		CHECK("wait_file_stage missing file: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_terminate_file_stage(missing);
		CHECK("terminate_file_stage missing file: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_stage_file_in(path(dw, "in-missing.dat"), pm);
		CHECK("stage_file_in missing PFS file: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_stage_file_out(a, "/nonexistent-dir/x", DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out missing PFS directory: -ENOENT", rc == -ENOENT, "rc %d", rc);
	}

	/* -EINVAL */
	{
		char *never = path(dw, "never.dat");
		write_file(never, "x");
		rc = dw_query_file_stage(never, &c, &p, &d, &f);
		CHECK("query_file_stage never staged: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_wait_file_stage(never);
		CHECK("wait_file_stage never staged: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_terminate_file_stage(never);
		CHECK("terminate_file_stage never staged: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_stage_file_out(never, pa, (enum dw_stage_type)7);
		CHECK("stage_file_out bad stage type: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_stage_file_out(NULL, pa, DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out NULL path: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_stage_file_out(never, "relative/path", DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out relative PFS path: error", rc < 0, "rc %d", rc);
		rc = dw_query_file_stage(never, NULL, &p, &d, &f);
		CHECK("query_file_stage NULL count: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_stage_file_out(never, NULL, DW_REVOKE_STAGE_AT_JOB_END);
		CHECK("revoke without a deferred stage: -EINVAL", rc == -EINVAL, "rc %d", rc);
	}

	/* a path outside any instance */
	{
		char *outside = path(pfs, "outside.dat");
		write_file(outside, "x");
		rc = dw_stage_file_out(outside, path(pfs, "o2"), DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out outside any instance: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_query_file_stage(outside, &c, &p, &d, &f);
		CHECK("query_file_stage outside any instance: -EINVAL", rc == -EINVAL, "rc %d", rc);
	}

	/* a PFS destination the user cannot write */
	{
		char *ro = path(pfs, "readonly/a.dat");
		rc = dw_stage_file_out(a, ro, DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out unwritable PFS directory: -EACCES", rc == -EACCES, "rc %d", rc);
		rc = dw_stage_directory_out(dw, path(pfs, "readonly"), DW_STAGE_IMMEDIATE);
		CHECK("stage_directory_out unwritable PFS directory: -EACCES", rc == -EACCES, "rc %d", rc);
	}

	/* stage_file_in */
	{
		char *src = path(pfs, "input.dat"), *dst = path(dw, "input.dat");
		write_file(src, "input\n");
		rc = dw_stage_file_in(dst, src);
		if (rc == 0)
			rc = dw_wait_file_stage(dst);
		CHECK("stage_file_in", rc == 0 && same(dst, "input\n"), "rc %d DW has %s", rc, read_file(dst));
	}

	/* directories */
	{
		char *dir = path(dw, "outdir"), *f1 = path(dw, "outdir/x"), *sub = path(dw, "outdir/sub");
		char *f2 = path(dw, "outdir/sub/y"), *pdir = path(pfs, "outdir");
		R(mkdir(dir, 0755));
		R(mkdir(sub, 0755));
		R(mkdir(pdir, 0755));
		write_file(f1, "x\n");
		write_file(f2, "y\n");
		rc = dw_stage_directory_out(dir, pdir, DW_STAGE_IMMEDIATE);
		CHECK("stage_directory_out", rc == 0, "rc %d", rc);
		rc = dw_wait_directory_stage(dir);
		CHECK("wait_directory_stage", rc == 0, "rc %d", rc);
		rc = dw_query_directory_stage(dir, &c, &p, &d, &f);
		/* DataWarp counts a directory's stages in files: x and sub/y. */
		CHECK("query_directory_stage counts its 2 files", rc == 0 && c == 2 && p == 0 && f == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
		CHECK("stage_directory_out copied recursively", same(path(pfs, "outdir/sub/y"), "y\n"), "PFS has %s", read_file(path(pfs, "outdir/sub/y")));
		rc = dw_stage_directory_out(dir, path(pfs, "no-such-dir"), DW_STAGE_IMMEDIATE);
		CHECK("stage_directory_out missing PFS directory: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_query_directory_stage(path(dw, "no-such-dir"), &c, &p, &d, &f);
		CHECK("query_directory_stage missing: -ENOENT", rc == -ENOENT, "rc %d", rc);

		char *indir = path(dw, "indir");
		R(mkdir(indir, 0755));
		rc = dw_stage_directory_in(indir, pdir);
		if (rc == 0)
			rc = dw_wait_directory_stage(indir);
		CHECK("stage_directory_in", rc == 0 && same(path(dw, "indir/sub/y"), "y\n"), "rc %d", rc);
	}

	/* lists */
	{
		char *l1 = path(dw, "l1"), *l2 = path(dw, "l2"), *pl = path(pfs, "lists");
		const char *list[] = {l1, l2, NULL};
		R(mkdir(pl, 0755));
		write_file(l1, "l1\n");
		write_file(l2, "l2\n");
		rc = dw_stage_list_out(list, pl, DW_STAGE_IMMEDIATE);
		CHECK("stage_list_out", rc == 0, "rc %d", rc);
		rc = dw_wait_list_stage(list);
		CHECK("wait_list_stage", rc == 0, "rc %d", rc);
		rc = dw_query_list_stage(list, &c, &p, &d, &f);
		CHECK("query_list_stage", rc == 0 && c == 2 && p == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
		CHECK("stage_list_out copied", same(path(pfs, "lists/l2"), "l2\n"), "PFS has %s", read_file(path(pfs, "lists/l2")));
		const char *empty[] = {NULL};
		rc = dw_query_list_stage(empty, &c, &p, &d, &f);
		CHECK("query_list_stage empty list: -EINVAL", rc == -EINVAL, "rc %d", rc);

		char *inl = path(dw, "inlist"), *s1 = path(pfs, "lists/l1"), *s2 = path(pfs, "lists/l2");
		const char *pfs_list[] = {s1, s2, NULL};
		R(mkdir(inl, 0755));
		rc = dw_stage_list_in(inl, pfs_list);
		if (rc == 0)
			rc = dw_wait_directory_stage(inl);
		CHECK("stage_list_in", rc == 0 && same(path(dw, "inlist/l1"), "l1\n"), "rc %d", rc);
	}

	/* activate a deferred stage */
	{
		char *b = path(dw, "b.dat"), *pb = path(pfs, "b.dat");
		write_file(b, "b\n");
		rc = dw_stage_file_out(b, pb, DW_STAGE_AT_JOB_END);
		CHECK("stage_file_out AT_JOB_END", rc == 0, "rc %d", rc);
		rc = dw_query_file_stage(b, &c, &p, &d, &f);
		CHECK("query deferred", rc == 0 && d == 1 && c + p + f == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
		CHECK("deferred has not run", access(pb, F_OK) != 0, "the PFS file exists already");
		rc = dw_stage_file_out(b, NULL, DW_ACTIVATE_DEFERRED_STAGE);
		CHECK("ACTIVATE_DEFERRED_STAGE", rc == 0, "rc %d", rc);
		rc = dw_wait_file_stage(b);
		CHECK("activated stage ran", rc == 0 && same(pb, "b\n"), "rc %d", rc);
	}

	/* the failed-stage walk */
	{
		char *e = path(dw, "e.dat"), *pe = path(pfs, "locked/e.dat"), got[4096];
		dw_failed_stage_t *h = NULL;
		int err = 0, n;
		write_file(e, "e\n");
		rc = dw_stage_file_out(e, pe, DW_STAGE_IMMEDIATE);
		CHECK("stage_file_out onto another user's write-protected file is accepted", rc == 0, "rc %d", rc);
		rc = dw_wait_file_stage(e);
		/* As Cray's: 0 once the stage ended, failed or not; the query says it failed. */
		CHECK("wait on a failed stage: 0", rc == 0, "rc %d", rc);
		rc = dw_query_file_stage(e, &c, &p, &d, &f);
		CHECK("query failed", rc == 0 && f == 1 && c + p + d == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
		rc = dw_open_failed_stage(dw, &h);
		CHECK("open_failed_stage", rc == 0 && h != NULL, "rc %d", rc);
		if (h != NULL) {
			n = dw_read_failed_stage(h, got, sizeof(got), &err);
			CHECK("read_failed_stage", n == (int)strlen(e) && strcmp(got, e) == 0 && err < 0,
			      "n %d path %s errno %d", n, got, err);
			CHECK("read_failed_stage errno is -EACCES", err == -EACCES, "errno %d", err);
			n = dw_read_failed_stage(h, got, 4, &err);
			CHECK("read_failed_stage end of walk", n == 0, "n %d", n);
			CHECK("close_failed_stage", dw_close_failed_stage(h) == 0, "nonzero");
		}
		/* re-staging it elsewhere clears the failure */
		rc = dw_stage_file_out(e, path(pfs, "e.dat"), DW_STAGE_IMMEDIATE);
		if (rc == 0)
			rc = dw_wait_file_stage(e);
		CHECK("a re-stage clears the failure", rc == 0, "rc %d", rc);
		rc = dw_open_failed_stage(dw, &h);
		if (rc == 0) {
			n = dw_read_failed_stage(h, got, sizeof(got), &err);
			dw_close_failed_stage(h);
		}
		CHECK("no failed stage left", rc == 0 && n == 0, "rc %d n %d", rc, n);
	}

	/* striping */
	{
		int size, width, start, fd;
		char *s = path(dw, "striped.dat");
		fd = (int)R(open(s, O_CREAT | O_RDWR, 0644));
		rc = dw_get_stripe_configuration(fd, &size, &width, &start);
		CHECK("get_stripe_configuration", rc == 0 && size == 8388608 && width == 1 && start == 0, "rc %d size %d width %d start %d", rc, size, width, start);
		rc = dw_set_stripe_configuration(fd, 1 << 20, 1);
		CHECK("set_stripe_configuration", rc == 0, "rc %d", rc);
		/* kept, on an instance of one server too (issue 23 item 10) */
		rc = dw_get_stripe_configuration(fd, &size, &width, &start);
		CHECK("get_stripe_configuration after set: kept", rc == 0 && size == 1 << 20 && width == 1 && start == 0, "rc %d size %d width %d start %d", rc, size, width, start);
		{
			char *d = path(dw, "stripedir");
			char *f;
			int dfd, ffd;
			R(mkdir(d, 0755));
			dfd = (int)R(open(d, O_RDONLY | O_DIRECTORY));
			rc = dw_set_stripe_configuration(dfd, 2 << 20, 1);
			CHECK("set_stripe_configuration on a directory", rc == 0, "rc %d", rc);
			f = path(dw, "stripedir/new.dat");
			ffd = (int)R(open(f, O_CREAT | O_RDWR, 0644));
			rc = dw_get_stripe_configuration(ffd, &size, &width, &start);
			CHECK("a new file takes its directory's stripe configuration", rc == 0 && size == 2 << 20 && width == 1, "rc %d size %d width %d", rc, size, width);
			R(write(ffd, "x", 1));
			rc = dw_set_stripe_configuration(ffd, 1 << 20, 1);
			CHECK("set_stripe_configuration on a file holding data: -EINVAL", rc == -EINVAL, "rc %d", rc);
			close(ffd);
			close(dfd);
		}
		rc = dw_set_stripe_configuration(fd, 1000, 1);
		CHECK("set_stripe_configuration size not a multiple of 4 KiB: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_set_stripe_configuration(fd, 0, 1);
		CHECK("set_stripe_configuration size 0: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_set_stripe_configuration(fd, 1 << 20, 0);
		CHECK("set_stripe_configuration width 0: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_set_stripe_configuration(fd, 1 << 20, 64);
		CHECK("set_stripe_configuration width too large: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_get_stripe_configuration(0, &size, &width, &start);
		CHECK("get_stripe_configuration fd 0: error", rc < 0, "rc %d", rc);
		rc = dw_get_stripe_configuration(9999, &size, &width, &start);
		CHECK("get_stripe_configuration bad fd: -EBADF", rc == -EBADF, "rc %d", rc);
		rc = dw_wait_sync_complete(fd);
		CHECK("wait_sync_complete", rc == 0, "rc %d", rc);
		{
			dw_cache_policy_t pol = {1 << 20, 0, 1, 0};
			rc = dw_get_cache_policy(fd, &pol);
			CHECK("get_cache_policy on scratch: -EOPNOTSUPP", rc == -EOPNOTSUPP, "rc %d", rc);
			rc = dw_set_cache_policy(fd, &pol);
			CHECK("set_cache_policy on scratch: -EOPNOTSUPP", rc == -EOPNOTSUPP, "rc %d", rc);
		}
		close(fd);
		rc = dw_wait_sync_complete(9999);
		CHECK("wait_sync_complete bad fd: -EBADF", rc == -EBADF, "rc %d", rc);
	}

	/* the rest */
	{
		char *m = dw_get_mds_path(dw, 12345), *m2 = dw_get_mds_path(dw, 12345);
		CHECK("get_mds_path", m != NULL && m2 != NULL && strcmp(m, m2) == 0 && strcmp(m, dw) == 0, "got %s", m ? m : "NULL");
		free(m);
		free(m2);
		m = dw_get_mds_path(pfs, 1);
		CHECK("get_mds_path not a mount: NULL", m == NULL, "got %s", m);
		int ecode = 1;
		char *j = dw_get_accounting_data_json(dw, &ecode);
		CHECK("get_accounting_data_json", j != NULL && ecode == 0 && strncmp(j, "{\"realm\":{", 10) == 0 &&
		      strstr(j, "\"server_count\":1") != NULL && strstr(j, "\"capacity\":1073741824") != NULL && j[strlen(j) - 1] == '}' &&
		      strstr(j, "\"bytes_written\":") != NULL && strstr(j, "\"stage_bytes_written\":") != NULL,
		      "ecode %d json %s", ecode, j ? j : "NULL");
		free(j);
		j = dw_get_accounting_data_json(pfs, &ecode);
		CHECK("get_accounting_data_json outside any instance: NULL, -EINVAL", j == NULL && ecode == -EINVAL, "ecode %d", ecode);
		rc = dw_set_stage_concurrency(dw, 4);
		CHECK("set_stage_concurrency", rc == 0, "rc %d", rc);
		rc = dw_set_stage_concurrency(path(dw, "nope"), 4);
		CHECK("set_stage_concurrency missing path: -ENOENT", rc == -ENOENT, "rc %d", rc);
		rc = dw_set_stage_concurrency(dw, 0);
		CHECK("set_stage_concurrency 0: -EINVAL", rc == -EINVAL, "rc %d", rc);
		rc = dw_set_stage_concurrency(dw, 4000000000u);
		CHECK("set_stage_concurrency beyond the maximum: clamped, 0", rc == 0, "rc %d", rc);
		rc = dw_set_stage_concurrency(pfs, 4);
		CHECK("set_stage_concurrency outside any instance: -EINVAL", rc == -EINVAL, "rc %d", rc);
	}
}

/* pattern is n bytes seeded by seed (malloc'd); write_all writes them to fd; holds checks
 * that the file p holds exactly them. */
static char *pattern(size_t n, int seed)
{
	char *b = malloc(n);
	size_t i;
	if (b == NULL)
		abort();
	for (i = 0; i < n; i++)
		b[i] = (char)((i * 131 + (size_t)seed * 7) & 0xff);
	return b;
}

static int write_all(int fd, const char *b, size_t n)
{
	size_t done = 0;
	while (done < n) {
		long k = R(write(fd, b + done, n - done));
		if (k <= 0)
			return -1;
		done += (size_t)k;
	}
	return 0;
}

static int holds(const char *p, const char *want, size_t n)
{
	char *got = malloc(n + 1);
	size_t have = 0;
	int fd = (int)R(open(p, O_RDONLY)), ok;
	if (fd < 0) {
		free(got);
		return 0;
	}
	for (;;) {
		long k = R(read(fd, got + have, n + 1 - have));
		if (k <= 0)
			break;
		have += (size_t)k;
		if (have == n + 1)
			break;
	}
	close(fd);
	ok = have == n && memcmp(got, want, n) == 0;
	free(got);
	return ok;
}

/* A cache instance ($DW_JOB_STRIPED_CACHE over PFS_DIR): dw_wait_sync_complete puts a
 * file's data on the PFS; the cache policy reads back as set and sync_on_close puts the data
 * on the PFS by close; a stage is refused. */
static void check_cache(void)
{
	const char *bb = getenv("DW_JOB_STRIPED_CACHE");
	const size_t n = (3 << 20) + 4321; /* more than one stripe: several extents */
	char *data = pattern(n, 1), *data2 = pattern(n, 2);
	dw_cache_policy_t pol, got;
	int fd, rc;
	if (bb == NULL) {
		printf("FAIL setup: DW_JOB_STRIPED_CACHE is not set\n");
		exit(100);
	}
	fd = (int)R(open(path(bb, "c1"), O_RDWR | O_CREAT | O_TRUNC, 0644));
	if (fd < 0 || write_all(fd, data, n) != 0) {
		printf("FAIL setup: cannot write c1: %s\n", strerror(errno));
		exit(100);
	}
	CHECK("cache: written, not yet on the PFS", !holds(path(pfs, "c1"), data, n), "the PFS holds it before any sync");
	rc = dw_wait_sync_complete(fd);
	CHECK("cache: wait_sync_complete", rc == 0, "rc %d", rc);
	CHECK("cache: after wait_sync_complete the PFS holds the data", holds(path(pfs, "c1"), data, n), "it does not");

	rc = dw_get_cache_policy(fd, &pol);
	CHECK("cache: get_cache_policy (the instance's defaults)", rc == 0 && pol.sync_on_close == 0 && pol.sync_to_pfs == 0,
	      "rc %d sync_on_close %d sync_to_pfs %d", rc, pol.sync_on_close, pol.sync_to_pfs);
	close(fd);

	fd = (int)R(open(path(bb, "c2"), O_RDWR | O_CREAT | O_TRUNC, 0644));
	pol.modified_threshold = 32 << 20;
	pol.read_ahead = 1 << 20;
	pol.sync_on_close = 1;
	pol.sync_to_pfs = 0;
	rc = dw_set_cache_policy(fd, &pol);
	CHECK("cache: set_cache_policy", rc == 0, "rc %d", rc);
	memset(&got, 0xff, sizeof(got));
	rc = dw_get_cache_policy(fd, &got);
	CHECK("cache: get_cache_policy returns what was set",
	      rc == 0 && got.modified_threshold == 32 << 20 && got.read_ahead == 1 << 20 && got.sync_on_close == 1 && got.sync_to_pfs == 0,
	      "rc %d: %llu %llu %d %d", rc, (unsigned long long)got.modified_threshold, (unsigned long long)got.read_ahead,
	      got.sync_on_close, got.sync_to_pfs);
	if (write_all(fd, data2, n) != 0) {
		printf("FAIL setup: cannot write c2: %s\n", strerror(errno));
		exit(100);
	}
	rc = close(fd);
	CHECK("cache: close with sync_on_close", rc == 0, "rc %d errno %d", rc, errno);
	CHECK("cache: after close with sync_on_close the PFS holds the data", holds(path(pfs, "c2"), data2, n), "it does not");

	rc = dw_set_cache_policy(fd, NULL);
	CHECK("cache: set_cache_policy NULL: -EINVAL", rc == -EINVAL, "rc %d", rc);
	rc = dw_get_cache_policy(9999, &got);
	CHECK("cache: get_cache_policy bad fd: -EBADF", rc == -EBADF, "rc %d", rc);
	rc = dw_stage_file_out(path(bb, "c2"), path(pfs, "c2.out"), DW_STAGE_IMMEDIATE);
	CHECK("cache: stage_file_out of a cache file: -EINVAL", rc == -EINVAL, "rc %d", rc);
	rc = dw_stage_directory_in(bb, pfs);
	CHECK("cache: stage_directory_in into a cache: -EINVAL", rc == -EINVAL, "rc %d", rc);
	free(data);
	free(data2);
}

/* Checkpoint rotation as libhio does it: each new checkpoint is staged at job end and the
 * previous one's request revoked; after the job only the newest is on the PFS. */
static void check_rotate(void)
{
	char name[64], prev[4096] = "";
	int i, rc, c, p, d, f;
	for (i = 1; i <= 3; i++) {
		char *ck, *pck;
		snprintf(name, sizeof(name), "ckpt.%d", i);
		ck = path(dw, name);
		pck = path(pfs, name);
		write_file(ck, name);
		rc = dw_stage_file_out(ck, pck, DW_STAGE_AT_JOB_END);
		CHECK("rotate: AT_JOB_END newest", rc == 0, "rc %d", rc);
		if (prev[0] != '\0') {
			rc = dw_stage_file_out(prev, NULL, DW_REVOKE_STAGE_AT_JOB_END);
			CHECK("rotate: REVOKE previous", rc == 0, "rc %d", rc);
		}
		snprintf(prev, sizeof(prev), "%s", ck);
	}
	rc = dw_query_directory_stage(dw, &c, &p, &d, &f);
	CHECK("rotate: one deferred stage", rc == 0 && d == 1 && p == 0 && f == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
}

/* A large stage-out stopped while it runs: the PFS keeps no partial file. */
static void check_terminate(void)
{
	char *big = path(dw, "big.dat"), *pbig = path(pfs, "big.dat");
	int rc, c, p, d, f, fd;
	static char chunk[1 << 20];
	time_t deadline;
	long i, mib = atol(getenv("DWCHECK_BIG_MIB") ? getenv("DWCHECK_BIG_MIB") : "2048");
	memset(chunk, 'z', sizeof(chunk));
	fd = (int)R(open(big, O_CREAT | O_WRONLY | O_TRUNC, 0644));
	for (i = 0; i < mib; i++)
		if (R(write(fd, chunk, sizeof(chunk))) != (ssize_t)sizeof(chunk)) {
			printf("FAIL setup: writing %s: %s\n", big, strerror(errno));
			exit(100);
		}
	close(fd);
	rc = dw_stage_file_out(big, pbig, DW_STAGE_IMMEDIATE);
	CHECK("terminate: stage_file_out", rc == 0, "rc %d", rc);
	/* wait until it runs, and see the file write-protected meanwhile */
	for (deadline = time(NULL) + 10; time(NULL) < deadline;) {
		struct stat st;
		if (R(stat(big, &st)) == 0 && (st.st_mode & 0222) == 0)
			break;
		usleep(1000);
	}
	{
		struct stat st;
		CHECK("terminate: the file is write-protected while it is staged out", R(stat(big, &st)) == 0 && (st.st_mode & 0222) == 0, "mode %o", st.st_mode);
	}
	rc = dw_terminate_file_stage(big);
	CHECK("terminate_file_stage", rc == 0, "rc %d", rc);
	for (deadline = time(NULL) + 60; time(NULL) < deadline;) {
		rc = dw_query_file_stage(big, &c, &p, &d, &f);
		if (rc != 0 || p == 0)
			break;
		usleep(100000);
	}
	CHECK("terminate: stage stopped, not complete", rc == 0 && c == 0 && p == 0 && f == 0, "rc %d c %d p %d d %d f %d", rc, c, p, d, f);
	CHECK("terminate: no partial file on the PFS", access(pbig, F_OK) != 0, "%s exists", pbig);
	{
		struct stat st;
		CHECK("terminate: the file is writable again", R(stat(big, &st)) == 0 && (st.st_mode & 0200), "mode %o", st.st_mode);
	}
}

struct job {
	int n;
	int failed;
};

static void *worker(void *arg)
{
	struct job *j = arg;
	char name[64];
	int k, c, p, d, f;
	for (k = 0; k < 3; k++) {
		char *x, *px;
		snprintf(name, sizeof(name), "t%d.%d", j->n, k);
		x = path(dw, name);
		px = path(pfs, name);
		write_file(x, name);
		int out = dw_stage_file_out(x, px, DW_STAGE_IMMEDIATE), wait = -1, query = -1, ok = 0;
		c = p = d = f = -1;
		if (out == 0)
			wait = dw_wait_file_stage(x);
		if (wait == 0)
			query = dw_query_file_stage(x, &c, &p, &d, &f);
		if (query == 0 && c == 1)
			ok = same(px, name);
		if (!ok) {
			/* which call, and what it said: a rare failure here must explain itself */
			const char *got = query == 0 && c == 1 ? read_file(px) : NULL;
			fprintf(stderr, "threads: %s: stage_out %d, wait %d, query %d (complete %d pending %d deferred %d failed %d), PFS copy %s%s%s\n",
				name, out, wait, query, c, p, d, f, query == 0 && c == 1 ? "differs: " : "not checked",
				got ? "holds " : "", query == 0 && c == 1 ? (got ? got : "cannot be read") : "");
			j->failed++;
		}
	}
	return NULL;
}

static void check_threads(void)
{
	pthread_t t[4];
	struct job jobs[4];
	int i, failed = 0;
	for (i = 0; i < 4; i++) {
		jobs[i].n = i;
		jobs[i].failed = 0;
		pthread_create(&t[i], NULL, worker, &jobs[i]);
	}
	for (i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		failed += jobs[i].failed;
	}
	CHECK("threads: 4 threads stage, wait and query at once", failed == 0, "%d calls failed", failed);
}

/* ---- direct: no helper, threads, fork --------------------------------------------------- */

static volatile sig_atomic_t children; /* SIGCHLDs: each helper process that ended sends one */
static void on_child(int sig) { (void)sig; children++; }

/* open_fds counts the open descriptors; *sockets (if not NULL) those that are sockets. */
static int open_fds_of(int *sockets)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;
	if (sockets != NULL)
		*sockets = 0;
	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL) {
		char link[64], target[256];
		ssize_t k;
		if (e->d_name[0] == '.')
			continue;
		n++;
		snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
		k = readlink(link, target, sizeof(target) - 1);
		if (sockets != NULL && k > 0 && strncmp(target, "socket:", 7) == 0)
			(*sockets)++;
	}
	closedir(d);
	return n - 1; /* the directory's own */
}


struct many {
	int n, failed, calls;
	char what[256];
};

/* many_worker stages out files of its own and asks about them, many calls in a row. */
static void *many_worker(void *arg)
{
	struct many *m = arg;
	int k, q, c, p, d, f, rc;
	for (k = 0; k < 3; k++) {
		char name[64], *x, *px;
		snprintf(name, sizeof(name), "m%d.%d", m->n, k);
		x = path(dw, name);
		px = path(pfs, name);
		write_file(x, name);
		rc = dw_stage_file_out(x, px, DW_STAGE_IMMEDIATE);
		m->calls++;
		if (rc != 0) {
			m->failed++;
			snprintf(m->what, sizeof(m->what), "stage out %s: %s", x, strerror(-rc));
			continue;
		}
		for (q = 0; q < 10; q++) {
			rc = dw_query_file_stage(x, &c, &p, &d, &f);
			m->calls++;
			if (rc != 0 || c + p + d + f != 1) {
				m->failed++;
				snprintf(m->what, sizeof(m->what), "query %s: %d (%d %d %d %d)", x, rc, c, p, d, f);
			}
		}
		rc = dw_wait_file_stage(x);
		m->calls++;
		if (rc != 0 || dw_query_file_stage(x, &c, &p, &d, &f) != 0 || c != 1) {
			m->failed++;
			snprintf(m->what, sizeof(m->what), "wait %s: %d, complete %d", x, rc, c);
		}
	}
	{
		char *never = path(dw, "never-staged-by-threads");
		write_file(never, "x");
		rc = dw_query_file_stage(never, &c, &p, &d, &f);
		m->calls++;
		if (rc != -EINVAL) {
			m->failed++;
			snprintf(m->what, sizeof(m->what), "query of a file never staged: %d, want -EINVAL", rc);
		}
	}
	return NULL;
}

static void check_direct(void)
{
	struct sigaction sa;
	struct many m[16];
	pthread_t t[16];
	int i, c, p, d, f, fds, sockets_before, failed = 0, calls = 0, status = -1;
	char *x = path(dw, "direct.dat"), *px = path(pfs, "direct.dat"), *js;
	dw_failed_stage_t *h = NULL;
	pid_t child;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_child;
	sigaction(SIGCHLD, &sa, NULL);
	fds = open_fds_of(&sockets_before);

	/* every kind of call once: none may run a process */
	write_file(x, "direct\n");
	CHECK("direct: stage out", dw_stage_file_out(x, px, DW_STAGE_IMMEDIATE) == 0, "failed");
	CHECK("direct: wait", dw_wait_file_stage(x) == 0, "failed");
	CHECK("direct: query", dw_query_file_stage(x, &c, &p, &d, &f) == 0 && c == 1, "complete %d", c);
	CHECK("direct: the PFS has the file", same(px, "direct\n"), "%s", px);
	CHECK("direct: stage in", dw_stage_file_in(path(dw, "direct.in"), px) == 0 && dw_wait_file_stage(path(dw, "direct.in")) == 0 &&
	      same(path(dw, "direct.in"), "direct\n"), "failed");
	CHECK("direct: EINVAL for an empty path (not the current directory)", dw_stage_file_out("", px, DW_STAGE_IMMEDIATE) == -EINVAL, "not EINVAL");
	CHECK("direct: EINVAL outside every mount", dw_query_file_stage(pfs, &c, &p, &d, &f) == -EINVAL, "not EINVAL");
	CHECK("direct: ENOENT for a missing source", dw_stage_file_in(path(dw, "none"), path(pfs, "no-such")) == -ENOENT, "not ENOENT");
	CHECK("direct: terminate", dw_terminate_file_stage(x) == 0, "failed");
	CHECK("direct: concurrency", dw_set_stage_concurrency(dw, 4) == 0, "failed");
	CHECK("direct: the failed-stage walk", dw_open_failed_stage(dw, &h) == 0 && dw_close_failed_stage(h) == 0, "failed");
	js = dw_get_accounting_data_json(dw, &c);
	CHECK("direct: accounting", js != NULL && c == 0 && strncmp(js, "{\"realm\":", 9) == 0, "%s", js ? js : "NULL");
	free(js);
	CHECK("direct: no helper process ran", children == 0, "%d processes ended", (int)children);

	/* 16 threads at once */
	for (i = 0; i < 16; i++) {
		memset(&m[i], 0, sizeof(m[i]));
		m[i].n = i;
		pthread_create(&t[i], NULL, many_worker, &m[i]);
	}
	/* a child forked while the threads call: it calls the library itself */
	child = fork();
	if (child == 0) {
		char *cx = path(dw, "forked.dat"), *cpx = path(pfs, "forked.dat");
		int ok;
		write_file(cx, "forked\n");
		ok = dw_stage_file_out(cx, cpx, DW_STAGE_IMMEDIATE) == 0 && dw_wait_file_stage(cx) == 0 &&
		     dw_query_file_stage(cx, &c, &p, &d, &f) == 0 && c == 1 && same(cpx, "forked\n");
		_exit(ok ? 0 : 1);
	}
	for (i = 0; i < 16; i++) {
		pthread_join(t[i], NULL);
		failed += m[i].failed;
		calls += m[i].calls;
		if (m[i].failed)
			printf("  thread %d: %s\n", i, m[i].what);
	}
	while (child > 0 && waitpid(child, &status, 0) < 0 && errno == EINTR)
		;
	CHECK("direct: 16 threads call at once", failed == 0 && calls >= 16 * 37, "%d of %d calls failed", failed, calls);
	CHECK("direct: a child forked while threads call uses the library", child > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "status %d", status);
	{
		/* the library keeps one connection to the controller for the next call, no more */
		int sockets, now = open_fds_of(&sockets);
		CHECK("direct: no descriptor left open but one kept connection", now == fds || (now == fds + 1 && sockets >= 1 + sockets_before),
		      "%d open (%d sockets), %d before (%d sockets)", now, sockets, fds, sockets_before);
	}
}

static void on_alarm(int sig) { (void)sig; }

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: dwcheck all|rotate|terminate|threads|direct|cache PFS_DIR\n");
		return 100;
	}
	dw = getenv("DW_JOB_STRIPED");
	pfs = argv[2];
	if (strcmp(argv[1], "cache") == 0) {
		check_cache();
		free_paths();
		printf("failures %d\n", failures);
		return failures;
	}
	if (dw == NULL) {
		printf("FAIL setup: DW_JOB_STRIPED is not set\n");
		return 100;
	}
	/* Signals arrive during the calls (an interval timer): none may fail with EINTR. */
	{
		struct sigaction sa;
		struct itimerval it = {{0, 5000}, {0, 5000}};
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_alarm;
		sigaction(SIGALRM, &sa, NULL);
		setitimer(ITIMER_REAL, &it, NULL);
	}
	if (strcmp(argv[1], "all") == 0)
		check_all();
	else if (strcmp(argv[1], "rotate") == 0)
		check_rotate();
	else if (strcmp(argv[1], "terminate") == 0)
		check_terminate();
	else if (strcmp(argv[1], "threads") == 0)
		check_threads();
	else if (strcmp(argv[1], "direct") == 0)
		check_direct();
	else
		return 100;
	free_paths();
	printf("failures %d\n", failures);
	return failures;
}
