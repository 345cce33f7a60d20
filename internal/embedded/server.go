package embedded

// The home's server. A home's controller and agent run in one small background process,
// `spillway home serve`, that the first command needing them starts and that every command on
// the home (spillway run, dwstat, dwcli, spillway persistent) talks to over the home's socket.
// It owns the FUSE mounts, so a job's files do not depend on which `spillway run` started it,
// and it outlives the commands: it exits once it has been idle for home.idle_timeout.
//
// Starting is decided under an exclusive lock on server.lock: a command that finds no server
// answering takes the lock, looks again (another may have just started one), and only then
// starts one and waits for it to answer. A server that decides to exit takes the same lock
// first and keeps it until it has closed its state, so a command that comes meanwhile waits and
// then starts a fresh one. Concurrent starts are therefore safe, and a command never talks to a
// server that is going away without noticing (its next connection starts a new one).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/controller"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/runjob"
	"github.com/spillway-hpc/spillway/internal/views"
)

// Files of a home besides the configuration, the state, the SSD tree and the mounts.
const (
	serverLockName = "server.lock" // who starts or stops the server
	serverInfoName = "server.json" // the running server: pid, start time, binary
	serverLogName  = "server.log"  // the server's output
	runsDirName    = "runs"        // one record per spillway run (see runjob.Record)
)

// LogPath is the server's log.
func (h *Home) LogPath() string { return h.path(serverLogName) }

// Records is the home's directory of run records.
func (h *Home) Records() *runjob.Records { return &runjob.Records{Dir: h.path(runsDirName)} }

// ServerInfo is what server.json says about the running server.
type ServerInfo struct {
	PID        int       `json:"pid"`
	Start      uint64    `json:"start"` // the process's start time, clock ticks since boot
	Started    time.Time `json:"started"`
	Exe        string    `json:"exe"`
	ExeModTime time.Time `json:"exe_mod_time"`
	Config     time.Time `json:"config_mod_time"` // of spillway.toml when the server read it
}

// Server returns the running server's record, nil when no server process is alive.
func (h *Home) Server() *ServerInfo {
	data, err := os.ReadFile(h.path(serverInfoName))
	if err != nil {
		return nil
	}
	var info ServerInfo
	if json.Unmarshal(data, &info) != nil || !runjob.Alive(info.PID, info.Start) {
		return nil
	}
	return &info
}

// Client returns an API client of the home's server. Every connection it opens starts the
// server first if none answers (the server exits when idle, so this may happen mid-command).
// exe is the spillway binary to start it with.
func (h *Home) Client(exe string) (*apiclient.Client, error) {
	sock := h.Config.Controller.Socket
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		if c, err := d.DialContext(ctx, "unix", sock); err == nil {
			return c, nil
		}
		if err := h.ensure(ctx, exe); err != nil {
			return nil, err
		}
		return d.DialContext(ctx, "unix", sock)
	}
	cfg := h.Config
	return apiclient.New("unix:"+sock, apiclient.Options{
		Dial: dial, ConnectRetries: cfg.Client.ConnectRetries, RetryWait: cfg.Client.RetryWait.D(),
		RequestTimeout: cfg.Controller.RequestTimeout.D() + cfg.Home.StartTimeout.D(),
		Hint:           "the server of Spillway home " + h.Dir + ": see " + h.LogPath(),
	})
}

// ping asks the server for the API's versions.
func (h *Home) ping(ctx context.Context) error {
	sock := h.Config.Controller.Socket
	c := http.Client{Timeout: h.Config.Controller.RequestTimeout.D(), Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://spillway/dw/", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", sock, resp.Status)
	}
	return nil
}

// lockFile takes an exclusive lock on path, giving up at deadline.
func lockFile(path string, deadline time.Time) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%s stayed locked", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ensure starts the home's server unless one answers.
func (h *Home) ensure(ctx context.Context, exe string) error {
	timeout := h.Config.Home.StartTimeout.D()
	deadline := time.Now().Add(timeout)
	unlock, err := lockFile(h.path(serverLockName), deadline)
	if err != nil {
		return fmt.Errorf("starting the home's server: %v for longer than home.start_timeout (%s): another command is starting or stopping it; see %s", err, timeout, h.LogPath())
	}
	defer unlock()
	if h.ping(ctx) == nil {
		return nil // another command started it meanwhile
	}
	if info := h.Server(); info != nil {
		// Alive but not answering, and not stopping (it would hold the lock): it may be
		// starting still. Give it until the deadline.
		for time.Now().Before(deadline) && runjob.Alive(info.PID, info.Start) {
			if h.ping(ctx) == nil {
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		if runjob.Alive(info.PID, info.Start) {
			return fmt.Errorf("the home's server (pid %d) runs but does not answer on %s; see %s, and stop it with `spillway home stop --force`", info.PID, h.Config.Controller.Socket, h.LogPath())
		}
	}
	h.rotateLog()
	logf, err := os.OpenFile(h.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("the home's server log: %w", err)
	}
	cmd := exec.Command(exe, "home", "serve", "--home", h.Dir)
	cmd.Dir = h.Dir
	cmd.Stdout, cmd.Stderr = logf, logf // not the command's: they may be a pipe someone waits on
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // no terminal: a closed one must not stop it
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("starting the home's server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		if h.ping(ctx) == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the home's server exited at start (%v): %s", err, logTail(h.LogPath(), 2000))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the home's server (pid %d) did not answer within home.start_timeout (%s); see %s", cmd.Process.Pid, timeout, h.LogPath())
		}
	}
}

// serverEnv is the environment of the server: the command's, without the test hooks meant
// for the command itself.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SPILLWAY_CRASH_") || strings.HasPrefix(kv, "SPILLWAY_TEST_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// rotateLog moves a log larger than home.log_max_size to server.log.1.
func (h *Home) rotateLog() {
	if st, err := os.Stat(h.LogPath()); err == nil && st.Size() > int64(h.Config.Home.LogMaxSize) {
		os.Rename(h.LogPath(), h.LogPath()+".1")
	}
}

func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log)"
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// activity counts the API requests of commands: the server is not idle while one runs, nor
// for home.idle_timeout after the last one.
type activity struct {
	inFlight atomic.Int64
	mu       sync.Mutex
	last     time.Time
}

func (a *activity) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.inFlight.Add(1)
		a.touch()
		defer func() { a.touch(); a.inFlight.Add(-1) }()
		h.ServeHTTP(w, r)
	})
}

func (a *activity) touch() {
	a.mu.Lock()
	a.last = time.Now()
	a.mu.Unlock()
}

func (a *activity) quietFor() time.Duration {
	if a.inFlight.Load() > 0 {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return time.Since(a.last)
}

// atRest reports whether nothing moves: nothing mounted, no stage unfinished, every object at
// its goal (or waiting for an operator). Persistent instances and kept sessions may rest.
func atRest(w *lifecycle.World) bool {
	if len(w.Activations) > 0 {
		return false
	}
	for _, st := range w.Stages {
		if !st.Ended() {
			return false
		}
	}
	settled := func(s model.State) bool {
		return s.FuseBlown || (s.Goal == model.GoalCreate && s.Actualized && !s.Transitioning)
	}
	for _, o := range w.Sessions {
		if !settled(o.State) {
			return false
		}
	}
	for _, o := range w.Instances {
		if !settled(o.State) {
			return false
		}
	}
	for _, o := range w.Fragments {
		if !settled(o.State) {
			return false
		}
	}
	for _, o := range w.Configurations {
		if !settled(o.State) {
			return false
		}
	}
	for _, o := range w.Namespaces {
		if !settled(o.State) {
			return false
		}
	}
	return true
}

// ctlOps lets the cleanup of gone runs (runjob.Reap) act on the controller directly.
type ctlOps struct{ c *controller.Controller }

func (o ctlOps) Session(ctx context.Context, token string) (views.All, error) {
	w, err := o.c.SessionWorld(ctx, token)
	if err != nil {
		return views.All{}, err
	}
	return views.Build(w), nil
}

func (o ctlOps) PostRun(ctx context.Context, token string) error { return o.c.PostRun(ctx, token) }
func (o ctlOps) Stages(ctx context.Context, token, direction string, reqs []lifecycle.StageRequest) error {
	return o.c.Stages(ctx, token, direction, reqs)
}
func (o ctlOps) Teardown(ctx context.Context, token string, hurry bool) error {
	return o.c.Teardown(ctx, token, hurry)
}

// Serve is `spillway home serve`: it runs the home's controller and agent, serves the API on
// the home's socket, cleans up after `spillway run`s that are gone, and returns once it has
// been idle for home.idle_timeout, or on SIGTERM or SIGINT. stageWorker and pfsWorker are
// the workers' argv prefixes ({exe, "stage-worker"} or the small binary; {exe, "pfs-worker"}).
func (h *Home) Serve(log *slog.Logger, stageWorker, pfsWorker []string) error {
	cfg := h.Config
	configTime := time.Time{}
	if st, err := os.Stat(h.path(ConfigName)); err == nil {
		configTime = st.ModTime()
	}
	r, err := h.start(log, stageWorker, pfsWorker)
	if err != nil {
		return err
	}
	l, err := listen(cfg.Controller.Socket)
	if err != nil {
		r.Close()
		return err
	}
	act := &activity{last: time.Now()}
	lim := APILimits(cfg, log)
	srv := httpapi.NewServer(r.handler(act.wrap(controller.NewServer(r.Controller, "", nil, log))), lim)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(httpapi.LimitListener(l, lim)) }()

	start, _ := runjob.ProcStart(os.Getpid())
	exe, _ := os.Executable()
	info := ServerInfo{PID: os.Getpid(), Start: start, Started: time.Now(), Exe: exe, Config: configTime}
	if st, err := os.Stat(exe); err == nil {
		info.ExeModTime = st.ModTime()
	}
	if data, err := json.Marshal(info); err == nil {
		writeFileAtomic(h.path(serverInfoName), data)
	}
	log.Info("home server started", "home", h.Dir, "pid", info.PID, "socket", cfg.Controller.Socket, "idle_timeout", cfg.Home.IdleTimeout.D())

	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(stop)
	tick := min(cfg.Home.ReapInterval.D(), cfg.Home.IdleTimeout.D())
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	records := h.Records()
	ops := ctlOps{r.Controller}
	lastBusy := time.Now()
	idle := func() bool {
		if act.quietFor() < cfg.Home.IdleTimeout.D() {
			return false
		}
		w, err := r.Controller.ReadWorld(context.Background())
		if err != nil || !atRest(w) {
			lastBusy = time.Now()
			return false
		}
		return time.Since(lastBusy) >= cfg.Home.IdleTimeout.D()
	}
	homeAtStart, _ := os.Stat(h.Dir)
	why := ""
	for why == "" {
		select {
		case s := <-stop:
			if s == syscall.SIGHUP {
				continue // no terminal to lose; only TERM and INT stop the server
			}
			why = "stopped by " + s.String()
		case <-ticker.C:
			if gone := homeGone(h.Dir, homeAtStart); gone != "" {
				why = gone // nothing can reach this server any more: its socket went with the home
				continue
			}
			cleanups, err := runjob.Reap(context.Background(), ops, *records)
			if err != nil {
				log.Warn("cleaning up after gone runs", "err", err)
			}
			for _, c := range cleanups {
				log.Info("cleaning up", "token", c.Token, "what", c.Message)
			}
			if !idle() {
				continue
			}
			// Stop only under the start lock, and only if still idle once it is held: a
			// command that came meanwhile keeps the server.
			unlock, err := lockFile(h.path(serverLockName), time.Now().Add(cfg.Home.StopTimeout.D()))
			if err != nil {
				continue
			}
			if !idle() {
				unlock()
				continue
			}
			defer unlock() // held until everything is closed
			why = fmt.Sprintf("idle for %s (home.idle_timeout)", cfg.Home.IdleTimeout.D())
		}
	}
	if why != "" && !strings.HasPrefix(why, "idle") {
		// A stop: still take the start lock (briefly, if a command holds it) so that nobody
		// starts a server while this one closes the state.
		if unlock, err := lockFile(h.path(serverLockName), time.Now().Add(cfg.Home.StopTimeout.D())); err == nil {
			defer unlock()
		}
	}
	log.Info("home server stopping", "why", why)
	os.Remove(h.path(serverInfoName))
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Home.StopTimeout.D())
	srv.Shutdown(ctx) // closes the socket: new commands wait for the lock, then start anew
	cancel()
	<-served
	r.Close()
	log.Info("home server stopped")
	return nil
}

// Stop asks the home's server to exit and waits for it (home.stop_timeout). Unless force, it
// refuses while jobs use the burst buffer: stopping unmounts their files.
func (h *Home) Stop(force bool, client *apiclient.Client) (stopped bool, err error) {
	info := h.Server()
	if info == nil {
		return false, nil
	}
	if !force && client != nil {
		if all, err := client.All(context.Background()); err == nil {
			var busy []string
			for _, s := range all.Sessions {
				for _, a := range all.Activations {
					if a.Session == s.ID {
						busy = append(busy, s.Token)
						break
					}
				}
			}
			if len(busy) > 0 {
				return false, fmt.Errorf("job(s) %s use the burst buffer: stopping the server would unmount their files; wait for them, or use --force", strings.Join(busy, ", "))
			}
		}
	}
	if err := syscall.Kill(info.PID, syscall.SIGTERM); err != nil {
		return false, fmt.Errorf("stopping the home's server (pid %d): %w", info.PID, err)
	}
	deadline := time.Now().Add(h.Config.Home.StopTimeout.D())
	for runjob.Alive(info.PID, info.Start) {
		if time.Now().After(deadline) {
			return false, fmt.Errorf("the home's server (pid %d) did not exit within home.stop_timeout (%s); see %s", info.PID, h.Config.Home.StopTimeout.D(), h.LogPath())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true, nil
}

// Stale says why the running server is not what this command would start ("" when it is):
// another binary, or an older configuration file.
func (h *Home) Stale(exe string) string {
	info := h.Server()
	if info == nil {
		return ""
	}
	if st, err := os.Stat(exe); err == nil && (exe != info.Exe || !st.ModTime().Equal(info.ExeModTime)) {
		return fmt.Sprintf("the home's server (pid %d) runs %s as it was at %s", info.PID, info.Exe, info.ExeModTime.Format("2006-01-02 15:04:05"))
	}
	if st, err := os.Stat(h.path(ConfigName)); err == nil && !st.ModTime().Equal(info.Config) {
		return fmt.Sprintf("the home's server (pid %d) read %s before it last changed", info.PID, h.path(ConfigName))
	}
	return ""
}

// homeGone says why the server's home is no longer the one it started in (removed, or
// replaced by a new directory of the same name), or "".
func homeGone(dir string, atStart os.FileInfo) string {
	now, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "its home directory " + dir + " was removed"
	case err == nil && atStart != nil && !os.SameFile(now, atStart):
		return "its home directory " + dir + " was replaced"
	}
	return ""
}
