package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

// reportedEndurance asks for reports until one carries a reading that satisfies ok (the
// agent reads in the background, so the first reports may carry none or an older one).
func reportedEndurance(t *testing.T, a *Agent, ok func(*agentapi.Endurance) bool) *agentapi.Endurance {
	t.Helper()
	var last *agentapi.Endurance
	for i := 0; i < 2000; i++ {
		rep, err := a.Report(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if last = rep.Endurance; last != nil && ok(last) {
			return last
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no report carried the expected endurance; last: %+v", last)
	return nil
}

func TestEnduranceFromTheSitesFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "wear")
	if err := os.WriteFile(file, []byte("7%\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := New(Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: filepath.Join(dir, "ssd"), Capacity: 1 << 20,
		Endurance: EnduranceOptions{File: file, Interval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	e := reportedEndurance(t, a, func(e *agentapi.Endurance) bool { return true })
	if !e.Known || e.PercentUsed != 7 || e.Source != "file "+file || e.Error != "" {
		t.Fatalf("want 7%% used from the file: %+v", e)
	}
	// The site's tooling writes a new figure: the next reading reports it.
	os.WriteFile(file, []byte("96"), 0o644)
	reportedEndurance(t, a, func(e *agentapi.Endurance) bool { return e.Known && e.PercentUsed == 96 })

	// What is not a percentage is reported, naming the key and the fix; the agent keeps going.
	os.WriteFile(file, []byte("worn out"), 0o644)
	e = reportedEndurance(t, a, func(e *agentapi.Endurance) bool { return !e.Known })
	if !strings.Contains(e.Error, "agent.endurance_file") || !strings.Contains(e.Error, "percentage used, e.g. 7") {
		t.Fatalf("error %q must name the key and the form", e.Error)
	}
	// Root never follows a link there.
	os.Remove(file)
	os.Symlink(filepath.Join(dir, "elsewhere"), file)
	os.WriteFile(filepath.Join(dir, "elsewhere"), []byte("1"), 0o644)
	e = reportedEndurance(t, a, func(e *agentapi.Endurance) bool {
		return !e.Known && strings.Contains(e.Error, "too many levels of symbolic links")
	})
	if e.PercentUsed != 0 {
		t.Fatalf("a link's target must not be read: %+v", e)
	}
}

func TestComputeNodeReportsNoEndurance(t *testing.T) {
	a, err := New(Options{Name: "cn1"})
	if err != nil {
		t.Fatal(err)
	}
	rep, _ := a.Report(context.Background())
	if rep.Endurance != nil {
		t.Fatalf("a compute-only node has no SSD to report: %+v", rep.Endurance)
	}
}

// The real smartctl, on the real device holding the SSD path (a loop device here: smartctl
// cannot read its wear): the device is found, the tool's own message is reported, and the
// agent keeps working.
func TestEnduranceWithSmartctl(t *testing.T) {
	if _, err := lookTool("smartctl"); err != nil {
		t.Skip("smartctl is not installed (scripts/install-deps --test installs smartmontools)")
	}
	mnt := xfstest.MountPlain(t, t.TempDir(), 320<<20)
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--target", mnt).Output()
	if err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(string(out))
	a, err := New(Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: filepath.Join(mnt, "ssd"), Capacity: 1 << 20,
		Endurance: EnduranceOptions{Interval: time.Hour, Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	e := reportedEndurance(t, a, func(*agentapi.Endurance) bool { return true })
	if e.Source != "smartctl "+dev {
		t.Fatalf("source %q: want smartctl on %s, the device holding the SSD path", e.Source, dev)
	}
	if e.Known || !strings.Contains(e.Error, "smartctl: ") || !strings.Contains(e.Error, dev) {
		t.Fatalf("a loop device has no wear: want smartctl's message naming %s: %+v", dev, e)
	}
	if err := a.CreateFragment(context.Background(), agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 1 << 20, InstanceCapacity: 1 << 20}); err != nil {
		t.Fatalf("an unknown wear must not stop the agent: %v", err)
	}
}

func TestDeviceOfPartitionAndNoDevice(t *testing.T) {
	// /proc is on no block device.
	if _, err := deviceOf("/proc"); err == nil || !strings.Contains(err.Error(), "on no block device") {
		t.Fatalf("/proc: %v", err)
	}
	// The root file system's device, as lsblk sees it: the whole disk for a partition.
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--target", "/").Output()
	src := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(src, "/dev/") {
		t.Skipf("the root file system is not on a /dev device (%q)", src)
	}
	disk := src
	if pk, err := exec.Command("lsblk", "-n", "-d", "-o", "PKNAME", src).Output(); err == nil && strings.TrimSpace(string(pk)) != "" {
		disk = "/dev/" + strings.TrimSpace(string(pk))
	}
	got, err := deviceOf("/")
	if err != nil {
		t.Fatal(err)
	}
	if got != disk {
		t.Fatalf("deviceOf(/) = %s, lsblk says %s", got, disk)
	}
}

// The wear as smartctl 7's JSON gives it for each kind of device (the fields Spillway reads,
// as in real outputs), and what it says when it cannot.
func TestParseSmartctl(t *testing.T) {
	cases := map[string]struct {
		json string
		used int
		err  string
	}{
		"nvme": {`{"device":{"name":"/dev/nvme0","type":"nvme","protocol":"NVMe"},
			"nvme_smart_health_information_log":{"critical_warning":0,"available_spare":100,"percentage_used":3,"media_errors":0}}`, 3, ""},
		"nvme past its rated life": {`{"nvme_smart_health_information_log":{"percentage_used":117}}`, 117, ""},
		"scsi":                     {`{"device":{"protocol":"SCSI"},"scsi_percentage_used_endurance_indicator":12}`, 12, ""},
		"ata device statistics": {`{"ata_device_statistics":{"pages":[{"number":1,"name":"General Statistics","table":[{"offset":8,"name":"Lifetime Power-On Resets","value":40}]},
			{"number":7,"name":"Solid State Device Statistics","table":[{"offset":8,"name":"Percentage Used Endurance Indicator","size":1,"value":4}]}]},
			"ata_smart_attributes":{"table":[{"id":245,"name":"Percent_Life_Remaining","value":50}]}}`, 4, ""},
		"ata intel attribute": {`{"ata_smart_attributes":{"revision":1,"table":[{"id":9,"name":"Power_On_Hours","value":100,"raw":{"value":21213}},
			{"id":202,"name":"End_of_Life","value":100},{"id":245,"name":"Percent_Life_Remaining","value":97,"raw":{"value":97}}]}}`, 3, ""},
		"ata samsung": {`{"ata_smart_attributes":{"table":[{"id":177,"name":"Wear_Leveling_Count","value":91,"raw":{"value":412}}]}}`, 9, ""},
		"ata micron":  {`{"ata_smart_attributes":{"table":[{"id":202,"name":"Percent_Lifetime_Remain","value":88}]}}`, 12, ""},
		"hard disk":   {`{"ata_smart_attributes":{"table":[{"id":5,"name":"Reallocated_Sector_Ct","value":100}]}}`, 0, "no wear indicator"},
		// What smartctl 7.3 prints for a virtio disk (this test machine's).
		"unknown device": {`{"json_format_version":[1,0],"smartctl":{"version":[7,3],"messages":[{"string":"/dev/vda: Unable to detect device type","severity":"error"}],"exit_status":1}}`,
			0, "smartctl: /dev/vda: Unable to detect device type"},
		"not json": {`smartctl 6.6`, 0, "smartmontools 7 or later"},
	}
	for name, c := range cases {
		used, err := parseSmartctl([]byte(c.json))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: want an error with %q, got %v (%d)", name, c.err, err, used)
			}
			continue
		}
		if err != nil || used != c.used {
			t.Errorf("%s: got %d, %v; want %d", name, used, err, c.used)
		}
	}
}

func TestParseNvmeSmartLog(t *testing.T) {
	// nvme-cli 2.x: `nvme smart-log /dev/nvme0 -o json`.
	used, err := parseNvmeSmartLog([]byte(`{"critical_warning":0,"temperature":313,"avail_spare":100,"spare_thresh":10,"percent_used":6,"data_units_read":28167888}`))
	if err != nil || used != 6 {
		t.Fatalf("got %d, %v", used, err)
	}
	if _, err := parseNvmeSmartLog([]byte(`{"temperature":313}`)); err == nil {
		t.Fatal("a log without percent_used must be an error")
	}
}
