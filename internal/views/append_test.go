package views

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/spillway-hpc/spillway/internal/model"
)

// oddStrings are strings encoding/json escapes in every way it has.
var oddStrings = []string{
	"",
	"plain /pfs/a_b-c.d",
	`quote " and backslash \ and slash /`,
	"it's an apostrophe",
	"<script>&amp;</script>",
	"controls \x00\x01\x07\b\f\n\r\t\x0b\x1b\x1f end",
	"del \x7f",
	"non-UTF-8 \xff\xfe and a cut rune \xe2\x82",
	"\xc0\xaf overlong, \xed\xa0\x80 surrogate",
	"line separator \u2028 paragraph separator \u2029",
	"unicode é 漢字 🙂 \ufffd",
	"\xe2\x80", // U+2028's first bytes alone
}

// rowsWith builds one row of every appended type whose strings are s and numbers n.
func rowsWith(s string, n int64, b bool) (Pool, Session, Instance, Configuration, Fragment, Namespace, Registration, Activation) {
	st := State{Actualized: b, FuseBlown: !b, Goal: s, Mixed: b, Transitioning: !b, Error: s}
	u := uint64(n)
	var uses, nodes []string
	var confs []int64
	if b {
		uses, nodes, confs = []string{s, "proj"}, []string{s}, []int64{n, 7}
	} else if n%2 == 0 {
		nodes, confs = []string{}, []int64{}
	}
	return Pool{ID: s, Units: "bytes", Granularity: u, Quantity: u + 1, Free: math.MaxUint64},
		Session{Created: n, Creator: s, Expiration: -n, Expired: b, ID: n, Links: SessionLinks{ClientNodes: nodes}, Owner: uint32(n), State: st,
			Token: s, Group: math.MaxUint32, Persistent: !b, Phase: s, Hurry: b, Failure: s, Uses: uses},
		Instance{Capacity: Capacity{Bytes: u, Nodes: int(n)}, Created: n, Expiration: n, Expired: b, ID: n, Intact: !b, Label: s,
			Limits: Limits{WriteWindowLength: n, WriteWindowMultiplier: -n}, Links: InstanceLinks{Configurations: confs, Session: n},
			Public: b, State: st, Pool: s, Requested: u, Strategy: s},
		Configuration{ID: n, Type: s, AccessType: s, AccessMode: s, RootPermissions: uint32(n), Group: uint32(u >> 3), BackingPath: s, Cache: cacheOf(s, n, u, b),
			Activations: int(n), Links: ConfigurationLink{Instance: n}, State: st},
		Fragment{ID: n, Instance: n, Capacity: u, Node: s, State: st, CacheDirty: u, CacheFlushError: s, CacheLost: s},
		Namespace{ID: n, Configuration: n, Fragment: n, Span: int(n), ClientNode: s, State: st},
		Registration{ID: n, Session: n, Configuration: n, Wait: b, State: st},
		Activation{ID: n, Session: n, Configuration: n, Namespace: n, Node: s, Mount: s, ReadOnly: b, State: st}
}

// cacheOf is a cache configuration's settings for the odd values (nil for half the rows).
func cacheOf(s string, n int64, u uint64, b bool) *model.CacheSettings {
	if n%2 != 0 {
		return nil
	}
	return &model.CacheSettings{PFS: s, ModifiedThreshold: u, ReadAhead: u >> 1, SyncOnClose: b, SyncToPFS: !b,
		HighWatermark: int(n), LowWatermark: -int(n)}
}

// checkSame fails unless appended is what encoding/json writes for v.
func checkSame(t *testing.T, what string, v any, appended []byte) {
	t.Helper()
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(appended, want) {
		t.Errorf("%s:\nappended      %s\nencoding/json %s", what, appended, want)
	}
}

func checkRows(t *testing.T, s string, n int64, b bool) {
	t.Helper()
	p, sess, inst, conf, frag, ns, reg, act := rowsWith(s, n, b)
	checkSame(t, "pool", p, AppendPool(nil, &p))
	checkSame(t, "session", sess, AppendSession(nil, &sess))
	checkSame(t, "instance", inst, AppendInstance(nil, &inst))
	checkSame(t, "configuration", conf, AppendConfiguration(nil, &conf))
	checkSame(t, "fragment", frag, AppendFragment(nil, &frag))
	checkSame(t, "namespace", ns, AppendNamespace(nil, &ns))
	checkSame(t, "registration", reg, AppendRegistration(nil, &reg))
	checkSame(t, "activation", act, AppendActivation(nil, &act))
	checkSame(t, "state", sess.State, AppendState(nil, &sess.State))
}

// Every appender writes what encoding/json writes for the same row: every escape of a
// string, omitted empty fields, nil and empty lists, extreme numbers.
func TestAppendersWriteWhatEncodingJSONWrites(t *testing.T) {
	for _, s := range oddStrings {
		for _, n := range []int64{0, 1, -1, 42, math.MaxInt64, math.MinInt64} {
			for _, b := range []bool{false, true} {
				checkRows(t, s, n, b)
			}
		}
	}
}

// AppendTable writes the listing's answer as json.Encoder wrote it before: {"name":[...]}
// and a newline; null for a table not built; and says which tables it cannot write.
func TestAppendTableIsTheEncodersAnswer(t *testing.T) {
	var a All
	for i, s := range oddStrings {
		p, sess, inst, conf, frag, ns, reg, act := rowsWith(s, int64(i), i%2 == 0)
		a.Pools, a.Sessions, a.Instances = append(a.Pools, p), append(a.Sessions, sess), append(a.Instances, inst)
		a.Configurations, a.Fragments, a.Namespaces = append(a.Configurations, conf), append(a.Fragments, frag), append(a.Namespaces, ns)
		a.Registrations, a.Activations = append(a.Registrations, reg), append(a.Activations, act)
	}
	empty := All{Sessions: []Session{}}
	for _, tc := range []struct {
		name string
		all  All
		rows any
	}{
		{"pools", a, a.Pools}, {"sessions", a, a.Sessions}, {"instances", a, a.Instances}, {"configurations", a, a.Configurations},
		{"fragments", a, a.Fragments}, {"namespaces", a, a.Namespaces}, {"registrations", a, a.Registrations}, {"activations", a, a.Activations},
		{"sessions", empty, empty.Sessions}, {"instances", empty, empty.Instances},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(map[string]any{tc.name: tc.rows}); err != nil {
			t.Fatal(err)
		}
		got, ok := AppendTable([]byte("kept:"), tc.name, tc.all)
		if !ok || string(got) != "kept:"+want.String() {
			t.Errorf("%s (%v):\nappended %s\nencoder  kept:%s", tc.name, ok, got, want.String())
		}
	}
	for _, name := range []string{"nodes", "stages", "stage_history", "nope"} {
		if _, ok := AppendTable(nil, name, a); ok {
			t.Errorf("AppendTable(%q) claims to write it", name)
		}
	}
}

// Any string and number: the appenders and encoding/json agree.
func FuzzAppendersMatchEncodingJSON(f *testing.F) {
	for i, s := range oddStrings {
		f.Add(s, int64(i), i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, s string, n int64, b bool) {
		checkRows(t, s, n, b)
	})
}
