package controller

import (
	"fmt"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// loadWorld reads every object in one transaction. Node liveness is derived from the last
// heartbeat, so a controller that was down does not trust stale "online" flags.
func loadWorld(tx *store.Tx, now time.Time, nodeTimeout time.Duration) (*lifecycle.World, error) {
	w := lifecycle.NewWorld()
	pools, err := store.Pools.List(tx)
	if err != nil {
		return nil, err
	}
	for _, p := range pools {
		w.Pools[p.Name] = p
	}
	nodes, err := store.Nodes.List(tx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		n.Online = !n.HeldOffline && now.Sub(n.LastSeen) < nodeTimeout
		w.Nodes[n.Name] = n
	}
	if err := loadInto(tx, store.Sessions, w.Sessions, func(o *model.Session) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Instances, w.Instances, func(o *model.Instance) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Fragments, w.Fragments, func(o *model.Fragment) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Configurations, w.Configurations, func(o *model.Configuration) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Namespaces, w.Namespaces, func(o *model.Namespace) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Registrations, w.Registrations, func(o *model.Registration) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Activations, w.Activations, func(o *model.Activation) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Stages, w.Stages, func(o *model.Stage) int64 { return o.ID }); err != nil {
		return nil, err
	}
	return w, nil
}

func loadInto[T any](tx *store.Tx, table store.IDTable[T], into map[int64]*T, id func(*T) int64) error {
	all, err := table.List(tx)
	if err != nil {
		return err
	}
	for _, o := range all {
		into[id(o)] = o
	}
	return nil
}

// persist writes a decision's changes in the caller's transaction, and keeps the newest
// stage.history finished stages of those it archives.
func (c *Controller) persist(tx *store.Tx, ch lifecycle.Changes) error {
	if err := persistObjects(tx, ch, c.now()); err != nil {
		return err
	}
	if len(ch.Archive) == 0 {
		return nil
	}
	for _, st := range ch.Archive {
		if err := store.StageHistory.Put(tx, st); err != nil {
			return err
		}
	}
	return pruneStageHistory(tx, c.cfg.Stage.History)
}

// pruneStageHistory deletes the oldest finished stages beyond keep.
func pruneStageHistory(tx *store.Tx, keep int) error {
	kept, err := store.StageHistory.List(tx)
	if err != nil {
		return err
	}
	for i := 0; i < len(kept)-keep; i++ {
		if err := store.StageHistory.Delete(tx, kept[i].ID); err != nil {
			return err
		}
	}
	return nil
}

// loadStageHistory reads the finished stages kept, oldest first.
func loadStageHistory(tx *store.Tx) ([]*model.FinishedStage, error) {
	return store.StageHistory.List(tx)
}

// persistObjects writes the changed objects (now: when). A deleted instance becomes its
// pending accounting record in the same transaction (keepAccounting).
func persistObjects(tx *store.Tx, ch lifecycle.Changes, now time.Time) error {
	for _, obj := range ch.Put {
		var err error
		switch o := obj.(type) {
		case *model.Session:
			err = store.PutSession(tx, o)
		case *model.Instance:
			err = store.Instances.Put(tx, o)
		case *model.Fragment:
			err = store.Fragments.Put(tx, o)
		case *model.Configuration:
			err = store.Configurations.Put(tx, o)
		case *model.Namespace:
			err = store.Namespaces.Put(tx, o)
		case *model.Registration:
			err = store.Registrations.Put(tx, o)
		case *model.Activation:
			err = store.Activations.Put(tx, o)
		case *model.Stage:
			err = store.Stages.Put(tx, o)
		case *model.Node:
			err = store.Nodes.Put(tx, o)
		case *model.Pool:
			err = store.Pools.Put(tx, o)
		default:
			err = fmt.Errorf("persist: unknown object %T", obj)
		}
		if err != nil {
			return err
		}
	}
	if err := keepAccounting(tx, ch, now); err != nil {
		return err
	}
	for _, r := range ch.Delete {
		var err error
		switch r.Kind {
		case lifecycle.KindSession:
			s, gerr := store.Sessions.Get(tx, r.ID)
			if store.IsNotFound(gerr) {
				continue
			}
			if gerr != nil {
				return gerr
			}
			err = store.DeleteSession(tx, s)
		case lifecycle.KindInstance:
			err = store.Instances.Delete(tx, r.ID)
		case lifecycle.KindFragment:
			err = store.Fragments.Delete(tx, r.ID)
		case lifecycle.KindConfiguration:
			err = store.Configurations.Delete(tx, r.ID)
		case lifecycle.KindNamespace:
			err = store.Namespaces.Delete(tx, r.ID)
		case lifecycle.KindRegistration:
			err = store.Registrations.Delete(tx, r.ID)
		case lifecycle.KindActivation:
			err = store.Activations.Delete(tx, r.ID)
		case lifecycle.KindStage:
			err = store.Stages.Delete(tx, r.ID)
		default:
			err = fmt.Errorf("persist: cannot delete kind %q", r.Kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// txIDs draws new ids from the store inside the transaction.
type txIDs struct{ tx *store.Tx }

func (t txIDs) NewID(kind string) (int64, error) { return t.tx.NextSeq(kind) }
