// Package agentclient is the controller's HTTP client of a remote `spillway agent`; it
// implements agentapi.Agent.
package agentclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/apiclient"
)

// Client calls one agent.
type Client struct {
	c             *apiclient.Client
	node, address string
}

// AddressError is an agent address the controller cannot dial as given: a configuration
// problem of the node (agent.advertise), never a fault of its agent.
type AddressError struct {
	Node, Address string
}

func (e *AddressError) Error() string {
	return fmt.Sprintf("node %s advertises the agent address %q, which is neither a Unix socket (unix:/path) nor a URL (http://host:port, https://host:port): "+
		"set agent.advertise on %s to the address this controller dials, e.g. \"http://%s:7701\"", e.Node, e.Address, e.Node, e.Node)
}

// New connects to the agent of node at address ("unix:/path", "/path", "http://host:port" or
// "https://host:port"). Errors name the agent, its node and its address.
func New(node, address string, o apiclient.Options) (*Client, error) {
	unix := strings.HasPrefix(address, "unix:/") || strings.HasPrefix(address, "/")
	web := strings.HasPrefix(address, "http://") || strings.HasPrefix(address, "https://")
	if !unix && !web || strings.Contains(address, ",") {
		return nil, &AddressError{Node: node, Address: address}
	}
	o.Service = "the Spillway agent of node " + node
	if o.Hint == "" {
		o.Hint = fmt.Sprintf("is `spillway agent` running on %s, and is its agent.advertise an address this controller's host can dial? see docs/admin.md", node)
	}
	c, err := apiclient.New(address, o)
	if err != nil {
		return nil, err
	}
	return &Client{c: c, node: node, address: address}, nil
}

// NodeFault reports whether err, from a call to a node's agent, is a fault of that node,
// counted toward draining it (controller.auto_drain_failures): its agent's own error
// answers, and a node that does not answer at a correct address (connection refused or
// reset, no route, a timeout). Not the node's: an address the controller cannot dial as
// given (AddressError; a Unix socket missing on the controller's host, or one it may not
// open; a host name it cannot resolve), TLS that does not agree (the controller's CA does
// not trust the agent's certificate, https:// to a plain agent or http:// to a TLS one),
// credentials the agent refuses (401, 403), and answers of something that is not a
// Spillway agent: each is a configuration problem on the controller's or the node's side
// that draining the node would not fix. docs/admin.md, "Auto-drain".
func NodeFault(err error) bool {
	if err == nil {
		return false
	}
	var addr *AddressError
	var dns *net.DNSError
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	var apiErr *apiclient.Error
	var op *net.OpError
	switch {
	case errors.As(err, &addr), errors.As(err, &dns):
		return false
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify),
		errors.As(err, &record), errors.As(err, &alert), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return false
	case errors.As(err, &apiErr):
		// The agent's own answers count; credentials it refuses, and answers without the
		// agent API's form (a web server, an HTTPS port spoken to in clear), do not.
		return apiErr.Status != http.StatusUnauthorized && apiErr.Status != http.StatusForbidden && apiErr.Kind != ""
	case errors.As(err, &op) && op.Net == "unix" && op.Op == "dial" &&
		(errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)):
		return false
	}
	return true
}

// NoAnswer reports whether err, from a call to a node's agent, is its agent not there to
// answer: a fault of that node (NodeFault) that is not an answer of its agent (connection
// refused or reset, no route, a connection that could not be made in time), or its Unix
// socket gone (an agent stopped cleanly removes it; NodeFault does not count that against
// the node, as a socket that never existed is a configuration problem). Its agent may be
// restarting, or the node lost: either way not a failure of what was asked (a cache
// flush's teardown waits on, lifecycle.Result.NoAnswer). An agent that took the call and
// did not answer it in time is there, and failing: not NoAnswer.
func NoAnswer(err error) bool {
	var apiErr *apiclient.Error
	if err == nil || errors.As(err, &apiErr) {
		return false
	}
	var op *net.OpError
	dial := errors.As(err, &op) && op.Op == "dial"
	if dial && op.Net == "unix" && errors.Is(err, syscall.ENOENT) {
		return true
	}
	var timeout interface{ Timeout() bool }
	if !dial && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &timeout) && timeout.Timeout()) {
		return false
	}
	return NodeFault(err)
}

var _ agentapi.Agent = (*Client)(nil)

// Report asks the agent about itself.
func (a *Client) Report(ctx context.Context) (agentapi.NodeReport, error) {
	var r agentapi.NodeReport
	err := a.do(ctx, "GET", "/agent/v1/report", nil, &r)
	return r, err
}

// FragmentUsage asks for one fragment's counters.
func (a *Client) FragmentUsage(ctx context.Context, id int64) (agentapi.FragmentUsage, bool, error) {
	var r agentapi.FragmentUsageReply
	err := a.do(ctx, "GET", fmt.Sprintf("/agent/v1/fragments/%d/usage", id), nil, &r)
	return r.Usage, r.Found, err
}

// CreateFragment creates a fragment.
func (a *Client) CreateFragment(ctx context.Context, s agentapi.FragmentSpec) error {
	return a.do(ctx, "PUT", fmt.Sprintf("/agent/v1/fragments/%d", s.ID), s, nil)
}

// DeleteFragment deletes a fragment.
func (a *Client) DeleteFragment(ctx context.Context, id int64) error {
	return a.do(ctx, "DELETE", fmt.Sprintf("/agent/v1/fragments/%d", id), nil, nil)
}

// CreateNamespace creates a namespace.
func (a *Client) CreateNamespace(ctx context.Context, s agentapi.NamespaceSpec) error {
	return a.do(ctx, "PUT", fmt.Sprintf("/agent/v1/namespaces/%d", s.ID), s, nil)
}

// DeleteNamespace deletes a namespace.
func (a *Client) DeleteNamespace(ctx context.Context, fragmentID, id int64) error {
	return a.do(ctx, "DELETE", fmt.Sprintf("/agent/v1/fragments/%d/namespaces/%d", fragmentID, id), nil, nil)
}

// Mount mounts a namespace.
func (a *Client) Mount(ctx context.Context, s agentapi.MountSpec) error {
	return a.do(ctx, "PUT", fmt.Sprintf("/agent/v1/mounts/%d", s.ActivationID), s, nil)
}

// Unmount unmounts a path.
func (a *Client) Unmount(ctx context.Context, activationID int64, mountPath string) error {
	return a.do(ctx, "DELETE", fmt.Sprintf("/agent/v1/mounts/%d?path=%s", activationID, url.QueryEscape(mountPath)), nil, nil)
}

// StartStage starts a stage.
func (a *Client) StartStage(ctx context.Context, s agentapi.StageSpec) error {
	return a.do(ctx, "PUT", "/agent/v1/stages/"+url.PathEscape(s.Key()), s, nil)
}

// StageStatus polls a stage.
func (a *Client) StageStatus(ctx context.Context, key string) (agentapi.StageStatus, error) {
	var st agentapi.StageStatus
	err := a.do(ctx, "GET", "/agent/v1/stages/"+url.PathEscape(key), nil, &st)
	return st, err
}

// CancelStage cancels a stage and returns its final status (agentapi.Agent). An agent of an
// earlier version answers {"ok": true}: that reads as Known false, a stage it no longer runs.
func (a *Client) CancelStage(ctx context.Context, key string) (agentapi.StageStatus, error) {
	var st agentapi.StageStatus
	err := a.do(ctx, "DELETE", "/agent/v1/stages/"+url.PathEscape(key), nil, &st)
	return st, err
}

// AttachSwap gives the node a swap area (agentapi.Agent).
func (a *Client) AttachSwap(ctx context.Context, s agentapi.SwapSpec) error {
	return a.do(ctx, "PUT", fmt.Sprintf("/agent/v1/swaps/%d", s.ID), s, nil)
}

// DetachSwap takes a swap area away, a poll (agentapi.Agent).
func (a *Client) DetachSwap(ctx context.Context, s agentapi.SwapDetachSpec) (agentapi.SwapStatus, error) {
	var st agentapi.SwapStatus
	err := a.do(ctx, "POST", fmt.Sprintf("/agent/v1/swaps/%d/detach", s.ID), s, &st)
	return st, err
}

// FlushCache drains (or discards) a cache fragment's dirty data: a poll (agentapi.Agent).
func (a *Client) FlushCache(ctx context.Context, s agentapi.CacheFlushSpec) (agentapi.CacheFlushStatus, error) {
	var st agentapi.CacheFlushStatus
	err := a.do(ctx, "POST", fmt.Sprintf("/agent/v1/fragments/%d/flush", s.FragmentID), s, &st)
	return st, err
}

// NodeFault reports whether err, from one of this client's calls, counts against the agent's
// node (the function NodeFault); the controller's executor asks it.
func (a *Client) NodeFault(err error) bool { return NodeFault(err) }

// NoAnswer reports whether err, from one of this client's calls, is its node not answering
// (the function NoAnswer); the controller's executor asks it.
func (a *Client) NoAnswer(err error) bool { return NoAnswer(err) }

// do makes one call. An answer refusing the controller's credentials, or one without the
// agent API's form, is a configuration problem: it is said with the agent's node and address.
func (a *Client) do(ctx context.Context, method, path string, body, out any) error {
	err := a.c.Do(ctx, method, path, body, out)
	var apiErr *apiclient.Error
	if !errors.As(err, &apiErr) {
		return err
	}
	switch {
	case apiErr.Status == http.StatusUnauthorized || apiErr.Status == http.StatusForbidden:
		return fmt.Errorf("the Spillway agent of node %s at %s refused the controller's credentials: %w (its agent.token_file must hold its node key, `spillway node-key %s` on the controller's host, or the controller's controller.token_file)",
			a.node, a.address, err, a.node)
	case apiErr.Kind == "":
		return fmt.Errorf("%w (is %s the Spillway agent of node %s? check its agent.advertise)", err, a.address, a.node)
	}
	return err
}
