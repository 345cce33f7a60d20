package controller

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/views"
)

// APIVersion is the version of the REST API under /dw/.
const APIVersion = "v1"

//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the API's OpenAPI 3 document.
func OpenAPI() []byte { return openAPIDocument }

// Serve serves the API on a listener until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener, lim httpapi.Limits) error {
	return httpapi.Serve(ctx, l, s, lim)
}

// Tables are the object lists served under /dw/v1/<table>, in dwstat's order.
var Tables = []string{"pools", "nodes", "sessions", "instances", "configurations", "registrations", "activations", "fragments", "namespaces", "stages", "stage_history"}

// caller is who sent a request.
type caller struct {
	uid        uint32
	gid        uint32 // from the socket: the caller's group when it connected
	known      bool   // the uid was read from the socket, or a token was presented
	privileged bool   // root, the controller's own user, a WLM user, or a token holder
	node       string // a node presenting its own credential (package nodekey): it may only heartbeat
}

type callerKey struct{}

// Server is the HTTP face of a Controller.
type Server struct {
	c          *Controller
	log        *slog.Logger
	token      string
	privileged map[uint32]bool
	mux        *http.ServeMux
	lead       Leadership // nil: the only controller (no [ha])
	munge      *mungeGate
	// Version is the running Spillway's version, shown by GET /dw/v1/controller.
	Version string
	// Routes lists "METHOD /path" patterns, for the OpenAPI consistency test.
	Routes []string
}

// NewServer builds the API. token is the shared secret TCP clients must present ("" = TCP
// refused); wlmUsers are user names allowed to act on any session.
func NewServer(c *Controller, token string, wlmUsers []string, log *slog.Logger) *Server {
	s := &Server{c: c, log: log, token: token, privileged: map[uint32]bool{0: true, uint32(os.Getuid()): true}, mux: http.NewServeMux(),
		munge: newMungeGate(c.cfg.Controller.MungeSocket, c.cfg.Controller.MungeFailuresPerMinute, c.cfg.Controller.MaxMungeDecodes)}
	for _, name := range wlmUsers {
		if u, err := user.Lookup(name); err == nil {
			if uid, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
				s.privileged[uint32(uid)] = true
			}
		}
	}
	s.handle("GET /dw/", s.versions)
	s.handle("GET /dw/v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPIDocument)
	})
	s.handle("GET /dw/v1/all", s.all)
	s.handle("GET /dw/v1/controller", s.controllerSelf)
	s.handle("GET /dw/v1/{table}", s.table)
	s.handle("POST /dw/v1/sessions", s.setup)
	s.handle("POST /dw/v1/sessions/{token}/data_in", s.stages(model.StageIn))
	s.handle("POST /dw/v1/sessions/{token}/data_out", s.stages(model.StageOut))
	s.handle("POST /dw/v1/sessions/{token}/pre_run", s.preRun)
	s.handle("POST /dw/v1/sessions/{token}/post_run", s.postRun)
	s.handle("POST /dw/v1/sessions/{token}/teardown", s.teardown)
	s.handle("GET /dw/v1/sessions/{token}/status", s.status)
	s.handle("GET /dw/v1/sessions/{token}/paths", s.paths)
	s.handle("PATCH /dw/v1/registrations/{id}", s.registration)
	s.handle("PATCH /dw/v1/nodes/{name}", s.node)
	s.handle("DELETE /dw/v1/nodes/{name}", s.removeNode)
	s.handle("POST /dw/v1/pools", s.pool)
	s.handle("DELETE /dw/v1/pools/{name}", s.removePool)
	s.handle("DELETE /dw/v1/activations/{id}", s.removeActivation)
	s.handle("POST /dw/v1/sessions/{token}/instances", s.createInstance)
	s.handle("POST /dw/v1/sessions/{token}/configurations", s.createConfiguration)
	s.handle("POST /dw/v1/sessions/{token}/activations", s.createActivation)
	s.handle("POST /dw/v1/{table}/{id}/replace_fuse", s.replaceFuse)
	s.handle("POST /dw/v1/nodes/{name}/heartbeat", s.heartbeat)
	s.handle("POST /dw/v1/run_ids", s.runID)
	s.handle("POST /dw/v1/sessions/{token}/lease", s.lease)
	s.handle("POST /dw/v1/sessions/{token}/job_stages", s.jobStages)
	s.handle("GET /dw/v1/sessions/{token}/job_stages", s.queryJobStages)
	s.handle("POST /dw/v1/sessions/{token}/job_stages/terminate", s.terminateJobStages)
	s.handle("POST /dw/v1/sessions/{token}/job_stages/concurrency", s.jobStageConcurrency)
	s.handle("GET /dw/v1/mounts", s.mount)
	s.handle("POST /dw/v1/job_stages", s.stageCall)
	s.handle("GET /dw/v1/accounting", s.allAccounting)
	s.handle("GET /dw/v1/instances/{id}/accounting", s.instanceAccounting)
	s.handle("GET /dw/v1/sessions/{token}/accounting", s.sessionAccounting)
	return s
}

// Leadership is what the API asks of a highly available controller's election (package ha).
type Leadership interface {
	Leading() bool
	// Leader is the leader's advertised API address; "" while none is elected.
	Leader(ctx context.Context) (string, error)
}

// SetLeadership makes the API of one of several controllers answer writes only while it
// leads: otherwise 503, kind not_leader, with the leader's address in the Spillway-Leader
// header. The client sends the request again to the leader itself, with its own credential,
// so a user stays that user (docs/security.md); reads are answered from the shared store.
func (s *Server) SetLeadership(l Leadership) { s.lead = l }

func (s *Server) notLeader(ctx context.Context, w http.ResponseWriter) {
	addr, err := s.lead.Leader(ctx)
	msg := "this controller does not lead (high availability, docs/admin.md): "
	switch {
	case err != nil:
		msg += "and cannot tell who does: " + err.Error()
	case addr == "":
		msg += "no leader is elected yet; try again shortly"
	default:
		w.Header().Set(controllerapi.LeaderHeader, addr)
		msg += "the leader is " + addr + "; send writes there (a client given several controllers does)"
	}
	httpapi.WriteError(w, http.StatusServiceUnavailable, "not_leader", msg)
}

func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.Routes = append(s.Routes, pattern)
	s.mux.HandleFunc(pattern, h)
}

// ServeHTTP authenticates the caller and dispatches.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	peer := httpapi.PeerOf(r)
	who := caller{uid: peer.UID, gid: peer.GID, known: peer.Known}
	viaMunge := false
	if auth := r.Header.Get("Authorization"); auth != "" {
		bearer, _ := strings.CutPrefix(auth, "Bearer ")
		node, isNode := nodekey.Verify(s.token, bearer)
		switch cred, isMunge := strings.CutPrefix(auth, "MUNGE "); {
		case s.token != "" && auth == "Bearer "+s.token:
			who.known, who.privileged = true, true
		case isNode:
			who = caller{known: true, node: node}
		case auth == controllerapi.MungeConnectionScheme:
			uid, gid, ok := s.connectionIdentity(w, r)
			if !ok {
				return
			}
			who, viaMunge = caller{uid: uid, gid: gid, known: true}, true
		case isMunge:
			ctx, cancel := context.WithTimeout(r.Context(), s.c.cfg.Controller.RequestTimeout.D())
			id, err := s.munge.decode(ctx, r.RemoteAddr, cred)
			cancel()
			if err != nil {
				httpapi.WriteError(w, mungeStatus(err), "unauthorized", err.Error())
				return
			}
			if !s.bindConnection(w, r, id.UID, id.GID) {
				return
			}
			who, viaMunge = caller{uid: id.UID, gid: id.GID, known: true}, true
		default:
			httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", "the token presented does not match controller.token_file")
			return
		}
	}
	if !who.known {
		httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", "TCP clients must authenticate: users with a MUNGE credential (munged running on their host with the cluster's key), "+
			"services with the shared token (Authorization: Bearer ...); local clients use the Unix socket")
		return
	}
	httpapi.Authenticated(w, r) // its connection may hold a reserved slot (controller.reserved_connections)
	if !r.ProtoAtLeast(1, 1) && strings.EqualFold(r.Header.Get("Connection"), "keep-alive") {
		// An HTTP/1.0 client keeping its connection (libdatawarp): told how long it stays
		// open idle, or that it does not when it would crowd out other connections.
		if httpapi.KeepAliveRoom(r) {
			w.Header().Set("Keep-Alive", fmt.Sprintf("timeout=%d", int(s.c.cfg.Controller.IdleTimeout.D()/time.Second)))
		} else {
			w.Header().Set("Connection", "close")
		}
	}
	if who.node != "" && (r.Method != "POST" || r.URL.Path != "/dw/v1/nodes/"+who.node+"/heartbeat") {
		httpapi.WriteError(w, http.StatusForbidden, "forbidden", fmt.Sprintf(
			"node %s's credential only sends that node's heartbeats; administration needs controller.token_file's secret", who.node))
		return
	}
	// A MUNGE credential proves a uid on some host of the cluster, and root on any compute
	// node can make one for any uid: it never grants administration (docs/security.md); nor
	// does a node's credential, which names no uid at all.
	if who.node == "" && !viaMunge {
		who.privileged = who.privileged || s.privileged[who.uid]
	}
	r.Body = http.MaxBytesReader(w, r.Body, int64(s.c.cfg.Controller.MaxRequestBytes))
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), callerKey{}, who), s.c.cfg.Controller.RequestTimeout.D())
	defer cancel()
	r = r.WithContext(ctx)
	if s.lead != nil && r.Method != http.MethodGet && r.Method != http.MethodHead && !s.lead.Leading() {
		s.notLeader(ctx, w) // every write is the leader's: the executor's state and the run leases are its
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		// No route: say so in JSON, as every other answer (the mux would answer in text).
		if s.routeExists(r) {
			httpapi.WriteError(w, http.StatusMethodNotAllowed, "user", fmt.Sprintf("%s is not allowed on %s; see /dw/v1/openapi.json", r.Method, r.URL.Path))
		} else {
			httpapi.WriteError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path+"; see /dw/v1/openapi.json")
		}
		return
	}
	s.mux.ServeHTTP(w, r)
}

// bindConnection checks a MUNGE credential's identity against its connection's: one identity
// per connection, so a credential of another user on a connection bound to a first one is
// refused (401, and the connection closed), never served as either. A request asking for it
// (Spillway-Connection-Identity: bind) binds the identity to the connection, for its later
// requests that claim it, for controller.munge_connection_lifetime; the answer says how long.
func (s *Server) bindConnection(w http.ResponseWriter, r *http.Request, uid, gid uint32) bool {
	conn := httpapi.IdentityOf(r)
	if conn == nil {
		return true
	}
	if buid, bgid, bound := conn.Bound(); bound && (buid != uid || bgid != gid) {
		w.Header().Set("Connection", "close")
		httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", fmt.Sprintf(
			"this connection proved uid %d gid %d with its first MUNGE credential, and this credential is uid %d gid %d's: "+
				"a connection keeps one identity; open a new connection for another user", buid, bgid, uid, gid))
		return false
	}
	lifetime := s.c.cfg.Controller.MungeConnectionLifetime.D()
	if lifetime <= 0 || !strings.EqualFold(r.Header.Get(controllerapi.ConnectionIdentityHeader), "bind") {
		return true
	}
	conn.Bind(uid, gid, time.Now())
	w.Header().Set(controllerapi.ConnectionIdentityHeader, strconv.Itoa(int(lifetime/time.Second)))
	return true
}

// connectionIdentity is the identity a request claims with Authorization: MUNGE-connection:
// its connection's, bound by an earlier request's MUNGE credential less than
// controller.munge_connection_lifetime ago; otherwise the request is refused (401) and its
// connection closed (the client sends a fresh credential on a new one).
func (s *Server) connectionIdentity(w http.ResponseWriter, r *http.Request) (uid, gid uint32, ok bool) {
	lifetime := s.c.cfg.Controller.MungeConnectionLifetime.D()
	var left time.Duration
	if conn := httpapi.IdentityOf(r); conn != nil {
		uid, gid, left, ok = conn.Claim(time.Now(), lifetime)
	}
	if !ok {
		w.Header().Set("Connection", "close")
		httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", fmt.Sprintf(
			"Authorization: %s claims the identity this connection proved with a MUNGE credential (%s: bind), and it has none: "+
				"none was proved on it, or longer ago than controller.munge_connection_lifetime (%s); send Authorization: MUNGE with a fresh credential",
			controllerapi.MungeConnectionScheme, controllerapi.ConnectionIdentityHeader, lifetime))
		return 0, 0, false
	}
	w.Header().Set(controllerapi.ConnectionIdentityHeader, strconv.Itoa(int(left/time.Second)))
	return uid, gid, true
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	kind := ErrorKind(err)
	status := map[string]int{"user": 400, "not_found": 404, "busy": 409, "taken": 409, "too_large": 413, "not_leader": 503}[kind]
	if status == 0 {
		status = 500
		s.log.Error("request failed", "err", err)
	}
	if kind == "not_leader" && s.lead != nil {
		s.notLeader(context.Background(), w) // deposed while answering: name the new leader
		return
	}
	httpapi.WriteError(w, status, kind, err.Error())
}

func who(r *http.Request) caller { c, _ := r.Context().Value(callerKey{}).(caller); return c }

// mayActOn checks that the caller owns the session (or is privileged).
func (s *Server) mayActOn(w http.ResponseWriter, r *http.Request, token string) bool {
	return s.mayActOnOr(w, r, token, func() { s.fail(w, lifecycle.ErrNoSession) })
}

// mayActOnOr is mayActOn with the answer for another user's job that the caller may not know
// of (controller.private_data): answered as an unknown token is, so tokens and owners cannot
// be enumerated.
func (s *Server) mayActOnOr(w http.ResponseWriter, r *http.Request, token string, unknown func()) bool {
	c := who(r)
	if c.privileged {
		return true
	}
	sess, err := s.c.sessionByToken(r.Context(), token)
	if err != nil {
		s.fail(w, err)
		return false
	}
	if sess == nil || sess.Owner == c.uid {
		return true // unknown tokens get their own answer (not found)
	}
	if s.c.cfg.Controller.PrivateData && !sess.Persistent {
		unknown()
		return false
	}
	httpapi.WriteError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("session %s belongs to uid %d, not to uid %d", token, sess.Owner, c.uid))
	return false
}

func (s *Server) requirePrivileged(w http.ResponseWriter, r *http.Request) bool {
	if who(r).privileged {
		return true
	}
	httpapi.WriteError(w, http.StatusForbidden, "forbidden", "this operation is for administrators (root or a controller.wlm_users user)")
	return false
}

// routeExists reports whether some method is served at the request's path.
func (s *Server) routeExists(r *http.Request) bool {
	for _, m := range []string{"GET", "POST", "PATCH", "DELETE"} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" {
			return true
		}
	}
	return false
}

func (s *Server) versions(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/dw/" {
		httpapi.WriteError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path+"; see /dw/v1/openapi.json")
		return
	}
	httpapi.WriteJSON(w, 200, map[string]any{"versions": []map[string]string{{"id": APIVersion}}})
}

func (s *Server) all(w http.ResponseWriter, r *http.Request) {
	if token := r.URL.Query().Get("token"); token != "" {
		// One session's objects (and those of the persistent instances it uses), read
		// through the indexes: what a command asks about its own job costs that job's
		// objects, not the state's.
		world, err := s.c.viewSession(r.Context(), token)
		if err != nil {
			s.fail(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, s.visible(r, views.Build(world)))
		return
	}
	all, err := s.snapshot(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, all)
}

// snapshot is every table and the stage history, as the caller may see them.
func (s *Server) snapshot(r *http.Request) (views.All, error) {
	world, err := s.c.viewShared(r.Context())
	if err != nil {
		return views.All{}, err
	}
	history, err := s.c.StageHistory(r.Context())
	if err != nil {
		return views.All{}, err
	}
	all := views.Build(world)
	all.StageHistory = views.History(history)
	return s.visible(r, all), nil
}

// visible is what the caller may see of all: everything for administrators and the workload
// manager, or where controller.private_data is off; an ordinary user's own objects and the
// persistent instances otherwise.
func (s *Server) visible(r *http.Request, all views.All) views.All {
	if c := who(r); !c.privileged && s.c.cfg.Controller.PrivateData {
		return all.VisibleTo(c.uid)
	}
	return all
}

// controllerSelf answers GET /dw/v1/controller: which role this controller plays. It answers
// with no leader elected too (that is when an admin asks).
func (s *Server) controllerSelf(w http.ResponseWriter, r *http.Request) {
	v := views.Controller{Role: "only", Engine: s.c.cfg.Store.Engine, Version: s.Version}
	if s.lead != nil {
		v.Role, v.Advertise = "following", s.c.cfg.HA.Advertise
		if s.lead.Leading() {
			v.Role = "leading"
		}
		leader, err := s.lead.Leader(r.Context())
		if err != nil {
			v.Error = err.Error()
		}
		v.Leader = leader
	}
	httpapi.WriteJSON(w, 200, v)
}

func (s *Server) setup(w http.ResponseWriter, r *http.Request) {
	var req lifecycle.Setup
	if !httpapi.Decode(w, r, &req) {
		return
	}
	if req.Manual && !s.requirePrivileged(w, r) { // dwcli create session: the walk-through is the administrators'
		return
	}
	if c := who(r); !c.privileged {
		if err := checkUserSetup(c.uid, groupsOf(c), req); err != nil {
			httpapi.WriteError(w, http.StatusForbidden, "forbidden", err.Error())
			return
		}
		if !req.Persistent && !s.ownsRunToken(r, c, req.Token) {
			httpapi.WriteError(w, http.StatusForbidden, "forbidden", fmt.Sprintf(
				"token %s was not drawn by uid %d: spillway run draws the run<N> of each of its jobs (POST /dw/v1/run_ids), and only the user who drew it may use it", req.Token, c.uid))
			return
		}
	}
	if err := s.c.Setup(r.Context(), req, !who(r).privileged); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"token": req.Token})
}

// ownsRunToken says whether the caller may set up the run<N> session token: they drew N, or
// the session exists and is theirs already (a setup re-sent after a controller restart).
func (s *Server) ownsRunToken(r *http.Request, c caller, token string) bool {
	if sess, err := s.c.sessionByToken(r.Context(), token); err == nil && sess != nil {
		return sess.Owner == c.uid
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(token, "run"), 10, 64)
	if err != nil {
		return false
	}
	drawn, err := s.c.RunIDDrawnBy(r.Context(), n, c.uid)
	return err == nil && drawn
}

// runToken is the form of the job tokens ordinary users make (spillway run): never a job id,
// which belongs to the workload manager.
var runToken = regexp.MustCompile(`^run[0-9]+$`)

// checkUserSetup says whether an ordinary (unprivileged) user may create this session: their
// own, with a group they belong to (stages run with it), and with a token that cannot take a
// job id from the workload manager.
func checkUserSetup(uid uint32, groups []uint32, req lifecycle.Setup) error {
	if req.Owner != uid {
		return fmt.Errorf("uid %d may not create a session for uid %d", uid, req.Owner)
	}
	if !slices.Contains(groups, req.Group) {
		return fmt.Errorf("uid %d is not in group %d: a session's group must be one of its owner's groups (stages run with it)", uid, req.Group)
	}
	if !req.Persistent && !runToken.MatchString(req.Token) {
		return fmt.Errorf("token %q is reserved for the workload manager (job ids); an ordinary user's job sessions are run<N> (spillway run), and persistent instances have names", req.Token)
	}
	if req.Creator == "SLURM" {
		return fmt.Errorf("creator SLURM is reserved for the workload manager (controller.wlm_users)")
	}
	return nil
}

// groupsOf lists the groups a caller belongs to: its group on the socket and its groups in
// the user database.
func groupsOf(c caller) []uint32 {
	groups := []uint32{c.gid}
	if u, err := user.LookupId(strconv.FormatUint(uint64(c.uid), 10)); err == nil {
		if ids, err := u.GroupIds(); err == nil {
			for _, g := range ids {
				if gid, err := strconv.ParseUint(g, 10, 32); err == nil {
					groups = append(groups, uint32(gid))
				}
			}
		}
	}
	return groups
}

func (s *Server) stages(direction string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token := r.PathValue("token")
		var req controllerapi.StagesRequest
		if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
			return
		}
		if err := s.c.Stages(r.Context(), token, direction, req.Stages); err != nil {
			s.fail(w, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"token": token})
	}
}

func (s *Server) preRun(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	var req controllerapi.PreRunRequest
	if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
		return
	}
	if err := s.c.PreRun(r.Context(), token, req.Nodes); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"token": token})
}

func (s *Server) postRun(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	if !s.mayActOn(w, r, token) {
		return
	}
	if err := s.c.PostRun(r.Context(), token); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"token": token})
}

func (s *Server) teardown(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	var req controllerapi.TeardownRequest
	if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
		return
	}
	if err := s.c.Teardown(r.Context(), token, req.Hurry); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"token": token})
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			httpapi.WriteError(w, 400, "user", "wait must be a duration such as 5s")
			return
		}
		// The request must be answered within request_timeout; the client's own bound is
		// larger (it waits half of its own).
		wait = min(d, s.c.cfg.Controller.MaxStatusWait.D(), s.c.cfg.Controller.RequestTimeout.D()/2)
	}
	token, step := r.PathValue("token"), r.URL.Query().Get("step")
	if !s.mayActOnOr(w, r, token, func() { httpapi.WriteJSON(w, 200, lifecycle.Status(&lifecycle.World{}, token, step)) }) {
		return
	}
	st, err := s.c.WaitStatus(r.Context(), token, step, wait)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, st)
}

func (s *Server) paths(w http.ResponseWriter, r *http.Request) {
	if !s.mayActOn(w, r, r.PathValue("token")) {
		return
	}
	env, err := s.c.Paths(r.Context(), r.PathValue("token"))
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]any{"paths": env})
}

func (s *Server) registration(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		httpapi.WriteError(w, 400, "user", "registration id must be a number")
		return
	}
	var req controllerapi.RegistrationUpdate
	if !httpapi.Decode(w, r, &req) || !s.requirePrivileged(w, r) {
		return
	}
	if req.Wait {
		httpapi.WriteError(w, 400, "user", "only wait=false (--no-wait) can be set")
		return
	}
	if err := s.c.ReleaseRegistration(r.Context(), id); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]int64{"id": id})
}

func (s *Server) node(w http.ResponseWriter, r *http.Request) {
	var req controllerapi.NodeUpdate
	if !httpapi.Decode(w, r, &req) || !s.requirePrivileged(w, r) {
		return
	}
	ch := lifecycle.NodeChange{Drain: req.Drain, Offline: req.Offline, Pool: req.Pool, Storage: req.Storage, Reason: req.Reason}
	if ch.Empty() {
		httpapi.WriteError(w, 400, "user", `give at least one of "drain", "offline", "pool" or "storage"`)
		return
	}
	if err := s.c.UpdateNode(r.Context(), r.PathValue("name"), ch); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]string{"id": r.PathValue("name")})
}

func (s *Server) removeNode(w http.ResponseWriter, r *http.Request) {
	if !s.requirePrivileged(w, r) {
		return
	}
	if err := s.c.RemoveNode(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]string{"id": r.PathValue("name")})
}

func (s *Server) removePool(w http.ResponseWriter, r *http.Request) {
	if !s.requirePrivileged(w, r) {
		return
	}
	if err := s.c.RemovePool(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]string{"id": r.PathValue("name")})
}

func (s *Server) removeActivation(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		httpapi.WriteError(w, 400, "user", "activation id must be a number")
		return
	}
	if !s.requirePrivileged(w, r) {
		return
	}
	if err := s.c.RemoveActivation(r.Context(), id); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 202, map[string]int64{"id": id})
}

// createInstance, createConfiguration and createActivation build a session's objects by
// hand (dwcli create instance|configuration|activation, DataWarp's walk-through): changes
// only administrators make, as the other administrative operations.
func (s *Server) createInstance(w http.ResponseWriter, r *http.Request) {
	var req lifecycle.ManualInstance
	if !httpapi.Decode(w, r, &req) || !s.requirePrivileged(w, r) {
		return
	}
	id, err := s.c.CreateInstance(r.Context(), r.PathValue("token"), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 201, controllerapi.Created{IDs: []int64{id}})
}

func (s *Server) createConfiguration(w http.ResponseWriter, r *http.Request) {
	var req lifecycle.ManualConfiguration
	if !httpapi.Decode(w, r, &req) || !s.requirePrivileged(w, r) {
		return
	}
	id, err := s.c.CreateConfiguration(r.Context(), r.PathValue("token"), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 201, controllerapi.Created{IDs: []int64{id}})
}

func (s *Server) createActivation(w http.ResponseWriter, r *http.Request) {
	var req lifecycle.ManualActivation
	if !httpapi.Decode(w, r, &req) || !s.requirePrivileged(w, r) {
		return
	}
	ids, err := s.c.CreateActivation(r.Context(), r.PathValue("token"), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 201, controllerapi.Created{IDs: ids})
}

// fuseTables are the tables whose objects have a fuse an administrator may replace.
var fuseTables = map[string]string{"fragments": lifecycle.KindFragment, "namespaces": lifecycle.KindNamespace, "activations": lifecycle.KindActivation,
	"sessions": lifecycle.KindSession, "instances": lifecycle.KindInstance, "configurations": lifecycle.KindConfiguration,
	"registrations": lifecycle.KindRegistration, "stages": lifecycle.KindStage}

func (s *Server) replaceFuse(w http.ResponseWriter, r *http.Request) {
	kind, ok := fuseTables[r.PathValue("table")]
	if !ok {
		httpapi.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no table %q with fuses; tables: fragments, namespaces, activations", r.PathValue("table")))
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		httpapi.WriteError(w, 400, "user", kind+" id must be a number")
		return
	}
	if !s.requirePrivileged(w, r) {
		return
	}
	if err := s.c.ReplaceFuse(r.Context(), kind, id); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 202, map[string]int64{"id": id})
}

func (s *Server) pool(w http.ResponseWriter, r *http.Request) {
	var req controllerapi.PoolCreate
	if !httpapi.Decode(w, r, &req) || !s.requirePrivileged(w, r) {
		return
	}
	if err := s.c.CreatePool(r.Context(), req.ID, req.Granularity); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 201, map[string]string{"id": req.ID})
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	var report agentapi.NodeReport
	if !httpapi.Decode(w, r, &report) {
		return
	}
	if who(r).node == "" && !s.requirePrivileged(w, r) { // a node's own credential was checked above
		return
	}
	if report.Name != r.PathValue("name") {
		httpapi.WriteError(w, 400, "user", "the report's name differs from the URL's")
		return
	}
	heartbeat := s.c.Heartbeat
	if who(r).node != "" {
		heartbeat = s.c.NodeHeartbeat // a node's own credential never makes it a storage node
	}
	reply, err := heartbeat(r.Context(), report)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, reply)
}

func (s *Server) runID(w http.ResponseWriter, r *http.Request) {
	id, err := s.c.NextRunID(r.Context(), who(r).uid)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]int64{"id": id})
}

func (s *Server) lease(w http.ResponseWriter, r *http.Request) {
	var req controllerapi.LeaseRequest
	token := r.PathValue("token")
	if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
		return
	}
	d, err := s.c.RenewLease(r.Context(), token, req.Release)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, controllerapi.LeaseReply{Seconds: d.Seconds()})
}

func (s *Server) jobStages(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	var req controllerapi.JobStagesRequest
	if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
		return
	}
	if err := s.c.JobStages(r.Context(), token, req.Stages); err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"token": token})
}

func (s *Server) queryJobStages(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	if !s.mayActOn(w, r, token) {
		return
	}
	world, err := s.c.viewSession(r.Context(), token)
	if err != nil {
		s.fail(w, err)
		return
	}
	q := r.URL.Query()
	counts, found, err := lifecycle.QueryInJob(world, token, q.Get("var"), q.Get("path"))
	if err != nil {
		s.fail(w, err)
		return
	}
	reply := controllerapi.JobStagesReply{Counts: counts, Stages: []lifecycle.StageProgress{}}
	for _, st := range found {
		reply.Stages = append(reply.Stages, lifecycle.ProgressOf(st))
	}
	httpapi.WriteJSON(w, 200, reply)
}

func (s *Server) terminateJobStages(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	var req controllerapi.TerminateRequest
	if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
		return
	}
	n, err := s.c.TerminateStages(r.Context(), token, req.Var, req.Path)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, map[string]int{"terminated": n})
}

func (s *Server) jobStageConcurrency(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	var req controllerapi.ConcurrencyRequest
	if !httpapi.Decode(w, r, &req) || !s.mayActOn(w, r, token) {
		return
	}
	n, err := s.c.StageConcurrency(r.Context(), token, req.Concurrency)
	if err != nil {
		s.fail(w, err)
		return
	}
	httpapi.WriteJSON(w, 200, controllerapi.ConcurrencyRequest{Concurrency: n})
}

// mount answers what is mounted at ?path= (on ?node=, or any node): the session and the
// variable, for libdatawarp. An ordinary user learns only about their own sessions.
func (s *Server) mount(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("path") == "" {
		httpapi.WriteError(w, 400, "user", "give ?path=<mount point>")
		return
	}
	world, err := s.c.viewShared(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	info, err := lifecycle.Locate(world, q.Get("path"), q.Get("node"))
	if err == nil && !who(r).privileged && info.Owner != who(r).uid {
		err = lifecycle.ErrNoSession // another user's mount: say nothing about it
	}
	if err != nil {
		httpapi.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no burst buffer of yours is mounted at %s", q.Get("path")))
		return
	}
	httpapi.WriteJSON(w, 200, info)
}

// mayRead reports whether the caller may see a session's accounting: administrators, anyone
// when controller.private_data is off, the session's owner, and everyone for a persistent
// instance (the objects views.All.VisibleTo shows).
func (s *Server) mayRead(r *http.Request, sess *model.Session) bool {
	c := who(r)
	return c.privileged || !s.c.cfg.Controller.PrivateData || sess == nil || sess.Owner == c.uid || sess.Persistent
}

func (s *Server) allAccounting(w http.ResponseWriter, r *http.Request) {
	all, pending, world, err := s.c.AllAccounting(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	out := controllerapi.AccountingList{Accounting: []views.Accounting{}}
	if who(r).privileged || !s.c.cfg.Controller.PrivateData {
		out.PendingRecords = &pending // how many teardowns the site had lately is the site's
	}
	for _, a := range all {
		if s.mayRead(r, world.Sessions[a.Realm.Session]) {
			out.Accounting = append(out.Accounting, a)
		}
	}
	httpapi.WriteJSON(w, 200, out)
}

func (s *Server) instanceAccounting(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		httpapi.WriteError(w, 400, "user", fmt.Sprintf("instance id %q must be a positive number (the id column of dwstat instances)", r.PathValue("id")))
		return
	}
	s.writeAccounting(w, r, id)
}

func (s *Server) sessionAccounting(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	world, err := s.c.viewSession(r.Context(), token) // the session's objects, by index
	if err != nil {
		s.fail(w, err)
		return
	}
	sess := world.SessionByToken(token)
	if sess == nil || !s.mayRead(r, sess) { // another user's job: as an unknown token
		s.fail(w, lifecycle.ErrNoSession)
		return
	}
	inst := world.InstanceOf(sess.ID)
	if inst == nil {
		httpapi.WriteError(w, 404, "not_found", fmt.Sprintf("session %s has no instance of its own (it uses persistent ones: ask for theirs, GET /dw/v1/instances/{id}/accounting)", token))
		return
	}
	s.writeAccounting(w, r, inst.ID)
}

func (s *Server) writeAccounting(w http.ResponseWriter, r *http.Request, id int64) {
	a, sess, err := s.c.Accounting(r.Context(), id)
	if errors.Is(err, lifecycle.ErrNoSession) {
		httpapi.WriteError(w, 404, "not_found", fmt.Sprintf("no instance %d (a torn-down instance's record is in controller.accounting_log)", id))
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	if !s.mayRead(r, sess) {
		// As for an instance that does not exist: another user's instances cannot be
		// enumerated.
		httpapi.WriteError(w, 404, "not_found", fmt.Sprintf("no instance %d (a torn-down instance's record is in controller.accounting_log)", id))
		return
	}
	httpapi.WriteJSON(w, 200, a)
}
