/*
 * libdatawarp for Spillway: DataWarp's C API (datawarp.h).
 *
 * Staging calls run `spillway dwcli stage ... --json`, the machine interface of Spillway's
 * in-job staging, with posix_spawn, and read its one JSON object: {"errno": N, ...}. The
 * command finds the mount, the session and the controller from the path, acting as the
 * calling user. Stripe calls work on the user.spillway.layout extended attribute directly.
 *
 * The library keeps no global state: every call is independent and thread-safe. Calls are
 * not interrupted by signals (EINTR is retried; the helper runs in its own process group, so
 * a terminal's Ctrl-C reaches the application, not the helper).
 *
 * The spillway binary is $SPILLWAY_BIN, else "spillway" on the PATH, else
 * SPILLWAY_PREFIX/bin/spillway (the install prefix, set at build time).
 */
#define _GNU_SOURCE
#include "datawarp.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SPILLWAY_PREFIX
#define SPILLWAY_PREFIX "/usr/local"
#endif

#define LAYOUT_XATTR "user.spillway.layout"
#define FUSE_MAGIC 0x65735546 /* a Spillway mount is a FUSE file system */
#define DEFAULT_STRIPE_SIZE 8388608
#define MAX_OUTPUT (16 << 20) /* bound on the helper's answer */

extern char **environ;

/* ---- running the helper ------------------------------------------------------------------ */

/* An answer of the helper: its JSON text (NUL-terminated) or an errno. */
struct answer {
	char *text;
	size_t len;
};

static int debug_enabled(void)
{
	const char *d = secure_getenv("SPILLWAY_DATAWARP_DEBUG");
	return d != NULL && *d != '\0' && strcmp(d, "0") != 0;
}

/* spawn runs the helper with args (after "dwcli stage") and its stdout on a pipe. */
static int spawn(const char *const *args, size_t nargs, pid_t *pid, int *out_fd)
{
	int pipefd[2];
	int rc;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t none, defaults;
	const char **argv;
	const char *bin = secure_getenv("SPILLWAY_BIN");
	size_t i;

	argv = calloc(nargs + 5, sizeof(*argv));
	if (argv == NULL)
		return -ENOMEM;
	argv[0] = "spillway";
	argv[1] = "dwcli";
	argv[2] = "stage";
	argv[3] = "--json";
	for (i = 0; i < nargs; i++)
		argv[4 + i] = args[i];
	argv[4 + nargs] = NULL;

	if (pipe2(pipefd, O_CLOEXEC) != 0) {
		rc = -errno;
		free(argv);
		return rc;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawnattr_init(&attr);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	if (!debug_enabled())
		posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
	/* Own process group: signals meant for the application's group do not kill the helper. */
	sigemptyset(&none);
	sigemptyset(&defaults);
	sigaddset(&defaults, SIGPIPE);
	sigaddset(&defaults, SIGINT);
	sigaddset(&defaults, SIGTERM);
	sigaddset(&defaults, SIGHUP);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &defaults);
	posix_spawnattr_setpgroup(&attr, 0);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);

	if (bin != NULL && *bin != '\0') {
		rc = posix_spawn(pid, bin, &fa, &attr, (char *const *)argv, environ);
	} else {
		rc = posix_spawnp(pid, "spillway", &fa, &attr, (char *const *)argv, environ);
		if (rc == ENOENT)
			rc = posix_spawn(pid, SPILLWAY_PREFIX "/bin/spillway", &fa, &attr, (char *const *)argv, environ);
	}
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	close(pipefd[1]);
	free(argv);
	if (rc != 0) {
		close(pipefd[0]);
		if (debug_enabled())
			fprintf(stderr, "libdatawarp: cannot run spillway (%s): set SPILLWAY_BIN or put spillway on the PATH\n", strerror(rc));
		return -EIO;
	}
	*out_fd = pipefd[0];
	return 0;
}

/* run runs the helper and returns its answer's errno (negated), or -EIO. */
static int run(const char *const *args, size_t nargs, struct answer *ans)
{
	pid_t pid;
	int fd = -1, rc, status = 0;
	size_t cap = 4096;
	ssize_t n;

	ans->text = NULL;
	ans->len = 0;
	rc = spawn(args, nargs, &pid, &fd);
	if (rc != 0)
		return rc;
	ans->text = malloc(cap);
	if (ans->text == NULL) {
		rc = -ENOMEM;
	}
	for (;;) {
		if (ans->text == NULL) {
			char sink[4096]; /* keep reading so that the helper is not blocked */
			n = read(fd, sink, sizeof(sink));
		} else {
			if (ans->len + 1 >= cap && cap < MAX_OUTPUT) {
				char *bigger = realloc(ans->text, cap * 2);
				if (bigger == NULL) {
					free(ans->text);
					ans->text = NULL;
					rc = -ENOMEM;
					continue;
				}
				ans->text = bigger;
				cap *= 2;
			}
			if (ans->len + 1 >= cap) { /* over the bound: drain and fail */
				free(ans->text);
				ans->text = NULL;
				rc = -EIO;
				continue;
			}
			n = read(fd, ans->text + ans->len, cap - 1 - ans->len);
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (ans->text != NULL)
			ans->len += (size_t)n;
	}
	close(fd);
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			status = -1;
			break;
		}
	}
	if (rc != 0) {
		free(ans->text);
		ans->text = NULL;
		return rc;
	}
	ans->text[ans->len] = '\0';
	{
		const char *e = strstr(ans->text, "\"errno\":");
		if (e == NULL) {
			if (debug_enabled())
				fprintf(stderr, "libdatawarp: spillway answered no errno (exit status %d): %s\n", status, ans->text);
			free(ans->text);
			ans->text = NULL;
			return -EIO;
		}
		rc = (int)strtol(e + 8, NULL, 10);
	}
	/* A list over the controller's limit ([stage] max_paths_per_request) is the caller's to
	   fix, and the errno alone does not say which limit: its message is always printed. */
	if (rc != 0 && (debug_enabled() || rc == E2BIG))
		fprintf(stderr, "libdatawarp: %s", ans->text);
	return -rc;
}

/* call runs the helper and keeps only its errno. */
static int call(const char *const *args, size_t nargs)
{
	struct answer ans;
	int rc = run(args, nargs, &ans);
	free(ans.text);
	return rc;
}

/* json_int reads the integer after "key": in text (the first occurrence). */
static int json_int(const char *text, const char *key, int *out)
{
	char pattern[64];
	const char *p;
	snprintf(pattern, sizeof(pattern), "\"%s\":", key);
	p = strstr(text, pattern);
	if (p == NULL)
		return -EIO;
	*out = (int)strtol(p + strlen(pattern), NULL, 10);
	return 0;
}

static const char *when_word(enum dw_stage_type t)
{
	switch (t) {
	case DW_STAGE_IMMEDIATE:
		return "immediate";
	case DW_STAGE_AT_JOB_END:
		return "at_job_end";
	case DW_REVOKE_STAGE_AT_JOB_END:
		return "revoke";
	case DW_ACTIVATE_DEFERRED_STAGE:
		return "activate";
	}
	return NULL;
}

static int pfs_ignored(enum dw_stage_type t)
{
	return t == DW_REVOKE_STAGE_AT_JOB_END || t == DW_ACTIVATE_DEFERRED_STAGE;
}

/* list_args builds args = prefix..., list... (list NULL-terminated). */
static const char **list_args(const char *const *prefix, size_t nprefix, const char **list, size_t *nargs)
{
	size_t n = 0, i;
	const char **args;
	while (list[n] != NULL)
		n++;
	if (n == 0)
		return NULL;
	args = calloc(nprefix + n + 1, sizeof(*args));
	if (args == NULL)
		return NULL;
	for (i = 0; i < nprefix; i++)
		args[i] = prefix[i];
	for (i = 0; i < n; i++)
		args[nprefix + i] = list[i];
	*nargs = nprefix + n;
	return args;
}

/* ---- staging ------------------------------------------------------------------------------- */

int dw_stage_file_in(const char *dw_file_path, const char *pfs_file_path)
{
	if (dw_file_path == NULL || pfs_file_path == NULL)
		return -EINVAL;
	const char *args[] = {"in", "--type", "file", "--", dw_file_path, pfs_file_path};
	return call(args, 6);
}

int dw_stage_directory_in(const char *dw_directory, const char *pfs_directory)
{
	if (dw_directory == NULL || pfs_directory == NULL)
		return -EINVAL;
	const char *args[] = {"in", "--type", "directory", "--", dw_directory, pfs_directory};
	return call(args, 6);
}

int dw_stage_list_in(const char *dw_directory, const char **pfs_list)
{
	size_t nargs;
	const char **args;
	int rc;
	if (dw_directory == NULL || pfs_list == NULL)
		return -EINVAL;
	const char *prefix[] = {"in", "--type", "list", "--", dw_directory};
	args = list_args(prefix, 5, pfs_list, &nargs);
	if (args == NULL)
		return pfs_list[0] == NULL ? -EINVAL : -ENOMEM;
	rc = call(args, nargs);
	free(args);
	return rc;
}

static int stage_out(const char *type, const char *dw, const char *pfs, enum dw_stage_type t)
{
	const char *when = when_word(t);
	if (dw == NULL || when == NULL)
		return -EINVAL;
	if (pfs_ignored(t)) {
		const char *args[] = {"out", "--type", type, "--when", when, "--", dw};
		return call(args, 7);
	}
	if (pfs == NULL)
		return -EINVAL;
	const char *args[] = {"out", "--type", type, "--when", when, "--", dw, pfs};
	return call(args, 8);
}

int dw_stage_file_out(const char *dw_file_path, const char *pfs_file_path, enum dw_stage_type stage_type)
{
	return stage_out("file", dw_file_path, pfs_file_path, stage_type);
}

int dw_stage_directory_out(const char *dw_directory, const char *pfs_directory, enum dw_stage_type stage_type)
{
	return stage_out("directory", dw_directory, pfs_directory, stage_type);
}

int dw_stage_list_out(const char **dw_list, const char *pfs_directory, enum dw_stage_type stage_type)
{
	size_t nargs;
	const char **args;
	int rc;
	const char *when = when_word(stage_type);
	if (dw_list == NULL || when == NULL)
		return -EINVAL;
	if (pfs_ignored(stage_type))
		pfs_directory = "/"; /* ignored, as DataWarp does (callers pass anything) */
	if (pfs_directory == NULL)
		return -EINVAL;
	const char *prefix[] = {"out", "--type", "list", "--when", when, "--", pfs_directory};
	args = list_args(prefix, 7, dw_list, &nargs);
	if (args == NULL)
		return dw_list[0] == NULL ? -EINVAL : -ENOMEM;
	rc = call(args, nargs);
	free(args);
	return rc;
}

/* ---- query, wait, terminate ------------------------------------------------------------- */

static int query(const char **paths, size_t n, int *complete, int *pending, int *deferred, int *failed)
{
	struct answer ans;
	const char **args;
	size_t i;
	int rc;
	if (complete == NULL || pending == NULL || deferred == NULL || failed == NULL)
		return -EINVAL;
	args = calloc(n + 2, sizeof(*args));
	if (args == NULL)
		return -ENOMEM;
	args[0] = "query";
	args[1] = "--";
	for (i = 0; i < n; i++)
		args[2 + i] = paths[i];
	rc = run(args, n + 2, &ans);
	free(args);
	if (rc == 0) {
		if (json_int(ans.text, "complete", complete) != 0 || json_int(ans.text, "pending", pending) != 0 ||
		    json_int(ans.text, "deferred", deferred) != 0 || json_int(ans.text, "failed", failed) != 0)
			rc = -EIO;
	}
	free(ans.text);
	return rc;
}

int dw_query_file_stage(const char *dw_file_path, int *complete, int *pending, int *deferred, int *failed)
{
	if (dw_file_path == NULL)
		return -EINVAL;
	return query(&dw_file_path, 1, complete, pending, deferred, failed);
}

int dw_query_directory_stage(const char *dw_directory_path, int *complete, int *pending, int *deferred, int *failed)
{
	if (dw_directory_path == NULL)
		return -EINVAL;
	return query(&dw_directory_path, 1, complete, pending, deferred, failed);
}

int dw_query_list_stage(const char **dw_list_path, int *complete, int *pending, int *deferred, int *failed)
{
	size_t n = 0;
	if (dw_list_path == NULL || dw_list_path[0] == NULL)
		return -EINVAL;
	while (dw_list_path[n] != NULL)
		n++;
	return query(dw_list_path, n, complete, pending, deferred, failed);
}

static int verb_paths(const char *verb, const char **paths)
{
	size_t nargs;
	const char **args;
	int rc;
	if (paths == NULL || paths[0] == NULL)
		return -EINVAL;
	const char *prefix[] = {verb, "--"};
	args = list_args(prefix, 2, paths, &nargs);
	if (args == NULL)
		return -ENOMEM;
	rc = call(args, nargs);
	free(args);
	return rc;
}

static int verb_path(const char *verb, const char *path)
{
	const char *list[] = {path, NULL};
	if (path == NULL)
		return -EINVAL;
	return verb_paths(verb, list);
}

/* wait_paths: the dw_wait_* calls return 0 once no stage of the paths is waiting or running,
   failed ones included, as Cray's did (clients such as AXL take any other answer for fatal);
   a failure shows in dw_query_* and the failed-stage walk. */
static int wait_paths(const char **paths)
{
	size_t nargs;
	const char **args;
	int rc;
	if (paths == NULL || paths[0] == NULL)
		return -EINVAL;
	const char *prefix[] = {"wait", "--failed-ok", "--"};
	args = list_args(prefix, 3, paths, &nargs);
	if (args == NULL)
		return -ENOMEM;
	rc = call(args, nargs);
	free(args);
	return rc;
}

static int wait_path(const char *path)
{
	const char *list[] = {path, NULL};
	if (path == NULL)
		return -EINVAL;
	return wait_paths(list);
}

int dw_wait_file_stage(const char *dw_file_path) { return wait_path(dw_file_path); }
int dw_wait_directory_stage(const char *dw_directory_path) { return wait_path(dw_directory_path); }
int dw_wait_list_stage(const char **dw_list) { return wait_paths(dw_list); }
int dw_terminate_file_stage(const char *dw_file_path) { return verb_path("terminate", dw_file_path); }
int dw_terminate_directory_stage(const char *dw_directory_path) { return verb_path("terminate", dw_directory_path); }
int dw_terminate_list_stage(const char **dw_list) { return verb_paths("terminate", dw_list); }

/* dw_set_stage_concurrency: at most concurrent_stages of the job's stages run at once (its
 * session's limit; the controller clamps it to stage.max_job_concurrency, as DataWarp
 * clamped it at will). */
int dw_set_stage_concurrency(const char *dw_instance_path, unsigned int concurrent_stages)
{
	char n[16];
	if (dw_instance_path == NULL)
		return -EINVAL;
	snprintf(n, sizeof(n), "%u", concurrent_stages);
	{
		const char *args[] = {"concurrency", "--", dw_instance_path, n};
		return call(args, 4);
	}
}

/* ---- failed stages ------------------------------------------------------------------------ */

struct failed_entry {
	char *path;
	int err; /* negative errno */
};

struct dw_failed_stage_state {
	struct failed_entry *entries;
	size_t n, next;
};

/* json_string decodes the JSON string starting at *p (just after its opening quote) into a
 * malloc'd UTF-8 string, and moves *p past the closing quote. */
static char *json_string(const char **p)
{
	const char *s = *p;
	size_t cap = strlen(s) + 1, len = 0;
	char *out = malloc(cap);
	if (out == NULL)
		return NULL;
	while (*s != '\0' && *s != '"') {
		if (*s != '\\') {
			out[len++] = *s++;
			continue;
		}
		s++;
		switch (*s) {
		case 'n': out[len++] = '\n'; break;
		case 't': out[len++] = '\t'; break;
		case 'r': out[len++] = '\r'; break;
		case 'b': out[len++] = '\b'; break;
		case 'f': out[len++] = '\f'; break;
		case 'u': {
			unsigned int cp = 0;
			int k;
			for (k = 1; k <= 4 && s[k] != '\0'; k++) {
				char c = s[k];
				cp = cp * 16 + (unsigned int)(c >= 'a' ? c - 'a' + 10 : c >= 'A' ? c - 'A' + 10 : c - '0');
			}
			s += 4;
			/* \u escapes are control characters or U+FFFD here (Go escapes nothing else) */
			if (cp < 0x80) {
				out[len++] = (char)cp;
			} else if (cp < 0x800) {
				out[len++] = (char)(0xC0 | (cp >> 6));
				out[len++] = (char)(0x80 | (cp & 0x3F));
			} else {
				out[len++] = (char)(0xE0 | (cp >> 12));
				out[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
				out[len++] = (char)(0x80 | (cp & 0x3F));
			}
			break;
		}
		case '\0': s--; break;
		default: out[len++] = *s; break; /* \" \\ \/ */
		}
		s++;
	}
	out[len] = '\0';
	if (*s == '"')
		s++;
	*p = s;
	return out;
}

int dw_open_failed_stage(const char *dw_instance_path, dw_failed_stage_t **handle)
{
	struct answer ans;
	struct dw_failed_stage_state *h;
	const char *p;
	int rc;
	if (dw_instance_path == NULL || handle == NULL)
		return -EINVAL;
	*handle = NULL;
	const char *args[] = {"list", "--failed", "--", dw_instance_path};
	rc = run(args, 4, &ans);
	if (rc != 0) {
		free(ans.text);
		return rc;
	}
	h = calloc(1, sizeof(*h));
	if (h == NULL) {
		free(ans.text);
		return -ENOMEM;
	}
	p = strstr(ans.text, "\"failed\":[");
	while (p != NULL) {
		const char *obj_end;
		const char *pp = strstr(p, "\"path\":\"");
		const char *pe;
		struct failed_entry e;
		if (pp == NULL)
			break;
		obj_end = strchr(pp, '}'); /* the message may hold '}', but comes after path and errno */
		pe = strstr(pp, "\"errno\":");
		pp += 8;
		e.path = json_string(&pp);
		if (e.path == NULL) {
			rc = -ENOMEM;
			break;
		}
		e.err = pe != NULL ? (int)strtol(pe + 8, NULL, 10) : -EIO;
		if (e.err >= 0)
			e.err = -EIO;
		{
			struct failed_entry *more = realloc(h->entries, (h->n + 1) * sizeof(*more));
			if (more == NULL) {
				free(e.path);
				rc = -ENOMEM;
				break;
			}
			h->entries = more;
			h->entries[h->n++] = e;
		}
		/* next object: after this one's error string */
		p = pe != NULL ? strstr(pe, "\"error\":\"") : NULL;
		if (p != NULL) {
			char *skip;
			p += 9;
			skip = json_string(&p);
			free(skip);
		}
		(void)obj_end;
	}
	free(ans.text);
	if (rc != 0) {
		dw_close_failed_stage(h);
		return rc;
	}
	*handle = h;
	return 0;
}

int dw_read_failed_stage(dw_failed_stage_t *handle, char *path, int path_size, int *ret_errno)
{
	struct failed_entry *e;
	if (handle == NULL || path == NULL || path_size <= 0 || ret_errno == NULL)
		return -EINVAL;
	if (handle->next >= handle->n)
		return 0;
	e = &handle->entries[handle->next++];
	snprintf(path, (size_t)path_size, "%s", e->path);
	*ret_errno = e->err;
	return (int)strlen(e->path);
}

int dw_close_failed_stage(dw_failed_stage_t *handle)
{
	size_t i;
	if (handle == NULL)
		return -EINVAL;
	for (i = 0; i < handle->n; i++)
		free(handle->entries[i].path);
	free(handle->entries);
	free(handle);
	return 0;
}

/* ---- striping ----------------------------------------------------------------------------- */

/* layout_field reads "name=N" from a layout text. */
static int layout_field(const char *text, const char *name, long *out)
{
	size_t n = strlen(name);
	const char *p = text;
	while ((p = strstr(p, name)) != NULL) {
		if ((p == text || p[-1] == ' ') && p[n] == '=') {
			*out = strtol(p + n + 1, NULL, 10);
			return 0;
		}
		p += n;
	}
	return -1;
}

/* The calls below work on the caller's descriptors directly. On a mount whose servers are on
 * other hosts a signal can interrupt them (the file system answers an interrupted request
 * with EINTR, whatever SA_RESTART says): they are retried, as the helper's are. */
static int fstat_r(int fd, struct stat *st)
{
	int rc;
	while ((rc = fstat(fd, st)) != 0 && errno == EINTR)
		;
	return rc;
}

static ssize_t fgetxattr_r(int fd, const char *name, void *value, size_t size)
{
	ssize_t n;
	while ((n = fgetxattr(fd, name, value, size)) < 0 && errno == EINTR)
		;
	return n;
}

int dw_get_stripe_configuration(int fd, int *stripe_size, int *stripe_width, int *starting_index)
{
	char buf[256];
	ssize_t n;
	struct stat st;
	long size, width, start = 0;
	if (stripe_size == NULL || stripe_width == NULL || starting_index == NULL)
		return -EINVAL;
	if (fstat_r(fd, &st) != 0)
		return -errno;
	if (fd <= STDERR_FILENO && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
		return -EINVAL;
	n = fgetxattr_r(fd, LAYOUT_XATTR, buf, sizeof(buf) - 1);
	if (n < 0) {
		if (errno != ENODATA && errno != ENOTSUP)
			return -errno;
		/* One server: the instance's whole layout. */
		*stripe_size = DEFAULT_STRIPE_SIZE;
		*stripe_width = 1;
		*starting_index = 0;
		return 0;
	}
	buf[n] = '\0';
	if (layout_field(buf, "stripe_size", &size) != 0 || layout_field(buf, "stripe_width", &width) != 0)
		return -EIO;
	layout_field(buf, "start", &start);
	*stripe_size = (int)size;
	*stripe_width = (int)width;
	*starting_index = (int)start;
	return 0;
}

int dw_set_stripe_configuration(int fd, int stripe_size, int stripe_width)
{
	char buf[128], cur[256];
	struct stat st;
	if (stripe_size <= 0 || stripe_size % 4096 != 0 || stripe_width <= 0)
		return -EINVAL;
	if (fstat_r(fd, &st) != 0)
		return -errno;
	if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
		return -EINVAL;
	if (fgetxattr_r(fd, LAYOUT_XATTR, cur, sizeof(cur)) < 0) {
		int err = errno;
		struct statfs sfs;
		int rc;
		if (err != ENODATA && err != ENOTSUP)
			return -err;
		while ((rc = fstatfs(fd, &sfs)) != 0 && errno == EINTR)
			;
		if (err == ENOTSUP || rc != 0 || sfs.f_type != FUSE_MAGIC)
			return stripe_width == 1 ? 0 : -EINVAL; /* not a Spillway file: nothing to keep */
		/* An instance on one server: the server keeps the configuration (width 1 only,
		 * -EINVAL otherwise, as for any width above the instance's servers). */
	}
	snprintf(buf, sizeof(buf), "stripe_size=%d stripe_width=%d", stripe_size, stripe_width);
	while (fsetxattr(fd, LAYOUT_XATTR, buf, strlen(buf), 0) != 0) {
		if (errno != EINTR)
			return errno == EEXIST ? -EINVAL : -errno;
	}
	return 0;
}

/* ---- the rest ----------------------------------------------------------------------------- */

/* mounted reports whether dir (resolved) is a fuse.spillway mount point. */
static int mounted(const char *dir)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int found = 0;
	if (f == NULL)
		return 0;
	while (!found && getline(&line, &cap, f) > 0) {
		char point[PATH_MAX], type[64];
		char *sep = strstr(line, " - ");
		char *q, *w;
		if (sep == NULL || sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 || sscanf(sep + 3, "%63s", type) != 1)
			continue;
		/* undo the kernel's octal escapes in the mount point */
		for (q = w = point; *q != '\0'; q++) {
			if (q[0] == '\\' && q[1] >= '0' && q[1] <= '3' && q[2] >= '0' && q[2] <= '7' && q[3] >= '0' && q[3] <= '7') {
				*w++ = (char)((q[1] - '0') * 64 + (q[2] - '0') * 8 + (q[3] - '0'));
				q += 3;
			} else {
				*w++ = *q;
			}
		}
		*w = '\0';
		found = strcmp(type, "fuse.spillway") == 0 && strcmp(point, dir) == 0;
	}
	free(line);
	fclose(f);
	return found;
}

/* dw_get_mds_path: Spillway's max_mds=yes spreads one tree's metadata over the instance's
 * servers inside the mount itself (by directory and name), so every key's path is the root:
 * the same answer from every node, and the one stage-in uses. */
char *dw_get_mds_path(const char *dw_root, uint64_t key)
{
	char *real;
	(void)key;
	if (dw_root == NULL)
		return NULL;
	while ((real = realpath(dw_root, NULL)) == NULL && errno == EINTR)
		;
	if (real == NULL)
		return NULL;
	if (!mounted(real)) {
		free(real);
		return NULL;
	}
	free(real);
	return strdup(dw_root);
}

/* dw_get_accounting_data_json: {"realm": {...}} with what Spillway counts (docs/libdatawarp.md). */
char *dw_get_accounting_data_json(const char *path, int *ecode)
{
	struct answer ans;
	const char *realm;
	char *out = NULL;
	size_t n;
	int rc;
	if (path == NULL) {
		rc = -EINVAL;
		goto done;
	}
	{
		const char *args[] = {"accounting", "--", path};
		rc = run(args, 3, &ans);
	}
	if (rc != 0) {
		free(ans.text);
		goto done;
	}
	/* the helper answers {"errno":0,"realm":{...}}: the realm is the last key */
	realm = strstr(ans.text, "\"realm\":");
	if (realm == NULL) {
		rc = -EIO;
	} else {
		n = strlen(realm);
		while (n > 0 && (realm[n - 1] == '\n' || realm[n - 1] == ' '))
			n--;
		out = malloc(n + 2);
		if (out == NULL) {
			rc = -ENOMEM;
		} else {
			out[0] = '{';
			memcpy(out + 1, realm, n);
			out[n + 1] = '\0';
		}
	}
	free(ans.text);
done:
	if (ecode != NULL)
		*ecode = rc;
	return out;
}

/* ---- cache instances ---------------------------------------------------------------------- */

/* A cache instance's mount answers these attributes of its files and directories itself
 * (never stored on the PFS); a scratch instance's refuses them (EOPNOTSUPP). */
#define POLICY_XATTR "user.spillway.cache.policy"
#define SYNC_XATTR "user.spillway.cache.sync"

/* policy_text reads fd's policy attribute into buf: 0, or -EOPNOTSUPP when fd is not a cache
 * instance's file or directory. */
static int policy_text(int fd, char *buf, size_t size)
{
	ssize_t n = fgetxattr_r(fd, POLICY_XATTR, buf, size - 1);
	if (n < 0) {
		if (errno == ENODATA || errno == ENOTSUP || errno == EOPNOTSUPP)
			return -EOPNOTSUPP; /* scratch, or not Spillway's */
		return -errno;
	}
	buf[n] = '\0';
	return 0;
}

/* policy_field reads "name=value" of a policy text: a number, or yes/no as 1/0. */
static int policy_field(const char *text, const char *name, uint64_t *out)
{
	size_t n = strlen(name);
	const char *p = text;
	while ((p = strstr(p, name)) != NULL) {
		if ((p == text || p[-1] == ' ') && p[n] == '=') {
			p += n + 1;
			if (strncmp(p, "yes", 3) == 0)
				*out = 1;
			else if (strncmp(p, "no", 2) == 0)
				*out = 0;
			else
				*out = strtoull(p, NULL, 10);
			return 0;
		}
		p += n;
	}
	return -1;
}

int dw_get_cache_policy(int fd, dw_cache_policy_t *policy)
{
	char buf[256];
	uint64_t mt, ra, soc, stp;
	int rc;
	if (policy == NULL)
		return -EINVAL;
	rc = policy_text(fd, buf, sizeof(buf));
	if (rc != 0)
		return rc;
	if (policy_field(buf, "modified_threshold", &mt) != 0 || policy_field(buf, "read_ahead", &ra) != 0 ||
	    policy_field(buf, "sync_on_close", &soc) != 0 || policy_field(buf, "sync_to_pfs", &stp) != 0)
		return -EIO;
	policy->modified_threshold = mt;
	policy->read_ahead = ra;
	policy->sync_on_close = (int)soc;
	policy->sync_to_pfs = (int)stp;
	return 0;
}

int dw_set_cache_policy(int fd, const dw_cache_policy_t *policy)
{
	char cur[256], buf[256];
	int rc;
	if (policy == NULL)
		return -EINVAL;
	rc = policy_text(fd, cur, sizeof(cur)); /* a cache's file or directory: nothing set elsewhere */
	if (rc != 0)
		return rc;
	snprintf(buf, sizeof(buf), "modified_threshold=%llu read_ahead=%llu sync_on_close=%s sync_to_pfs=%s",
		 (unsigned long long)policy->modified_threshold, (unsigned long long)policy->read_ahead,
		 policy->sync_on_close ? "yes" : "no", policy->sync_to_pfs ? "yes" : "no");
	while (fsetxattr(fd, POLICY_XATTR, buf, strlen(buf), 0) != 0) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

/* dw_wait_sync_complete: fsync (what the program wrote reaches the burst buffer, durably);
 * then, on a cache instance, every server holding some of the file puts its data on the PFS
 * and syncs the PFS file. On a scratch instance nothing is kept for the PFS: the fsync is all. */
int dw_wait_sync_complete(int fd)
{
	char cur[256];
	int rc;
	while (fsync(fd) != 0) {
		if (errno != EINTR)
			return -errno;
	}
	{
		struct stat st;
		if (fstat_r(fd, &st) != 0)
			return -errno;
		if (!S_ISREG(st.st_mode))
			return 0; /* no data of its own to put on the PFS */
	}
	rc = policy_text(fd, cur, sizeof(cur));
	if (rc == -EOPNOTSUPP)
		return 0; /* not a cache's file: synced */
	if (rc != 0)
		return rc;
	while (fsetxattr(fd, SYNC_XATTR, "1", 1, 0) != 0) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}
