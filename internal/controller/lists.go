package controller

import (
	"fmt"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// The lists a request carries are bounded, and their repetitions dropped, before the
// controller's write transaction (every other write waits for it, heartbeats included): a
// request's work inside it is then linear in limits the configuration names (security
// issue 19). Each refusal names its limit and the way out.

// checkStages refuses stage requests naming more than stage.max_paths_per_request stages, or
// a bad path (lifecycle.CheckStageRequests).
func (c *Controller) checkStages(step, direction string, reqs []lifecycle.StageRequest) error {
	if err := c.checkStageCount(step, len(reqs)); err != nil {
		return err
	}
	return lifecycle.CheckStageRequests(direction, reqs)
}

// checkStageCount refuses a request naming more than stage.max_paths_per_request stages.
func (c *Controller) checkStageCount(step string, n int) error {
	if max := c.cfg.Stage.MaxPathsPerRequest; n > max {
		return &lifecycle.LimitError{Msg: fmt.Sprintf("%s: %d stages in one request, more than stage.max_paths_per_request (%d): stage their directory, "+
			"or a list file (type=list), rather than the files one by one, or ask the administrator to raise stage.max_paths_per_request", step, n, max)}
	}
	return nil
}

// uniqueNodes drops repeated node names, keeping the first of each, and refuses more than
// controller.max_nodes_per_request.
func (c *Controller) uniqueNodes(step string, nodes []string) ([]string, error) {
	nodes = unique(nodes)
	if max := c.cfg.Controller.MaxNodesPerRequest; len(nodes) > max {
		return nil, &lifecycle.LimitError{Msg: fmt.Sprintf("%s: %d compute nodes in one request, more than controller.max_nodes_per_request (%d); "+
			"the administrator raises it for a machine with more compute nodes", step, len(nodes), max)}
	}
	return nodes, nil
}

// uniqueUses drops repeated persistent instance names and refuses more than
// controller.max_uses_per_job.
func (c *Controller) uniqueUses(uses []string) ([]string, error) {
	uses = unique(uses)
	if max := c.cfg.Controller.MaxUsesPerJob; len(uses) > max {
		return nil, &lifecycle.LimitError{Msg: fmt.Sprintf("setup: the job uses %d persistent instances (#DW persistentdw), more than controller.max_uses_per_job (%d)", len(uses), max)}
	}
	return uses, nil
}

// unique returns list without its repetitions, in order; list itself when it has none.
func unique(list []string) []string {
	seen := make(map[string]bool, len(list))
	var out []string
	for i, v := range list {
		if seen[v] {
			if out == nil {
				out = append([]string(nil), list[:i]...)
			}
			continue
		}
		seen[v] = true
		if out != nil {
			out = append(out, v)
		}
	}
	if out == nil {
		return list
	}
	return out
}
