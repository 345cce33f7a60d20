// Command loadseed fills a stopped controller's state with persistent instances and live job
// sessions for bench/load_bench.py: objects as the lifecycle makes them (lifecycle.ApplySetup,
// then lifecycle.Step and Complete with every effect succeeding, all in memory), written in
// batches through the store's typed tables. The sessions' fragments are on one storage node
// (--node), which the benchmark's agent then serves; their directories are not made (nothing
// reads them: the agent removes only directories the controller does not know).
//
// Usage: go run ./bench/loadseed --config spillway.toml --persistent 10000 --jobs 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/engines"
)

func main() {
	cfgPath := flag.String("config", "", "the controller's configuration (its [store])")
	persistent := flag.Int("persistent", 0, "persistent instances to make (p00001, ...)")
	jobs := flag.Int("jobs", 0, "job sessions to make, set up and not yet running (tokens 900000001, ...)")
	node := flag.String("node", "bench1", "the storage node holding every fragment")
	capacity := flag.Uint64("capacity", 0, "the node's capacity in bytes (agent.capacity)")
	batch := flag.Int("batch", 50, "sessions per transaction")
	flag.Parse()
	if err := seed(*cfgPath, *persistent, *jobs, *node, *capacity, *batch); err != nil {
		fmt.Fprintln(os.Stderr, "loadseed:", err)
		os.Exit(1)
	}
}

type txIDs struct{ tx *store.Tx }

func (t txIDs) NewID(kind string) (int64, error) { return t.tx.NextSeq(kind) }

func seed(cfgPath string, persistent, jobs int, nodeName string, capacity uint64, batch int) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	ctx := context.Background()
	st, err := engines.OpenState(ctx, &cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	defer st.Close()
	pc := cfg.Pools[0]
	pool := &model.Pool{Name: pc.Name, Granularity: uint64(pc.Granularity), StripeSize: uint64(pc.StripeSize)}
	p := lifecycle.Params{MountRoot: cfg.Controller.MountRoot, MaxSessions: cfg.Controller.MaxSessions, MaxAttempts: cfg.Executor.MaxAttempts,
		StageMaxAttempts: cfg.Stage.MaxAttempts, StageMaxRunning: cfg.Stage.MaxRunning, StageMaxJobConcurrency: cfg.Stage.MaxJobConcurrency}
	now := time.Now()
	n := &model.Node{Name: nodeName, Pool: pool.Name, Capacity: capacity, Roles: []string{"storage", "client"}, LastSeen: now, Online: true}
	used := uint64(0) // grains already placed on the node: one stand-in fragment carries them
	requests := make([]lifecycle.Setup, 0, persistent+jobs)
	for i := 1; i <= persistent; i++ {
		requests = append(requests, lifecycle.Setup{Token: fmt.Sprintf("p%05d", i), Creator: "CLI", Persistent: true,
			Instance: &lifecycle.InstanceRequest{Capacity: pool.Granularity, Pool: pool.Name, Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}})
	}
	for i := 1; i <= jobs; i++ {
		requests = append(requests, lifecycle.Setup{Token: fmt.Sprint(900000000 + i), Creator: "SLURM",
			Instance: &lifecycle.InstanceRequest{Capacity: pool.Granularity, Pool: pool.Name, Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}})
	}
	start := time.Now()
	for len(requests) > 0 {
		k := min(batch, len(requests))
		err := st.Update(ctx, func(tx *store.Tx) error {
			w := lifecycle.NewWorld()
			w.Pools[pool.Name] = pool
			w.Nodes[n.Name] = n
			w.Fragments[-1] = &model.Fragment{ID: -1, Node: n.Name, Grains: used} // not persisted
			for _, req := range requests[:k] {
				if err := lifecycle.ApplySetup(w, req, txIDs{tx}, p, now); err != nil {
					return err
				}
			}
			for i := 0; i < 20; i++ {
				effects := lifecycle.Step(w, p, now)
				if len(effects) == 0 {
					break
				}
				for _, e := range effects {
					lifecycle.Complete(w, e, lifecycle.Result{}, p, now)
				}
			}
			if err := put(tx, w.TakeChanges()); err != nil {
				return err
			}
			for _, s := range w.Sessions {
				if !s.State.Actualized {
					return fmt.Errorf("session %s did not finish its setup in memory", s.Token)
				}
			}
			for _, f := range w.Fragments {
				if f.ID > 0 {
					used += f.Grains
				}
			}
			return store.Nodes.Put(tx, n)
		})
		if err != nil {
			return err
		}
		requests = requests[k:]
	}
	fmt.Printf("seeded %d persistent instances and %d job sessions in %.1f s\n", persistent, jobs, time.Since(start).Seconds())
	return nil
}

// put writes a decision's new objects (seeding only creates).
func put(tx *store.Tx, ch lifecycle.Changes) error {
	if len(ch.Delete) > 0 || len(ch.Archive) > 0 {
		return fmt.Errorf("seeding deleted objects: %v", ch.Delete)
	}
	for _, obj := range ch.Put {
		switch obj.(type) {
		case *model.Node, *model.Pool: // seeded once, before the decisions
			continue
		}
		if err := store.PutObject(tx, obj); err != nil {
			return err
		}
	}
	return nil
}
