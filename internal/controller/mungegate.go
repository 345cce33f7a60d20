package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-hpc/spillway/internal/munge"
	"github.com/spillway-hpc/spillway/internal/netgroup"
)

// mungeGate bounds what MUNGE credentials cost the controller. Each one is a round trip to
// munged (its socket; munged decrypts it and checks it against its replay cache): a credential
// that does not have the form of one is refused without it; at most max_munge_decodes are at
// munged at once; and a network
// (an IPv4 /24, an IPv6 /64: one host or allocation's addresses) whose credentials failed
// munge_failures_per_minute times in the last minute is refused without decoding until its
// budget refills. A user's good credentials never use up the budget.
type mungeGate struct {
	socket    string
	perMinute float64
	slots     chan struct{}

	mu       sync.Mutex
	failures map[string]*failureBudget

	decodes atomic.Int64 // credentials asked of munged (tests)
	now     func() time.Time
}

// failureBudget is a token bucket of failed decodes: perMinute tokens, refilled evenly.
type failureBudget struct {
	left float64
	at   time.Time
}

// maxFailureNetworks bounds the networks remembered; full ones are forgotten first.
const maxFailureNetworks = 4096

func newMungeGate(socket string, perMinute, maxDecodes int) *mungeGate {
	return &mungeGate{socket: socket, perMinute: float64(perMinute), slots: make(chan struct{}, max(1, maxDecodes)),
		failures: map[string]*failureBudget{}, now: time.Now}
}

// errMungeThrottled answers a network out of budget (429).
type errMungeThrottled struct{ network string }

func (e errMungeThrottled) Error() string {
	return fmt.Sprintf("too many invalid MUNGE credentials from %s in the last minute (controller.munge_failures_per_minute); "+
		"check munged and munge.key on that host, then retry in a minute", e.network)
}

// decode checks cred for a caller at remoteAddr.
func (g *mungeGate) decode(ctx context.Context, remoteAddr, cred string) (munge.Identity, error) {
	if err := munge.WellFormed(cred); err != nil {
		return munge.Identity{}, err
	}
	network := netgroup.Of(remoteAddr)
	now := g.now()
	if !g.hasBudget(network, now) {
		return munge.Identity{}, errMungeThrottled{network}
	}
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return munge.Identity{}, fmt.Errorf("MUNGE credential not checked: every one of controller.max_munge_decodes is busy: %w", ctx.Err())
	}
	g.decodes.Add(1)
	id, err := munge.Decode(ctx, g.socket, cred)
	<-g.slots
	// Only munged's verdict on the credential counts against its network: munged down or
	// stuck is this host's fault, and every network's.
	if err != nil && !errors.Is(err, munge.ErrUnavailable) {
		g.spend(network, g.now())
	}
	return id, err
}

func (g *mungeGate) refill(b *failureBudget, now time.Time) {
	b.left = min(g.perMinute, b.left+now.Sub(b.at).Minutes()*g.perMinute)
	b.at = now
}

func (g *mungeGate) hasBudget(network string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.failures[network]
	if b == nil {
		return true
	}
	g.refill(b, now)
	return b.left >= 1
}

func (g *mungeGate) spend(network string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.failures[network]
	if b == nil {
		if len(g.failures) >= maxFailureNetworks {
			for k, old := range g.failures {
				if g.refill(old, now); old.left >= g.perMinute {
					delete(g.failures, k)
				}
			}
			if len(g.failures) >= maxFailureNetworks {
				return // every remembered network is failing: this one goes uncounted for now
			}
		}
		b = &failureBudget{left: g.perMinute, at: now}
		g.failures[network] = b
	}
	g.refill(b, now)
	b.left = max(0, b.left-1)
}

// mungeStatus is the HTTP status of a refused credential.
func mungeStatus(err error) int {
	if _, ok := err.(errMungeThrottled); ok {
		return http.StatusTooManyRequests
	}
	if errors.Is(err, munge.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		return http.StatusServiceUnavailable
	}
	return http.StatusUnauthorized
}
