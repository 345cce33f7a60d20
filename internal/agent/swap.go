package agent

import (
	"context"
	"errors"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// Swap areas on the burst buffer (issue 22): placeholders until the node side lands.

var errSwapNotBuilt = errors.New("swap areas are not built in this agent yet")

// AttachSwap gives this compute node a swap area (agentapi.Agent).
func (a *Agent) AttachSwap(ctx context.Context, spec agentapi.SwapSpec) error {
	return errSwapNotBuilt
}

// DetachSwap takes a swap area away, a poll (agentapi.Agent).
func (a *Agent) DetachSwap(ctx context.Context, spec agentapi.SwapDetachSpec) (agentapi.SwapStatus, error) {
	return agentapi.SwapStatus{Done: true}, nil
}
