package agent

import (
	"strings"
	"testing"
)

// An agent never offers more than its disk: jobs would be promised space that fails only
// once they have written into it.
func TestCapacityLargerThanTheDiskIsRefused(t *testing.T) {
	dir := t.TempDir()
	_, err := New(Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: dir, Capacity: 1 << 60})
	if err == nil || !strings.Contains(err.Error(), "is larger than the file system holding agent.ssd_path") ||
		!strings.Contains(err.Error(), "set agent.capacity to at most") {
		t.Fatalf("an agent offering 1EiB on %s: %v", dir, err)
	}
	a, err := New(Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: dir, Capacity: 1 << 30})
	if err != nil || a.capacity != 1<<30 {
		t.Fatalf("an agent offering 1GiB: %v", err)
	}
}
