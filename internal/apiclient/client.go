// Package apiclient talks to the controller's REST API: every command (dw_wlm_cli, dwstat,
// dwcli, spillway run) goes through it. It retries while the controller restarts, a bounded
// number of times, and turns error answers into errors that say what went wrong.
package apiclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/munge"
	"github.com/spillway-hpc/spillway/internal/stagecall"
	"github.com/spillway-hpc/spillway/internal/views"
)

// Client is a controller connection: to one controller, or to the first that answers of
// several (high availability), preferring the leader.
type Client struct {
	targets []*target
	cur     atomic.Int32 // the target that answered last (the leader, once found)
	token   string
	retries int
	wait    time.Duration
	// skipRounds: a controller found unreachable is left out of a request's rounds while
	// another answers, and tried again every skipRounds rounds.
	skipRounds int
	address    string
	hint       string
	service    string // what the client calls, for errors ("the Spillway controller")
	munge      bool   // authenticate each request with a fresh MUNGE credential
	mungeAt    string // munged's socket ("" = munge's default)
	// longPoll is how long a status request asks the controller to wait for a change: half
	// the request timeout, so the answer always comes back within it.
	longPoll time.Duration
}

// target is one controller.
type target struct {
	base    string // http://spillway for Unix sockets, or the TCP base URL
	address string // as given
	http    *http.Client
}

// Options are the connection limits (config section [client]).
type Options struct {
	Token          string
	ConnectRetries int           // attempts while the controller is unreachable
	RetryWait      time.Duration // between attempts
	RequestTimeout time.Duration // one request
	// ConnectTimeout bounds opening a TCP connection to one controller (client.connect_timeout;
	// 0 = the request's bound): with several, a host cut off is given up after it.
	ConnectTimeout time.Duration
	// UnreachableRounds: with several controllers, one found unreachable is tried again only
	// every this many rounds of a request while another answers (client.unreachable_rounds;
	// 0 = 4).
	UnreachableRounds int
	// Dial, when set, opens the connections to a Unix-socket address instead of a plain dial
	// (the one-machine home starts its server on demand here).
	Dial func(ctx context.Context) (net.Conn, error)
	// Hint ends the message of an Unreachable error: what to check ("" = the system
	// install's advice).
	Hint string
	// Service names what is called, in errors: "" = "the Spillway controller"; the
	// controller's client of an agent says "the Spillway agent of node ssd1".
	Service string
	// Munge authenticates every request to a TCP controller as this process's user with a
	// MUNGE credential from the munged at MungeSocket ("" = munge's default), when there is
	// no Token.
	Munge       bool
	MungeSocket string
	// TLS is what an https:// controller must prove (nil: the system's roots).
	TLS *tls.Config
}

// New connects to address: "unix:/path/to.sock", a bare socket path, or "http://host:port";
// or to several controllers of one cluster, comma-separated ("https://10.0.0.1:7700,
// https://10.0.0.2:7700"): each request goes to the one that answered last, then to the
// others in order; a controller that does not lead is left for the leader it names, if listed
// (writes go to the leader only; credentials are only ever sent to the addresses given).
func New(address string, o Options) (*Client, error) {
	if o.ConnectRetries <= 0 {
		o.ConnectRetries = 1
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 60 * time.Second
	}
	if o.UnreachableRounds <= 0 {
		o.UnreachableRounds = 4
	}
	if o.Service == "" {
		o.Service = "the Spillway controller"
	}
	c := &Client{token: o.Token, retries: o.ConnectRetries, wait: o.RetryWait, address: address, hint: o.Hint, service: o.Service,
		mungeAt: o.MungeSocket, skipRounds: o.UnreachableRounds, longPoll: o.RequestTimeout / 2}
	var addrs []string
	for _, a := range strings.Split(address, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("empty controller address")
	}
	for _, a := range addrs {
		t := &target{address: a}
		switch {
		case strings.HasPrefix(a, "http://") || strings.HasPrefix(a, "https://"):
			t.base = strings.TrimRight(a, "/")
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = o.TLS
			if o.ConnectTimeout > 0 {
				tr.DialContext = (&net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
			}
			// With several controllers, a connection kept open to one cut off since would hold
			// a request for the whole request timeout: connect afresh each time, bounded by
			// the connect timeout.
			tr.DisableKeepAlives = len(addrs) > 1
			t.http = &http.Client{Timeout: o.RequestTimeout, Transport: tr}
			c.munge = o.Munge && o.Token == "" // a Unix socket's peer credentials say who we are
		default:
			sock := strings.TrimPrefix(a, "unix:")
			if sock == "" {
				return nil, fmt.Errorf("empty controller address in %q", address)
			}
			t.base = "http://spillway"
			dial := o.Dial
			if dial == nil {
				dial = func(ctx context.Context) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", sock)
				}
			}
			t.http = &http.Client{Timeout: o.RequestTimeout, Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
			}}
		}
		c.targets = append(c.targets, t)
	}
	return c, nil
}

// Current is the address of the controller that answered last (the leader, once a write
// found it).
func (c *Client) Current() string { return c.targets[c.cur.Load()].address }

// Address is what the client connects to.
func (c *Client) Address() string { return c.address }

// Error is an error answer of the API.
type Error struct {
	Status int
	Kind   string // user, not_found, busy, forbidden, unauthorized, internal
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// IsNotFound reports whether the controller said the token does not exist.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == "not_found"
}

// IsBusy reports whether the controller asked to retry later.
func IsBusy(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == "busy"
}

// Unreachable is returned when the controller could not be reached within the retries.
type Unreachable struct {
	Address string
	Err     error
	Hint    string // what to check; "" = the system install's advice
	Service string // what could not be reached; "" = the Spillway controller
}

// Unwrap is the error of the last attempt (a dial's, a timeout).
func (e *Unreachable) Unwrap() error { return e.Err }

func (e *Unreachable) Error() string {
	hint := e.Hint
	if hint == "" {
		hint = "is `spillway controller` running? see docs/admin.md"
	}
	service := e.Service
	if service == "" {
		service = "the Spillway controller"
	}
	return fmt.Sprintf("cannot reach %s at %s: %v (%s)", service, e.Address, e.Err, hint)
}

func retryable(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Do sends one request and decodes the answer into out (when not nil).
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return err
		}
	}
	var lastErr error
	down := make([]bool, len(c.targets)) // not reachable in an earlier round of this request
	for attempt := 0; attempt < c.retries; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(c.wait):
			}
		}
		if attempt%c.skipRounds == 0 {
			clear(down) // try the unreachable again now and then: the leader may be among them
		}
		// One round: the controller that answered last, then the leader a follower names, then
		// the others in order. A controller that could not be reached in an earlier round of
		// this request is left out while another answers (a host cut off costs its connect
		// timeout once, not every round, though a follower still names it until its lease
		// expires).
		tried := make([]bool, len(c.targets))
		pick := func(from int) int {
			for _, skipDown := range []bool{true, false} {
				if skipDown && allDown(down) {
					continue
				}
				for j := range c.targets {
					if k := (from + j) % len(c.targets); !tried[k] && (!skipDown || !down[k]) && (skipDown || !anyAnswered(tried, down)) {
						return k
					}
				}
			}
			return -1
		}
		next := pick(int(c.cur.Load()))
		for next >= 0 {
			i := next
			tried[i] = true
			data, err := c.send(ctx, c.targets[i], method, path, body != nil, raw)
			if err != nil && !isAnswer(err) {
				down[i] = true
			} else {
				down[i] = false
			}
			next = pick(i + 1)
			var apiErr *Error
			var nl *notLeader
			var f *fatal
			switch {
			case errors.As(err, &f):
				return f.err
			case errors.As(err, &nl):
				lastErr = nl.err
				if j := c.find(nl.leader); j >= 0 && !tried[j] && !down[j] {
					next = j
				}
				continue
			case errors.As(err, &apiErr) && apiErr.Status >= 500 && len(c.targets) > 1:
				// One of several that failed (a controller cut off from etcd): another may not.
				lastErr = err
				continue
			case errors.As(err, &apiErr):
				c.cur.Store(int32(i))
				return err
			case err != nil:
				lastErr = err
				if ctx.Err() != nil {
					return &Unreachable{Address: c.address, Err: err, Hint: c.hint, Service: c.service}
				}
				if len(c.targets) == 1 && !retryable(err) && !errors.Is(err, errReadBody) {
					return &Unreachable{Address: c.address, Err: err, Hint: c.hint, Service: c.service}
				}
				continue
			}
			c.cur.Store(int32(i))
			if raw, ok := out.(rawAnswer); ok {
				_, err := raw.w.Write(data)
				return err
			}
			if out != nil {
				if err := json.Unmarshal(data, out); err != nil {
					return fmt.Errorf("%s's answer to %s %s: %v", c.service, method, path, err)
				}
			}
			return nil
		}
	}
	var apiErr *Error
	if errors.As(lastErr, &apiErr) {
		return lastErr // no controller led within the retries: say what they said
	}
	return &Unreachable{Address: c.address, Err: lastErr, Hint: c.hint, Service: c.service}
}

// Stream sends one request as Do does (the same retries, leader finding and errors) and
// writes the answer's body to w as the controller sent it, undecoded: a listing of 10,000
// instances passed on as it is costs no decoding and encoding again (dw_wlm_cli's show_*).
// The whole answer was received when w is written; w is not written on an error.
func (c *Client) Stream(ctx context.Context, method, path string, w io.Writer) error {
	return c.Do(ctx, method, path, nil, rawAnswer{w})
}

// rawAnswer, given to Do as out, takes the answer's body as it is (Stream).
type rawAnswer struct{ w io.Writer }

// isAnswer reports whether err is a controller's answer (it was reached).
func isAnswer(err error) bool {
	var apiErr *Error
	var nl *notLeader
	var f *fatal
	return errors.As(err, &apiErr) || errors.As(err, &nl) || errors.As(err, &f)
}

func allDown(down []bool) bool {
	for _, d := range down {
		if !d {
			return false
		}
	}
	return true
}

// anyAnswered reports whether a controller tried in this round was reached: then the ones
// unreachable before are not tried again in it.
func anyAnswered(tried, down []bool) bool {
	for i := range tried {
		if tried[i] && !down[i] {
			return true
		}
	}
	return false
}

// notLeader is a controller's not_leader answer: the leader it names ("" = none elected).
type notLeader struct {
	leader string
	err    *Error
}

func (e *notLeader) Error() string { return e.err.Error() }

var errReadBody = errors.New("reading the answer")

// fatal is an error no other controller or attempt would change (no MUNGE credential).
type fatal struct{ err error }

func (e *fatal) Error() string { return e.err.Error() }

// find returns the index of the target at addr, or -1.
func (c *Client) find(addr string) int {
	addr = strings.TrimRight(strings.TrimSpace(addr), "/")
	for i, t := range c.targets {
		if addr != "" && t.base == addr {
			return i
		}
	}
	return -1
}

// send makes one request to one controller and returns the answer's body: an *Error for an
// error answer, a *notLeader for a controller that does not lead, another error when it could
// not be reached.
func (c *Client) send(ctx context.Context, t *target, method, path string, hasBody bool, raw []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, t.base+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	switch {
	case c.token != "":
		req.Header.Set("Authorization", "Bearer "+c.token)
	case c.munge && strings.HasPrefix(t.base, "http") && t.base != "http://spillway":
		cred, err := munge.Encode(ctx, c.mungeAt) // one per request: munged refuses a replay
		if err != nil {
			return nil, &fatal{err}
		}
		req.Header.Set("Authorization", "MUNGE "+cred)
	}
	resp, err := t.http.Do(req)
	if err != nil {
		return nil, err
	}
	data, err := readAnswer(resp)
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errReadBody, err)
	}
	if resp.StatusCode >= 300 {
		var apiErr controllerapi.APIError
		if json.Unmarshal(data, &apiErr) != nil || apiErr.Error == "" {
			apiErr.Error = fmt.Sprintf("%s at %s answered %s: %s", c.service, t.address, resp.Status, strings.TrimSpace(string(data)))
		}
		e := &Error{Status: resp.StatusCode, Kind: apiErr.Kind, Msg: apiErr.Error}
		if e.Kind == "not_leader" {
			return nil, &notLeader{leader: resp.Header.Get(controllerapi.LeaderHeader), err: e}
		}
		return nil, e
	}
	return data, nil
}

// readAnswer reads an answer's body, at most 64 MiB: in one allocation when its length is
// announced (a listing of 10,000 instances is megabytes, read without growing a buffer).
func readAnswer(resp *http.Response) ([]byte, error) {
	const limit = 64 << 20
	if n := resp.ContentLength; n > 0 && n <= limit {
		data := make([]byte, n)
		_, err := io.ReadFull(resp.Body, data)
		return data, err
	}
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}

func esc(s string) string { return url.PathEscape(s) }

// All returns every table.
func (c *Client) All(ctx context.Context) (views.All, error) {
	var a views.All
	err := c.Do(ctx, "GET", "/dw/v1/all", nil, &a)
	return a, err
}

// Session is the job or persistent session with token, with its objects and those of the
// persistent instances it uses, in views.All's shapes (GET /dw/v1/all?token=): the other
// sessions are not read. No session with token (or one the caller may not see): no sessions.
func (c *Client) Session(ctx context.Context, token string) (views.All, error) {
	var a views.All
	err := c.Do(ctx, "GET", "/dw/v1/all?token="+url.QueryEscape(token), nil, &a)
	return a, err
}

// Controllers asks every controller the client was given, one by one, what it is (GET
// /dw/v1/controller): one row each, in the order given; one that cannot be reached, or
// answers with an error, is a row with role "unreachable" and the reason. It needs no
// leader.
func (c *Client) Controllers(ctx context.Context) []views.Controller {
	rows := make([]views.Controller, 0, len(c.targets))
	for _, t := range c.targets {
		v := views.Controller{}
		raw, err := c.send(ctx, t, "GET", "/dw/v1/controller", false, nil)
		if err == nil {
			err = json.Unmarshal(raw, &v)
		}
		if err != nil {
			v = views.Controller{Role: "unreachable", Error: err.Error()}
		}
		v.Address = t.address
		rows = append(rows, v)
	}
	return rows
}

// Setup creates a session.
func (c *Client) Setup(ctx context.Context, req lifecycle.Setup) error {
	return c.Do(ctx, "POST", "/dw/v1/sessions", req, nil)
}

// Stages asks for stage-ins ("in") or stage-outs ("out").
func (c *Client) Stages(ctx context.Context, token, direction string, reqs []lifecycle.StageRequest) error {
	return c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/data_"+direction, controllerapi.StagesRequest{Stages: reqs}, nil)
}

// PreRun mounts the session on compute nodes.
func (c *Client) PreRun(ctx context.Context, token string, nodes []string) error {
	return c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/pre_run", controllerapi.PreRunRequest{Nodes: nodes}, nil)
}

// PostRun unmounts it.
func (c *Client) PostRun(ctx context.Context, token string) error {
	return c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/post_run", nil, nil)
}

// Teardown destroys a session.
func (c *Client) Teardown(ctx context.Context, token string, hurry bool) error {
	return c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/teardown", controllerapi.TeardownRequest{Hurry: hurry}, nil)
}

// Status reports progress with a step. With wait > 0 the controller answers as soon as the
// step finishes or fails, or after wait.
func (c *Client) Status(ctx context.Context, token, step string, wait time.Duration) (lifecycle.StepStatus, error) {
	var st lifecycle.StepStatus
	q := "?step=" + url.QueryEscape(step)
	if wait > 0 {
		q += "&wait=" + wait.String()
	}
	err := c.Do(ctx, "GET", "/dw/v1/sessions/"+esc(token)+"/status"+q, nil, &st)
	return st, err
}

// Paths returns the job's environment variables.
func (c *Client) Paths(ctx context.Context, token string) (map[string]string, error) {
	var out struct {
		Paths map[string]string `json:"paths"`
	}
	err := c.Do(ctx, "GET", "/dw/v1/sessions/"+esc(token)+"/paths", nil, &out)
	return out.Paths, err
}

// ReleaseRegistration sets a registration's wait flag to false.
func (c *Client) ReleaseRegistration(ctx context.Context, id int64) error {
	return c.Do(ctx, "PATCH", fmt.Sprintf("/dw/v1/registrations/%d", id), controllerapi.RegistrationUpdate{Wait: false}, nil)
}

// SetDrain drains or fills a node.
func (c *Client) SetDrain(ctx context.Context, node string, drain bool, reason string) error {
	return c.Do(ctx, "PATCH", "/dw/v1/nodes/"+esc(node), controllerapi.NodeUpdate{Drain: &drain, Reason: reason}, nil)
}

// UpdateNode changes a node (dwcli update node): the fields given change, the others stay.
func (c *Client) UpdateNode(ctx context.Context, node string, u controllerapi.NodeUpdate) error {
	return c.Do(ctx, "PATCH", "/dw/v1/nodes/"+esc(node), u, nil)
}

// RemoveNode forgets a retired node.
func (c *Client) RemoveNode(ctx context.Context, node string) error {
	return c.Do(ctx, "DELETE", "/dw/v1/nodes/"+esc(node), nil, nil)
}

// RemovePool removes an empty pool.
func (c *Client) RemovePool(ctx context.Context, name string) error {
	return c.Do(ctx, "DELETE", "/dw/v1/pools/"+esc(name), nil, nil)
}

// RemoveActivation unmounts one activation.
func (c *Client) RemoveActivation(ctx context.Context, id int64) error {
	return c.Do(ctx, "DELETE", "/dw/v1/activations/"+strconv.FormatInt(id, 10), nil, nil)
}

// ReplaceFuse resets the blown fuse of an object of a table (fragments, namespaces,
// activations).
func (c *Client) ReplaceFuse(ctx context.Context, table string, id int64) error {
	return c.Do(ctx, "POST", "/dw/v1/"+esc(table)+"/"+strconv.FormatInt(id, 10)+"/replace_fuse", nil, nil)
}

// CreatePool creates a pool.
func (c *Client) CreatePool(ctx context.Context, name string, granularity uint64) error {
	return c.Do(ctx, "POST", "/dw/v1/pools", controllerapi.PoolCreate{ID: name, Granularity: granularity}, nil)
}

// Heartbeat reports an agent.
func (c *Client) Heartbeat(ctx context.Context, r agentapi.NodeReport) (agentapi.Assignment, error) {
	var reply agentapi.Assignment
	err := c.Do(ctx, "POST", "/dw/v1/nodes/"+esc(r.Name)+"/heartbeat", r, &reply)
	return reply, err
}

// WaitStep waits for a step to finish or fail. Each status request is a long poll: the
// controller answers when the job changes, or after half the request timeout (and at most its
// controller.max_status_wait), so a waiting command costs a request per change of its job,
// not one per poll interval. It gives up after timeout (0 = never): staging steps pass 0 and
// rely on the WLM's own timeout.
func (c *Client) WaitStep(ctx context.Context, token, step string, timeout time.Duration) (lifecycle.StepStatus, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		wait := c.longPoll
		if !deadline.IsZero() {
			wait = min(wait, time.Until(deadline))
		}
		st, err := c.Status(ctx, token, step, max(wait, time.Millisecond))
		if err != nil {
			return st, err
		}
		if st.Done || (st.Failed && step != lifecycle.PhaseDataIn && step != lifecycle.PhaseDataOut) {
			return st, nil
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			if st.Message != "" { // what it waits for (a swap area's failed detach, a cache's flush)
				return st, fmt.Errorf("%s of %s did not finish within %s (client.step_timeout): %s", step, token, timeout, st.Message)
			}
			return st, fmt.Errorf("%s of %s did not finish within %s (client.step_timeout)", step, token, timeout)
		}
	}
}

// TokenFromFile reads a shared-secret file ("" = no token).
func TokenFromFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// NextRunID draws a job id for `spillway run`.
func (c *Client) NextRunID(ctx context.Context) (int64, error) {
	var out struct {
		ID int64 `json:"id"`
	}
	err := c.Do(ctx, "POST", "/dw/v1/run_ids", nil, &out)
	return out.ID, err
}

// RenewLease renews a spillway run session's lease (release: the run ends and keeps the
// session on purpose) and returns the lease's length; 0 means the controller keeps none.
func (c *Client) RenewLease(ctx context.Context, token string, release bool) (time.Duration, error) {
	var out controllerapi.LeaseReply
	err := c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/lease", controllerapi.LeaseRequest{Release: release}, &out)
	return time.Duration(out.Seconds * float64(time.Second)), err
}

// JobStages records in-job stage requests (libdatawarp, dwcli stage).
func (c *Client) JobStages(ctx context.Context, token string, reqs []lifecycle.InJobStage) error {
	return c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/job_stages", controllerapi.JobStagesRequest{Stages: reqs}, nil)
}

// QueryJobStages returns the stages concerning a path of variable v and their counts.
func (c *Client) QueryJobStages(ctx context.Context, token, v, p string) (controllerapi.JobStagesReply, error) {
	var out controllerapi.JobStagesReply
	q := "?var=" + url.QueryEscape(v) + "&path=" + url.QueryEscape(p)
	err := c.Do(ctx, "GET", "/dw/v1/sessions/"+esc(token)+"/job_stages"+q, nil, &out)
	return out, err
}

// TerminateJobStages stops the job's in-job stages of a path and says how many.
func (c *Client) TerminateJobStages(ctx context.Context, token, v, p string) (int, error) {
	var out struct {
		N int `json:"terminated"`
	}
	err := c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/job_stages/terminate", controllerapi.TerminateRequest{Var: v, Path: p}, &out)
	return out.N, err
}

// SetStageConcurrency sets how many of the job's in-job stages may run at once and returns
// the limit the controller set (clamped to its stage.max_job_concurrency).
func (c *Client) SetStageConcurrency(ctx context.Context, token string, n int) (int, error) {
	var out controllerapi.ConcurrencyRequest
	err := c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/job_stages/concurrency", controllerapi.ConcurrencyRequest{Concurrency: n}, &out)
	return out.Concurrency, err
}

// StageCallReply is the answer of POST /dw/v1/job_stages: libdatawarp's result, errno 0
// and the verb's fields, or the errno and the error.
type StageCallReply struct {
	Errno       int               `json:"errno"`
	Error       string            `json:"error,omitempty"`
	Complete    int               `json:"complete"`
	Pending     int               `json:"pending"`
	Deferred    int               `json:"deferred"`
	Failed      json.RawMessage   `json:"failed,omitempty"` // query: a count; failed: the failed stages
	Stages      []stagecall.Found `json:"stages,omitempty"`
	Terminated  int               `json:"terminated"`
	Concurrency int               `json:"concurrency"`
	Realm       json.RawMessage   `json:"realm,omitempty"`
}

// StageCall sends an in-job staging call (package stagecall), the one libdatawarp sends.
func (c *Client) StageCall(ctx context.Context, call stagecall.Call) (StageCallReply, error) {
	var out StageCallReply
	err := c.Do(ctx, "POST", "/dw/v1/job_stages", call, &out)
	return out, err
}

// Mount says what burst buffer of the caller's is mounted at a mount point (node "" = any).
func (c *Client) Mount(ctx context.Context, mountPoint, node string) (lifecycle.MountInfo, error) {
	var out lifecycle.MountInfo
	q := "?path=" + url.QueryEscape(mountPoint)
	if node != "" {
		q += "&node=" + url.QueryEscape(node)
	}
	err := c.Do(ctx, "GET", "/dw/v1/mounts"+q, nil, &out)
	return out, err
}

// Accounting is an instance's live accounting record (GET /instances/{id}/accounting).
func (c *Client) Accounting(ctx context.Context, instance int64) (views.Accounting, error) {
	var out views.Accounting
	err := c.Do(ctx, "GET", fmt.Sprintf("/dw/v1/instances/%d/accounting", instance), nil, &out)
	return out, err
}

// SessionAccounting is the accounting record of a session's own instance.
func (c *Client) SessionAccounting(ctx context.Context, token string) (views.Accounting, error) {
	var out views.Accounting
	err := c.Do(ctx, "GET", "/dw/v1/sessions/"+url.PathEscape(token)+"/accounting", nil, &out)
	return out, err
}

// AllAccounting is every visible instance's live accounting record, and the number of
// records waiting for the accounting log (GET /accounting).
func (c *Client) AllAccounting(ctx context.Context) (controllerapi.AccountingList, error) {
	var out controllerapi.AccountingList
	err := c.Do(ctx, "GET", "/dw/v1/accounting", nil, &out)
	return out, err
}

// CreateObject builds one of a session's objects by hand (table instances, configurations or
// activations; req the lifecycle.Manual* of it) and returns the new objects' ids.
func (c *Client) CreateObject(ctx context.Context, token, table string, req any) ([]int64, error) {
	var out controllerapi.Created
	err := c.Do(ctx, "POST", "/dw/v1/sessions/"+esc(token)+"/"+esc(table), req, &out)
	return out.IDs, err
}
