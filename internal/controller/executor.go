package controller

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/crashpoint"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// Run is the executor: until ctx ends, it looks at the world whenever something changed (or
// every executor.tick), settles what needs no agent, and runs the effects that are due, at
// most executor.max_in_flight at once and one per object.
func (c *Controller) Run(ctx context.Context) error {
	ctx = store.Background(ctx) // its transactions let the requests' go first
	c.swept.Store(false)        // the first pass reads the whole state (a new leader's too)
	c.unparkAll()
	tick := time.NewTicker(c.cfg.Executor.Tick.D())
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { defer wg.Done(); c.finishAbandonedRuns(ctx) }()
	// One timer for the whole loop, reset each pass (a timer per pass with a deferred Stop
	// kept one deferred call per pass alive until the controller stopped).
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	gather := time.NewTimer(time.Hour) // wakeGather's delay
	gather.Stop()
	defer gather.Stop()
	var gatherC <-chan time.Time // set while a gathered wake-up waits
	for {
		next := c.runOnce(ctx, &wg)
		var dueC <-chan time.Time
		if next > 0 {
			due.Reset(next)
			dueC = due.C
		}
	wait:
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-c.wakeGathered:
			if gatherC == nil {
				gather.Reset(c.cfg.Executor.WakeDelay.D())
				gatherC = gather.C
			}
			goto wait // the pass at the delay's end (or sooner, woken otherwise) sees it
		case <-gatherC:
		case <-tick.C:
			c.unparkAll() // a safety net: whatever parked a session, the tick looks at it again
		case <-dueC:
		}
		due.Stop()
		if gatherC != nil { // this pass sees what the gathered calls asked for
			gather.Stop()
			select {
			case <-gather.C:
			default:
			}
			gatherC = nil
		}
	}
}

// RunOnce performs one pass (tests use it to drive the executor step by step) and waits for
// its effects, and those queued, to end.
func (c *Controller) RunOnce(ctx context.Context) {
	ctx = store.Background(ctx)
	var wg sync.WaitGroup
	c.runOnce(ctx, &wg)
	wg.Wait()
}

// maxStepsPerPass bounds how often a pass steps its sessions before it persists: a step's
// changes often make the next decision (an instance created makes its fragments), and taking
// them in the same pass saves a pass, with its reads and its commit, each time.
const maxStepsPerPass = 8

// stepUntilSettled steps w until a step changes nothing, at most maxStepsPerPass times, and
// returns the last step's effects.
func (c *Controller) stepUntilSettled(w *lifecycle.World, now time.Time) []lifecycle.Effect {
	var effects []lifecycle.Effect
	for i := 0; i < maxStepsPerPass; i++ {
		before := w.ChangeCount()
		effects = lifecycle.Step(w, c.params, now)
		if w.ChangeCount() == before {
			break
		}
	}
	return effects
}

// queuedEffect is an effect waiting for a slot, with the world it was decided on.
type queuedEffect struct {
	e       lifecycle.Effect
	w       *lifecycle.World
	session int64
	wg      *sync.WaitGroup
}

// dueNow splits the due index: the sessions due by now, and the earliest due time still to
// come (zero: none).
func dueNow(due map[int64]time.Time, now time.Time) (selected []int64, wake time.Time) {
	for id, at := range due {
		if !at.After(now) {
			selected = append(selected, id)
		} else if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	return selected, wake
}

// runOnce returns how soon a skipped effect (a stage poll not yet due) wants another pass;
// 0 when none.
func (c *Controller) runOnce(ctx context.Context, wg *sync.WaitGroup) time.Duration {
	var effects []lifecycle.Effect
	var w *lifecycle.World
	var whole bool
	var wake time.Time // the earliest due time still to come
	var touched map[int64]bool
	changed := false
	if c.swept.Load() {
		// Most wake-ups find nothing to decide (an outcome already stepped its session): seen
		// in a read, beside the writers, they cost no turn of the write transaction the
		// requests wait for. Whatever is marked due after this read wakes the executor again.
		idle := false
		err := c.store.View(ctx, func(tx *store.Tx) error {
			due, err := store.DueSessions(tx)
			if err != nil {
				return err
			}
			var selected []int64
			selected, wake = dueNow(due, c.now())
			idle = len(c.unparked(selected)) == 0
			return nil
		})
		if err == nil && idle {
			c.metrics.passOver(nil, 0, false)
			c.flushAccounting(ctx)
			if wake.IsZero() {
				return 0
			}
			return max(wake.Sub(c.now()), time.Millisecond)
		}
	}
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		now := c.now()
		due, err := store.DueSessions(tx)
		if err != nil {
			return err
		}
		var selected []int64
		selected, wake = dueNow(due, now)
		whole = !c.swept.Load()
		if !whole {
			if selected = c.unparked(selected); len(selected) == 0 {
				return nil // nothing to decide (most wake-ups, once outcomes step their sessions)
			}
			if w, err = loadSessionsWorld(tx, selected, now, c.cfg.Controller.NodeTimeout.D()); err != nil {
				return err
			}
			whole = lifecycle.NeedsWhole(w, now)
		}
		if whole {
			if w, err = loadWorld(tx, now, c.cfg.Controller.NodeTimeout.D()); err != nil {
				return err
			}
			selected = selected[:0]
			for id := range due {
				selected = append(selected, id)
			}
			for id := range w.Sessions {
				if _, ok := due[id]; !ok {
					selected = append(selected, id)
				}
			}
		}
		if whole {
			// The whole state: count its running stages afresh (a state written before the
			// count was kept has none; the count is kept by every change after).
			if err := store.SetRunningStages(tx, runningIn(w)); err != nil {
				return err
			}
		}
		w.Elsewhere.RunningStages += c.startsElsewhere(w)
		effects = c.stepUntilSettled(w, now)
		ch := w.TakeChanges()
		changed = !ch.Empty()
		if touched, err = c.persistTouched(tx, ch); err != nil {
			return err
		}
		return settleDue(tx, w, selected, due, touched, now)
	})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error("executor: cannot load or settle the state", "err", err)
		}
		return 0
	}
	if whole {
		c.swept.Store(true)
	}
	if w == nil { // no session to look at
		c.metrics.passOver(nil, 0, false)
	} else {
		c.metrics.passOver(w, len(effects), whole)
	}
	if changed {
		c.notifyChange(touched)
	}
	c.flushAccounting(ctx)
	now := c.now()
	var next time.Duration
	if !wake.IsZero() {
		next = max(wake.Sub(now), time.Millisecond)
	}
	if w == nil {
		return next
	}
	if wait := c.dispatch(ctx, wg, w, effects, !whole, now, true); wait > 0 && (next == 0 || wait < next) {
		next = wait
	}
	return next
}

// dispatch starts the effects a decision returned, or queues them when every slot
// (executor.max_in_flight) is taken, skipping those in flight or queued already and stage
// polls not yet due. With park, the sessions whose every effect is now in flight or queued
// are parked. forgetPolls: the decision saw every running stage there is to poll (a pass),
// so the pacing of the others is dropped. It returns how soon a held-back poll wants a pass
// (0: none).
func (c *Controller) dispatch(ctx context.Context, wg *sync.WaitGroup, w *lifecycle.World, effects []lifecycle.Effect, park bool, now time.Time, forgetPolls bool) time.Duration {
	var next time.Duration
	var start []queuedEffect
	c.mu.Lock() // decisions and parking under one lock: an effect ending after it unparks
	polled := map[lifecycle.EffectKey]bool{}
	paced := map[int64]bool{} // sessions with a stage poll held back: they need the pass at its time
	withEffects := map[int64]bool{}
	for _, e := range effects {
		key := e.Key()
		session := lifecycle.SessionOf(w, e.Ref)
		withEffects[session] = true
		busy := c.inflight[key] || c.queued[key]
		if isPoll(e) {
			polled[key] = true
			p, seen := c.polls[key]
			if !seen {
				p = pollState{gap: firstPollGap(c.cfg.Stage.PollInterval.D())}
			}
			if wait := p.gap - now.Sub(p.last); !busy && seen && wait > 0 {
				busy = true
				paced[session] = true
				if next == 0 || wait < next {
					next = wait
				}
			}
			if !busy {
				if seen {
					p.gap = min(2*p.gap, c.cfg.Stage.PollInterval.D())
				}
				p.last = now
			}
			c.polls[key] = p
		}
		if busy {
			continue
		}
		q := queuedEffect{e: e, w: w, session: session, wg: wg}
		if isStart(e) {
			c.starting[e.Ref.ID] = true
		}
		wg.Add(1) // counted from now on: RunOnce waits for queued effects too
		// First come, first started: behind the queue when there is one.
		if len(c.inflight) >= c.cfg.Executor.MaxInFlight || len(c.queue) > 0 {
			c.queued[key] = true
			c.queue = append(c.queue, q)
			continue
		}
		c.inflight[key] = true
		start = append(start, q)
	}
	for session := range withEffects {
		if park && !paced[session] {
			c.parked[session] = true
		}
	}
	if forgetPolls {
		for key := range c.polls { // stages no longer running
			if !polled[key] {
				delete(c.polls, key)
			}
		}
	}
	c.mu.Unlock()
	c.launch(ctx, start)
	return next
}

// sessionsWorld loads the world of some sessions (loadSessionsWorld), or the whole world
// when a decision on them needs it (lifecycle.NeedsWhole; whole is then true).
func (c *Controller) sessionsWorld(tx *store.Tx, ids []int64, now time.Time) (w *lifecycle.World, whole bool, err error) {
	w, err = loadSessionsWorld(tx, ids, now, c.cfg.Controller.NodeTimeout.D())
	if err != nil || !lifecycle.NeedsWhole(w, now) {
		return w, false, err
	}
	w, err = loadWorld(tx, now, c.cfg.Controller.NodeTimeout.D())
	return w, true, err
}

// settleDue updates the due index for the sessions a pass looked at (selected): a session
// gone, or settled with nothing to wait for, leaves it; one settled until a time (a
// persistent instance's expiration) is due then; any other stays due now. Entries are
// written only where they change (due: the index as the pass read it; touched: the sessions
// the pass's own changes marked due now).
func settleDue(tx *store.Tx, w *lifecycle.World, selected []int64, due map[int64]time.Time, touched map[int64]bool, now time.Time) error {
	for _, id := range selected {
		at, has := due[id]
		if touched[id] {
			at, has = time.Time{}, true
		}
		s := w.Sessions[id]
		if s == nil {
			if has {
				if err := store.NotDue(tx, id); err != nil {
					return err
				}
			}
			continue
		}
		settled, wake := lifecycle.Settled(w, s, now)
		switch {
		case !settled:
			if !has || !at.IsZero() {
				if err := store.MarkDue(tx, id, time.Time{}); err != nil {
					return err
				}
			}
		case wake.IsZero():
			if has {
				if err := store.NotDue(tx, id); err != nil {
					return err
				}
			}
		case !has || !at.Equal(wake):
			if err := store.MarkDue(tx, id, wake); err != nil {
				return err
			}
		}
	}
	return nil
}

// pollState paces the polls of one running stage: a stage is asked about soon after it
// starts (most stages are short), then less and less often, up to stage.poll_interval.
type pollState struct {
	last time.Time
	gap  time.Duration
}

// firstPollGap is the wait before the second poll of a stage: 1/16 of stage.poll_interval,
// doubling at each poll after it.
func firstPollGap(max time.Duration) time.Duration { return max / 16 }

// launch performs effects, each in its own goroutine (their slots are already taken; each is
// counted in its wait group since it was decided).
func (c *Controller) launch(ctx context.Context, effects []queuedEffect) {
	for _, q := range effects {
		go func(q queuedEffect) {
			defer q.wg.Done()
			c.perform(ctx, q)
		}(q)
	}
}

// startQueued takes the queued effects that the free slots can start, in order, and marks
// them in flight (under c.mu).
func (c *Controller) startQueued() []queuedEffect {
	var start []queuedEffect
	for len(c.queue) > 0 && len(c.inflight) < c.cfg.Executor.MaxInFlight {
		q := c.queue[0]
		c.queue = c.queue[1:]
		delete(c.queued, q.e.Key())
		if c.inflight[q.e.Key()] { // cannot be: a key in flight is never queued
			q.wg.Done()
			continue
		}
		c.inflight[q.e.Key()] = true
		start = append(start, q)
	}
	if len(c.queue) == 0 {
		c.queue = nil // let the backing array go
	}
	return start
}

// unparked returns the sessions of ids that are not parked.
func (c *Controller) unparked(ids []int64) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := ids[:0]
	for _, id := range ids {
		if !c.parked[id] {
			kept = append(kept, id)
		}
	}
	return kept
}

// unparkAll makes every due session looked at again by the next pass.
func (c *Controller) unparkAll() {
	c.mu.Lock()
	clear(c.parked)
	c.mu.Unlock()
}

// replan makes the next pass decide again on the sessions a change touched (nil: none):
// they are unparked, and their queued effects, decided on the state before the change, are
// dropped (a teardown request must not be followed by a queued fragment creation).
func (c *Controller) replan(touched map[int64]bool) {
	if len(touched) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.queue[:0]
	for _, q := range c.queue {
		if touched[q.session] {
			delete(c.queued, q.e.Key())
			if isStart(q.e) {
				delete(c.starting, q.e.Ref.ID)
			}
			q.wg.Done()
		} else {
			kept = append(kept, q)
		}
	}
	for i := len(kept); i < len(c.queue); i++ {
		c.queue[i] = queuedEffect{} // no stale world kept alive behind the slice's end
	}
	c.queue = kept
	for id := range touched {
		delete(c.parked, id)
	}
}

// perform runs one effect on its agent and records the outcome. A success's session is
// stepped in the same transaction (its world is loaded to record the outcome anyway) and its
// next effects start at once, the session parked behind them; otherwise the session is
// unparked for the next pass. The freed slot starts the next queued effect.
func (c *Controller) perform(ctx context.Context, q queuedEffect) {
	w, e, session := q.w, q.e, q.session
	released := false
	release := func() { // the effect's slot, and its session for the passes
		c.mu.Lock()
		delete(c.inflight, e.Key())
		delete(c.parked, session)
		if e.Op == lifecycle.OpMount {
			delete(c.mountsInFlight[e.Node], e.Mount.MountPath)
			if len(c.mountsInFlight[e.Node]) == 0 {
				delete(c.mountsInFlight, e.Node)
			}
		}
		if isStart(e) { // its outcome is recorded (or will be found again after a restart)
			delete(c.starting, e.Ref.ID)
		}
		c.mu.Unlock()
		released = true
	}
	defer func() {
		if !released {
			release()
		}
		c.mu.Lock()
		start := c.startQueued()
		c.mu.Unlock()
		c.launch(ctx, start)
		c.wakeUp()
	}()
	if !isPoll(e) {
		crashpoint.Hit("before-effect:" + e.Op)
	}
	var r lifecycle.Result
	agent, err := c.agentFor(w, e.Node)
	if err != nil {
		r.Err, r.NotTheNode = err, true // no address, or one that cannot be dialled as given
	} else {
		actx, cancel := context.WithTimeout(ctx, c.cfg.Executor.AgentTimeout.D())
		start := time.Now()
		switch e.Op {
		case lifecycle.OpCreateFragment:
			r.Err = agent.CreateFragment(actx, e.Fragment)
		case lifecycle.OpDeleteFragment:
			c.finalUsage(actx, agent, e.Node, e.Fragment.ID) // persisted before the delete
			r.Err = agent.DeleteFragment(actx, e.Fragment.ID)
		case lifecycle.OpCreateNamespace:
			r.Err = agent.CreateNamespace(actx, e.Namespace)
		case lifecycle.OpDeleteNamespace:
			r.Err = agent.DeleteNamespace(actx, e.Namespace.FragmentID, e.Namespace.ID)
		case lifecycle.OpMount:
			granted := c.grant(e.Mount, e.Node)
			c.mu.Lock()
			if c.mountsInFlight[e.Node] == nil {
				c.mountsInFlight[e.Node] = map[string]agentapi.MountSpec{}
			}
			c.mountsInFlight[e.Node][granted.MountPath] = granted // until its outcome is persisted (release)
			c.mu.Unlock()
			r.Err = agent.Mount(actx, granted)
		case lifecycle.OpUnmount:
			r.Err = agent.Unmount(actx, e.Mount.ActivationID, e.Mount.MountPath)
		case lifecycle.OpStartStage:
			e.Stage.Parallel = c.cfg.Stage.FilesInFlight
			// The storage node mounts striped namespaces to stage them: a capability for this
			// node (a fresh map: a split stage's runs on other nodes share the step's).
			granted := make(map[string]agentapi.MountSpec, len(e.Stage.Striped))
			for v, ms := range e.Stage.Striped {
				granted[v] = c.grant(ms, agentapi.StageClient(e.Node)) // its stage workers' sessions
			}
			if len(granted) > 0 {
				e.Stage.Striped = granted
			}
			r.Err = agent.StartStage(actx, e.Stage)
		case lifecycle.OpPollStage:
			r.Stage, r.Err = agent.StageStatus(actx, e.Stage.Key())
		case lifecycle.OpCancelStage:
			r.Stage, r.Err = agent.CancelStage(actx, e.Stage.Key())
		case lifecycle.OpFlushCache:
			r.Flush, r.Err = agent.FlushCache(actx, e.Flush)
		case lifecycle.OpAttachSwap:
			spec := e.Swap
			if spec.Mount != nil { // a remote compute node mounts the namespace: its grant
				m := c.grant(*spec.Mount, e.Node)
				spec.Mount = &m
			}
			r.Err = agent.AttachSwap(actx, spec)
		case lifecycle.OpDetachSwap:
			r.Swap, r.Err = agent.DetachSwap(actx, e.SwapDetach)
		}
		cancel()
		if fc, ok := agent.(nodeFaults); ok && r.Err != nil {
			r.NotTheNode = !fc.NodeFault(r.Err)
		}
		if na, ok := agent.(noAnswers); ok && r.Err != nil {
			r.NoAnswer = na.NoAnswer(r.Err)
		}
		c.metrics.effect(w, e, time.Since(start), r.Err)
	}
	if ctx.Err() != nil {
		return // shutting down: the outcome is found again after restart
	}
	if r.Err != nil && r.NotTheNode {
		c.log.Error("effect failed on a configuration or controller-side problem, not counted against the node (auto-drain)", "op", e.Op, "node", e.Node, "object", e.Ref, "err", r.Err)
	} else if r.Err != nil && !isPoll(e) {
		c.log.Warn("effect failed", "op", e.Op, "node", e.Node, "object", e.Ref, "err", r.Err)
	}
	if !isPoll(e) {
		crashpoint.Hit("after-effect:" + e.Op)
	}
	if lifecycle.PollSaysNothingNew(w, e, r) && c.pollSaysNothingNew(ctx, e, r) {
		// The running stage as it is recorded: recording the answer would change nothing,
		// and its transaction (a session's load and step) is one the requests would wait
		// for. The passes keep polling it.
		return
	}
	drained := "" // the reason, when this outcome drained the node (auto-drain)
	var touched map[int64]bool
	var recorded *lifecycle.World // the world the outcome was recorded in
	stepped := false              // and its session stepped there, next its next effects
	var next []lifecycle.Effect
	err = c.store.Update(ctx, func(tx *store.Tx) error {
		now := c.now()
		w, whole, err := c.sessionsWorld(tx, []int64{session}, now)
		if err != nil {
			return err
		}
		recorded = w
		n := w.Nodes[e.Node]
		wasDrained := n != nil && n.Drain
		lifecycle.Complete(w, e, r, c.params, now)
		w.Elsewhere.RunningStages += c.startsElsewhere(w) // this start, recorded, is w's own now
		if n != nil && !wasDrained && n.AutoDrained {
			drained = n.Reason
		}
		// A success moves its session on: step it here, as a pass would (a failure waits
		// for its retry time, which passes keep). Not a whole world: a pass steps those.
		next, stepped = nil, r.Err == nil && !whole
		if stepped {
			next = c.stepUntilSettled(w, now)
		}
		touched, err = c.persistTouched(tx, w.TakeChanges())
		if err != nil || !stepped || !touched[session] {
			return err
		}
		return settleDue(tx, w, []int64{session}, map[int64]time.Time{session: {}}, touched, now)
	})
	if err != nil && ctx.Err() == nil {
		c.log.Error("executor: cannot record an effect's outcome; it will be redone", "op", e.Op, "err", err)
	} else if drained != "" {
		c.log.Warn("node drained", "node", e.Node, "reason", drained)
	}
	if err == nil && recorded != nil {
		c.metrics.stagesOver(recorded, false) // a stage this outcome ended, seen at once
	}
	c.announce(touched)
	if !isPoll(e) {
		crashpoint.Hit("outcome-persisted:" + e.Op)
	}
	release()
	if err == nil && stepped && !slices.ContainsFunc(next, isPoll) {
		// Polls are paced by the passes (dispatch's pacing needs their wake-up).
		c.dispatch(ctx, q.wg, recorded, next, true, c.now(), false)
	}
}

// pollSaysNothingNew is lifecycle.PollSaysNothingNew on the stage as recorded now (read
// beside the writers), not as the pass that sent the poll saw it: a poll that failed since
// left a retry count that this answer must clear. Only this poll's outcome can change the
// stage's counts and retries meanwhile (one effect per object at a time); a request that
// ends it meanwhile leaves nothing for the answer to change either.
func (c *Controller) pollSaysNothingNew(ctx context.Context, e lifecycle.Effect, r lifecycle.Result) bool {
	var st *model.Stage
	if err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		st, err = store.Stages.Get(tx, e.Ref.ID)
		return err
	}); err != nil {
		return false
	}
	w := lifecycle.NewWorld()
	w.Stages[st.ID] = st
	return lifecycle.PollSaysNothingNew(w, e, r)
}

// nodeFaults is an agent whose errors may be no fault of its node (a remote agent's client,
// agentclient): those do not count toward auto-drain. An in-process agent's errors all do.
type nodeFaults interface {
	NodeFault(err error) bool
}

// noAnswers is an agent whose errors may be its node not answering at all (a remote agent's
// client, agentclient): lifecycle.Result.NoAnswer. An in-process agent always answers.
type noAnswers interface {
	NoAnswer(err error) bool
}

// isPoll reports whether an effect is a poll: a running stage's (poll-stage) or a cache
// flush's (flush-cache). Polls are paced (dispatch: soon after the first, then less and
// less often, up to stage.poll_interval), are not crash points (their number varies from run
// to run; a restart polls again, which is harmless: a poll is idempotent) and their failures
// are not logged one by one (the object's state keeps the last).
func isPoll(e lifecycle.Effect) bool {
	return e.Op == lifecycle.OpPollStage || e.Op == lifecycle.OpFlushCache || e.Op == lifecycle.OpDetachSwap
}

// isStart reports whether an effect starts a stage (a split stage's runs are not: the stage
// is running already).
func isStart(e lifecycle.Effect) bool { return e.Op == lifecycle.OpStartStage && e.Part == 0 }

// runningIn counts a world's running stages.
func runningIn(w *lifecycle.World) int {
	n := 0
	for _, st := range w.Stages {
		if st.Status == model.StageRunning {
			n++
		}
	}
	return n
}

// startsElsewhere counts the stage starts decided and not yet recorded (in flight or
// queued) whose stages w does not count as running: with the state's running stages
// elsewhere (countElsewhere), what stage.max_running leaves a decision on w. A start of a
// stage w holds as pending counts here and again if the step decides it again: a slot is
// never given twice, at worst held a moment longer.
func (c *Controller) startsElsewhere(w *lifecycle.World) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for id := range c.starting {
		if st := w.Stages[id]; st == nil || st.Status != model.StageRunning {
			n++
		}
	}
	return n
}
