package lifecycle

import (
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
)

// ExpirationNever asks for a persistent instance that never expires (Setup.Expiration), where
// the site's default would give it a lifetime.
const ExpirationNever = -1

// expirationFor decides a new session's expiration (epoch seconds, 0 = never). Only
// persistent instances expire: a job's instance lives as long as its job, which the workload
// manager ends. A persistent instance asked without one gets the site's default
// (controller.persistent_expiration, else controller.max_persistent_expiration); none may
// outlive the maximum.
func expirationFor(req Setup, p Params, now time.Time) (int64, error) {
	if !req.Persistent {
		if req.Expiration != 0 {
			return 0, userErr("expiration: only persistent instances expire; a job's instance lives as long as its job (leave expiration out)")
		}
		return 0, nil
	}
	maxAt := int64(0)
	if p.MaxPersistentExpiration > 0 {
		maxAt = now.Add(p.MaxPersistentExpiration).Unix()
	}
	switch e := req.Expiration; {
	case e == ExpirationNever:
		if maxAt > 0 {
			return 0, userErr("expiration never: persistent instances live at most %s here (controller.max_persistent_expiration); give an expiration up to %s",
				shortDuration(p.MaxPersistentExpiration), stamp(maxAt))
		}
		return 0, nil
	case e == 0:
		if p.PersistentExpiration > 0 {
			return now.Add(p.PersistentExpiration).Unix(), nil
		}
		return maxAt, nil
	case e < 0:
		return 0, userErr("expiration %d: give a time in seconds since the epoch, or %d for never", e, ExpirationNever)
	case e <= now.Unix():
		return 0, userErr("expiration %s is not in the future; give a later time", stamp(e))
	case maxAt > 0 && e > maxAt:
		return 0, userErr("expiration %s is past the longest lifetime of a persistent instance here, %s (controller.max_persistent_expiration); give %s or earlier",
			stamp(e), shortDuration(p.MaxPersistentExpiration), stamp(maxAt))
	default:
		return e, nil
	}
}

// stamp writes an expiration as dwstat does, in UTC with its zone for messages.
func stamp(epoch int64) string { return time.Unix(epoch, 0).UTC().Format("2006-01-02T15:04:05Z") }

// expired reports whether a session's expiration has come.
func expired(s *model.Session, now time.Time) bool {
	return s.Expired || s.Expiration > 0 && now.Unix() >= s.Expiration
}

// Expire enforces persistent instances' expirations (Step calls it): an instance whose
// expiration has come is marked expired — no new job may use it — and is destroyed as
// destroy_persistent would destroy it once no job uses it any more. Jobs already using it
// keep it until they end: expiring never pulls storage from under a running job.
func Expire(w *World, now time.Time) {
	for _, s := range w.SortedSessions() {
		if !s.Persistent || s.State.Goal != model.GoalCreate || !expired(s, now) {
			continue
		}
		inUse := len(usersOf(w, s)) > 0
		if s.Expired && inUse {
			continue // recorded already; waits for its jobs
		}
		s.Expired = true
		if !inUse {
			s.State = model.Destroying()
			s.Phase = PhaseTeardown
		}
		w.put(s)
	}
}
