// Package alloc places an instance's grains on storage nodes. It is a pure function of the
// pool's current state and the request: no I/O, no clock, no randomness, so the same state
// always gives the same placement and the controller can persist the result before acting.
package alloc

import (
	"fmt"
	"sort"
	"strings"
)

// Strategies, as DataWarp's optimization_strategy names them.
const (
	// Bandwidth spreads the grains over as many nodes as the grain count allows, least loaded
	// nodes first (DataWarp's default).
	Bandwidth = "bandwidth"
	// Interference packs the grains on as few nodes as possible, so the instance shares
	// servers with as few other jobs as possible.
	Interference = "interference"
)

// Node is what the allocator needs to know of one storage node of the pool.
type Node struct {
	Name      string
	Grains    uint64 // grains the node offers in all
	Used      uint64 // grains already held by fragments
	Instances int    // instances with a fragment here: the load measure
	Online    bool
	Drain     bool
	// Worn: the SSD's remaining endurance is below the site's threshold (DataWarp stops
	// assigning such a node to new instances).
	Worn bool
}

// Free is the number of grains still available on the node.
func (n Node) Free() uint64 {
	if n.Used >= n.Grains {
		return 0
	}
	return n.Grains - n.Used
}

func (n Node) eligible() bool { return n.Online && !n.Drain && !n.Worn && n.Free() > 0 }

// Placement is the part of an instance on one node.
type Placement struct {
	Node   string
	Grains uint64
}

// InsufficientError says a request does not fit, and what would.
type InsufficientError struct {
	Requested  uint64 // grains
	Free       uint64 // grains free on eligible nodes
	FreeNodes  int    // eligible nodes
	Unusable   []string
	TotalNodes int
}

// Grains is a count of grains in words: "1 grain", "3 grains".
func Grains(n uint64) string {
	if n == 1 {
		return "1 grain"
	}
	return fmt.Sprintf("%d grains", n)
}

func (e *InsufficientError) Error() string {
	msg := fmt.Sprintf("requested %s but only %d %s free on %d usable node(s) of %d", Grains(e.Requested), e.Free, map[bool]string{true: "is", false: "are"}[e.Free == 1], e.FreeNodes, e.TotalNodes)
	if len(e.Unusable) > 0 {
		msg += " (not usable: " + strings.Join(e.Unusable, ", ") + ")"
	}
	return msg
}

// Place returns where to put grains grains with the given strategy. It never uses offline,
// drained, worn or full nodes, never over-commits a node, and places exactly the grains asked for:
// a request that fits in the pool's free grains is placed (over as many nodes as it takes).
func Place(nodes []Node, grains uint64, strategy string) ([]Placement, error) {
	if grains == 0 {
		return nil, nil
	}
	var usable []Node
	var free uint64
	var unusable []string
	for _, n := range nodes {
		switch {
		case n.eligible():
			usable = append(usable, n)
			free += n.Free()
		case !n.Online:
			unusable = append(unusable, n.Name+" offline")
		case n.Drain:
			unusable = append(unusable, n.Name+" drained")
		case n.Worn:
			unusable = append(unusable, n.Name+" SSD worn (endurance below controller.endurance_threshold)")
		default:
			unusable = append(unusable, n.Name+" full")
		}
	}
	if free < grains {
		return nil, &InsufficientError{Requested: grains, Free: free, FreeNodes: len(usable), Unusable: unusable, TotalNodes: len(nodes)}
	}
	switch strategy {
	case Interference:
		return pack(usable, grains), nil
	case Bandwidth, "":
		return spread(usable, grains), nil
	}
	return nil, fmt.Errorf("unknown optimization_strategy %q; expected %s or %s", strategy, Bandwidth, Interference)
}

func lessLoaded(a, b Node) bool {
	if a.Instances != b.Instances {
		return a.Instances < b.Instances
	}
	if a.Used != b.Used {
		return a.Used < b.Used
	}
	return a.Name < b.Name
}

// spread deals grains one at a time, round robin, over the nodes in order of load.
func spread(nodes []Node, grains uint64) []Placement {
	sort.SliceStable(nodes, func(i, j int) bool { return lessLoaded(nodes[i], nodes[j]) })
	given := make([]uint64, len(nodes))
	for grains > 0 {
		// Each round gives every node with room one grain, or as many as fit evenly:
		// deal whole rounds at once so a large request on few nodes costs few passes.
		open := 0
		minRoom := ^uint64(0)
		for i, n := range nodes {
			if room := n.Free() - given[i]; room > 0 {
				open++
				minRoom = min(minRoom, room)
			}
		}
		if rounds := grains / uint64(open); rounds > 1 {
			rounds = min(rounds, minRoom)
			for i, n := range nodes {
				if n.Free()-given[i] > 0 {
					given[i] += rounds
					grains -= rounds
				}
			}
			continue
		}
		for i, n := range nodes {
			if grains == 0 {
				break
			}
			if n.Free()-given[i] > 0 {
				given[i]++
				grains--
			}
		}
	}
	return collect(nodes, given)
}

// pack fills the nodes with the most free grains first: the fewest nodes that can hold the
// request.
func pack(nodes []Node, grains uint64) []Placement {
	sort.SliceStable(nodes, func(i, j int) bool {
		a, b := nodes[i], nodes[j]
		if a.Free() != b.Free() {
			return a.Free() > b.Free()
		}
		if a.Instances != b.Instances {
			return a.Instances < b.Instances
		}
		return a.Name < b.Name
	})
	given := make([]uint64, len(nodes))
	for i, n := range nodes {
		if grains == 0 {
			break
		}
		take := min(n.Free(), grains)
		given[i] = take
		grains -= take
	}
	return collect(nodes, given)
}

func collect(nodes []Node, given []uint64) []Placement {
	var out []Placement
	for i, n := range nodes {
		if given[i] > 0 {
			out = append(out, Placement{Node: n.Name, Grains: given[i]})
		}
	}
	return out
}
