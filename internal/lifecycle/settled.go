package lifecycle

import (
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
)

// Settled reports whether Step has nothing to do for a session until a request or an
// administrator changes it: the session and every object of it (instance, fragments,
// configurations, namespaces, registrations, activations) at the goal create and actualized,
// or waiting for an operator (a blown fuse); every stage ended or deferred. A persistent
// instance with an expiration is settled until then: wake is when it must be looked at
// again (zero: only when something changes it). An expired persistent instance is never
// settled (Expire has to look at it). The executor keeps the sessions that are not settled,
// or that have a wake time, in the due index and looks only at those (controller/executor.go).
func Settled(w *World, s *model.Session, now time.Time) (settled bool, wake time.Time) {
	done := func(st model.State) bool {
		return st.FuseBlown || st.Goal == model.GoalCreate && st.Actualized
	}
	if !done(s.State) || s.Persistent && expired(s, now) {
		return false, time.Time{}
	}
	for _, inst := range w.InstancesOf(s.ID) {
		if !done(inst.State) {
			return false, time.Time{}
		}
		for _, f := range w.FragmentsOf(inst.ID) {
			if !done(f.State) {
				return false, time.Time{}
			}
		}
		for _, c := range w.ConfigurationsOf(inst.ID) {
			if !done(c.State) {
				return false, time.Time{}
			}
			for _, ns := range w.NamespacesOf(c.ID) {
				if !done(ns.State) {
					return false, time.Time{}
				}
			}
		}
	}
	for _, r := range w.RegistrationsOf(s.ID) {
		if !done(r.State) {
			return false, time.Time{}
		}
	}
	for _, a := range w.ActivationsOf(s.ID) {
		if !done(a.State) {
			return false, time.Time{}
		}
	}
	for _, st := range w.StagesOf(s.ID) {
		if !st.Ended() && st.Status != model.StageDeferred {
			return false, time.Time{}
		}
	}
	if s.Persistent && s.Expiration > 0 {
		wake = time.Unix(s.Expiration, 0)
	}
	return true, wake
}

// NeedsWhole reports whether a decision on a world holding only some sessions could go
// wrong: a persistent instance in it is being destroyed or has expired, and what becomes of
// it depends on every job that uses or mounts it (usersOf, mountedElsewhere, the
// registrations of its configurations), which such a world does not hold. The caller loads
// the whole state instead.
func NeedsWhole(w *World, now time.Time) bool {
	for _, s := range w.Sessions {
		if s.Persistent && (s.State.Goal == model.GoalDestroy || expired(s, now)) {
			return true
		}
	}
	return false
}

// SessionOf is the id of the session an object belongs to (0 when the world does not hold it).
func SessionOf(w *World, r Ref) ID {
	instance := func(id ID) ID {
		if i := w.Instances[id]; i != nil {
			return i.SessionID
		}
		return 0
	}
	switch r.Kind {
	case KindSession:
		return r.ID
	case KindInstance:
		return instance(r.ID)
	case KindFragment:
		if f := w.Fragments[r.ID]; f != nil {
			return instance(f.InstanceID)
		}
	case KindConfiguration:
		if c := w.Configurations[r.ID]; c != nil {
			return instance(c.InstanceID)
		}
	case KindNamespace:
		if ns := w.Namespaces[r.ID]; ns != nil {
			if c := w.Configurations[ns.ConfigurationID]; c != nil {
				return instance(c.InstanceID)
			}
		}
	case KindRegistration:
		if o := w.Registrations[r.ID]; o != nil {
			return o.SessionID
		}
	case KindActivation:
		if o := w.Activations[r.ID]; o != nil {
			return o.SessionID
		}
	case KindStage:
		if o := w.Stages[r.ID]; o != nil {
			return o.SessionID
		}
	}
	return 0
}
