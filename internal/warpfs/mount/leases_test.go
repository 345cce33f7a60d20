package mount

import (
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// A change's reply keeps the attributes it carries only when no other change of the inode by
// this mount overlapped it and no invalidation came meanwhile: an overlapping change may
// have reached the server after the reply's attributes were taken.
func TestKeptAttributesNeedAChangeAlone(t *testing.T) {
	ls := newLeaseState()
	a := &proto.Attr{Ino: 5, Nlink: 3}
	kept := func() bool {
		_, _, ok := ls.cachedAttr(5)
		return ok
	}
	t1 := ls.startChange(5)
	t2 := ls.startChange(5)
	ls.endChange(t2, a, time.Minute)
	if kept() {
		t.Error("kept the reply of a change while an earlier one was in flight")
	}
	ls.endChange(t1, a, time.Minute)
	if kept() {
		t.Error("kept the reply of a change another started after")
	}
	t3 := ls.startChange(5)
	ls.dropSizes(6) // an invalidation of anything
	ls.endChange(t3, a, time.Minute)
	if kept() {
		t.Error("kept a reply an invalidation overtook")
	}
	t4 := ls.startChange(5)
	ls.endChange(t4, &proto.Attr{Ino: 7}, time.Minute)
	if kept() {
		t.Error("kept another inode's attributes")
	}
	t5 := ls.startChange(5)
	ls.endChange(t5, a, time.Minute)
	if got, _, ok := ls.cachedAttr(5); !ok || got.Nlink != 3 {
		t.Fatalf("a change alone: kept %v %v, want its attributes", got, ok)
	}
	ls.startChange(5) // a change of this mount's own starts: the copy goes at once
	if kept() {
		t.Error("kept attributes past the start of a change")
	}
	ls = newLeaseState()
	ls.endChange(ls.startChange(5), a, time.Minute)
	ls.dropSizes(5)
	if kept() {
		t.Error("kept attributes past their invalidation")
	}
}
