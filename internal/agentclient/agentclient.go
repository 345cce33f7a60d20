// Package agentclient is the controller's HTTP client of a remote `spillway agent`; it
// implements agentapi.Agent.
package agentclient

import (
	"context"
	"fmt"
	"net/url"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/apiclient"
)

// Client calls one agent.
type Client struct {
	c *apiclient.Client
}

// New connects to an agent address ("unix:/path" or "http://host:port").
func New(address string, o apiclient.Options) (*Client, error) {
	c, err := apiclient.New(address, o)
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

var _ agentapi.Agent = (*Client)(nil)

// Report asks the agent about itself.
func (a *Client) Report(ctx context.Context) (agentapi.NodeReport, error) {
	var r agentapi.NodeReport
	err := a.c.Do(ctx, "GET", "/agent/v1/report", nil, &r)
	return r, err
}

// FragmentUsage asks for one fragment's counters.
func (a *Client) FragmentUsage(ctx context.Context, id int64) (agentapi.FragmentUsage, bool, error) {
	var r agentapi.FragmentUsageReply
	err := a.c.Do(ctx, "GET", fmt.Sprintf("/agent/v1/fragments/%d/usage", id), nil, &r)
	return r.Usage, r.Found, err
}

// CreateFragment creates a fragment.
func (a *Client) CreateFragment(ctx context.Context, s agentapi.FragmentSpec) error {
	return a.c.Do(ctx, "PUT", fmt.Sprintf("/agent/v1/fragments/%d", s.ID), s, nil)
}

// DeleteFragment deletes a fragment.
func (a *Client) DeleteFragment(ctx context.Context, id int64) error {
	return a.c.Do(ctx, "DELETE", fmt.Sprintf("/agent/v1/fragments/%d", id), nil, nil)
}

// CreateNamespace creates a namespace.
func (a *Client) CreateNamespace(ctx context.Context, s agentapi.NamespaceSpec) error {
	return a.c.Do(ctx, "PUT", fmt.Sprintf("/agent/v1/namespaces/%d", s.ID), s, nil)
}

// DeleteNamespace deletes a namespace.
func (a *Client) DeleteNamespace(ctx context.Context, fragmentID, id int64) error {
	return a.c.Do(ctx, "DELETE", fmt.Sprintf("/agent/v1/fragments/%d/namespaces/%d", fragmentID, id), nil, nil)
}

// Mount mounts a namespace.
func (a *Client) Mount(ctx context.Context, s agentapi.MountSpec) error {
	return a.c.Do(ctx, "PUT", fmt.Sprintf("/agent/v1/mounts/%d", s.ActivationID), s, nil)
}

// Unmount unmounts a path.
func (a *Client) Unmount(ctx context.Context, activationID int64, mountPath string) error {
	return a.c.Do(ctx, "DELETE", fmt.Sprintf("/agent/v1/mounts/%d?path=%s", activationID, url.QueryEscape(mountPath)), nil, nil)
}

// StartStage starts a stage.
func (a *Client) StartStage(ctx context.Context, s agentapi.StageSpec) error {
	return a.c.Do(ctx, "PUT", "/agent/v1/stages/"+url.PathEscape(s.Key()), s, nil)
}

// StageStatus polls a stage.
func (a *Client) StageStatus(ctx context.Context, key string) (agentapi.StageStatus, error) {
	var st agentapi.StageStatus
	err := a.c.Do(ctx, "GET", "/agent/v1/stages/"+url.PathEscape(key), nil, &st)
	return st, err
}

// CancelStage cancels a stage.
func (a *Client) CancelStage(ctx context.Context, key string) error {
	return a.c.Do(ctx, "DELETE", "/agent/v1/stages/"+url.PathEscape(key), nil, nil)
}
