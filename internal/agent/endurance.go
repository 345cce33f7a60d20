package agent

// A storage node's SSD wear (DataWarp's endurance): read every agent.endurance_interval from
// a file the site's tooling writes (agent.endurance_file), else with smartctl (smartmontools)
// or nvme (nvme-cli) from the device holding ssd_path, and reported with every heartbeat. A
// missing or failing tool makes the wear unknown, with the reason: never an agent failure.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"golang.org/x/sys/unix"
)

// EnduranceOptions say how the agent reads its SSD's wear.
type EnduranceOptions struct {
	File     string        // agent.endurance_file: a percentage used, written by the site
	Interval time.Duration // agent.endurance_interval
	Timeout  time.Duration // agent.endurance_timeout: one run of smartctl or nvme
}

// maxEnduranceOutput bounds what is read of the file or a tool's output.
const maxEnduranceOutput = 4 << 20

// endurance returns the last reading, and starts a new one in the background when the last
// is older than the interval (a slow smartctl never delays a heartbeat).
func (a *Agent) endurance() *agentapi.Endurance {
	a.endMu.Lock()
	defer a.endMu.Unlock()
	if !a.endReading && (a.endLast == nil || time.Since(a.endAt) >= a.opt.Endurance.Interval) {
		a.endReading = true
		go func() {
			e := a.readEndurance()
			a.endMu.Lock()
			if a.endLast == nil || *a.endLast != e {
				a.opt.Log.Info("SSD endurance", "known", e.Known, "percent_used", e.PercentUsed, "source", e.Source, "error", e.Error)
			}
			a.endLast, a.endAt, a.endReading = &e, time.Now(), false
			a.endMu.Unlock()
		}()
	}
	if a.endLast == nil {
		return nil
	}
	e := *a.endLast
	return &e
}

// readEndurance reads the wear once, the one way the configuration says.
func (a *Agent) readEndurance() agentapi.Endurance {
	if f := a.opt.Endurance.File; f != "" {
		used, err := readEnduranceFile(f)
		if err != nil {
			return agentapi.Endurance{Source: "file " + f, Error: err.Error()}
		}
		return agentapi.Endurance{Known: true, PercentUsed: used, Source: "file " + f}
	}
	dev, err := deviceOf(a.ssd)
	if err != nil {
		return agentapi.Endurance{Error: fmt.Sprintf("the device holding %s: %v (set agent.endurance_file to report the wear another way)", a.ssd, err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.opt.Endurance.Timeout)
	defer cancel()
	if path, err := lookTool("smartctl"); err == nil {
		src := "smartctl " + dev
		out, runErr := runTool(ctx, path, "--json", "-a", dev)
		used, err := parseSmartctl(out)
		if err != nil {
			return agentapi.Endurance{Source: src, Error: toolError(ctx, a.opt.Endurance.Timeout, runErr, err)}
		}
		return agentapi.Endurance{Known: true, PercentUsed: used, Source: src}
	}
	if path, err := lookTool("nvme"); err == nil {
		src := "nvme " + dev
		out, runErr := runTool(ctx, path, "smart-log", dev, "-o", "json")
		used, err := parseNvmeSmartLog(out)
		if err != nil {
			return agentapi.Endurance{Source: src, Error: toolError(ctx, a.opt.Endurance.Timeout, runErr, err)}
		}
		return agentapi.Endurance{Known: true, PercentUsed: used, Source: src}
	}
	return agentapi.Endurance{Error: "neither smartctl (Debian: smartmontools) nor nvme (nvme-cli) is installed; install one, or set agent.endurance_file"}
}

// lookTool finds a tool on PATH or in the system directories (systemd's PATH may lack sbin).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

func runTool(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	var out bytes.Buffer
	cmd.Stdout = &limitedBuffer{buf: &out, left: maxEnduranceOutput}
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

type limitedBuffer struct {
	buf  *bytes.Buffer
	left int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	n := min(len(p), l.left)
	l.buf.Write(p[:n])
	l.left -= n
	return len(p), nil
}

func toolError(ctx context.Context, timeout time.Duration, runErr, parseErr error) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Sprintf("took longer than agent.endurance_timeout (%s)", timeout)
	}
	if runErr != nil {
		return fmt.Sprintf("%v (%v)", parseErr, runErr)
	}
	return parseErr.Error()
}

// readEnduranceFile reads a percentage used: a number, optionally followed by %. The file is
// the administrator's (in a directory only root writes): it is opened without following a
// symbolic link, and must be a regular file (a FIFO would block the reading).
func readEnduranceFile(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("agent.endurance_file %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return 0, fmt.Errorf("agent.endurance_file %s is not a regular file", path)
	}
	buf := make([]byte, 64)
	n, _ := f.Read(buf)
	text := strings.TrimSuffix(strings.TrimSpace(string(buf[:n])), "%")
	used, err := strconv.Atoi(strings.TrimSpace(text))
	if err != nil || used < 0 {
		return 0, fmt.Errorf("agent.endurance_file %s holds %q; write the SSD's wear as a percentage used, e.g. 7", path, strings.TrimSpace(string(buf[:n])))
	}
	return used, nil
}

// smartctlReport is what is read of `smartctl --json -a`.
type smartctlReport struct {
	Smartctl struct {
		Messages []struct {
			String string `json:"string"`
		} `json:"messages"`
	} `json:"smartctl"`
	// NVMe: the SMART / Health log's Percentage Used (NVMe 1.2+), may pass 100.
	NVMe *struct {
		PercentageUsed *int `json:"percentage_used"`
	} `json:"nvme_smart_health_information_log"`
	// SCSI / SAS: the Percentage Used Endurance Indicator (log page 11h).
	SCSIPercentUsed *int `json:"scsi_percentage_used_endurance_indicator"`
	// ATA: Device Statistics, Solid State Device page: Percentage Used Endurance Indicator
	// (ACS-3); present when smartctl reads the log.
	ATAStats *struct {
		Pages []struct {
			Number int `json:"number"`
			Table  []struct {
				Name  string `json:"name"`
				Value *int   `json:"value"`
			} `json:"table"`
		} `json:"pages"`
	} `json:"ata_device_statistics"`
	// ATA: vendors' SMART attributes whose normalized value is the life remaining, in percent.
	ATAAttributes *struct {
		Table []struct {
			Name  string `json:"name"`
			Value int    `json:"value"`
		} `json:"table"`
	} `json:"ata_smart_attributes"`
}

// remainingLifeAttributes are SATA SSD attributes whose normalized value counts down from 100
// as the flash wears (smartmontools' drive database names), in order of preference.
var remainingLifeAttributes = []string{
	"Percent_Lifetime_Remain", // Micron, Crucial
	"Percent_Life_Remaining",  // Intel (Dell)
	"SSD_Life_Left",           // SandForce, Kingston, ADATA
	"Remaining_Lifetime_Perc", // SanDisk
	"Media_Wearout_Indicator", // Intel
	"Wear_Leveling_Count",     // Samsung
}

// parseSmartctl returns the percentage used from smartctl's JSON: NVMe's percentage_used,
// SCSI's and ATA's standard Percentage Used Endurance Indicator, else 100 minus the first
// vendor attribute of remaining life.
func parseSmartctl(out []byte) (int, error) {
	var r smartctlReport
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("smartctl gave no JSON (%v); is it smartmontools 7 or later?", err)
	}
	if r.NVMe != nil && r.NVMe.PercentageUsed != nil {
		return *r.NVMe.PercentageUsed, nil
	}
	if r.SCSIPercentUsed != nil {
		return *r.SCSIPercentUsed, nil
	}
	if r.ATAStats != nil {
		for _, p := range r.ATAStats.Pages {
			for _, e := range p.Table {
				if e.Name == "Percentage Used Endurance Indicator" && e.Value != nil {
					return *e.Value, nil
				}
			}
		}
	}
	if r.ATAAttributes != nil {
		for _, want := range remainingLifeAttributes {
			for _, at := range r.ATAAttributes.Table {
				if at.Name == want && at.Value >= 0 && at.Value <= 100 {
					return 100 - at.Value, nil
				}
			}
		}
	}
	var msgs []string
	for _, m := range r.Smartctl.Messages {
		msgs = append(msgs, m.String)
	}
	if len(msgs) > 0 {
		return 0, fmt.Errorf("smartctl: %s", strings.Join(msgs, "; "))
	}
	return 0, errors.New("smartctl reports no wear indicator for this device (not an SSD, or a vendor attribute Spillway does not know: set agent.endurance_file)")
}

// parseNvmeSmartLog returns percent_used from `nvme smart-log -o json`.
func parseNvmeSmartLog(out []byte) (int, error) {
	var r struct {
		PercentUsed    *int `json:"percent_used"`
		PercentageUsed *int `json:"percentage_used"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("nvme smart-log gave no JSON (%v): not an NVMe device?", err)
	}
	if r.PercentUsed != nil {
		return *r.PercentUsed, nil
	}
	if r.PercentageUsed != nil {
		return *r.PercentageUsed, nil
	}
	return 0, errors.New("nvme smart-log reports no percent_used")
}

// deviceOf finds the whole block device holding path's file system (/dev/nvme0n1 for a
// partition /dev/nvme0n1p1; the first device under a device-mapper or md device), from
// /sys/dev/block.
func deviceOf(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	dir, err := filepath.EvalSymlinks(sys)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return "", fmt.Errorf("its file system (device %d:%d) is on no block device", unix.Major(st.Dev), unix.Minor(st.Dev))
		}
		return "", err
	}
	for range 8 { // device-mapper or md over other devices: follow the first one down
		slaves, _ := os.ReadDir(filepath.Join(dir, "slaves"))
		if len(slaves) == 0 {
			break
		}
		next, err := filepath.EvalSymlinks(filepath.Join(dir, "slaves", slaves[0].Name()))
		if err != nil {
			return "", err
		}
		dir = next
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir) // a partition: its disk is the parent
	}
	return "/dev/" + filepath.Base(dir), nil
}
