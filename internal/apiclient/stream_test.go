package apiclient

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Stream reaches a controller as Do does (past a dead one, to the leader for a write) and
// passes its answer on byte for byte; an error answer writes nothing.
func TestStreamPassesTheAnswerOn(t *testing.T) {
	cs := &controllers{asked: map[string][]string{}, auth: map[string][]string{}}
	follower, leader := cs.start(t), cs.start(t)
	cs.leader = leader
	c, err := New(strings.Join([]string{deadAddress(t), follower, leader}, ","), Options{ConnectRetries: 2, RetryWait: 10 * time.Millisecond, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var got bytes.Buffer
	if err := c.Stream(ctx, "GET", "/dw/v1/sessions", &got); err != nil || got.String() != `{"from":"`+follower+`"}`+"\n" {
		t.Fatalf("a read past a dead controller: %v %q, want the follower's answer as it sent it", err, got.String())
	}
	got.Reset()
	if err := c.Stream(ctx, "POST", "/dw/v1/run_ids", &got); err != nil || got.String() != `{"from":"`+leader+`"}`+"\n" {
		t.Fatalf("a write: %v %q, want the leader's answer", err, got.String())
	}
	cs.mu.Lock()
	cs.leader = ""
	cs.mu.Unlock()
	got.Reset()
	err = c.Stream(ctx, "POST", "/dw/v1/run_ids", &got)
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Kind != "not_leader" || got.Len() != 0 {
		t.Fatalf("no leader: %v, %q written; want the not_leader error and nothing written", err, got.String())
	}
}
