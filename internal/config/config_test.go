package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaultsAreValid(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEncodeRoundTrips(t *testing.T) {
	c := Defaults()
	c.Stage.Timeout = Duration(90 * time.Minute)
	c.Agent.Capacity = Size(3 << 30)
	back, err := Parse([]byte(Encode(c)), "encoded", Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if back.Stage.Timeout != c.Stage.Timeout || back.Agent.Capacity != c.Agent.Capacity || len(back.Pools) != 1 {
		t.Fatalf("round trip lost values: %+v", back)
	}
}

func TestParseUnitsAndDurations(t *testing.T) {
	c, err := Parse([]byte(`
[agent]
capacity = "3.5TB"
[stage]
poll_interval = "2s"
[[pool]]
name = "small"
granularity = "16MiB"
[[pool]]
name = "big"
granularity = "1TiB"
`), "t.toml", Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.Capacity != 3500000000000 || c.Stage.PollInterval.D() != 2*time.Second {
		t.Fatalf("got %+v", c)
	}
	if len(c.Pools) != 2 || c.Pools[0].Name != "small" || c.Pools[1].Granularity != 1<<40 {
		t.Fatalf("pools must replace the default list: %+v", c.Pools)
	}
}

func TestParseErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		"[stage]\nmax_runing = 3\n":                                                            "stage.max_runing",
		"[agent]\ncapacity = \"12XB\"\n":                                                       "XB",
		"[stage]\ntimeout = \"soon\"\n":                                                        "soon",
		"[executor]\nmax_attempts = 0\n":                                                       "executor.max_attempts must be greater than 0",
		"[[pool]]\nname = \"p\"\ngranularity = \"0\"":                                          "granularity must be greater than 0",
		"[controller]\nmount_root = \"rel/dir\"\n":                                             "must be an absolute path",
		"[client]\nteardown_attempts = 0\n":                                                    "client.teardown_attempts must be greater than 0",
		"[stage]\ncancel_grace = \"0s\"\n":                                                     "stage.cancel_grace must be greater than 0",
		"[stage]\nstall_timeout = \"0s\"\n":                                                    "stage.stall_timeout must be greater than 0",
		"[stage]\nstall_timeout = \"1s\"\nprogress_interval = \"500ms\"\n":                     "raise stage.stall_timeout (the default is 10m)",
		"[stage]\nmax_parallel = 4\n":                                                          "stage.files_in_flight (8) is above stage.max_parallel (4)",
		"[stage]\nmax_list_size = \"2GiB\"\n":                                                  "stage.max_list_size must be at most 1GiB",
		"[stage]\nworker_output_limit = \"100\"\n":                                             "stage.worker_output_limit must be at least 1KiB",
		"[home]\nidle_timeout = \"0s\"\n":                                                      "home.idle_timeout must be greater than 0",
		"[home]\nidel_timeout = \"1s\"\n":                                                      "home.idel_timeout",
		"[agent]\nfragment_filesystem = \"xfs\"\n":                                             "agent.fragment_filesystem \"xfs\" must be \"directory\"",
		"[agent]\nfragment_mkfs_timeout = \"0s\"\n":                                            "agent.fragment_mkfs_timeout must be greater than 0",
		"[agent]\nfragment_mount_timeout = \"0s\"\n":                                           "agent.fragment_mount_timeout must be greater than 0",
		"[controller]\naccounting_log = \"acct.log\"\n":                                        "controller.accounting_log \"acct.log\" must be an absolute path",
		"[agent]\nendurance_timeout = \"0s\"\n":                                                "agent.endurance_timeout must be greater than 0",
		"[agent]\nendurance_interval = \"0s\"\n":                                               "agent.endurance_interval must be greater than 0",
		"[controller]\nendurance_threshold = 101\n":                                            "controller.endurance_threshold 101 must be a percentage of remaining SSD endurance",
		"[controller]\nauto_drain_failures = -1\n":                                             "controller.auto_drain_failures must be 0 (off) or more",
		"[controller]\nauto_drain_window = \"0s\"\n":                                           "controller.auto_drain_window must be greater than 0",
		"[controller]\nmax_status_wait = \"0s\"\n":                                             "controller.max_status_wait must be greater than 0",
		"[controller]\npersistent_expiration = \"48h\"\nmax_persistent_expiration = \"24h\"\n": "controller.persistent_expiration (48h0m0s) is longer than controller.max_persistent_expiration",
		"[controller]\nmax_connections = 64\nreserved_connections = 64\n":                      "controller.reserved_connections 64 must be from 0 (no reserve) to below controller.max_connections (64)",
		"[controller]\nreserved_connections = -1\n":                                            "controller.reserved_connections -1 must be from 0",
		"[controller]\nmax_connections_per_network = 0\n":                                      "controller.max_connections_per_network must be greater than 0",
		"[cache]\nhigh_watermark = 20\n":                                                       "cache.low_watermark (20) and cache.high_watermark (20) are percentages of a cache's capacity: 0 <= low < high <= 100 (the defaults are 20 and 45)",
		"[cache]\nhigh_watermark = 101\n":                                                      "cache.low_watermark (20) and cache.high_watermark (101)",
		"[cache]\nmodified_threshold = \"0\"\n":                                                "cache.modified_threshold must be greater than 0",
		"[swap]\npriority = -5\n":                                                              "swap.priority is -5; write -1 (the kernel's choice, below the node's own swap) or 0 to 32767",
		"[swap]\npriority = 40000\n":                                                           "swap.priority is 40000",
		"[swap]\ndetach_timeout = \"0s\"\n":                                                    "swap.detach_timeout must be greater than 0",
		"[cache]\nallowed_pfs = [\"/lustre/\"]\n":                                              "cache.allowed_pfs \"/lustre/\": give absolute directories in clean form (no .., no trailing /), e.g. \"/lustre\"",
		"[cache]\nallowed_pfs = [\"lustre\"]\n":                                                "cache.allowed_pfs \"lustre\": give absolute directories",
	}
	for text, want := range cases {
		_, err := Parse([]byte(text), "bad.toml", Defaults())
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "bad.toml") {
			t.Errorf("%q: error %v, want one naming %q and the file", text, err, want)
		}
	}
}

// TestEveryLimitReadsItsKey: each limit added for the run path and the stage worker is read
// from its key (a key that parsed but did nothing would be a silent lie).
func TestEveryLimitReadsItsKey(t *testing.T) {
	c, err := Parse([]byte(`
[client]
teardown_attempts = 7
teardown_retry_wait = "3s"
[stage]
cancel_grace = "4s"
max_parallel = 9
max_list_size = "2MiB"
copy_chunk_size = "8MiB"
copy_buffer_size = "256KiB"
max_warnings = 11
worker_stderr_limit = "4KiB"
[controller]
max_status_wait = "2s"
max_connections_per_network = 12
reserved_connections = 13
[home]
idle_timeout = "5s"
start_timeout = "6s"
stop_timeout = "7s"
reap_interval = "8s"
log_max_size = "3MiB"
`), "t.toml", Defaults())
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Client.TeardownAttempts, c.Client.TeardownRetryWait.D(), c.Stage.CancelGrace.D(), c.Stage.MaxParallel,
		uint64(c.Stage.MaxListSize), uint64(c.Stage.CopyChunkSize), uint64(c.Stage.CopyBufferSize), c.Stage.MaxWarnings,
		uint64(c.Stage.WorkerStderrLimit), c.Home.IdleTimeout.D(), c.Home.StartTimeout.D(), c.Home.StopTimeout.D(),
		c.Home.ReapInterval.D(), uint64(c.Home.LogMaxSize), c.Controller.MaxStatusWait.D(),
		c.Controller.MaxConnectionsPerNetwork, c.Controller.ReservedConnections}
	want := []any{7, 3 * time.Second, 4 * time.Second, 9, uint64(2 << 20), uint64(8 << 20), uint64(256 << 10), 11,
		uint64(4 << 10), 5 * time.Second, 6 * time.Second, 7 * time.Second, 8 * time.Second, uint64(3 << 20), 2 * time.Second,
		12, 13}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("value %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

// The write-protection bounds must hold their defaults: an inconsistent [limits] is refused,
// naming both keys.
func TestLimitsDefaultsWithinTheirBounds(t *testing.T) {
	for _, c := range []struct {
		set  func(*Limits)
		want []string
	}{
		{func(l *Limits) { l.WriteWindowMultiplierMaximum = 4 }, []string{"limits.write_window_multiplier (10)", "limits.write_window_multiplier_maximum (4)"}},
		{func(l *Limits) { l.FilesCreatedMaximum = 100 }, []string{"limits.files_created (0)", "limits.files_created_maximum (100)"}},
		{func(l *Limits) { l.WriteWindowLengthMinimum = Duration(48 * time.Hour) }, []string{"limits.write_window_length", "limits.write_window_length_minimum"}},
		{func(l *Limits) { l.WriteWindowLength = 0 }, []string{"limits.write_window_length must be greater than 0"}},
	} {
		cfg := Defaults()
		c.set(&cfg.Limits)
		err := cfg.Validate()
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %v, want it to name %q", cfg.Limits, err, w)
			}
		}
	}
	cfg := Defaults()
	cfg.Limits = Limits{WriteWindowLength: Duration(time.Hour), WriteWindowLengthMinimum: Duration(time.Minute),
		WriteWindowMultiplier: 0, FilesCreated: 10, FilesCreatedMaximum: 10}
	if err := cfg.Validate(); err != nil {
		t.Errorf("a consistent [limits]: %v", err)
	}
}

func TestStoreEngineChoice(t *testing.T) {
	cfg, err := Parse([]byte("[store]\nengine = \"etcd\"\netcd_endpoints = [\"http://127.0.0.1:2379\"]\netcd_prefix = \"/spillway/c1/\"\n"), "etcd", Defaults())
	if err != nil || cfg.Store.Engine != "etcd" || cfg.Store.EtcdEndpoints[0] != "http://127.0.0.1:2379" {
		t.Fatalf("etcd engine: %+v %v", cfg.Store, err)
	}
	for text, want := range map[string]string{
		"[store]\nengine = \"etcd\"\n": "store.etcd_endpoints is empty",
		"[store]\nengine = \"bolt\"\n": `store.engine "bolt" must be`,
		"[store]\nengine = \"etcd\"\netcd_endpoints = [\"x\"]\netcd_prefix = \"spillway\"\n":           "store.etcd_prefix",
		"[store]\nengine = \"etcd\"\netcd_endpoints = [\"x\"]\netcd_username = \"u\"\n":                "store.etcd_password_file go together",
		"[store]\nengine = \"etcd\"\netcd_endpoints = [\"x\"]\nrestore_batch = 127\n":                  "store.restore_batch (127) must be at most",
		"[store]\nengine = \"etcd\"\netcd_endpoints = [\"x\"]\n[controller]\naccounting_batch = 125\n": "controller.accounting_batch (125) must be at most store.etcd_max_txn_ops - 8",
		"[controller]\naccounting_refresh_limit = -1\n":                                                "controller.accounting_refresh_limit must be 0 (no refresh) or more",
		"[mount]\nunlinks_behind = -1\n":                                                               "mount.unlinks_behind must be 0 (every unlink waits for the storage node) or more",
		"[mount]\ncreate_whole_max = \"2MiB\"\n":                                                       "mount.create_whole_max must be between 0 (no file is placed whole) and 1MiB (one request's data)",
		"[mount]\ncreate_write_wait = \"2s\"\n":                                                        "mount.create_write_wait must be between 0 (a create behind is sent at once) and 1s (each one waiting holds a slot of mount.creates_behind)",
		"[mount]\ncreates_behind = -1\n":                                                               "mount.creates_behind must be 0 (every create waits for the storage node) or more",
		"[controller]\nmunge_connection_lifetime = \"-1s\"\n":                                          `line 2 (last key "controller.munge_connection_lifetime"): "-1s" is negative`,
		"[controller]\naccounting_refresh_timeout = \"0s\"\n":                                          "controller.accounting_refresh_timeout must be greater than 0",
		"[controller]\naccounting_batch = 0\n":                                                         "controller.accounting_batch must be greater than 0",
	} {
		if _, err := Parse([]byte(text), "bad", Defaults()); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", text, err, want)
		}
	}
}

// TestHAChoice: several controllers need etcd and a lease of whole seconds (the controller
// itself checks its listener and advertised address: agents and commands may share its file).
func TestHAChoice(t *testing.T) {
	const etcd = "[store]\nengine = \"etcd\"\netcd_endpoints = [\"x\"]\n[controller]\nlisten = \"10.0.0.1:7700\"\n"
	cfg, err := Parse([]byte(etcd+"[ha]\nenabled = true\nadvertise = \"http://10.0.0.1:7700\"\nlease_ttl = \"3s\"\n"), "ok", Defaults())
	if err != nil || !cfg.HA.Enabled || cfg.HA.LeaseTTL.D() != 3*time.Second {
		t.Fatalf("ha: %+v %v", cfg.HA, err)
	}
	for text, want := range map[string]string{
		"[controller]\nlisten = \"10.0.0.1:7700\"\n[ha]\nenabled = true\nadvertise = \"http://10.0.0.1:7700\"\n": `ha.enabled needs store.engine = "etcd" (it is "sqlite")`,
		etcd + "[ha]\nenabled = true\nadvertise = \"http://a:1\"\nlease_ttl = \"1500ms\"\n":                      "ha.lease_ttl 1.5s: etcd leases count whole seconds",
		etcd + "node_timeout = \"5s\"\n[ha]\nenabled = true\nadvertise = \"http://a:1\"\nlease_ttl = \"5s\"\n":   "controller.node_timeout 5s must be at least twice ha.lease_ttl 5s",
	} {
		if _, err := Parse([]byte(text), "bad", Defaults()); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", text, err, want)
		}
	}
}

// issue 23 item 4: an agent listening on TCP without agent.advertise used to advertise its
// bare host:port, which the controller dialled as the path of a Unix socket.
func TestAgentAdvertise(t *testing.T) {
	cases := []struct {
		listen, advertise, cert string
		want, err               string
	}{
		{listen: "unix:/run/spillway/agent.sock", want: "unix:/run/spillway/agent.sock"},
		{listen: "/run/a.sock", want: "/run/a.sock"},
		{listen: "127.0.0.1:17711", want: "http://127.0.0.1:17711"},
		{listen: "tcp:10.0.0.17:7701", want: "http://10.0.0.17:7701"},
		{listen: "10.0.0.17:7701", cert: "/etc/spillway/cert.pem", want: "https://10.0.0.17:7701"},
		{listen: "[fd00::17]:7701", want: "http://[fd00::17]:7701"},
		{listen: "0.0.0.0:7701", advertise: "http://node17:7701/", want: "http://node17:7701"},
		{listen: "0.0.0.0:7701", advertise: "node17:7701", want: "http://node17:7701"},
		{listen: "0.0.0.0:7701", err: `agent.listen "0.0.0.0:7701" is a wildcard address the controller cannot dial: set agent.advertise to this node's address as the controller reaches it, e.g. advertise = "http://node17:7701"`},
		{listen: "[::]:7701", err: "set agent.advertise"},
		{listen: ":7701", err: "set agent.advertise"},
		{listen: "0.0.0.0:7701", advertise: "0.0.0.0:7701", err: "agent.advertise \"0.0.0.0:7701\" is a wildcard address"},
		{listen: "node17", err: `agent.listen "node17" is neither a Unix socket`},
		{listen: "http://node17:7701", err: "agent.advertise takes the URL"},
	}
	for _, c := range cases {
		cfg := Defaults()
		cfg.Agent.Listen, cfg.Agent.Advertise, cfg.TLS.CertFile = c.listen, c.advertise, c.cert
		got, err := cfg.AgentAdvertise()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("listen %q advertise %q: got %q, %v; want the error %q", c.listen, c.advertise, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("listen %q advertise %q: got %q, %v; want %q", c.listen, c.advertise, got, err, c.want)
		}
	}
}

// TestCacheSection: every [cache] key is read (issue 20).
func TestCacheSection(t *testing.T) {
	c, err := Parse([]byte("[cache]\nallowed_pfs = [\"/lustre\", \"/gpfs/proj\"]\nmodified_threshold = \"1GiB\"\nread_ahead = \"0\"\nsync_on_close = true\nsync_to_pfs = true\nhigh_watermark = 60\nlow_watermark = 30\n"), "c.toml", Defaults())
	if err != nil {
		t.Fatal(err)
	}
	want := Cache{AllowedPFS: []string{"/lustre", "/gpfs/proj"}, ModifiedThreshold: 1 << 30, ReadAhead: 0, SyncOnClose: true, SyncToPFS: true, HighWatermark: 60, LowWatermark: 30}
	if !reflect.DeepEqual(c.Cache, want) {
		t.Fatalf("got %+v\nwant %+v", c.Cache, want)
	}
}

// stage.worker_nice is a nice value a process may lower itself to: 0 to 19, 10 by default;
// anything else is refused naming the key and the range.
func TestStageWorkerNice(t *testing.T) {
	if n := Defaults().Stage.WorkerNice; n != 10 {
		t.Errorf("stage.worker_nice defaults to %d, want 10", n)
	}
	for text, want := range map[string]int{"[stage]\nworker_nice = 0\n": 0, "[stage]\nworker_nice = 19\n": 19} {
		cfg, err := Parse([]byte(text), "nice", Defaults())
		if err != nil || cfg.Stage.WorkerNice != want {
			t.Errorf("%q: %d %v, want %d", text, cfg.Stage.WorkerNice, err, want)
		}
	}
	for _, text := range []string{"[stage]\nworker_nice = -5\n", "[stage]\nworker_nice = 20\n"} {
		if _, err := Parse([]byte(text), "nice", Defaults()); err == nil || !strings.Contains(err.Error(), "stage.worker_nice") || !strings.Contains(err.Error(), "from 0") {
			t.Errorf("%q: %v, want a refusal naming stage.worker_nice and its range", text, err)
		}
	}
}

// The stage worker pool's limits: defaults, a value read, and 0 or less refused naming the key
// (worker_max_stages = 1 is how reuse is turned off).
func TestStageWorkerPoolLimits(t *testing.T) {
	d := Defaults().Stage
	if d.WorkerIdleTimeout.D() != 5*time.Second || d.MaxIdleWorkers != 8 || d.WorkerMaxStages != 100 {
		t.Errorf("defaults %v, %d, %d; want 5s, 8, 100", d.WorkerIdleTimeout.D(), d.MaxIdleWorkers, d.WorkerMaxStages)
	}
	cfg, err := Parse([]byte("[stage]\nworker_idle_timeout = \"2s\"\nmax_idle_workers = 3\nworker_max_stages = 1\n"), "pool", Defaults())
	if err != nil || cfg.Stage.WorkerIdleTimeout.D() != 2*time.Second || cfg.Stage.MaxIdleWorkers != 3 || cfg.Stage.WorkerMaxStages != 1 {
		t.Errorf("read %+v %v", cfg.Stage, err)
	}
	for _, key := range []string{"worker_idle_timeout = \"0s\"", "max_idle_workers = 0", "worker_max_stages = -1"} {
		name := "stage." + strings.Fields(key)[0]
		if _, err := Parse([]byte("[stage]\n"+key+"\n"), "pool", Defaults()); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%q: %v, want a refusal naming %s", key, err, name)
		}
	}
}
