/*
 * libdatawarp for Spillway: DataWarp's C API (datawarp.h).
 *
 * Staging calls are one request each to the controller, POST /dw/v1/job_stages, sent by the
 * library itself on its Unix socket, or over TCP with a MUNGE credential ("speaking to the
 * controller directly" below): what the library found of the paths as the calling user goes
 * in, libdatawarp's result comes out, {"errno": N, ...}. Where that cannot be done (several
 * controllers, https, no credential, a controller that does not answer) a call runs the helper,
 * `spillway dwcli stage ... --json`, with posix_spawn, which sends the same request. Stripe
 * and cache calls work on extended attributes of the caller's descriptors directly.
 *
 * The library keeps one thing between calls, the connection of the last answered call, for the
 * next ("a connection kept for the next call" below): taken by one call at a time (an atomic
 * exchange), never used by a child after fork, nor after the caller's euid or egid changed,
 * close-on-exec. Every call is thread-safe and safe in a child after fork. Calls are not
 * interrupted by signals (EINTR is retried; the helper runs in its own process group, so a terminal's
 * Ctrl-C reaches the application, not the helper).
 *
 * The helper is $SPILLWAY_BIN, else "spillway" on the PATH, else SPILLWAY_PREFIX/bin/spillway
 * (the install prefix, set at build time).
 */
#define _GNU_SOURCE
#include "datawarp.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
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

/* ---- speaking to the controller directly ------------------------------------------------ */

/* The staging calls send one request, POST /dw/v1/job_stages, on the controller's Unix
 * socket (the controller knows the caller from the socket's peer credentials), with what the
 * library knows of each path: the path with its links resolved (as the caller), the Spillway
 * mount holding it, and what stat(2) and access(2), asked as the caller, say of it and of its
 * directory. The controller resolves the session and the variable, makes the checks
 * (package stagecall, the same code for `dwcli stage`) and answers libdatawarp's result,
 * {"errno": N, ...}. No child process; the connection is kept for the next call when the
 * controller offers it (below), never shared by two threads nor by a child after fork.
 *
 * A TCP controller gets the same request, in one write, with a fresh MUNGE credential of the
 * caller's on a connection's first request (asked of munged before the paths are probed, in
 * its own protocol; libmunge, loaded at run time, when that fails); later requests on a kept
 * connection claim the identity that credential proved. When the controller cannot be spoken to directly (several
 * controllers: the helper follows the leader; https; no credential: munged's protocol failed
 * and libmunge is not installed; no answer: a one-machine
 * home's server the helper starts again, a controller the helper retries), the call runs the
 * helper as before. */

#define NO_DIRECT 1 /* dcall: use the helper */

struct buf {
	char *p;
	size_t len, cap;
	int oom;
};

static void buf_add(struct buf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 1024;
		char *more;
		while (cap < b->len + n + 1)
			cap *= 2;
		more = realloc(b->p, cap);
		if (more == NULL) {
			b->oom = 1;
			return;
		}
		b->p = more;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* buf_json adds s as a JSON string. */
static void buf_json(struct buf *b, const char *s)
{
	buf_add(b, "\"", 1);
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			buf_add(b, esc, 2);
		} else if (c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			buf_add(b, esc, 6);
		} else {
			buf_add(b, (const char *)&c, 1);
		}
	}
	buf_add(b, "\"", 1);
}

/* ---- what the controller's address is --------------------------------------------------- */

/* toml_string reads the string value of key in [section] of a TOML file (the simple
 * `key = "value"` lines Spillway's configuration files hold): 1 found, 0 not, -1 no file. */
static int toml_string(const char *file, const char *section, const char *key, char *out, size_t size)
{
	FILE *f = fopen(file, "re");
	char *line = NULL;
	size_t cap = 0, klen = strlen(key);
	int in = 0, found = 0;
	if (f == NULL)
		return -1;
	while (!found && getline(&line, &cap, f) > 0) {
		char *s = line, *v;
		size_t n = 0;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '[') {
			char *end = strchr(s, ']');
			in = end != NULL && (size_t)(end - s - 1) == strlen(section) && strncmp(s + 1, section, strlen(section)) == 0;
			continue;
		}
		if (!in || strncmp(s, key, klen) != 0)
			continue;
		v = s + klen;
		while (*v == ' ' || *v == '\t')
			v++;
		if (*v++ != '=')
			continue;
		while (*v == ' ' || *v == '\t')
			v++;
		if (*v == '\'') { /* a literal string */
			for (v++; *v != '\0' && *v != '\'' && n + 1 < size; v++)
				out[n++] = *v;
		} else if (*v == '"') {
			for (v++; *v != '\0' && *v != '"' && n + 1 < size; v++) {
				if (*v == '\\' && v[1] != '\0')
					v++;
				out[n++] = *v;
			}
		} else {
			continue;
		}
		out[n] = '\0';
		found = 1;
	}
	free(line);
	fclose(f);
	return found;
}

static int file_exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* An endpoint: the controller's Unix socket, or its TCP address with the munged to ask for a
 * credential. */
struct endpoint {
	int tcp;
	char sock[PATH_MAX];   /* unix: its path */
	char host[256], port[16];
	char munge[PATH_MAX];  /* tcp: munged's socket ("" = munge's default) */
	int connect_ms;        /* tcp: [client] connect_timeout */
	int answer_ms;         /* tcp: [controller] request_timeout + 5 s, as the Go client waits */
};

/* duration_ms reads a configuration duration ("3s", "500ms", "1m"), or def. */
static int duration_ms(const char *text, int def)
{
	char *end;
	double v = strtod(text, &end);
	if (end == text || v < 0)
		return def;
	if (strcmp(end, "ms") == 0)
		return (int)v;
	if (strcmp(end, "s") == 0)
		return (int)(v * 1000);
	if (strcmp(end, "m") == 0)
		return (int)(v * 60000);
	return def;
}

/* controller_endpoint finds the controller as `dwcli stage` does (cli.Connection.Connect):
 * $SPILLWAY_CONFIG, else /etc/spillway/spillway.toml if it exists, its [client] controller;
 * else the one-machine home ($SPILLWAY_HOME, $XDG_DATA_HOME/spillway,
 * ~/.local/share/spillway), its [controller] socket. 0, or NO_DIRECT (https, several
 * controllers, a token file, no home: the helper says or does what is needed). */
static int controller_endpoint(struct endpoint *e)
{
	const char *cfg = secure_getenv("SPILLWAY_CONFIG");
	char addr[PATH_MAX + 16], file[2 * PATH_MAX + 32], home[2 * PATH_MAX + 8];
	const char *sock;
	memset(e, 0, sizeof(*e));
	if (cfg == NULL || *cfg == '\0')
		cfg = file_exists("/etc/spillway/spillway.toml") ? "/etc/spillway/spillway.toml" : NULL;
	if (cfg != NULL) {
		int rc = toml_string(cfg, "client", "controller", addr, sizeof(addr));
		if (rc < 0)
			return NO_DIRECT; /* the helper names the file it cannot read */
		if (rc == 0)
			snprintf(addr, sizeof(addr), "unix:/run/spillway/controller.sock");
		if (strchr(addr, ',') != NULL || strncmp(addr, "https:", 6) == 0)
			return NO_DIRECT; /* several controllers (the leader to follow), TLS */
		if (strncmp(addr, "http://", 7) == 0) {
			/* a TCP controller: each request with a fresh MUNGE credential of the caller's;
			   a token file is a service's (the helper sends it) */
			char *h = addr + 7, *colon, *slash, tok[64];
			if (toml_string(cfg, "client", "token_file", tok, sizeof(tok)) == 1 && tok[0] != '\0')
				return NO_DIRECT;
			if ((slash = strchr(h, '/')) != NULL)
				*slash = '\0';
			if (*h == '[') { /* [v6]:port */
				char *close = strchr(h, ']');
				if (close == NULL)
					return NO_DIRECT;
				*close = '\0';
				colon = close[1] == ':' ? close + 1 : NULL;
				h++;
			} else {
				colon = strrchr(h, ':');
				if (colon != NULL)
					*colon = '\0';
			}
			if (strlen(h) >= sizeof(e->host) || (colon != NULL && strlen(colon + 1) >= sizeof(e->port)))
				return NO_DIRECT;
			memcpy(e->host, h, strlen(h) + 1);
			memcpy(e->port, colon != NULL ? colon + 1 : "80", strlen(colon != NULL ? colon + 1 : "80") + 1);
			if (toml_string(cfg, "client", "munge_socket", e->munge, sizeof(e->munge)) != 1)
				e->munge[0] = '\0';
			e->connect_ms = 3000; /* [client] connect_timeout's default */
			if (toml_string(cfg, "client", "connect_timeout", tok, sizeof(tok)) == 1)
				e->connect_ms = duration_ms(tok, 3000);
			e->answer_ms = 30000; /* [controller] request_timeout's default */
			if (toml_string(cfg, "controller", "request_timeout", tok, sizeof(tok)) == 1)
				e->answer_ms = duration_ms(tok, 30000);
			e->answer_ms += 5000;
			e->tcp = 1;
			return e->host[0] != '\0' ? 0 : NO_DIRECT;
		}
		sock = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr;
		if (*sock != '/' || strlen(sock) >= sizeof(e->sock))
			return NO_DIRECT;
		snprintf(e->sock, sizeof(e->sock), "%s", sock);
		return 0;
	}
	{
		const char *h = secure_getenv("SPILLWAY_HOME"), *x = secure_getenv("XDG_DATA_HOME"), *u = secure_getenv("HOME");
		if (h != NULL && *h != '\0') {
			if (h[0] == '/') {
				snprintf(home, sizeof(home), "%s", h);
			} else {
				char cwd[PATH_MAX];
				if (getcwd(cwd, sizeof(cwd)) == NULL)
					return NO_DIRECT;
				snprintf(home, sizeof(home), "%s/%s", cwd, h);
			}
		} else if (x != NULL && *x != '\0') {
			snprintf(home, sizeof(home), "%s/spillway", x);
		} else if (u != NULL && *u != '\0') {
			snprintf(home, sizeof(home), "%s/.local/share/spillway", u);
		} else {
			return NO_DIRECT;
		}
	}
	if ((size_t)snprintf(file, sizeof(file), "%s/spillway.toml", home) >= sizeof(file))
		return NO_DIRECT;
	switch (toml_string(file, "controller", "socket", addr, sizeof(addr))) {
	case -1:
		return NO_DIRECT; /* no home there: the helper says so */
	case 0:
		if ((size_t)snprintf(file, sizeof(file), "%s/controller.sock", home) >= sizeof(addr))
			return NO_DIRECT;
		memcpy(addr, file, strlen(file) + 1);
	}
	if (addr[0] != '/' || strlen(addr) >= sizeof(e->sock))
		return NO_DIRECT;
	snprintf(e->sock, sizeof(e->sock), "%s", addr);
	return 0;
}

/* ---- MUNGE, through libmunge when it is installed ----------------------------------------- */

/* munge_credential asks munged (at sock, "" = munge's default) for a credential of the
 * caller's, with libmunge loaded at run time (a program that never speaks TCP needs none):
 * 0 and a malloc'd credential; NO_DIRECT without libmunge (the helper runs `munge`); -EIO
 * when munged refuses. A context per call: libmunge's are not to be shared between threads.
 * The library stays loaded once found (each call's dlopen only counts a reference; no
 * unloading and loading again per call). */
#define MUNGE_OPT_SOCKET_ 8 /* munge.h's MUNGE_OPT_SOCKET */
static int munge_credential(const char *sock, char **cred)
{
	typedef int (*encode_f)(char **, void *, const void *, int);
	typedef void *(*create_f)(void);
	typedef int (*set_f)(void *, int, ...);
	typedef void (*destroy_f)(void *);
	typedef const char *(*strerror_f)(int);
	void *lib = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL), *ctx = NULL;
	encode_f encode;
	create_f create;
	set_f set;
	destroy_f destroy;
	strerror_f why;
	int rc;
	*cred = NULL;
	if (lib == NULL)
		return NO_DIRECT;
	encode = (encode_f)dlsym(lib, "munge_encode");
	create = (create_f)dlsym(lib, "munge_ctx_create");
	set = (set_f)dlsym(lib, "munge_ctx_set");
	destroy = (destroy_f)dlsym(lib, "munge_ctx_destroy");
	why = (strerror_f)dlsym(lib, "munge_strerror");
	if (encode == NULL || create == NULL || set == NULL || destroy == NULL) {
		dlclose(lib);
		return NO_DIRECT;
	}
	if (*sock != '\0') {
		if ((ctx = create()) == NULL) {
			dlclose(lib);
			return -ENOMEM;
		}
		set(ctx, MUNGE_OPT_SOCKET_, sock);
	}
	rc = encode(cred, ctx, NULL, 0);
	if (ctx != NULL)
		destroy(ctx);
	if (rc != 0) {
		if (debug_enabled())
			fprintf(stderr, "libdatawarp: cannot get a MUNGE credential: %s (is munged running, with the cluster's key? [client] munge_socket names its socket)\n",
				why != NULL ? why(rc) : "munge_encode failed");
		free(*cred);
		*cred = NULL;
		return -EIO;
	}
	return 0;
}

/* tcp_connect opens a connection to host:port within ms milliseconds: the descriptor, or -1. */
static int tcp_connect(const struct endpoint *e)
{
	struct addrinfo hints, *res = NULL, *ai;
	int fd = -1;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(e->host, e->port, &hints, &res) != 0)
		return -1;
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
		struct pollfd pfd;
		int err = 0, rc, flags;
		socklen_t len = sizeof(err);
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0)
			continue;
		rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
		if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
			pfd.fd = fd;
			pfd.events = POLLOUT;
			while ((rc = poll(&pfd, 1, e->connect_ms)) < 0 && errno == EINTR)
				; /* a signal restarts the wait (at most twice the bound under a storm of them) */
			rc = rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 ? 0 : -1;
		}
		flags = fcntl(fd, F_GETFL);
		if (rc == 0) { /* a host cut off mid-request: the answer is not waited for forever */
			struct timeval tv = {e->answer_ms / 1000, (e->answer_ms % 1000) * 1000};
			rc = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) | setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		}
		if (rc != 0 || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	return fd;
}

/* ---- the paths a call names ------------------------------------------------------------- */

/* mount_points lists the fuse.spillway mount points of /proc/self/mountinfo (a
 * malloc'd NULL-terminated array of malloc'd strings), or NULL. */
static char **mount_points(void)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL, **out = NULL;
	size_t cap = 0, n = 0;
	if (f == NULL)
		return NULL;
	out = calloc(1, sizeof(*out));
	while (out != NULL && getline(&line, &cap, f) > 0) {
		char point[PATH_MAX], type[64];
		char *sep = strstr(line, " - ");
		char *q, *w, **more;
		if (sep == NULL || sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 || sscanf(sep + 3, "%63s", type) != 1)
			continue;
		if (strcmp(type, "fuse.spillway") != 0)
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
		more = realloc(out, (n + 2) * sizeof(*out));
		if (more == NULL)
			break;
		out = more;
		if ((out[n] = strdup(point)) != NULL)
			n++;
		out[n] = NULL;
	}
	free(line);
	fclose(f);
	return out;
}

static void free_points(char **points)
{
	size_t i;
	if (points == NULL)
		return;
	for (i = 0; points[i] != NULL; i++)
		free(points[i]);
	free(points);
}

/* absolute makes p absolute (malloc'd): from the current directory when relative. */
static char *absolute(const char *p)
{
	char cwd[PATH_MAX], *out;
	if (p[0] == '/')
		return strdup(p);
	if (getcwd(cwd, sizeof(cwd)) == NULL)
		return strdup(p); /* the controller refuses a relative path, naming it */
	out = malloc(strlen(cwd) + strlen(p) + 2);
	if (out != NULL)
		sprintf(out, "%s/%s", cwd, p);
	return out;
}

/* canonical makes p absolute and resolves its links, as the caller; a missing last
 * component is kept as named (as instage's did). */
static char *canonical(const char *p)
{
	char *abs = absolute(p), *real, *slash, *dir;
	if (abs == NULL)
		return NULL;
	if ((real = realpath(abs, NULL)) != NULL) {
		free(abs);
		return real;
	}
	slash = strrchr(abs, '/');
	if (slash == NULL || slash[1] == '\0')
		return abs;
	*slash = '\0';
	dir = realpath(abs[0] != '\0' ? abs : "/", NULL);
	*slash = '/';
	if (dir == NULL)
		return abs;
	real = malloc(strlen(dir) + strlen(slash) + 1);
	if (real != NULL)
		sprintf(real, "%s%s", strcmp(dir, "/") == 0 ? "" : dir, slash);
	free(dir);
	free(abs);
	return real;
}

/* buf_stat adds what stat(2) and access(2) say of p, as the caller (stagecall.Stat). */
static void buf_stat(struct buf *b, const char *p)
{
	struct stat st;
	char num[32];
	int rc;
	while ((rc = stat(p, &st)) != 0 && errno == EINTR)
		;
	if (rc != 0) {
		snprintf(num, sizeof(num), "{\"errno\":%d}", errno);
		buf_str(b, num);
		return;
	}
	buf_str(b, S_ISREG(st.st_mode) ? "{\"kind\":\"file\"" : S_ISDIR(st.st_mode) ? "{\"kind\":\"dir\"" : "{\"kind\":\"other\"");
	if (access(p, R_OK) == 0)
		buf_str(b, ",\"r\":true");
	if (access(p, W_OK | X_OK) == 0)
		buf_str(b, ",\"wx\":true");
	buf_str(b, "}");
}

/* buf_probe adds a probe of a path (stagecall.Probe): a burst buffer path (points: the
 * mounts) resolved and with its mount, a PFS path made absolute. */
static void buf_probe(struct buf *b, const char *given, char **points, int bb, int with_dir)
{
	char *path, *dir;
	const char *mount = NULL;
	size_t i, best = 0;
	if (*given == '\0') { /* no path: the controller says so (never the current directory) */
		buf_str(b, "{\"path\":\"\"}");
		return;
	}
	path = bb ? canonical(given) : absolute(given);
	if (path == NULL) {
		b->oom = 1;
		return;
	}
	buf_str(b, "{\"path\":");
	buf_json(b, path);
	if (strcmp(given, path) != 0) { /* the name given, for messages; a list must stay small */
		buf_str(b, ",\"given\":");
		buf_json(b, given);
	}
	for (i = 0; bb && points != NULL && points[i] != NULL; i++) {
		size_t n = strlen(points[i]);
		if (n > best && strncmp(path, points[i], n) == 0 && (path[n] == '\0' || path[n] == '/' || strcmp(points[i], "/") == 0)) {
			mount = points[i];
			best = n;
		}
	}
	if (mount != NULL) {
		buf_str(b, ",\"mount\":");
		buf_json(b, mount);
	}
	buf_str(b, ",\"stat\":");
	buf_stat(b, path);
	dir = with_dir ? strdup(path) : NULL;
	if (dir != NULL) {
		char *slash = strrchr(dir, '/');
		if (slash == dir)
			slash[1] = '\0';
		else if (slash != NULL)
			*slash = '\0';
		buf_str(b, ",\"dir\":");
		buf_stat(b, dir);
		free(dir);
	}
	buf_str(b, "}");
	free(path);
}

/* ---- one request ------------------------------------------------------------------------ */

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL); /* a closed socket is an error, not SIGPIPE */
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static int read_full(int fd, unsigned char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = read(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* ---- MUNGE, asked of munged while the paths are probed ------------------------------------
 *
 * A call over TCP needs a fresh credential from the node's munged: a round trip to another
 * process, which on a busy node waits for a core as long as it works. The library asks for it
 * first (munge_ask), probes the call's paths meanwhile, and then reads it (munge_take), in
 * munged's own client protocol, as the controller decodes it (internal/munge/proto.go has the
 * format): one ENC_REQ with munged's defaults and no payload, what `munge -n` asks for. When
 * that fails (munged unreachable, its listen queue full, a refusal) munge_credential asks
 * again through libmunge, with its retries and its reasons. */

#define MUNGE_DEFAULT_SOCKET "/run/munge/munge.socket.2" /* munge's own default */
#define MUNGE_WAIT_MS 2000                                /* libmunge's bound on an exchange */

/* munge_ask sends munged (at sock, "" = its default) a request for a credential of the
 * caller's: the connection its answer comes on, or -1. */
static int munge_ask(const char *sock)
{
	static const unsigned char req[11 + 20] = {
		0x00, 0x60, 0x6D, 0x4B, 4, 2, 0, 0, 0, 0, 20, /* magic, version 4, ENC_REQ, retry 0, body length */
		1, 1, 1, 0,                                   /* cipher, mac, zip: munged's defaults; no realm */
		0, 0, 0, 0,                                   /* ttl: munged's default */
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* any uid and gid may decode it */
		0, 0, 0, 0};                                  /* no payload */
	struct timeval tv = {MUNGE_WAIT_MS / 1000, (MUNGE_WAIT_MS % 1000) * 1000};
	struct sockaddr_un sa;
	int fd, rc;
	if (*sock == '\0')
		sock = MUNGE_DEFAULT_SOCKET;
	if (strlen(sock) >= sizeof(sa.sun_path))
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, sock, strlen(sock));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	/* the time-outs first: a connect to a listen queue that is full waits, within SO_SNDTIMEO */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
		close(fd);
		return -1;
	}
	while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa))) != 0 && errno == EINTR)
		;
	if ((rc != 0 && errno != EISCONN) || write_all(fd, (const char *)req, sizeof(req)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* munge_take reads munged's answer to munge_ask on fd, and closes it: 0 and a malloc'd
 * credential, or -1 (munged's refusal included: libmunge then says why). */
static int munge_take(int fd, char **cred)
{
	unsigned char hdr[11], *body = NULL;
	uint32_t size = 0, off, n;
	int rc = -1;
	*cred = NULL;
	if (read_full(fd, hdr, sizeof(hdr)) == 0 && be32(hdr) == 0x00606D4B && hdr[4] == 4 && hdr[5] == 3 /* ENC_RSP */ &&
	    (size = be32(hdr + 7)) >= 6 && size <= 4096 && (body = malloc(size)) != NULL && read_full(fd, body, size) == 0 &&
	    body[0] == 0 /* success */) {
		/* error u8, message (u8 length), credential (u32 length, NUL-ended) */
		off = 2 + (uint32_t)body[1];
		if (off + 4 <= size && (n = be32(body + off)) > 6 && n <= size - off - 4 && body[off + 4 + n - 1] == '\0' &&
		    strncmp((const char *)body + off + 4, "MUNGE:", 6) == 0)
			rc = (*cred = strdup((const char *)body + off + 4)) != NULL ? 0 : -1;
	}
	free(body);
	close(fd);
	return rc;
}

/* ---- a connection kept for the next call ---------------------------------------------------
 *
 * A new connection costs a call more than its request: over TCP a MUNGE credential (a round
 * trip to the node's munged, a decode by the controller's) and a connect and accept. So the
 * library keeps the connection of a call's answer for the next call, when the controller
 * offers it: Keep-Alive: timeout=N (its controller.idle_timeout), and over TCP
 * Spillway-Connection-Identity: S, the controller bound the identity of the connection's first
 * MUNGE credential to the connection for S more seconds (controller.munge_connection_lifetime);
 * later requests on it claim that identity with Authorization: MUNGE-connection, and carry no
 * credential (docs/security.md).
 *
 * One slot, taken by an atomic exchange (no lock, so none held across a fork): a thread that
 * finds it empty opens a connection of its own and offers it back after its call (the slot
 * keeps the newest; the one it held is closed), so no two threads ever use one connection. A
 * kept connection is used again only
 *   - by the process that opened it: a child after fork closes its copy (pthread_atfork; the
 *     pid is compared as well, for a clone that runs no fork handlers);
 *   - by the euid and egid that opened it: the controller knows the connection by the identity
 *     proved on it then (after setuid or seteuid a call opens a new connection);
 *   - to the same controller (SPILLWAY_CONFIG changed between calls: a new connection);
 *   - within half the idle time the controller announced, and at most KEEP_IDLE_MAX_MS, so
 *     that the controller never closes it while a request is on its way; over TCP also a
 *     second before the identity's lifetime ends;
 *   - when poll(2) finds nothing on it: a controller that closed it (a restart, an idle
 *     timeout shorter than announced) has sent its end.
 * Root's calls keep nothing (a process that drops its privileges keeps no connection of
 * root's), and the connection is close-on-exec.
 *
 * A request on a kept connection is sent again, on a new connection with a fresh credential,
 * only when the controller cannot have acted on it: the request did not all leave (the
 * controller never read a whole body), or the controller refused the connection's identity
 * (401: it expired). A kept connection that ends without an answer after the request left
 * fails the call with EIO: the stage may have been made, and is never made twice. */

#define KEEP_IDLE_MAX_MS 30000 /* the library's own bound on reuse, whatever the controller says */

struct conn {
	int fd;
	pid_t pid;
	uid_t euid;
	gid_t egid;
	long long until_ms;          /* CLOCK_MONOTONIC: used again only before */
	long long identity_until_ms; /* TCP: the connection's identity ends (less a second) */
	char where[PATH_MAX + 300];  /* the endpoint (endpoint_key) */
};

static struct conn *_Atomic kept;

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void conn_close(struct conn *c)
{
	if (c != NULL) {
		close(c->fd);
		free(c);
	}
}

static void endpoint_key(const struct endpoint *e, char *out, size_t size)
{
	if (e->tcp)
		snprintf(out, size, "tcp %s %s", e->host, e->port);
	else
		snprintf(out, size, "unix %s", e->sock);
}

/* conn_take takes the kept connection for a call to e, when it may be used: the connection,
 * or NULL (one that may not is closed). */
static struct conn *conn_take(const struct endpoint *e)
{
	struct conn *c = atomic_exchange(&kept, NULL);
	char where[sizeof(c->where)];
	struct pollfd pfd;
	int rc;
	if (c == NULL)
		return NULL;
	endpoint_key(e, where, sizeof(where));
	if (c->pid != getpid() || c->euid != geteuid() || c->egid != getegid() || strcmp(c->where, where) != 0 || mono_ms() >= c->until_ms) {
		conn_close(c);
		return NULL;
	}
	pfd.fd = c->fd;
	pfd.events = POLLIN | POLLRDHUP;
	pfd.revents = 0;
	while ((rc = poll(&pfd, 1, 0)) < 0 && errno == EINTR)
		;
	if (rc != 0) { /* its end (or anything: nothing comes unasked), or an error */
		if (debug_enabled())
			fprintf(stderr, "libdatawarp: the controller closed the kept connection; a new one\n");
		conn_close(c);
		return NULL;
	}
	return c;
}

/* conn_offer keeps c for a next call; the connection kept before is closed. */
static void conn_offer(struct conn *c)
{
	if (c != NULL)
		conn_close(atomic_exchange(&kept, c));
}

/* A child after fork never uses its parent's connection: its copy is closed. */
static void conn_after_fork(void) { conn_close(atomic_exchange(&kept, NULL)); }

__attribute__((constructor)) static void conn_init(void) { pthread_atfork(NULL, NULL, conn_after_fork); }

/* header_value finds header name (case-insensitive) in an answer's head of hlen bytes: its
 * value and *vlen, or NULL. */
static const char *header_value(const char *head, size_t hlen, const char *name, size_t *vlen)
{
	const char *end = head + hlen, *p = memchr(head, '\n', hlen);
	size_t n = strlen(name);
	while (p != NULL && p + 1 < end) {
		const char *line = p + 1, *eol = memchr(line, '\n', (size_t)(end - line)), *v, *ve;
		if (eol == NULL)
			eol = end;
		if ((size_t)(eol - line) > n && strncasecmp(line, name, n) == 0 && line[n] == ':') {
			for (v = line + n + 1; v < eol && (*v == ' ' || *v == '\t'); v++)
				;
			for (ve = eol; ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'); ve--)
				;
			*vlen = (size_t)(ve - v);
			return v;
		}
		p = eol < end ? eol : NULL;
	}
	return NULL;
}

/* header_number reads the number after prefix in header name's value (prefix "" = the value
 * itself), or -1. */
static long long header_number(const char *head, size_t hlen, const char *name, const char *prefix)
{
	size_t vlen, plen = strlen(prefix);
	const char *v = header_value(head, hlen, name, &vlen), *at;
	char num[32];
	size_t i = 0;
	if (v == NULL)
		return -1;
	if (plen > 0) {
		for (at = v; at + plen <= v + vlen && strncasecmp(at, prefix, plen) != 0; at++)
			;
		if (at + plen > v + vlen)
			return -1;
		vlen -= (size_t)(at + plen - v);
		v = at + plen;
	}
	while (i < vlen && i + 1 < sizeof(num) && v[i] >= '0' && v[i] <= '9') {
		num[i] = v[i];
		i++;
	}
	num[i] = '\0';
	return i > 0 ? strtoll(num, NULL, 10) : -1;
}

/* unix_connect opens a connection to the controller's socket: the descriptor, or NO_DIRECT
 * (no controller there), or -EIO. */
static int unix_connect(const struct endpoint *e)
{
	struct sockaddr_un sa;
	int fd, rc;
	if (strlen(e->sock) >= sizeof(sa.sun_path))
		return NO_DIRECT; /* too long for a socket address: the helper's Go client says so */
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, e->sock, strlen(e->sock));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -EIO;
	while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa))) != 0 && errno == EINTR)
		;
	if (rc != 0 && errno != EISCONN) {
		close(fd);
		return NO_DIRECT;
	}
	return fd;
}

/* post sends body to the controller and reads the answer's body into ans: the HTTP status,
 * or NO_DIRECT when the controller does not answer there (the helper retries, as the Go
 * client does, [client] connect_retries times), or a negative errno. Over TCP, mfd is
 * munge_ask's connection (or -1), which post closes. kc is a kept connection to use (or
 * NULL), which post keeps again or closes. */
static int post(const struct endpoint *e, const struct buf *body, struct answer *ans, int mfd, struct conn *kc)
{
	const int keep_ok = geteuid() != 0;
	int again = 0;
	for (;;) {
		char head[512];
		char *cred = NULL, *sep;
		struct buf in = {0}, req = {0};
		int fd, rc, status = 0, reused = kc != NULL, timed_out = 0;
		size_t hlen = 0;
		long long clen = -1, idle_s = -1, identity_s = -1;
		int framed = 0, keep = 0;
		if (reused) {
			fd = kc->fd;
		} else if (e->tcp) {
			/* one per connection: munged refuses a replay */
			if (mfd < 0 && again)
				mfd = munge_ask(e->munge);
			rc = mfd >= 0 ? munge_take(mfd, &cred) : -1;
			mfd = -1;
			if (rc != 0)
				rc = munge_credential(e->munge, &cred);
			if (rc != 0)
				return rc;
			fd = tcp_connect(e);
			if (fd < 0) {
				free(cred);
				return NO_DIRECT;
			}
		} else if ((fd = unix_connect(e)) < 0) {
			return fd;
		}
		/* HTTP/1.0: an answer the controller cannot frame (no Content-Length) is the rest of
		 * the stream, never chunked; one it frames keeps the connection open when asked
		 * (Connection: keep-alive). The request goes in one write: pieces written apart each
		 * wake the controller (and over TCP, Nagle's algorithm holds each piece after the
		 * first until the one before it is acknowledged). */
		snprintf(head, sizeof(head), "POST /dw/v1/job_stages HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s%s",
			 e->tcp ? e->host : "spillway", body->len, keep_ok ? "Connection: keep-alive\r\n" : "",
			 reused && e->tcp ? "Authorization: MUNGE-connection\r\n" : "");
		buf_str(&req, head);
		if (cred != NULL) {
			buf_str(&req, "Authorization: MUNGE ");
			buf_str(&req, cred);
			buf_str(&req, keep_ok ? "\r\nSpillway-Connection-Identity: bind\r\n" : "\r\n");
		}
		buf_str(&req, "\r\n");
		free(cred);
		buf_add(&req, body->p, body->len);
		if (req.oom) {
			free(req.p);
			if (reused)
				conn_offer(kc); /* unused: still good */
			else
				close(fd);
			return -ENOMEM;
		}
		rc = write_all(fd, req.p, req.len);
		free(req.p);
		if (rc != 0) {
			if (reused) {
				conn_close(kc);
				kc = NULL;
				if (!again) { /* the request did not all leave: not acted on; a new connection */
					again = 1;
					continue;
				}
			} else {
				close(fd);
			}
			return NO_DIRECT; /* the controller went away before reading: the helper retries */
		}
		for (;;) {
			char chunk[16384];
			size_t want = sizeof(chunk);
			ssize_t n;
			if (framed) { /* no more than the answer: the connection may carry the next */
				if (in.len >= hlen + (size_t)clen)
					break;
				if (hlen + (size_t)clen - in.len < want)
					want = hlen + (size_t)clen - in.len;
			}
			n = read(fd, chunk, want);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { /* no answer within the bound */
				timed_out = 1;
				break;
			}
			if (n <= 0)
				break;
			if (in.len + (size_t)n > MAX_OUTPUT) {
				in.oom = 1;
				break;
			}
			buf_add(&in, chunk, (size_t)n);
			if (hlen == 0 && in.p != NULL && (sep = strstr(in.p, "\r\n\r\n")) != NULL) {
				size_t vlen;
				const char *conn;
				hlen = (size_t)(sep + 4 - in.p);
				clen = header_number(in.p, hlen, "Content-Length", "");
				conn = header_value(in.p, hlen, "Connection", &vlen);
				framed = clen >= 0 && conn != NULL && vlen == 10 && strncasecmp(conn, "keep-alive", 10) == 0;
				idle_s = header_number(in.p, hlen, "Keep-Alive", "timeout=");
				identity_s = header_number(in.p, hlen, "Spillway-Connection-Identity", "");
			}
		}
		if (in.oom || timed_out || hlen == 0 || (framed && in.len < hlen + (size_t)clen) || sscanf(in.p, "HTTP/%*s %d", &status) != 1) {
			int answered = in.p != NULL;
			free(in.p);
			if (reused)
				conn_close(kc);
			else
				close(fd);
			if (timed_out) {
				if (debug_enabled())
					fprintf(stderr, "libdatawarp: the controller at %s did not answer within %d ms ([controller] request_timeout + 5 s)\n", e->host, e->answer_ms);
				return -EIO;
			}
			if (reused && !answered) {
				if (debug_enabled())
					fprintf(stderr, "libdatawarp: the kept connection to the controller ended without an answer; the call may have been made, so it is not sent again\n");
				return -EIO;
			}
			return !answered ? NO_DIRECT : -EIO; /* closed without an answer: the helper retries */
		}
		if (status == 401 && reused && e->tcp && !again) {
			/* the connection's identity expired: the controller did not act; a new connection
			   with a fresh credential */
			free(in.p);
			conn_close(kc);
			kc = NULL;
			again = 1;
			continue;
		}
		keep = keep_ok && framed && idle_s >= 1 && (!e->tcp || identity_s >= 1);
		if (keep && kc == NULL && (kc = malloc(sizeof(*kc))) != NULL) {
			kc->fd = fd;
			kc->pid = getpid();
			kc->euid = geteuid();
			kc->egid = getegid();
			endpoint_key(e, kc->where, sizeof(kc->where));
		}
		if (keep && kc != NULL) {
			long long now = mono_ms(), idle_ms = idle_s * 1000 / 2;
			if (idle_ms > KEEP_IDLE_MAX_MS)
				idle_ms = KEEP_IDLE_MAX_MS;
			kc->until_ms = now + idle_ms;
			if (e->tcp) {
				kc->identity_until_ms = now + identity_s * 1000 - 1000;
				if (kc->identity_until_ms < kc->until_ms)
					kc->until_ms = kc->identity_until_ms;
			}
			conn_offer(kc);
		} else if (kc != NULL) {
			conn_close(kc);
		} else {
			close(fd);
		}
		memmove(in.p, in.p + hlen, in.len - hlen + 1);
		ans->text = in.p;
		ans->len = in.len - hlen;
		return status;
	}
}

/* errno_of_kind is stagecall.ErrnoOfKind: the errno of an error answer's kind. */
static int errno_of_kind(const char *text)
{
	static const struct {
		const char *kind;
		int err;
	} kinds[] = {{"\"busy\"", EBUSY}, {"\"user\"", EINVAL}, {"\"too_large\"", E2BIG}, {"\"not_found\"", ENOENT},
		     {"\"forbidden\"", EACCES}, {"\"unauthorized\"", EACCES}};
	const char *k = strstr(text, "\"kind\":");
	size_t i;
	if (k == NULL)
		return EIO;
	k += 7;
	while (*k == ' ')
		k++;
	for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strncmp(k, kinds[i].kind, strlen(kinds[i].kind)) == 0)
			return kinds[i].err;
	return EIO;
}

/* A call: the verb, its type and when, the burst buffer paths and the PFS paths
 * (stagecall.Call). pfs_dir_of_list: out --type list, whose PFS paths are the directory and
 * each file's destination in it. */
struct call {
	const char *verb, *type, *when;
	const char *const *dw;
	size_t ndw;
	const char *const *pfs;
	size_t npfs;
	int pfs_dir_of_list;
	long long concurrency;
};

/* dcall makes a call on the controller's socket: the answer's errno (negated), its text in
 * ans when ans is not NULL; NO_DIRECT when the helper must make it. */
static int dcall(const struct call *c, struct answer *ans)
{
	struct endpoint ep;
	struct buf body = {0};
	struct answer a = {NULL, 0};
	struct conn *kc;
	char **points;
	size_t i;
	int status, rc, dw_dir, mfd = -1;
	if (ans != NULL) {
		ans->text = NULL;
		ans->len = 0;
	}
	if (controller_endpoint(&ep) != 0)
		return NO_DIRECT;
	kc = conn_take(&ep);
	if (ep.tcp && kc == NULL) /* munged makes the credential while the paths are probed */
		mfd = munge_ask(ep.munge);
	points = mount_points();
	buf_str(&body, "{\"verb\":");
	buf_json(&body, c->verb);
	if (c->type != NULL) {
		buf_str(&body, ",\"type\":");
		buf_json(&body, c->type);
	}
	if (c->when != NULL) {
		buf_str(&body, ",\"when\":");
		buf_json(&body, c->when);
	}
	if (c->concurrency != 0) {
		char num[32];
		snprintf(num, sizeof(num), ",\"concurrency\":%lld", c->concurrency);
		buf_str(&body, num);
	}
	/* the directory of a burst buffer path counts for a file staged in only */
	dw_dir = strcmp(c->verb, "in") == 0 && c->type != NULL && strcmp(c->type, "file") == 0;
	buf_str(&body, ",\"dw\":[");
	for (i = 0; i < c->ndw; i++) {
		if (i > 0)
			buf_str(&body, ",");
		buf_probe(&body, c->dw[i], points, 1, dw_dir); /* a list must stay small */
	}
	buf_str(&body, "],\"pfs\":[");
	for (i = 0; i < c->npfs; i++) {
		if (i > 0)
			buf_str(&body, ",");
		buf_probe(&body, c->pfs[i], points, 0, 1);
	}
	if (c->pfs_dir_of_list && c->npfs == 1) {
		/* each file's destination: the directory joined with the base name of its path */
		for (i = 0; i < c->ndw; i++) {
			char *real = canonical(c->dw[i]), *dest;
			const char *base;
			if (real == NULL) {
				body.oom = 1;
				break;
			}
			base = strrchr(real, '/') != NULL ? strrchr(real, '/') + 1 : real;
			dest = malloc(strlen(c->pfs[0]) + strlen(base) + 2);
			if (dest == NULL) {
				free(real);
				body.oom = 1;
				break;
			}
			sprintf(dest, "%s/%s", c->pfs[0], base);
			buf_str(&body, ",");
			buf_probe(&body, dest, points, 0, 0); /* its directory is pfs[0] */
			free(dest);
			free(real);
		}
	}
	buf_str(&body, "]}");
	free_points(points);
	if (body.oom) {
		free(body.p);
		if (mfd >= 0)
			close(mfd);
		conn_offer(kc);
		return -ENOMEM;
	}
	status = post(&ep, &body, &a, mfd, kc);
	free(body.p);
	if (status == NO_DIRECT || status < 0)
		return status;
	if (status == 404 || status == 405) {
		/* the call always answers 200: a controller older than it (an upgrade under way)
		   has no such endpoint, and the helper speaks to it as it knows */
		free(a.text);
		return NO_DIRECT;
	}
	if (status != 200) {
		/* not a call (no credential, ...): {"error": ..., "kind": ...} */
		rc = errno_of_kind(a.text);
		if (debug_enabled())
			fprintf(stderr, "libdatawarp: the controller at %s answered %d: %s", ep.tcp ? ep.host : ep.sock, status, a.text);
		free(a.text);
		return -rc;
	}
	{
		const char *e = strstr(a.text, "\"errno\":");
		if (e == NULL) {
			if (debug_enabled())
				fprintf(stderr, "libdatawarp: the controller answered no errno: %s\n", a.text);
			free(a.text);
			return -EIO;
		}
		rc = (int)strtol(e + 8, NULL, 10);
	}
	/* as the helper's: a list over the controller's limit is always said */
	if (rc != 0 && (debug_enabled() || rc == E2BIG))
		fprintf(stderr, "libdatawarp: %s", a.text);
	if (ans != NULL)
		*ans = a;
	else
		free(a.text);
	return -rc;
}

/* dwait is dw_wait_*'s direct path: a query until no stage of the paths is waiting or
 * running (failed ones end the wait, as Cray's did), polled as `dwcli stage wait` polls:
 * every 10 ms at first, doubling up to 500 ms. */
static int dwait(const char *const *paths, size_t n)
{
	struct timespec delay = {0, 10 * 1000 * 1000};
	for (;;) {
		struct answer ans;
		struct call c = {.verb = "query", .dw = paths, .ndw = n};
		int rc = dcall(&c, &ans), pending = 0;
		if (rc != 0) {
			free(ans.text);
			return rc;
		}
		if (json_int(ans.text, "pending", &pending) != 0)
			rc = -EIO;
		free(ans.text);
		if (rc != 0 || pending == 0)
			return rc;
		{
			struct timespec left = delay;
			while (nanosleep(&left, &left) != 0 && errno == EINTR)
				;
		}
		delay.tv_nsec *= 2;
		if (delay.tv_nsec > 500 * 1000 * 1000)
			delay.tv_nsec = 500 * 1000 * 1000;
	}
}

/* ---- staging ------------------------------------------------------------------------------- */

int dw_stage_file_in(const char *dw_file_path, const char *pfs_file_path)
{
	if (dw_file_path == NULL || pfs_file_path == NULL)
		return -EINVAL;
	{
		struct call c = {.verb = "in", .type = "file", .dw = &dw_file_path, .ndw = 1, .pfs = &pfs_file_path, .npfs = 1};
		int rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
	const char *args[] = {"in", "--type", "file", "--", dw_file_path, pfs_file_path};
	return call(args, 6);
}

int dw_stage_directory_in(const char *dw_directory, const char *pfs_directory)
{
	if (dw_directory == NULL || pfs_directory == NULL)
		return -EINVAL;
	{
		struct call c = {.verb = "in", .type = "directory", .dw = &dw_directory, .ndw = 1, .pfs = &pfs_directory, .npfs = 1};
		int rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
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
	{
		size_t n = 0;
		while (pfs_list[n] != NULL)
			n++;
		struct call c = {.verb = "in", .type = "list", .dw = &dw_directory, .ndw = 1, .pfs = pfs_list, .npfs = n};
		rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
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
	if (!pfs_ignored(t) && pfs == NULL)
		return -EINVAL;
	{
		struct call c = {.verb = "out", .type = type, .when = when, .dw = &dw, .ndw = 1, .pfs = &pfs, .npfs = pfs_ignored(t) ? 0 : 1};
		int rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
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
	{
		size_t n = 0;
		while (dw_list[n] != NULL)
			n++;
		struct call c = {.verb = "out", .type = "list", .when = when, .dw = dw_list, .ndw = n,
				 .pfs = &pfs_directory, .npfs = pfs_ignored(stage_type) ? 0 : 1, .pfs_dir_of_list = 1};
		rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
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
	{
		struct call c = {.verb = "query", .dw = paths, .ndw = n};
		rc = dcall(&c, &ans);
	}
	if (rc == NO_DIRECT) {
		args = calloc(n + 2, sizeof(*args));
		if (args == NULL)
			return -ENOMEM;
		args[0] = "query";
		args[1] = "--";
		for (i = 0; i < n; i++)
			args[2 + i] = paths[i];
		rc = run(args, n + 2, &ans);
		free(args);
	}
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
	{
		size_t n = 0;
		while (paths[n] != NULL)
			n++;
		struct call c = {.verb = verb, .dw = paths, .ndw = n};
		rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
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
	{
		size_t n = 0;
		while (paths[n] != NULL)
			n++;
		rc = dwait(paths, n);
		if (rc != NO_DIRECT)
			return rc;
	}
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
		/* 0 is the controller's to refuse (-EINVAL, with its message) */
		struct call c = {.verb = "concurrency", .dw = &dw_instance_path, .ndw = 1, .concurrency = concurrent_stages};
		int rc = dcall(&c, NULL);
		if (rc != NO_DIRECT)
			return rc;
	}
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
	{
		struct call c = {.verb = "failed", .dw = &dw_instance_path, .ndw = 1};
		rc = dcall(&c, &ans);
	}
	if (rc == NO_DIRECT) {
		const char *args[] = {"list", "--failed", "--", dw_instance_path};
		rc = run(args, 4, &ans);
	}
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
		struct call c = {.verb = "accounting", .dw = &path, .ndw = 1};
		rc = dcall(&c, &ans);
	}
	if (rc == NO_DIRECT) {
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
