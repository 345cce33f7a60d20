package views

import (
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// A striped instance on two servers: the record sums the servers' counters, the namespaces'
// shares and the compute nodes' shares over both; every stage of its configuration counts
// (the WLM's and the job's own), in its namespace and in the totals; a fragment already
// deleted is known from its counters; the record is final only when every fragment's counters
// are.
func TestBuildAccounting(t *testing.T) {
	w := lifecycle.NewWorld()
	created := time.Unix(1700000000, 0)
	w.Pools["p"] = &model.Pool{Name: "p", Granularity: 1 << 30, StripeSize: 1 << 20}
	w.Sessions[1] = &model.Session{ID: 1, Token: "4711", Owner: 1000, Group: 100}
	w.Instances[2] = &model.Instance{ID: 2, SessionID: 1, Pool: "p", Capacity: 2 << 30, Label: "I2-0", Created: created}
	w.Fragments[3] = &model.Fragment{ID: 3, InstanceID: 2, Node: "bb1", Capacity: 1 << 30}
	w.Configurations[5] = &model.Configuration{ID: 5, InstanceID: 2, AccessMode: model.AccessStriped, MaxFileSize: 1 << 20}
	w.Namespaces[6] = &model.Namespace{ID: 6, ConfigurationID: 5, FragmentID: 3}
	w.Stages[7] = &model.Stage{ID: 7, SessionID: 1, ConfigurationID: 5, NamespaceID: 6, Direction: model.StageIn, BytesDone: 100}
	w.Stages[8] = &model.Stage{ID: 8, SessionID: 1, ConfigurationID: 5, NamespaceID: 6, Direction: model.StageOut, BytesDone: 30, InJob: true}
	w.Stages[9] = &model.Stage{ID: 9, SessionID: 1, ConfigurationID: 99, NamespaceID: 98, Direction: model.StageIn, BytesDone: 1000} // another instance's
	updated := time.Unix(1700000100, 0)
	usage := []*model.FragmentUsage{
		{Fragment: 3, Instance: 2, Node: "bb1", Capacity: 1 << 30, Updated: updated, Final: true, Counters: agentapi.FragmentUsage{
			Fragment: 3, BytesWritten: 600, BytesRead: 200, WriteOps: 6, ReadOps: 2, FilesCreated: 4, CapacityUsed: 600, CapacityMax: 700,
			WriteLimit: 10 << 30, WindowLength: 10, WindowWritten: 600, MaxWindowWrite: 650,
			Namespaces: []agentapi.NamespaceUsage{{Namespace: 6, BytesWritten: 600, BytesRead: 200, FilesCreated: 4, MaxOffsetWritten: 300}},
			Clients:    []agentapi.ClientUsage{{Node: "cn1", BytesWritten: 600, BytesRead: 200, WriteOps: 6, ReadOps: 2, FilesCreated: 4}}}},
		// The second server's fragment is already deleted: known from its counters.
		{Fragment: 4, Instance: 2, Node: "bb2", Capacity: 1 << 30, Updated: updated.Add(time.Second), Counters: agentapi.FragmentUsage{
			Fragment: 4, BytesWritten: 400, WriteOps: 4, CapacityUsed: 400, CapacityMax: 400, ReadOnly: true, ReadOnlyReason: "write window",
			Namespaces: []agentapi.NamespaceUsage{{Namespace: 6, BytesWritten: 400, MaxOffsetWritten: 500}},
			Clients: []agentapi.ClientUsage{{Node: "cn1", BytesWritten: 100, WriteOps: 1},
				{Node: "cn0", BytesWritten: 300, WriteOps: 3}}}},
		{Fragment: 40, Instance: 9, Node: "bb2"}, // another instance's
	}
	r := BuildAccounting(w, w.Instances[2], usage, nil).Realm
	if r.RealmID != 2 || r.Token != "4711" || r.Owner != 1000 || r.Group != 100 || r.Pool != "p" || r.Label != "I2-0" || r.Capacity != 2<<30 || r.Created != created.Unix() {
		t.Errorf("instance fields: %+v", r)
	}
	if r.ServerCount != 2 || r.NamespaceCount != 1 || r.Updated != updated.Unix()+1 || r.Final {
		t.Errorf("servers %d namespaces %d updated %d final %v", r.ServerCount, r.NamespaceCount, r.Updated, r.Final)
	}
	if r.BytesWritten != 1000 || r.BytesRead != 200 || r.WriteOps != 10 || r.ReadOps != 2 || r.FilesCreated != 4 || r.CapacityUsed != 1000 || r.CapacityMax != 1100 {
		t.Errorf("totals: %+v", r)
	}
	if r.StageBytesIn != 100 || r.StageBytesOut != 30 {
		t.Errorf("stage bytes in %d out %d, want 100 and 30", r.StageBytesIn, r.StageBytesOut)
	}
	f0, f1 := r.Fragments[0], r.Fragments[1]
	if f0.ServerHostname != "bb1" || f0.FSCapacity != 1<<30 || f0.MaxWindowWrite != 650 || f0.WriteHighWater != 600 || f0.WriteMovingAvg != 60 || f0.WriteLimit != 10<<30 || f0.Updated != updated.Unix() {
		t.Errorf("fragment bb1: %+v", f0)
	}
	if f1.ServerHostname != "bb2" || f1.Fragment != 4 || !f1.ReadOnly || f1.ReadOnlyReason != "write window" || f1.BytesWritten != 400 {
		t.Errorf("fragment bb2 (deleted): %+v", f1)
	}
	n := r.Namespaces[0]
	if n.NamespaceID != 6 || n.Configuration != 5 || n.StripeWidth != 2 || n.StripeSize != 1<<20 || n.BytesWritten != 1000 || n.BytesRead != 200 ||
		n.MaxOffsetWritten != 500 || n.FileSizeLimit != 1<<20 || n.StageBytesWritten != 100 || n.StageBytesRead != 30 || n.FilesCreated != 4 {
		t.Errorf("namespace: %+v", n)
	}
	if len(r.Clients) != 2 || r.Clients[0] != (RealmClient{Node: "cn0", BytesWritten: 300, WriteOps: 3}) ||
		r.Clients[1] != (RealmClient{Node: "cn1", BytesWritten: 700, BytesRead: 200, WriteOps: 7, ReadOps: 2, FilesCreated: 4}) {
		t.Errorf("clients: %+v", r.Clients)
	}
	if r.Cache != nil || f0.Cache != nil {
		t.Errorf("a scratch instance's record has cache figures: %+v", r.Cache)
	}
	usage[1].Final = true
	if r := BuildAccounting(w, w.Instances[2], usage, nil).Realm; !r.Final {
		t.Error("every fragment's counters are final: the record is")
	}
	// A cache instance's fragments' cache figures, and their sum.
	usage[0].Counters.Cache = &agentapi.CacheUsage{PFSBytesRead: 10, PFSBytesWritten: 20, Hits: 3, Misses: 1, Dirty: 5}
	usage[1].Counters.Cache = &agentapi.CacheUsage{PFSBytesRead: 1, PFSBytesWritten: 2, Hits: 4, Evictions: 2, Dirty: 7}
	if r := BuildAccounting(w, w.Instances[2], usage, nil).Realm; r.Cache == nil ||
		*r.Cache != (agentapi.CacheUsage{PFSBytesRead: 11, PFSBytesWritten: 22, Hits: 7, Misses: 1, Evictions: 2, Dirty: 12}) ||
		r.Fragments[1].Cache == nil || r.Fragments[1].Cache.PFSBytesWritten != 2 {
		t.Errorf("cache figures: %+v", r.Cache)
	}
	usage[0].Counters.Cache, usage[1].Counters.Cache = nil, nil

	// At teardown the namespaces and fragments are gone: their metadata kept with the
	// counters makes the same namespace.
	delete(w.Namespaces, 6)
	delete(w.Fragments, 3)
	usage[0].Namespaces = []model.Namespace{{ID: 6, ConfigurationID: 5, FragmentID: 3}}
	a := AccountingOf(w, w.Instances[2], usage, nil, "c-2", time.Unix(1700000200, 0))
	if r := a.Realm; r.RecordID != "c-2" || r.Ended != 1700000200 || len(r.Namespaces) != 1 || r.Namespaces[0].Configuration != 5 || r.Namespaces[0].StripeWidth != 2 || r.ServerCount != 2 {
		t.Errorf("teardown record: %+v", r)
	}

	// Stages that are gone (a replaced in-job request, a job's stage into a persistent
	// instance) count with the carried bytes, in the totals and their namespace.
	var carried model.StageBytes
	carried.Add(&model.Stage{NamespaceID: 6, Direction: model.StageOut, BytesDone: 70})
	carried.Add(&model.Stage{NamespaceID: 6, Direction: model.StageOut, BytesDone: 5})
	carried.Add(&model.Stage{NamespaceID: 6, Direction: model.StageIn, BytesDone: 1})
	carried.Instance = 2
	if r := BuildAccounting(w, w.Instances[2], usage, &carried).Realm; r.StageBytesIn != 101 || r.StageBytesOut != 105 ||
		r.Namespaces[0].StageBytesRead != 105 || r.Namespaces[0].StageBytesWritten != 101 {
		t.Errorf("carried stage bytes: in %d out %d, namespace %+v", r.StageBytesIn, r.StageBytesOut, r.Namespaces[0])
	}

	// A loadbalance configuration's replicas are not striped; an instance nobody reported
	// on has empty lists and is not final.
	w.Configurations[5].AccessMode = model.AccessLoadbalance
	if r := BuildAccounting(w, w.Instances[2], usage, nil).Realm; r.Namespaces[0].StripeWidth != 1 {
		t.Errorf("loadbalance stripe width %d, want 1", r.Namespaces[0].StripeWidth)
	}
	w.Instances[10] = &model.Instance{ID: 10, SessionID: 1, Pool: "p"}
	if r := BuildAccounting(w, w.Instances[10], nil, nil).Realm; r.Final || r.Fragments == nil || r.Namespaces == nil || r.Clients == nil || r.ServerCount != 0 {
		t.Errorf("an instance with nothing: %+v", r)
	}
}

// The stage workers' traffic (client agentapi.StageClient(node)) is no compute node's: it is
// the record's stage_traffic, by the storage node it ran on (issue 23 item 9).
func TestAccountingStageTraffic(t *testing.T) {
	w := lifecycle.NewWorld()
	w.Sessions[1] = &model.Session{ID: 1, Token: "4711"}
	w.Instances[2] = &model.Instance{ID: 2, SessionID: 1, Created: time.Unix(1700000000, 0)}
	w.Fragments[3] = &model.Fragment{ID: 3, InstanceID: 2, Node: "bb1"}
	usage := []*model.FragmentUsage{{Fragment: 3, Instance: 2, Node: "bb1", Counters: agentapi.FragmentUsage{
		Fragment: 3, BytesWritten: 700,
		Clients: []agentapi.ClientUsage{{Node: "cn1", BytesWritten: 200}, {Node: agentapi.StageClient("bb1"), BytesWritten: 500, WriteOps: 5}}}}}
	r := BuildAccounting(w, w.Instances[2], usage, nil).Realm
	if len(r.Clients) != 1 || r.Clients[0].Node != "cn1" {
		t.Errorf("clients %+v: the compute nodes only", r.Clients)
	}
	if len(r.StageTraffic) != 1 || r.StageTraffic[0] != (RealmClient{Node: "bb1", BytesWritten: 500, WriteOps: 5}) {
		t.Errorf("stage traffic %+v, want bb1's 500 bytes", r.StageTraffic)
	}
	if r.BytesWritten != 700 {
		t.Errorf("totals %d: what the SSD wrote, stages included", r.BytesWritten)
	}
}
