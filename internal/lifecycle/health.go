package lifecycle

import (
	"fmt"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// Health is what decides that a storage node takes no new fragments on its own account
// (docs/admin.md, "Endurance and auto-drain"): a worn SSD, or repeated failures.
type Health struct {
	// EnduranceThreshold is the remaining endurance (percent of the SSD's rated life) below
	// which a node takes no new fragments (controller.endurance_threshold); 0: off.
	EnduranceThreshold int
	// AutoDrainFailures failures within AutoDrainWindow drain a node
	// (controller.auto_drain_failures, controller.auto_drain_window); 0: off.
	AutoDrainFailures int
	AutoDrainWindow   time.Duration
}

// NodeWorn reports whether a node with this endurance takes no new fragments: its wear is
// known and the remaining endurance is below the threshold. An unknown wear never excludes a
// node (a node without smartctl or nvme works as before).
func NodeWorn(e *model.Endurance, threshold int) bool {
	return e != nil && e.Known && threshold > 0 && e.Remaining() < threshold
}

// WornReason says why a worn node takes no new fragments, for dwstat and the log.
func WornReason(n *model.Node) string {
	if n.Endurance == nil {
		return ""
	}
	return fmt.Sprintf("SSD endurance %d%% remaining, below controller.endurance_threshold", n.Endurance.Remaining())
}

// NodeReported records what a node's agent reported about its health (in the heartbeat's
// transaction): its SSD wear, whether it is now worn, and the data-path errors it counted
// since its last report, each a failure toward auto-drain. It returns the reason when the
// report made the node auto-drained.
func NodeReported(n *model.Node, r agentapi.NodeReport, h Health, now time.Time) (drained string) {
	if r.Endurance != nil {
		e := model.Endurance{Known: r.Endurance.Known, PercentUsed: r.Endurance.PercentUsed, Source: r.Endurance.Source, Error: r.Endurance.Error}
		n.Endurance = &e
	}
	n.Worn = NodeWorn(n.Endurance, h.EnduranceThreshold)
	added := r.DataErrors - n.DataErrorsSeen
	if r.DataErrors < n.DataErrorsSeen {
		added = r.DataErrors // the agent restarted and counts from zero
	}
	n.DataErrorsSeen = r.DataErrors
	for i := uint64(0); i < added && i < uint64(max(h.AutoDrainFailures, 1)); i++ {
		if recordFailure(n, "data path: "+orDefault(r.LastDataError, "I/O error"), h, now) {
			drained = n.Reason
		}
	}
	return drained
}

// failureOps are the effects whose failure counts against the node they ran on: making and
// removing its fragments and namespaces, and starting a stage (or a split stage's run) there.
var failureOps = map[string]bool{
	OpCreateFragment: true, OpDeleteFragment: true, OpCreateNamespace: true, OpDeleteNamespace: true, OpStartStage: true,
}

// noteEffectFailure counts a failed effect against its storage node. A node that is offline is
// not counted against: its failures are explained by its being away, which dwstat shows; nor
// is a failure that is not the node's (r.NotTheNode: the controller's own, a configuration
// problem), which draining the node would not fix.
func noteEffectFailure(w *World, e Effect, r Result, p Params, now time.Time) {
	err := r.Err
	if err == nil || r.NotTheNode || !failureOps[e.Op] {
		return
	}
	n := w.Nodes[e.Node]
	if n == nil || !n.Online || n.Pool == "" {
		return
	}
	recordFailure(n, fmt.Sprintf("%s: %v", e.Op, err), p.Health, now)
	w.put(n)
}

// maxFailureText bounds the error kept with each failure (a node keeps at most
// auto_drain_failures of them).
const maxFailureText = 512

// recordFailure adds a failure to a node's recent ones (forgetting those older than the
// window) and drains the node when they reach the limit. It reports whether it drained it.
// A node already drained (by an administrator or before) stays as it is.
func recordFailure(n *model.Node, msg string, h Health, now time.Time) bool {
	if h.AutoDrainFailures <= 0 {
		return false
	}
	if len(msg) > maxFailureText {
		msg = msg[:maxFailureText] + "..."
	}
	kept := n.Failures[:0:0]
	for _, f := range n.Failures {
		if now.Sub(f.At) < h.AutoDrainWindow {
			kept = append(kept, f)
		}
	}
	kept = append(kept, model.NodeFailure{At: now, Error: msg})
	if len(kept) > h.AutoDrainFailures {
		kept = kept[len(kept)-h.AutoDrainFailures:]
	}
	n.Failures = kept
	if len(kept) < h.AutoDrainFailures || n.Drain {
		return false
	}
	n.Drain, n.AutoDrained = true, true
	n.Reason = fmt.Sprintf("auto-drained: %d failures in %s: %s", len(kept), shortDuration(h.AutoDrainWindow), msg)
	return true
}

// shortDuration writes 10m rather than 10m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
